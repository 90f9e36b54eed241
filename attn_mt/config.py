"""The config schema: a tree of dataclasses, each key with its meaning and constraints.

The dataclasses below are the single source of truth for config keys: the loader
(`attn_mt.configfile`), the `--set` overrides, the resolved `config.yaml` in a run folder and
the docs' key table all come from them. Each key is declared with `key(default, doc, ...)`:
its meaning and its own range live in the field's metadata (fairseq's `field(metadata=...)`
pattern), checked by one loop, `check_keys`; only the rules between keys are written by hand,
in each section's `validate()`.
"""

from __future__ import annotations

import dataclasses
import re
import typing
from dataclasses import dataclass
from typing import Any, Literal

from attn_mt.configkeys import check_keys, group, key, mapping_shape, reject, type_name
from attn_mt.errors import ConfigError

NAMED_CORPORA = ("multi30k",)
# The languages of each named corpus (`data.pairs` may pair any two of them).
CORPUS_LANGUAGES = {"multi30k": ("de", "en", "fr", "cs")}
# A language code (`de`, `pt_BR`); its target-language tag is `<2de>` (`language_tag`).
_LANG = re.compile(r"[a-z]{2,3}(_[A-Za-z0-9]+)?")
# A tag is a piece of its own: never one SentencePiece has already (special, byte <0xNN>).
_TAG = re.compile(r"(?!<(s|unk|pad)>|<0x[0-9A-Fa-f]{2}>)<[A-Za-z0-9_-]+>")
# Above this many parameters the model cannot be held for training on any machine we support.
MAX_PARAMETERS = 2**32


@dataclass
class SplitFiles:
    """One parallel split: a source file and a target file, plain text or .gz."""

    src: str | None = key(None, "path to the source-language file")
    tgt: str | None = key(None, "path to the target-language file")


def language_tag(lang: str) -> str:
    """The piece put before a source sentence to ask for target language `lang`: `<2lang>`."""
    return f"<2{lang}>"


_LANGUAGE_RULE = (lambda v: _LANG.fullmatch(v), "must be a language code such as de or pt_BR")


@dataclass
class ValidCorpus:
    """One direction's validation files (`data.valid` given as a list of these)."""

    src: str | None = key(None, "path to the source-language file")
    tgt: str | None = key(None, "path to the target-language file")
    src_lang: str | None = key(None, "its source language", rule=_LANGUAGE_RULE)
    tgt_lang: str | None = key(None, "its target language", rule=_LANGUAGE_RULE)


@dataclass
class TrainCorpus:
    """One corpus of a training mix (`data.train` given as a list of these)."""

    src: str | None = key(None, "path to the source-language file")
    tgt: str | None = key(None, "path to the target-language file")
    weight: float = key(
        1.0, "passes per epoch: 2 = twice, 0.5 = a seeded half drawn anew each epoch", gt=0
    )
    tag: str | None = key(
        None,
        "a token like <bt> put before each source sentence of this corpus",
        rule=(
            _TAG.fullmatch,
            "must look like <name> (letters, digits, _ or -), not a piece SentencePiece has "
            "(<s>, <unk>, <pad>, <0xNN>)",
        ),
    )
    src_lang: str | None = key(None, "its source language (multilingual)", rule=_LANGUAGE_RULE)
    tgt_lang: str | None = key(None, "its target language (multilingual)", rule=_LANGUAGE_RULE)

    def validate(self, where: str) -> None:
        """Both files are given (a mapping's files may come from `data.dataset` instead)."""
        for side in ("src", "tgt"):
            if getattr(self, side) is None:
                raise ConfigError(f"{where}.{side}: missing; every corpus needs src and tgt files")


