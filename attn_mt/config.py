"""Typed configuration: YAML -> a tree of dataclasses, with every key checked and defaulted.

The dataclasses below are the single source of truth for config keys: the loader, the `--set`
overrides, the resolved `config.yaml` in a run folder and the README's key table all come from
them. An unknown key names its full path and the closest valid key; a bad value names the key,
the value and the rule it breaks.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import reprlib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Union

import yaml

from attn_mt.errors import ConfigError
from attn_mt.fileio import os_reason

NAMED_CORPORA = ("multi30k",)
# YAML 1.1 reads `5e-4` (no dot) as a string; float fields accept such numbers anyway.
_FLOAT_TEXT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")
_TAG = re.compile(r"<[A-Za-z0-9_-]+>")
# Every integer key is passed to C code somewhere (torch, SentencePiece): it must fit in 32 bits.
INT_LIMIT = 2**31
# A config is three levels deep; far deeper YAML is a mistake (and recursed without end).
MAX_DEPTH = 20
# Above this many parameters the model cannot be held for training on any machine we support.
MAX_PARAMETERS = 2**32
_SHORT_REPR = reprlib.Repr()
_SHORT_REPR.maxlevel, _SHORT_REPR.maxlist, _SHORT_REPR.maxdict = 2, 3, 3
_SHORT_REPR.maxstring = _SHORT_REPR.maxother = 60


@dataclass
class SplitFiles:
    """One parallel split: a source file and a target file, plain text or .gz."""

    src: str | None = None  # path to the source-language file
    tgt: str | None = None  # path to the target-language file


@dataclass
class TrainCorpus:
    """One corpus of a training mix (`data.train` given as a list of these)."""

    src: str | None = None  # path to the source-language file
    tgt: str | None = None  # path to the target-language file
    weight: float = 1.0  # passes per epoch: 2 = twice, 0.5 = a seeded half drawn anew each epoch
    tag: str | None = None  # a token like <bt> put before each source sentence of this corpus

    def validate(self, where: str) -> None:
        for side in ("src", "tgt"):
            if getattr(self, side) is None:
                raise ConfigError(f"{where}.{side}: missing; every corpus needs src and tgt files")
        if self.weight <= 0:
            _fail(f"{where}.weight", self.weight, "must be > 0")
        if self.tag is not None and not _TAG.fullmatch(self.tag):
            _fail(f"{where}.tag", self.tag, "must look like <name> (letters, digits, _ or -)")


@dataclass
class DataConfig:
    """Where the parallel text comes from and which pairs are kept for training."""

    dataset: str | None = None  # a named corpus (multi30k) or null to use the files below
    src_lang: str = "de"  # source language code
    tgt_lang: str = "en"  # target language code
    # training files, or a list of corpora {src, tgt, weight, tag} mixed by weight
    train: SplitFiles | list[TrainCorpus] = field(default_factory=SplitFiles)
    valid: SplitFiles = field(default_factory=SplitFiles)  # validation files (BLEU, early stop)
    test: SplitFiles = field(default_factory=SplitFiles)  # test files (`evaluate --split test`)
    max_len: int = 128  # training pairs with more subword tokens on either side are dropped
    max_len_ratio: float = 0  # drop pairs whose longer side has over N times the tokens (0 = off)
    prepared_dir: str | None = None  # token shards go under it (null = the user cache folder)

    def validate(self) -> None:
        if self.dataset is not None and self.dataset not in NAMED_CORPORA:
            _fail("data.dataset", self.dataset, f"must be one of {list(NAMED_CORPORA)} or null")
        if isinstance(self.train, list):
            if not self.train:
                raise ConfigError("data.train: an empty list; give at least one corpus")
            for i, corpus in enumerate(self.train):
                corpus.validate(f"data.train[{i}]")
        if self.dataset is None:
            for split in ("train", "valid") if isinstance(self.train, SplitFiles) else ("valid",):
                files = getattr(self, split)
                for side in ("src", "tgt"):
                    if getattr(files, side) is None:
                        raise ConfigError(
                            f"data.{split}.{side}: missing; give the file, "
                            "or set data.dataset to a named corpus such as multi30k"
                        )
        if self.src_lang == self.tgt_lang:
            _fail("data.tgt_lang", self.tgt_lang, "must differ from data.src_lang")
        _check_min("data.max_len", self.max_len, 1)
        if self.max_len_ratio and self.max_len_ratio < 1:
            _fail("data.max_len_ratio", self.max_len_ratio, "must be 0 (off) or >= 1")

    def weights(self) -> list[float]:
        """Each training corpus's weight (one corpus of weight 1 when `train` is a mapping)."""
        return [c.weight for c in self.train] if isinstance(self.train, list) else [1.0]

    def tags(self) -> list[str]:
        """The distinct corpus tags, in order of first use (reserved tokenizer pieces)."""
        corpora = self.train if isinstance(self.train, list) else []
        return list(dict.fromkeys(c.tag for c in corpora if c.tag))


