"""`attn_mt.load(PATH)` -> Translator, `attn_mt.load([PATH, PATH])` -> a Translator over the
ensemble: every inference check once (device, precision, quantization, prepacking, `decode=`
overrides, which checkpoints may decode together), so the command line and a notebook meet the
same rules.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from attn_mt.checkpoint import (
    config_differences,
    load_checkpoint,
    model_from,
    tokenizers_from,
)
from attn_mt.config.file import config_from_dict
from attn_mt.config.schema import Config
from attn_mt.decode.packed import pack, packing_pays
from attn_mt.decode.packed import quantize as quantize_model
from attn_mt.decode.translator import Translator
from attn_mt.decode.written import text_rules
from attn_mt.errors import UserError
from attn_mt.model.transformer import Transformer, parameter_count
from attn_mt.paths import resolve_checkpoint
from attn_mt.precision import (
    DTYPES,
    avoid_cudnn_attention,
    resolve_device,
    resolve_precision,
    set_tf32,
)

# The keys checkpoints of one ensemble must share: they translate one language pair.
LANGUAGE_KEYS = ("data.src_lang", "data.tgt_lang")


def load(
    path: str | Path | Sequence[str | Path],
    device: str | torch.device = "auto",
    precision: str = "fp32",
    quantize: str | None = None,
    prepack: bool | str = "auto",
    decode: dict[str, Any] | None = None,
) -> Translator:
    """Load a run folder (its checkpoints/best.pt) or a .pt file as a Translator; a list of them
    as one Translator over the ensemble, which averages the models' log-probabilities at every
    step (they must share the SentencePiece models and language pair; decode settings are the
    first one's).

    Args:
        device: "auto" (CUDA when present), "cpu", "cuda" or "cuda:N".
        precision: "fp32", "bf16" or "fp16" autocast (fp16 on CUDA only), or "auto" (bf16 where
            the device runs it natively).
        quantize: "int8": int8 linear layers on the CPU, computing in float32 otherwise.
        prepack: in float32 on the CPU, the linear layers prepacked for oneDNN (the same
            function; much faster on some CPUs, slower on others): True, False, or "auto"
            (pack where a product timed on this CPU at load runs clearly faster packed).
        decode: decode.* settings over the checkpoint's, e.g. {"beam": 4}, checked as in a
            config file.

    fp32 on CUDA sets torch's TF32 switches (process-wide) as training did: on with the
    (first) checkpoint's `train.tf32`, off with its `train.deterministic`.

    Every check of these arguments is here, so the command line and a notebook meet the same
    rules; they are named as the command-line options that set them.
    """
    device = resolve_device(device) if isinstance(device, str) else device
    dtype = DTYPES[resolve_precision(precision, device, "--precision")]
    if quantize is not None and dtype is not None:
        raise UserError(f"--quantize {quantize} and --precision {precision} exclude each other")
    if prepack not in (True, False, "auto"):
        raise UserError(f"prepack={prepack!r}: must be True, False or 'auto'")
    given = [path] if isinstance(path, (str, Path)) else list(path)
    if not given:
        raise UserError("load: give at least one checkpoint")
    paths = [resolve_checkpoint(p) for p in given]
    states = [load_checkpoint(p) for p in paths]
    for other, state in zip(given[1:], states[1:], strict=True):
        if why := _ensemble_mismatch(states[0], state):
            raise UserError(f"{other} cannot join an ensemble with {given[0]}: {why}")
    built = [model_from(s, p) for s, p in zip(states, given, strict=True)]
    models: list[Transformer] = [m for m, _ in built]
    configs = [c for _, c in built]
    config = with_decode(configs[0], decode)
    if device.type == "cuda":
        avoid_cudnn_attention()  # each decoding step's new shape would cost cuDNN a new plan
        if dtype is None:  # fp32: TF32 as the model trained
            set_tf32(config.train.tf32 and not config.train.deterministic)
    src_tok, tgt_tok = tokenizers_from(states[0], given[0])
    parameters = parameter_count(models[0])  # before int8 or packed layers hold the weights
    if quantize is not None:
        models = [quantize_model(m, quantize, device) for m in models]
    elif dtype is None and device.type == "cpu" and _packs(prepack, models[0]):
        models = [pack(m) for m in models]
    text = text_rules(config, states[0].get("casing"), src_tok, given[0])  # the first's table
    return Translator(
        list(models), config, src_tok, tgt_tok, device, dtype, paths, parameters, text
    )


def _packs(prepack: bool | str, model: Transformer) -> bool:
    """Whether `load` prepacks float32 CPU models: as told, or for "auto" as timed on this CPU
    on a feed-forward block of the model's size (d_model -> d_ff -> d_model)."""
    if prepack != "auto":
        return bool(prepack)
    first_ff = model.decoder_layers[0].ff.w_1
    return packing_pays(first_ff.in_features, first_ff.out_features, torch.get_num_threads())


def with_decode(config: Config, decode: dict[str, Any] | None) -> Config:
    """`config` with the decode.* settings in `decode` over its own, checked as a config file
    is (`{"beam": 0}` fails as `decode.beam: 0 is invalid`)."""
    if not decode:
        return config
    raw = config.to_dict()
    raw["decode"].update(decode)
    return config_from_dict(raw, files=False)


def _ensemble_mismatch(first: dict, other: dict) -> str | None:
    """Why the checkpoint `other` cannot decode together with `first`, or None."""
    if other["tokenizers"] != first["tokenizers"]:
        return "their SentencePiece models differ (an ensemble needs one vocabulary)"
    if keys := config_differences(first["config"], other["config"], LANGUAGE_KEYS):
        return f"they translate different languages ({', '.join(keys)} differ)"
    pairs = [c["config"].get("data", {}).get("pairs") or [] for c in (first, other)]
    if pairs[0] != pairs[1]:  # a checkpoint from before data.pairs has none
        return "they translate different directions (data.pairs differ)"
    return None
