"""The config schema: a tree of dataclasses, each key with its meaning and constraints.

The dataclasses below are the single source of truth for config keys: the loader
(`attn_mt.config.file`), the `--set` overrides, the resolved `config.yaml` in a run folder and
the docs' key table all come from them. Each key is declared with `key(default, doc, ...)`:
its meaning and its own range live in the field's metadata (fairseq's `field(metadata=...)`
pattern), checked by one loop, `check_keys`; only the rules between keys are written by hand,
in each section's `validate()`.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from typing import Any, Literal

from attn_mt.config.data import DataConfig
from attn_mt.config.keys import check_keys, group, key, mapping_shape, reject, type_name
from attn_mt.errors import ConfigError
from attn_mt.scores import DEFAULT_METRICS, METRICS, STRING_METRICS

# Above this many parameters the model cannot be held for training on any machine we support.
MAX_PARAMETERS = 2**32


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
        0.1,
        "dropout on embeddings, sub-layer outputs and (unless model.activation_dropout) the "
        "feed-forward hidden layer",
        ge=0,
        lt=1,
    )
    activation_dropout: float | None = key(
        None,
        "dropout on the feed-forward hidden layer alone (null: model.dropout; 0 as in the paper)",
        ge=0,
        lt=1,
    )
    attention_dropout: float = key(0.0, "dropout on attention weights", ge=0, lt=1)
    attention: Literal["dot", "additive"] = key("dot", "scaled dot-product or additive scoring")
    norm: Literal["pre", "post"] = key("pre", "layer norm before (pre) or after (post) each block")
    activation: Literal["relu", "gelu", "swish"] = key(
        "relu", "feed-forward non-linearity (swish: x * sigmoid(x), as OPUS-MT models)"
    )
    positions: Literal["sinusoidal", "learned"] = key("sinusoidal", "positional encoding kind")
    max_positions: int = key(
        1024, "table size for learned positions (sinusoidal grows as needed)", ge=1
    )
    tie_embeddings: bool = key(True, "share src/tgt embeddings (joint vocab) and the output matrix")
    output_bias: bool = key(
        False, "a learned bias on the output logits (Marian's final_logits_bias; imports set it)"
    )
    fused_attention: bool = key(True, "use torch's fused scaled_dot_product_attention kernel")

    def validate(self) -> None:
        """Heads split d_model evenly; sinusoidal positions pair up dimensions."""
        if self.d_model % self.heads:
            reject("model.heads", self.heads, f"must divide model.d_model ({self.d_model})")
        if self.d_model % 2 and self.positions == "sinusoidal":
            reject("model.d_model", self.d_model, "must be even for sinusoidal positions")


# The parts `train.freeze` may name (`train.state.freeze` says which tensors each holds).
FREEZABLE = ("embeddings", "encoder", "decoder")
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
        None,
        "run folder or .pt whose weights and SentencePiece start the run (its model, tokenizer "
        "and decode keys fill those the config leaves out)",
    )
    freeze: list[str] = dataclasses.field(
        default_factory=list,
        metadata={
            "doc": "parts not trained: embeddings (the tables, the output layer: with tied "
            "embeddings one matrix), encoder, decoder"
        },
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
    valid_loss_every: int = key(
        0, "between validations, the validation loss alone every N updates (0 = off)", ge=0
    )
    log_every: int = key(100, "print and log training figures every N updates", ge=1)
    eval_beam: int = key(1, "beam size for validation BLEU (1 = greedy)", ge=1)
    valid_max_sentences: int = key(
        0, "validate on a fixed seeded subset of this many pairs (0 = all)", ge=0
    )
    select_metric: Literal["bleu", "chrf", "chrf++", "ter", "loss"] = key(
        "bleu", "validation figure that picks best.pt (ter and loss: the lowest)"
    )
    valid_metrics: list[str] = dataclasses.field(
        default_factory=lambda: list(DEFAULT_METRICS),
        metadata={
            "doc": "scores of the validation search: bleu, chrf, chrf++, ter (and "
            "select_metric's, always)"
        },
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
    bf16_stream: bool = key(
        False,
        "under bf16 autocast, the residual stream (embeddings, residual sums, layer-norm "
        "outputs) in bf16, not fp32: half the bytes; weights, gradients, optimizer stay fp32",
    )

    @property
    def higher_is_better(self) -> bool:
        """Whether a larger select_metric is better: not for TER (edits) nor the loss."""
        return self.select_metric != "loss" and METRICS[self.select_metric].higher_is_better

    def scored_metrics(self) -> tuple[str, ...]:
        """The scores a validation computes: valid_metrics and the select_metric's."""
        chosen = [*self.valid_metrics, self.select_metric]
        return tuple(name for name in dict.fromkeys(chosen) if name != "loss")

    def checks_loss_alone(self, step: int) -> bool:
        """Whether `step` checks the validation loss alone: at valid_loss_every, but not where
        a validation falls (at eval_every, and at the end of max_steps)."""
        due = bool(self.valid_loss_every) and step % self.valid_loss_every == 0
        return due and step % self.eval_every != 0 and step != self.max_steps

    def validate(self) -> None:
        """A decaying schedule needs its length: max_steps, else the max_minutes budget; the
        budget must fit the run's clock (in seconds, as floats); the floor must not be above
        the peak; valid_metrics are scores validation can compute; freeze names parts of the
        model, and leaves one to train."""
        if self.max_minutes > MAX_MINUTES:
            reject("train.max_minutes", self.max_minutes, f"must be at most {MAX_MINUTES:g}")
        if not self.valid_metrics or not set(self.valid_metrics) <= set(STRING_METRICS):
            rule = f"must list one or more of {list(STRING_METRICS)}"
            reject("train.valid_metrics", self.valid_metrics, rule)
        if self.min_lr > self.lr:
            reject("train.min_lr", self.min_lr, f"must not exceed train.lr ({self.lr:g})")
        if not set(self.freeze) <= set(FREEZABLE) or len(set(self.freeze)) < len(self.freeze):
            reject("train.freeze", self.freeze, f"must list some of {list(FREEZABLE)}, once each")
        if set(self.freeze) == set(FREEZABLE):
            reject("train.freeze", self.freeze, "leaves nothing to train")
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
        1.0, "alpha: score / ((5 + len) / 6) ** alpha (gnmt) or len ** alpha (plain); 0 = sum", ge=0
    )
    length_penalty_kind: Literal["gnmt", "plain"] = key(
        "gnmt", "gnmt: Wu et al.'s ((5 + len) / 6) ** alpha; plain: len ** alpha (transformers)"
    )
    end_at_limit: Literal["scored", "free"] = key(
        "scored",
        "the <eos> forced at the output limit: scored by the model, or free (transformers' "
        "forced_eos_token_id; imported Marian models)",
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
    alignment_layer: int | None = key(
        None,
        "decoder layer whose cross-attention gives --alignment (from 0; -1 last, -2 "
        "penultimate, the one layer of a one-layer decoder; null: the mean of every layer)",
    )
    shortlist: str | None = key(
        None,
        "a lexical shortlist file (`attn-mt shortlist`): each step scores only the target pieces "
        "likely for the batch's sources (faster with a large vocabulary); null: every piece",
    )
    # Text as people write it (docs/decoding.md); with both off, lines are read as given.
    recase: Literal["auto", "off"] = key(
        "auto",
        "ALL CAPS and Title Case lines (and runs in capitals) read in the casing table's forms, "
        "the output cased back; no final punctuation in, none out",
    )
    protect: Literal["auto", "off"] = key(
        "auto",
        "URLs, e-mails, @handles, #tags, paths, `code` and emoji kept verbatim, every number "
        "kept, invisible and unknown typographic characters normalised",
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

    def validate(self, files: bool = True) -> None:
        """Section by section: each key's own constraints, then the rules between keys.
        `files` False: data.* need not name training files (`DataConfig.validate`)."""
        for f in dataclasses.fields(self):
            section = getattr(self, f.name)
            check_keys(section, f"{f.name}.")
            if isinstance(section, DataConfig):
                section.validate(files)
            else:
                section.validate()
        for name, beam in (
            ("train.eval_beam", self.train.eval_beam),
            ("decode.beam", self.decode.beam),
        ):
            if beam > self.tokenizer.vocab_size:  # a search keeps at most one entry per piece
                vocab = self.tokenizer.vocab_size
                raise ConfigError(f"{name}: {beam} is wider than tokenizer.vocab_size ({vocab})")
        # attn-mt trains a multilingual model on one vocabulary; an imported one (a Tatoeba
        # model: `>>xx<<` labels in its source vocabulary) may have two.
        if files and self.data.language_tags() and not self.tokenizer.joint:
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

    def given(self) -> frozenset[str] | None:
        """The keys its YAML file and --set overrides wrote, dotted (`model.d_model`,
        `data.train`): a run started from a checkpoint (or resumed from its last.pt) takes
        the model, tokenizer and decode keys it leaves out from there (pydantic's
        `model_fields_set`). `config.file.config_from_dict` records them beside the fields,
        not as one, and `dataclasses.replace` drops them: None, every key counts as written."""
        return self.__dict__.get("_given")


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