@dataclass
class TokenizerConfig:
    """SentencePiece settings; the model is trained on the training split and cached."""

    vocab_size: int = 8000  # subword vocabulary size (per side when not joint)
    model_type: Literal["unigram", "bpe"] = "unigram"  # SentencePiece algorithm
    joint: bool = True  # one vocabulary for both languages (enables shared embeddings)
    character_coverage: float = 1.0  # share of characters covered by the vocabulary
    byte_fallback: bool = True  # unknown characters become UTF-8 byte pieces instead of <unk>
    max_sentences: int = 2_000_000  # cap on sentences SentencePiece reads when training
    # Subword regularization: each training pair is cut into pieces anew each time it is used;
    # for unigram the smoothing alpha (smaller splits more), for bpe the BPE-dropout rate.
    sampling_alpha: float = 0.0  # subword regularization of training pairs (0 = off; e.g. 0.3)

    def validate(self) -> None:
        _check_min("tokenizer.vocab_size", self.vocab_size, 8, "room for the 4 special symbols")
        if self.sampling_alpha < 0 or (self.model_type == "bpe" and self.sampling_alpha >= 1):
            _fail(
                "tokenizer.sampling_alpha",
                self.sampling_alpha,
                "must be 0 (off) or positive, and below 1 for model_type bpe (a dropout rate)",
            )
        if not 0.9 <= self.character_coverage <= 1.0:
            _fail("tokenizer.character_coverage", self.character_coverage, "must be in [0.9, 1]")
        _check_min("tokenizer.max_sentences", self.max_sentences, 1)


@dataclass
class ModelConfig:
    """Transformer encoder-decoder sizes and variants."""

    d_model: int = 256  # width of embeddings and every sub-layer output
    heads: int = 4  # attention heads; must divide d_model
    encoder_layers: int = 3  # number of encoder layers
    decoder_layers: int = 3  # number of decoder layers
    d_ff: int = 1024  # hidden width of the position-wise feed-forward network
    dropout: float = 0.1  # dropout on embeddings, sub-layer outputs and feed-forward hidden
    attention_dropout: float = 0.0  # dropout on attention weights
    attention: Literal["dot", "additive"] = "dot"  # scaled dot-product or additive scoring
    norm: Literal["pre", "post"] = "pre"  # layer norm before (pre) or after (post) each block
    activation: Literal["relu", "gelu"] = "relu"  # feed-forward non-linearity
    positions: Literal["sinusoidal", "learned"] = "sinusoidal"  # positional encoding kind
    max_positions: int = 1024  # table size for learned positions (sinusoidal grows as needed)
    tie_embeddings: bool = True  # share src/tgt embeddings (joint vocab) and the output matrix
    fused_attention: bool = True  # use torch's fused scaled_dot_product_attention kernel

    def validate(self) -> None:
        for key in ("d_model", "heads", "encoder_layers", "decoder_layers", "d_ff"):
            _check_min(f"model.{key}", getattr(self, key), 1)
        if self.d_model % self.heads:
            _fail("model.heads", self.heads, f"must divide model.d_model ({self.d_model})")
        if self.d_model % 2 and self.positions == "sinusoidal":
            _fail("model.d_model", self.d_model, "must be even for sinusoidal positions")
        for key in ("dropout", "attention_dropout"):
            value = getattr(self, key)
            if not 0.0 <= value < 1.0:
                _fail(f"model.{key}", value, "must be in [0, 1)")
        _check_min("model.max_positions", self.max_positions, 1)