@dataclass
class DataConfig:
    """Where the parallel text comes from and which pairs are kept for training."""

    dataset: str | None = key(
        None,
        "a named corpus (multi30k) or null to use the files below",
        rule=(NAMED_CORPORA.__contains__, f"must be one of {list(NAMED_CORPORA)} or null"),
    )
    src_lang: str = key("de", "source language code")
    tgt_lang: str = key("en", "target language code")
    train: SplitFiles | list[TrainCorpus] = group(
        SplitFiles, "training files, or a list of corpora {src, tgt, weight, tag} mixed by weight"
    )
    valid: SplitFiles | list[ValidCorpus] = group(
        SplitFiles, "validation files (BLEU, early stop), or a list {src, tgt, src_lang, tgt_lang}"
    )
    test: SplitFiles = group(SplitFiles, "test files (`evaluate --split test`)")
    max_len: int = key(
        128, "training pairs with more subword tokens on either side are dropped", ge=1
    )
    max_len_ratio: float = key(
        0.0, "drop pairs whose longer side has over N times the tokens (0 = off)", off=0, ge=1
    )
    prepared_dir: str | None = key(None, "token shards go under it (null = the user cache folder)")
    pairs: list[str] = dataclasses.field(
        default_factory=list,
        metadata={"doc": "directions of the named corpus for one multilingual model: [de-en, ...]"},
    )
    temperature: float = key(
        1.0, "multilingual mix: corpus shares p ~ n^(1/T) (1 = by size; larger flattens)", gt=0
    )

    def validate(self) -> None:
        """Every split has its files unless a named corpus supplies them; two languages."""
        self._validate_languages()
        if isinstance(self.train, list):
            if not self.train:
                raise ConfigError("data.train: an empty list; give at least one corpus")
            for i, corpus in enumerate(self.train):
                corpus.validate(f"data.train[{i}]")
        for i, entry in enumerate(self.valid if isinstance(self.valid, list) else []):
            for side in ("src", "tgt"):
                if getattr(entry, side) is None:
                    raise ConfigError(f"data.valid[{i}].{side}: missing; give src and tgt files")
        if self.dataset is None:
            for split in ("train", "valid") if isinstance(self.train, SplitFiles) else ("valid",):
                files = getattr(self, split)
                for side in ("src", "tgt"):
                    if isinstance(files, SplitFiles) and getattr(files, side) is None:
                        raise ConfigError(
                            f"data.{split}.{side}: missing; give the file, "
                            "or set data.dataset to a named corpus such as multi30k"
                        )
        if self.src_lang == self.tgt_lang:
            reject("data.tgt_lang", self.tgt_lang, "must differ from data.src_lang")

    def _validate_languages(self) -> None:
        """data.pairs names two languages of its named corpus; file entries give both
        languages or neither, and a multilingual file mix gives its validation per direction."""
        for i, pair in enumerate(self.pairs):
            where = f"data.pairs[{i}]"
            if self.dataset is None:
                raise ConfigError(
                    f"{where}: pairs take their files from a named corpus (data.dataset); for "
                    "files give src_lang and tgt_lang on each data.train and data.valid entry"
                )
            known = CORPUS_LANGUAGES[self.dataset]
            src, _, tgt = str(pair).partition("-")
            if src not in known or tgt not in known:
                reject(where, pair, f"{self.dataset} has the languages {', '.join(known)}")
            if src == tgt:
                reject(where, pair, "a pair needs two different languages")
        if self.pairs and isinstance(self.train, list):
            raise ConfigError(
                "data.pairs: take the files of data.dataset; leave data.train out, or give files "
                "with src_lang and tgt_lang on each data.train entry instead"
            )
        if len(set(self.pairs)) < len(self.pairs):
            reject("data.pairs", self.pairs, "names a pair twice")
        entries: list[tuple[str, TrainCorpus | ValidCorpus]] = []
        entries += [("data.train", c) for c in self.train] if isinstance(self.train, list) else []
        entries += [("data.valid", c) for c in self.valid] if isinstance(self.valid, list) else []
        given = [(w, c) for w, c in entries if c.src_lang or c.tgt_lang]
        for where, c in given:
            if not (c.src_lang and c.tgt_lang) or c.src_lang == c.tgt_lang:
                raise ConfigError(
                    f"{where}: an entry with {c.src} needs src_lang and tgt_lang, two different "
                    "languages"
                )
        if given and len(given) < len(entries):
            raise ConfigError(
                "data.train, data.valid: give src_lang and tgt_lang on every entry, or on none"
            )
        if given and not isinstance(self.valid, list):
            raise ConfigError(
                "data.valid: a multilingual data.train needs its validation per direction: a "
                "list of {src, tgt, src_lang, tgt_lang}"
            )

    def directions(self) -> list[tuple[str, str]]:
        """The (source, target) languages trained: data.pairs, else those of the data.train
        entries, else (src_lang, tgt_lang)."""
        if self.pairs:
            return [tuple(p.split("-", 1)) for p in self.pairs]  # type: ignore[misc]
        if isinstance(self.train, list) and self.train[0].src_lang:
            found = [(c.src_lang, c.tgt_lang) for c in self.train]
            return list(dict.fromkeys(found))  # type: ignore[arg-type]
        return [(self.src_lang, self.tgt_lang)]

    def target_languages(self) -> list[str]:
        """The languages the model translates into, in order of first use."""
        return list(dict.fromkeys(tgt for _, tgt in self.directions()))

    def language_tags(self) -> bool:
        """Whether a `<2xx>` tag leads every source: the model has several target languages."""
        return len(self.target_languages()) > 1

    def weights(self) -> list[float]:
        """Each training corpus's weight (one corpus of weight 1 when `train` is a mapping,
        one per pair with data.pairs)."""
        if isinstance(self.train, list):
            return [c.weight for c in self.train]
        return [1.0] * max(len(self.pairs), 1)

    def tags(self) -> list[str]:
        """The distinct corpus and target-language tags, in order of first use (reserved
        tokenizer pieces)."""
        corpora = self.train if isinstance(self.train, list) else []
        tags = [language_tag(lang) for lang in self.target_languages()] * self.language_tags()
        return list(dict.fromkeys(tags + [c.tag for c in corpora if c.tag]))


