"""Checkpoints: atomic saving, safe loading (`weights_only=True`), rebuilding, averaging.

A checkpoint is a plain dict of tensors and Python data:
    format      "attn-mt/1"
    model       the model's state_dict: the weights that translate, except in last.pt of a run
                with train.ema_decay > 0, where it holds the raw trained weights (for resume)
    ema         (last.pt of a run with train.ema_decay > 0 only) the exponential moving average
                of the weights, which translates; best.pt and step_N.pt hold it as `model`
    config      the resolved config as nested dicts
    step, epoch updates done, and the epoch they are in
    tokenizers  {"src": bytes, "tgt": bytes}: SentencePiece models (the same bytes when joint)
    metrics     the latest validation figures (of the averaged weights when there is an ema)
    train_state (last.pt only) optimizer, scaler, RNG states, data position, early-stop state
so a checkpoint alone is enough to translate (`translation_weights`), and `last.pt` alone is
enough to resume.
"""

from __future__ import annotations

import os
import pickle
import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from attn_mt.config import Config, config_from_dict
from attn_mt.errors import CheckpointError, ConfigError
from attn_mt.model import Transformer, build_model
from attn_mt.tokenizer import Tokenizer

FORMAT = "attn-mt/1"
REQUIRED_KEYS = ("format", "model", "config", "step", "tokenizers")


def make_checkpoint(
    model: Transformer,
    config: Config,
    step: int,
    epoch: int,
    tokenizers: tuple[Tokenizer, Tokenizer],
    metrics: dict[str, float],
) -> dict[str, Any]:
    """A checkpoint that translates on its own (last.pt adds `train_state` to it)."""
    return {
        "format": FORMAT,
        "model": model.state_dict(),
        "config": config.to_dict(),
        "step": step,
        "epoch": epoch,
        "tokenizers": {"src": tokenizers[0].model_bytes, "tgt": tokenizers[1].model_bytes},
        "metrics": metrics,
    }


def resolve_checkpoint(path: str | Path) -> Path:
    """A run folder means its `checkpoints/best.pt`; a file is used as it is."""
    path = Path(path)
    if path.is_dir():
        best = path / "checkpoints" / "best.pt"
        if not best.is_file():
            last = path / "checkpoints" / "last.pt"
            hint = (
                "it stopped before its first validation; resume it with `attn-mt train --resume`"
                if last.is_file()
                else "is it a run folder (train.out_dir)?"
            )
            raise CheckpointError(f"{path}: no checkpoints/best.pt in this folder; {hint}")
        return best
    if not path.is_file():
        raise CheckpointError(f"{path}: checkpoint not found")
    return path


def save_checkpoint(state: dict[str, Any], path: str | Path) -> None:
    """Write `state` to `path` atomically: a temp file in the same folder, fsync, rename.

    A crash or a full disk leaves the previous file at `path` intact. Temp files of earlier
    writes of `path` that a SIGKILL cut short are removed first.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    prefix, suffix = f".{path.name}.", ".tmp"
    for stale in path.parent.iterdir():
        if stale.name.startswith(prefix) and stale.name.endswith(suffix):
            stale.unlink(missing_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=prefix, suffix=suffix)
    try:
        with os.fdopen(fd, "wb") as handle:
            torch.save(state, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except (OSError, RuntimeError) as err:
        # torch.save reports a failed write (a full disk) as a RuntimeError around the OSError.
        cause = err.__context__ if isinstance(err.__context__, OSError) else err
        text = str(cause).strip() or type(cause).__name__
        reason = getattr(cause, "strerror", None) or text.splitlines()[0][:120]
        raise CheckpointError(
            f"{path}: could not write checkpoint ({reason}); the previous checkpoint is intact"
        ) from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Read a checkpoint safely: checksums first, then only tensors and plain data, never code."""
    path = resolve_checkpoint(path)
    try:
        _verify_checksums(path)
        state = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        detail = f" ({first[:120]})" if "Unsupported" in first or "global" in first else ""
        raise CheckpointError(
            f"{path}: refused to load; the file holds objects other than tensors and plain "
            f"data, which could run code{detail}"
        ) from None
    except CheckpointError:
        raise
    except Exception as err:  # a damaged file can fail anywhere in the zip reader or unpickler
        lines = str(err).strip().splitlines() or [""]
        reason = f"{type(err).__name__}: {lines[0]}"[:120].rstrip(": ")
        raise CheckpointError(
            f"{path}: not a readable checkpoint, truncated or corrupt ({reason})"
        ) from None
    if not isinstance(state, dict) or any(key not in state for key in REQUIRED_KEYS):
        raise CheckpointError(
            f"{path}: not an attn-mt checkpoint (missing model/config/tokenizers)"
        )
    if state["format"] != FORMAT:
        raise CheckpointError(f"{path}: checkpoint format {state['format']!r}, expected {FORMAT!r}")
    return state