@dataclass
class TrainConfig:
    """The training loop: budget, optimiser, schedule, precision, validation, checkpoints."""

    out_dir: str = "runs/default"  # run folder (relative paths resolve against the working dir)
    max_steps: int = 0  # stop after this many updates (0 = no limit; -1 = run until stopped)
    max_minutes: float = 0  # stop after this much wall time (0 = no limit)
    max_epochs: int = 0  # stop after this many passes over the data (0 = no limit)
    seed: int = 1  # seeds parameter init, data order and dropout
    init_from: str | None = None  # run folder or .pt whose weights and SentencePiece start the run
    lr: float = 7e-4  # peak learning rate
    schedule: Literal["inverse_sqrt", "cosine", "constant"] = "inverse_sqrt"  # lr schedule
    warmup: int = 4000  # linear warm-up steps
    min_lr: float = 0.0  # floor of the cosine schedule
    weight_decay: float = 0.0  # AdamW decoupled weight decay
    adam_beta1: float = 0.9  # AdamW beta1
    adam_beta2: float = 0.98  # AdamW beta2
    adam_eps: float = 1e-9  # AdamW epsilon
    clip_norm: float = 1.0  # gradient-norm clipping (0 = off)
    label_smoothing: float = 0.1  # label-smoothing epsilon of the cross-entropy
    ema_decay: float = 0.0  # weight EMA for validation, best.pt, translation (0 = off; e.g. 0.999)
    batch_tokens: int = 4096  # tokens per batch: rows x longest side, padding included
    accumulate: int = 1  # batches per update (gradient accumulation)
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"  # autocast dtype
    compile: bool = False  # torch.compile the model
    threads: int = 0  # CPU threads for torch (0 = torch's default)
    eval_every: int = 1000  # validate every N updates
    log_every: int = 100  # print and log training figures every N updates
    eval_beam: int = 1  # beam size for validation BLEU (1 = greedy)
    valid_max_sentences: int = 0  # validate on a fixed seeded subset of this many pairs (0 = all)
    select_metric: Literal["bleu", "chrf", "loss"] = "bleu"  # validation figure that picks best.pt
    patience: int = 0  # stop after N validations without a better select_metric (0 = never)
    max_nonfinite: int = 10  # stop after this many NaN/inf losses in a row
    samples: int = 3  # validation translations shown in the log and TensorBoard
    keep_checkpoints: int = 0  # also keep the last N validated checkpoints as step_N.pt

    def validate(self) -> None:
        _check_min("train.max_steps", self.max_steps, -1, "-1 = run until stopped")
        for key in ("max_minutes", "max_epochs", "warmup", "patience"):
            _check_min(f"train.{key}", getattr(self, key), 0)
        for key in ("batch_tokens", "accumulate", "eval_every", "log_every", "eval_beam"):
            _check_min(f"train.{key}", getattr(self, key), 1)
        for key in (
            "max_nonfinite",
            "threads",
            "samples",
            "keep_checkpoints",
            "valid_max_sentences",
        ):
            _check_min(f"train.{key}", getattr(self, key), 0)
        if self.lr <= 0:
            _fail("train.lr", self.lr, "must be > 0")
        for key in ("label_smoothing", "ema_decay"):
            if not 0.0 <= getattr(self, key) < 1.0:
                _fail(f"train.{key}", getattr(self, key), "must be in [0, 1)")
        for key in ("adam_beta1", "adam_beta2"):
            if not 0.0 <= getattr(self, key) < 1.0:
                _fail(f"train.{key}", getattr(self, key), "must be in [0, 1)")
        for key in ("weight_decay", "clip_norm", "min_lr", "adam_eps"):
            _check_min(f"train.{key}", getattr(self, key), 0)
        if self.schedule == "cosine" and self.max_steps <= 0:
            _fail("train.schedule", self.schedule, "needs train.max_steps > 0 to know its length")
        _check_min("train.seed", self.seed, 0)
        if not self.out_dir.strip():
            _fail("train.out_dir", self.out_dir, "must name a folder for the run")