@dataclass
class TokenizerConfig:
    """SentencePiece settings; the model is trained on the training split and cached."""

    vocab_size: int = key(
        8000,
        "subword vocabulary size (per side when not joint)",
        ge=8,
        why="room for the 4 special symbols",
    )
    model_type: Literal["unigram", "bpe"] = key("unigram", "SentencePiece algorithm")
    joint: bool = key(True, "one vocabulary for both languages (enables shared embeddings)")
    character_coverage: float = key(
        1.0, "share of characters covered by the vocabulary", ge=0.9, le=1
    )
    byte_fallback: bool = key(True, "unknown characters become UTF-8 byte pieces instead of <unk>")
    max_sentences: int = key(
        2_000_000,
        "cap on sentences SentencePiece reads when training",
        ge=101,
        why="SentencePiece refuses to train on 100 sentences or fewer",
    )
    # Subword regularization: each training pair is cut into pieces anew each time it is used;
    # for unigram the smoothing alpha (smaller splits more), for bpe the BPE-dropout rate.
    sampling_alpha: float = key(0.0, "subword regularization of training pairs (0 = off; e.g. 0.3)")

    def validate(self) -> None:
        """sampling_alpha is a dropout rate, below 1, for bpe."""
        if self.sampling_alpha < 0 or (self.model_type == "bpe" and self.sampling_alpha >= 1):
            reject(
                "tokenizer.sampling_alpha",
                self.sampling_alpha,
                "must be 0 (off) or positive, and below 1 for model_type bpe (a dropout rate)",
            )


@dataclass
class ModelConfig:
    """Transformer encoder-decoder sizes and variants."""

    d_model: int = key(256, "width of embeddings and every sub-layer output", ge=1)
    heads: int = key(4, "attention heads; must divide d_model", ge=1)
    encoder_layers: int = key(3, "number of encoder layers", ge=1)
    decoder_layers: int = key(3, "number of decoder layers", ge=1)
    d_ff: int = key(1024, "hidden width of the position-wise feed-forward network", ge=1)
    dropout: float = key(
        0.1, "dropout on embeddings, sub-layer outputs and feed-forward hidden", ge=0, lt=1
    )
    attention_dropout: float = key(0.0, "dropout on attention weights", ge=0, lt=1)
    attention: Literal["dot", "additive"] = key("dot", "scaled dot-product or additive scoring")
    norm: Literal["pre", "post"] = key("pre", "layer norm before (pre) or after (post) each block")
    activation: Literal["relu", "gelu"] = key("relu", "feed-forward non-linearity")
    positions: Literal["sinusoidal", "learned"] = key("sinusoidal", "positional encoding kind")
    max_positions: int = key(
        1024, "table size for learned positions (sinusoidal grows as needed)", ge=1
    )
    tie_embeddings: bool = key(True, "share src/tgt embeddings (joint vocab) and the output matrix")
    fused_attention: bool = key(True, "use torch's fused scaled_dot_product_attention kernel")

    def validate(self) -> None:
        """Heads split d_model evenly; sinusoidal positions pair up dimensions."""
        if self.d_model % self.heads:
            reject("model.heads", self.heads, f"must divide model.d_model ({self.d_model})")
        if self.d_model % 2 and self.positions == "sinusoidal":
            reject("model.d_model", self.d_model, "must be even for sinusoidal positions")


# train.max_minutes' ceiling (about 1,900 years): far larger budgets overflow the clock's
# arithmetic in seconds (1e308 minutes is inf seconds).
MAX_MINUTES = 1e9