def _verify_checksums(path: Path) -> None:
    """Check the CRC-32 of every record of a zip checkpoint; torch.load does not, so a flipped
    bit in the weights or the SentencePiece models would otherwise load silently."""
    if not zipfile.is_zipfile(path):
        return  # torch.load says what it is
    with zipfile.ZipFile(path) as archive:
        damaged = archive.testzip()
    if damaged is not None:
        raise CheckpointError(
            f"{path}: corrupt, the record {damaged} fails its checksum; use another checkpoint "
            "(e.g. last.pt, best.pt or a step_N.pt of the run)"
        )


def checkpoint_config(state: dict[str, Any], path: str | Path = "checkpoint") -> Config:
    """The config stored in a checkpoint, validated."""
    try:
        return config_from_dict(state["config"])
    except ConfigError as err:
        raise CheckpointError(f"{path}: its stored config is invalid ({err})") from None


def tokenizers_from(
    state: dict[str, Any], path: str | Path = "checkpoint"
) -> tuple[Tokenizer, Tokenizer]:
    """The (source, target) SentencePiece models embedded in a checkpoint."""
    try:
        src_model, tgt_model = state["tokenizers"]["src"], state["tokenizers"]["tgt"]
        src = Tokenizer(src_model)
        tgt = src if tgt_model == src_model else Tokenizer(tgt_model)
    except (KeyError, TypeError, RuntimeError) as err:
        raise CheckpointError(
            f"{path}: its SentencePiece models are missing or corrupt ({str(err)[:120]})"
        ) from None
    return src, tgt


def translation_weights(state: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The weights a checkpoint translates with: last.pt's `ema` when its run kept one."""
    return state["ema"] if state.get("ema") is not None else state["model"]


def load_weights(
    model: Transformer, weights: dict[str, torch.Tensor], path: str | Path = "checkpoint"
) -> None:
    """Load a state_dict into `model` strictly; tensors that do not fit are a CheckpointError."""
    try:
        model.load_state_dict(weights)
    except RuntimeError as err:
        lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()][1:3]
        raise CheckpointError(
            f"{path}: its tensors do not fit its config ({'; '.join(lines)[:300]})"
        ) from None


def model_from(
    state: dict[str, Any], path: str | Path = "checkpoint"
) -> tuple[Transformer, Config]:
    """Rebuild the model a checkpoint describes, with the weights it translates with."""
    cfg = checkpoint_config(state, path)
    src_tok, tgt_tok = tokenizers_from(state, path)
    model = build_model(cfg, src_tok.vocab_size, tgt_tok.vocab_size)
    load_weights(model, translation_weights(state), path)
    return model, cfg


def config_differences(old: dict[str, Any], new: dict[str, Any], keys: Sequence[str]) -> list[str]:
    """Which of `keys` differ between two plain configs, as dotted names (`model.d_ff`).

    A key is a whole `section` or one `section.key`.
    """
    differ = []
    for key in keys:
        section, _, name = key.partition(".")
        a, b = old.get(section, {}), new.get(section, {})
        names = [name] if name else sorted(a.keys() | b.keys())
        differ += [f"{section}.{n}" for n in names if a.get(n) != b.get(n)]
    return differ


def _average_mismatch(first: dict[str, Any], other: dict[str, Any]) -> str | None:
    """Why `other` cannot be averaged with `first` (a different model or tokenizer), or None."""
    if keys := config_differences(first["config"], other["config"], ["model"]):
        return f"model keys differ: {', '.join(keys)}"
    if other["tokenizers"] != first["tokenizers"]:
        keys = config_differences(first["config"], other["config"], ["tokenizer"])
        return f"tokenizer keys differ: {', '.join(keys)}" if keys else "their tokenizers differ"
    shapes = {k: v.shape for k, v in translation_weights(first).items()}
    if {k: v.shape for k, v in translation_weights(other).items()} != shapes:
        return "their tensors differ in names or shapes"
    return None


def average_checkpoints(paths: list[str | Path]) -> dict[str, Any]:
    """Element-wise mean of the weights that checkpoints of one model translate with; the rest
    from the last."""
    if len(paths) < 2:
        raise CheckpointError("average: give at least two checkpoints")
    states = [load_checkpoint(p) for p in paths]
    for state, path in zip(states[1:], paths[1:], strict=True):
        if why := _average_mismatch(states[0], state):
            raise CheckpointError(f"average: {path} does not match {paths[0]} ({why})")
    weights = [translation_weights(s) for s in states]
    averaged = {}
    for key, tensor in weights[0].items():
        if tensor.is_floating_point():
            stacked = torch.stack([w[key].double() for w in weights])
            averaged[key] = stacked.mean(dim=0).to(tensor.dtype)
        else:
            averaged[key] = tensor
    result = {k: v for k, v in states[-1].items() if k not in ("train_state", "ema")}
    result["model"] = averaged
    result["averaged_from"] = [str(p) for p in paths]
    return result