@dataclass
class DecodeConfig:
    """Search settings used by `translate`, `evaluate` and the checkpoint's defaults."""

    beam: int = 5  # beam size (1 = greedy)
    length_penalty: float = 1.0  # GNMT alpha: score / ((5 + len) / 6) ** alpha (0 = raw sum)
    max_len_a: float = 1.5  # output length limit: a * source_length + b
    max_len_b: int = 10  # output length limit: a * source_length + b
    batch_tokens: int = 6000  # source tokens (x beam) per translation batch
    max_input_len: int = 256  # longer input lines are truncated to this many tokens, with a warning

    def validate(self) -> None:
        _check_min("decode.beam", self.beam, 1)
        _check_min("decode.length_penalty", self.length_penalty, 0)
        _check_min("decode.max_len_a", self.max_len_a, 0)
        _check_min("decode.max_len_b", self.max_len_b, 1)
        _check_min("decode.batch_tokens", self.batch_tokens, 1)
        _check_min("decode.max_input_len", self.max_input_len, 1)


@dataclass
class Config:
    """The whole run: one YAML file maps onto this tree."""

    data: DataConfig = field(default_factory=DataConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)

    def validate(self) -> None:
        for section in (self.data, self.tokenizer, self.model, self.train, self.decode):
            section.validate()
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
# Loading


class _Refused(yaml.YAMLError):
    """Well-formed YAML that is almost surely a mistake (a duplicate key, absurd nesting)."""

    def __init__(self, line: int, problem: str):
        super().__init__(problem)
        self.line, self.problem = line, problem


class _StrictLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses duplicate mapping keys and nesting deeper than MAX_DEPTH."""

    depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        self.depth += 1
        try:
            if self.depth > MAX_DEPTH:
                line = self.peek_event().start_mark.line + 1
                raise _Refused(line, f"nested more than {MAX_DEPTH} levels deep")
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base` may be overridden
                continue
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if isinstance(key, typing.Hashable) and key in seen:
                raise _Refused(
                    line, f"duplicate key {key!r} (first at line {seen[key]}); keep only one"
                )
            seen[key] = line
        return super().construct_mapping(node, deep)


def parse_yaml(text: str) -> Any:
    """YAML text -> plain data, with the duplicate-key and depth checks of `_StrictLoader`."""
    try:
        return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 (a SafeLoader subclass)
    except ValueError as err:  # an integer of more than 4300 digits
        raise _Refused(1, f"a value cannot be read ({err})") from None


def load_config(path: str | Path, overrides: typing.Sequence[str] = ()) -> Config:
    """Read a YAML config file, apply `key.path=value` overrides, and validate the result."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{path}: is a folder; give the YAML config file")
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found")
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise ConfigError(f"{path}: cannot read config ({os_reason(err)})") from None
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path}: cannot read config ({err})") from None
    try:
        raw = parse_yaml(text)
    except _Refused as err:
        raise ConfigError(f"{path}:{err.line}: {err.problem}") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        # A ReaderError (control or binary characters) has a `reason` instead of a `problem`.
        problem = getattr(err, "problem", None) or getattr(err, "reason", None) or "invalid YAML"
        raise ConfigError(f"{where}: YAML syntax error: {problem}") from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections, not {_kind(raw)}")
    _resolve_data_paths(raw, path.parent)
    for item in overrides:
        apply_override(raw, item)
    _resolve_data_paths(raw, Path.cwd())  # paths given with --set are relative to the shell
    config = config_from_dict(raw)
    _check_budget(config.train)
    return config


def config_from_dict(raw: dict[str, Any]) -> Config:
    """Build and validate a Config from plain nested dicts (a YAML file or a checkpoint)."""
    config = _build(Config, raw, prefix="")
    config.validate()
    return config


def apply_override(raw: dict[str, Any], item: str) -> None:
    """Apply one `--set a.b=value` to the raw dict; the value is parsed as YAML."""
    if "=" not in item:
        raise ConfigError(f"--set {item}: expected KEY=VALUE, e.g. --set train.lr=0.0005")
    key, text = item.split("=", 1)
    parts = key.strip().split(".")
    field_type = _field_type(parts)  # raises on unknown keys
    if _base_type(field_type) is str:
        value: Any = None if text.strip() in ("null", "~") else text
    else:
        try:
            value = parse_yaml(text) if text.strip() else None
        except yaml.YAMLError:
            raise ConfigError(f"--set {item}: cannot parse {text!r} as a value") from None
    node = raw
    for i, part in enumerate(parts[:-1]):
        child = node.get(part)
        if isinstance(child, list):
            raise ConfigError(
                f"--set {item}: {'.'.join(parts[: i + 1])} is a list of corpora in the config; "
                "edit the file instead"
            )
        if not isinstance(child, dict):
            child = {}
            node[part] = child
        node = child
    node[parts[-1]] = value