@dataclass
class TrainConfig:
    """The training loop: budget, optimiser, schedule, precision, validation, checkpoints."""

    out_dir: str = key(
        "runs/default",
        "run folder (relative paths resolve against the working dir)",
        rule=(str.strip, "must name a folder for the run"),
    )
    max_steps: int = key(
        0,
        "stop after this many updates (0 = no limit; -1 = run until stopped)",
        ge=-1,
        why="-1 = run until stopped",
    )
    max_minutes: float = key(
        0.0,
        "wall minutes for the whole run, start-up and final validation included (0 = none)",
        ge=0,
    )
    max_epochs: int = key(0, "stop after this many passes over the data (0 = no limit)", ge=0)
    seed: int = key(1, "seeds parameter init, data order and dropout", ge=0)
    init_from: str | None = key(
        None, "run folder or .pt whose weights and SentencePiece start the run"
    )
    lr: float = key(7e-4, "peak learning rate", gt=0)
    schedule: Literal["inverse_sqrt", "linear", "cosine", "constant"] = key(
        "inverse_sqrt", "lr schedule (linear, cosine: decay over max_steps, else max_minutes)"
    )
    warmup: int = key(4000, "linear warm-up steps", ge=0)
    min_lr: float = key(0.0, "floor of the linear and cosine schedules", ge=0)
    weight_decay: float = key(0.0, "AdamW decoupled weight decay", ge=0)
    adam_beta1: float = key(0.9, "AdamW beta1", ge=0, lt=1)
    adam_beta2: float = key(0.98, "AdamW beta2", ge=0, lt=1)
    adam_eps: float = key(1e-9, "AdamW epsilon", ge=0)
    clip_norm: float = key(1.0, "gradient-norm clipping (0 = off)", ge=0)
    label_smoothing: float = key(0.1, "label-smoothing epsilon of the cross-entropy", ge=0, lt=1)
    ema_decay: float = key(
        0.0,
        "weight EMA for validation, best.pt, translation (0 = off; e.g. 0.999)",
        ge=0,
        lt=1,
    )
    batch_tokens: int = key(4096, "tokens per batch: rows x longest side, padding included", ge=1)
    accumulate: int = key(1, "batches per update (gradient accumulation)", ge=1)
    precision: Literal["auto", "fp32", "bf16", "fp16"] = key("auto", "autocast dtype")
    compile: Literal["auto", "true", "false"] = key(
        "false", "torch.compile the updates (auto: if faster in a timing at start-up)"
    )
    threads: int = key(0, "CPU threads for torch (0 = torch's default)", ge=0)
    eval_every: int = key(1000, "validate every N updates", ge=1)
    log_every: int = key(100, "print and log training figures every N updates", ge=1)
    eval_beam: int = key(1, "beam size for validation BLEU (1 = greedy)", ge=1)
    valid_max_sentences: int = key(
        0, "validate on a fixed seeded subset of this many pairs (0 = all)", ge=0
    )
    select_metric: Literal["bleu", "chrf", "loss"] = key(
        "bleu", "validation figure that picks best.pt"
    )
    patience: int = key(
        0, "stop after N validations without a better select_metric (0 = never)", ge=0
    )
    max_nonfinite: int = key(10, "stop after this many NaN/inf losses in a row", ge=0)
    samples: int = key(3, "validation translations shown in the log and TensorBoard", ge=0)
    keep_checkpoints: int = key(0, "also keep the last N validated checkpoints as step_N.pt", ge=0)
    # On the GPU (docs/gpu.md): number formats, determinism, memory.
    tf32: bool = key(True, "TF32 matrix products for fp32 on CUDA (ignored when deterministic)")
    deterministic: bool = key(
        False, "deterministic kernels: repeats and resumes bit-exact on CUDA too, but slower"
    )
    activation_checkpointing: bool = key(
        False, "recompute each layer's activations in the backward pass: less memory, more time"
    )

    def validate(self) -> None:
        """A decaying schedule needs its length: max_steps, else the max_minutes budget; the
        budget must fit the run's clock (in seconds, as floats); the floor must not be above
        the peak."""
        if self.max_minutes > MAX_MINUTES:
            reject("train.max_minutes", self.max_minutes, f"must be at most {MAX_MINUTES:g}")
        if self.min_lr > self.lr:
            reject("train.min_lr", self.min_lr, f"must not exceed train.lr ({self.lr:g})")
        if self.schedule in ("linear", "cosine") and self.max_steps <= 0 and not self.max_minutes:
            reject(
                "train.schedule",
                self.schedule,
                "decays over train.max_steps or train.max_minutes; set one of them",
            )


@dataclass
class DecodeConfig:
    """Search settings used by `translate`, `evaluate` and the checkpoint's defaults."""

    beam: int = key(5, "beam size (1 = greedy)", ge=1)
    length_penalty: float = key(
        1.0, "GNMT alpha: score / ((5 + len) / 6) ** alpha (0 = raw sum)", ge=0
    )
    # Output limits are bounded: a search allocates per output step, an absurd limit fails late.
    max_len_a: float = key(1.5, "output length limit: a * source_length + b", ge=0, le=100)
    max_len_b: int = key(10, "output length limit: a * source_length + b", ge=1, le=100_000)
    batch_tokens: int = key(
        6000, "source tokens per translation batch, x (beam + 1) / 2 or x samples", ge=1
    )
    max_input_len: int = key(
        256,
        "longer input lines are truncated to this many tokens, with a warning",
        ge=1,
        le=100_000,
    )
    alignment_layer: int = key(
        -2,
        "decoder layer whose cross-attention gives --alignment (from 0; -1 last, -2 "
        "penultimate, the one layer of a one-layer decoder)",
    )

    def validate(self) -> None:
        """No rules between decode keys: each key's own range is in its metadata."""


@dataclass
class Config:
    """The whole run: one YAML file maps onto this tree."""

    data: DataConfig = group(DataConfig, "where the text comes from")
    tokenizer: TokenizerConfig = group(TokenizerConfig, "SentencePiece")
    model: ModelConfig = group(ModelConfig, "the Transformer")
    train: TrainConfig = group(TrainConfig, "the training loop")
    decode: DecodeConfig = group(DecodeConfig, "search")

    def validate(self) -> None:
        """Section by section: each key's own constraints, then the rules between keys."""
        for f in dataclasses.fields(self):
            section = getattr(self, f.name)
            check_keys(section, f"{f.name}.")
            section.validate()
        for name, beam in (
            ("train.eval_beam", self.train.eval_beam),
            ("decode.beam", self.decode.beam),
        ):
            if beam > self.tokenizer.vocab_size:  # a search keeps at most one entry per piece
                vocab = self.tokenizer.vocab_size
                raise ConfigError(f"{name}: {beam} is wider than tokenizer.vocab_size ({vocab})")
        if self.data.language_tags() and not self.tokenizer.joint:
            reject(
                "tokenizer.joint",
                False,
                "a model of several target languages needs one joint vocabulary",
            )
        if (count := self.estimated_parameters()) > MAX_PARAMETERS:
            raise ConfigError(
                f"model: about {count:,} parameters with tokenizer.vocab_size "
                f"{self.tokenizer.vocab_size}, more than can be allocated for training (limit "
                f"{MAX_PARAMETERS:,}); lower model.d_model, model.d_ff, the layers or vocab_size"
            )

    def estimated_parameters(self) -> int:
        """The model's parameter count, roughly, erring high (untied embeddings, learned table)."""
        m, vocab = self.model, self.tokenizer.vocab_size
        attention, feed_forward = 4 * m.d_model * (m.d_model + 1), 2 * m.d_model * m.d_ff
        layers = m.encoder_layers * (attention + feed_forward) + m.decoder_layers * (
            2 * attention + feed_forward
        )
        return 3 * vocab * m.d_model + 2 * m.max_positions * m.d_model + layers

    def to_dict(self) -> dict[str, Any]:
        """Plain nested dicts, as written to `config.yaml` and stored in checkpoints."""
        return dataclasses.asdict(self)


# ---------------------------------------------------------------------------------------------
# Checking keys against their metadata


# ---------------------------------------------------------------------------------------------
# Reading the schema


def config_keys(cls: type = Config, prefix: str = "") -> list[tuple[str, str, Any, str]]:
    """Every leaf key as (path, type, default, meaning), for docs and the README check."""
    rows = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        path, hint = f"{prefix}{f.name}", mapping_shape(hints[f.name])
        if isinstance(hint, type) and dataclasses.is_dataclass(hint):
            rows.extend(config_keys(hint, path + "."))
            continue
        factory = f.default_factory  # a group's (or a list's) default is made by a factory
        default = factory() if factory is not dataclasses.MISSING else f.default
        rows.append((path, type_name(hint), default, f.metadata.get("doc", "")))
    return rows