def save_config(config: Config, path: str | Path) -> None:
    """Write the resolved config (every default filled in) as YAML."""
    Path(path).write_text(yaml.safe_dump(config.to_dict(), sort_keys=False), encoding="utf-8")


def config_keys(cls: type = Config, prefix: str = "") -> list[tuple[str, str, Any, str]]:
    """Every leaf key as (path, type, default, meaning), for docs and the README check."""
    rows = []
    comments = _field_comments(cls)
    for f in dataclasses.fields(cls):
        path = f"{prefix}{f.name}"
        hint = _mapping_shape(typing.get_type_hints(cls)[f.name])
        if dataclasses.is_dataclass(hint):
            rows.extend(config_keys(hint, path + "."))
            continue
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        rows.append((path, _type_name(hint), default, comments.get(f.name, "")))
    return rows


# ---------------------------------------------------------------------------------------------
# Internals


def _fail(key: str, value: Any, rule: str) -> typing.NoReturn:
    raise ConfigError(f"{key}: {_shown(value)} is invalid; {rule}")


def _shown(value: Any) -> str:
    """`repr(value)`, cut short (a YAML alias bomb is a list of a billion items); a huge
    integer is described by its size."""
    if isinstance(value, int) and value.bit_length() > 64:
        return f"a {value.bit_length()}-bit integer"
    return _SHORT_REPR.repr(value)


def _check_budget(train: TrainConfig) -> None:
    """Refuse a training config that would never stop by itself, unless it says so."""
    if not (train.max_steps or train.max_minutes or train.max_epochs or train.patience):
        raise ConfigError(
            "train: no budget (max_steps, max_minutes, max_epochs and patience are all 0); "
            "set one, e.g. --set train.max_minutes=60, or train.max_steps: -1 to run until stopped"
        )


def _check_min(key: str, value: float, low: float, why: str = "") -> None:
    if value < low:
        _fail(key, value, f"must be >= {low}" + (f" ({why})" if why else ""))


def _kind(value: Any) -> str:
    return {dict: "a mapping", list: "a list", str: "a string"}.get(
        type(value), type(value).__name__
    )


def _resolve_data_paths(raw: dict[str, Any], base: Path) -> None:
    """Make relative data file paths relative to the config file's folder."""
    data = raw.get("data")
    if not isinstance(data, dict):
        return
    entries = [data] if isinstance(data.get("prepared_dir"), str) else []
    for split in ("train", "valid", "test"):
        files = data.get(split)
        entries += files if isinstance(files, list) else [files]
    for entry in entries:
        if not isinstance(entry, dict):
            continue
        for key in ("src", "tgt", "prepared_dir"):
            value = entry.get(key)
            if isinstance(value, str) and value and not Path(value).expanduser().is_absolute():
                entry[key] = str((base / value).resolve())
            elif isinstance(value, str):
                entry[key] = str(Path(value).expanduser())


def _mapping_shape(hint: Any) -> Any:
    """`Files | list[Corpus]` -> Files (a mapping is the shape `--set` and the docs use)."""
    if typing.get_origin(hint) in (Union, types.UnionType):
        shapes = [a for a in typing.get_args(hint) if dataclasses.is_dataclass(a)]
        return shapes[0] if shapes else hint
    return hint


def _list_item(hint: Any) -> Any:
    """`Files | list[Corpus]` -> Corpus; None when a list is not allowed."""
    for arg in typing.get_args(hint) if typing.get_origin(hint) in (Union, types.UnionType) else ():
        if typing.get_origin(arg) is list:
            return typing.get_args(arg)[0]
    return None


def _base_type(hint: Any) -> Any:
    """`int | None` -> int; other hints unchanged."""
    if typing.get_origin(hint) in (Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return args[0] if len(args) == 1 else hint
    return hint


def _type_name(hint: Any) -> str:
    if typing.get_origin(hint) is Literal:
        return "|".join(str(a) for a in typing.get_args(hint))
    base = _base_type(hint)
    name = getattr(base, "__name__", str(base))
    return name + (" or null" if base is not hint else "")


def _field_type(parts: list[str]) -> Any:
    """The type hint of a dotted key, or a ConfigError naming the unknown part."""
    cls: Any = Config
    for i, part in enumerate(parts):
        hints = typing.get_type_hints(cls)
        if part not in hints:
            _unknown(".".join(parts[:i]), part, list(hints))
        cls = _mapping_shape(hints[part])
        if i < len(parts) - 1 and not dataclasses.is_dataclass(cls):
            raise ConfigError(f"{'.'.join(parts[: i + 1])}: is a value, not a section")
    if dataclasses.is_dataclass(cls):
        raise ConfigError(f"{'.'.join(parts)}: is a section; set one of its keys")
    return cls


def _unknown(prefix: str, key: str, valid: list[str]) -> typing.NoReturn:
    path = f"{prefix}.{key}" if prefix else str(key)
    close = difflib.get_close_matches(str(key), valid, n=1, cutoff=0.5)
    hint = (
        f"did you mean {prefix + '.' if prefix else ''}{close[0]}?"
        if close
        else (f"valid keys: {', '.join(valid)}")
    )
    raise ConfigError(f"{path}: unknown key; {hint}")


def _build(cls: type, raw: Any, prefix: str) -> Any:
    """Recursively turn a dict into dataclass `cls`, checking keys and types."""
    where = prefix.rstrip(".") or "config"
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a mapping of keys, got {_kind(raw)} {_shown(raw)}")
    hints = typing.get_type_hints(cls)
    for key in raw:
        if key not in hints:
            _unknown(prefix.rstrip("."), key, list(hints))
    values = {}
    for name, hint in hints.items():
        if name not in raw:
            continue
        item = _list_item(hint)
        if item is not None and isinstance(raw[name], list):
            values[name] = [
                _build(item, entry, f"{prefix}{name}[{i}].") for i, entry in enumerate(raw[name])
            ]
        elif dataclasses.is_dataclass(_mapping_shape(hint)):
            values[name] = _build(_mapping_shape(hint), raw[name], f"{prefix}{name}.")
        else:
            values[name] = _coerce(f"{prefix}{name}", raw[name], hint)
    return cls(**values)


def _coerce(key: str, value: Any, hint: Any) -> Any:
    """Check `value` against the field's type hint; ints are accepted where floats are."""
    base = _base_type(hint)
    if value is None:
        if base is not hint:
            return None
        raise ConfigError(f"{key}: must not be null (expected {_type_name(hint)})")
    if typing.get_origin(base) is Literal:
        choices = typing.get_args(base)
        if value not in choices:
            close = difflib.get_close_matches(str(value), [str(c) for c in choices], n=1)
            extra = f"; did you mean {close[0]!r}?" if close else ""
            _fail(key, value, f"must be one of {list(choices)}{extra}")
        return value
    if base is bool:
        if isinstance(value, bool):
            return value
    elif base is int:
        if isinstance(value, int) and not isinstance(value, bool):
            if not -INT_LIMIT <= value < INT_LIMIT:
                _fail(key, value, f"must be below {INT_LIMIT:,} in size")
            return value
    elif base is float:
        number = None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            number = float(value) if abs(value) < 1e300 else math.inf
        elif isinstance(value, str) and _FLOAT_TEXT.fullmatch(value.strip()):
            number = float(value)
        if number is not None:
            if not math.isfinite(number):
                _fail(key, value, "must be a finite number")
            return number
    elif base is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
    raise ConfigError(f"{key}: {_shown(value)} is {_kind(value)}, expected {_type_name(hint)}")


def _field_comments(cls: type) -> dict[str, str]:
    """The trailing `# comment` of each field in the class source: the key's meaning."""
    import inspect

    try:
        lines = inspect.getsource(cls).splitlines()
    except (OSError, TypeError):
        return {}
    comments = {}
    for line in lines:
        stripped = line.strip()
        if ":" in stripped and "  # " in stripped and not stripped.startswith(("def", "#")):
            name = stripped.split(":", 1)[0].strip()
            if name.isidentifier():
                comments[name] = stripped.split("  # ", 1)[1].strip()
    return comments
