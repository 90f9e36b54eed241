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
    casing      (from runs that wrote one) each source language's casing table, plain data
                (`attn_mt.text.casing`; `decode.recase` reads it)
    train_state (last.pt only) optimizer, scaler, RNG states, data position, early-stop state
so a checkpoint alone is enough to translate (`translation_weights`), and `last.pt` alone is
enough to resume.
"""

from __future__ import annotations

import pickle
import pickletools
import re
import threading
import warnings
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from attn_mt.config.file import config_from_dict
from attn_mt.config.schema import Config
from attn_mt.data.tokenizer import Tokenizer
from attn_mt.errors import CheckpointError, ConfigError
from attn_mt.fileio import atomic_write, os_reason
from attn_mt.model.transformer import Transformer, build_model
from attn_mt.paths import resolve_checkpoint

FORMAT = "attn-mt/1"
REQUIRED_KEYS = ("format", "model", "config", "step", "tokenizers")


def make_checkpoint(
    model: Transformer,
    config: Config,
    step: int,
    epoch: int,
    tokenizers: tuple[Tokenizer, Tokenizer],
    metrics: dict[str, float],
    casing: dict[str, Any] | None = None,
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
        **({"casing": casing} if casing is not None else {}),
    }


class WriteAbandoned(Exception):
    """A checkpoint write given up before its rename (`save_checkpoint`'s `abandon`)."""


def save_checkpoint(
    state: dict[str, Any], path: str | Path, abandon: threading.Event | None = None
) -> None:
    """Write `state` to `path` atomically (see `paths.atomic_write`).

    A crash or a full disk leaves the previous file at `path` intact. If `abandon` is set by
    the time the file is written, its temp file is removed instead of renamed into place and
    `WriteAbandoned` is raised.
    """
    path = Path(path)
    try:
        with atomic_write(path) as handle:
            torch.save(state, handle)
            if abandon is not None and abandon.is_set():
                raise WriteAbandoned(path)
    except (OSError, RuntimeError) as err:
        # torch.save reports a failed write (a full disk) as a RuntimeError around the OSError.
        cause = err.__context__ if isinstance(err.__context__, OSError) else err
        text = str(cause).strip() or type(cause).__name__
        reason = getattr(cause, "strerror", None) or text.splitlines()[0][:120]
        raise CheckpointError(
            f"{path}: could not write checkpoint ({reason}); the previous checkpoint is intact"
        ) from None


def load_checkpoint(
    path: str | Path, map_location: str | torch.device = "cpu", mapped: bool = False
) -> dict[str, Any]:
    """Read a checkpoint safely: checksums first, then only tensors and plain data, never code.
    `mapped`: what a checkpoint says of itself (config, step, metrics, tokenizers) without
    reading its tensors, which are memory-mapped (`info` of a last.pt with its optimizer
    state); the checksums, which would read the whole file, are not verified then."""
    path = resolve_checkpoint(path)
    try:
        if not mapped:
            _verify_checksums(path)
        with warnings.catch_warnings():  # torch warns about pickle protocols of foreign files
            warnings.simplefilter("ignore")
            state = torch.load(path, map_location=map_location, weights_only=True, mmap=mapped)
    except CheckpointError:
        raise
    except OSError as err:
        raise CheckpointError(f"{path}: cannot read the checkpoint ({os_reason(err)})") from None
    except pickle.UnpicklingError as err:
        unsafe = re.search(r"Unsupported global: GLOBAL (\S+)", str(err))
        calls = unsafe.group(1) if unsafe else _pickle_global(path)
        if calls is None:
            raise CheckpointError(f"{path}: not a checkpoint; {_describe(path)}") from None
        raise CheckpointError(
            f"{path}: refused to load; the file holds objects other than tensors and plain "
            f"data, which could run code (it refers to {calls})"
        ) from None
    except Exception as err:  # a damaged file can fail anywhere in the zip reader or unpickler
        if not _starts_with(path, b"PK") or _foreign_zip(path):
            raise CheckpointError(f"{path}: not a checkpoint; {_describe(path)}") from None
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


def _starts_with(path: Path, magic: bytes) -> bool:
    with open(path, "rb") as handle:
        return handle.read(len(magic)) == magic


def _foreign_zip(path: Path) -> bool:
    """A whole zip archive that torch.save did not write (it has no data.pkl record)."""
    if not zipfile.is_zipfile(path):
        return False
    with zipfile.ZipFile(path) as archive:
        return not any(name.endswith("/data.pkl") for name in archive.namelist())


def _describe(path: Path) -> str:
    """What a file that is not a checkpoint holds instead, from its first bytes."""
    with open(path, "rb") as handle:
        head = handle.read(4096)
    if _foreign_zip(path):
        return "it is a zip archive that torch.save did not write"
    if not head:
        return "the file is empty"
    if head.startswith(b"\x1f\x8b"):
        return "it holds gzip-compressed data"
    if head.startswith(b"\x80"):
        return "it is a plain pickle, not a file written by torch.save"
    try:
        head.decode("utf-8")
    except UnicodeDecodeError:
        return "its content is not a PyTorch file (attn-mt checkpoints are zip archives)"
    return "it is a text file"


def _pickle_global(path: Path) -> str | None:
    """The first importable name a whole (non-zip) pickle file refers to, read without
    unpickling it; None for a pickle of plain data or a file that is no pickle at all."""
    if zipfile.is_zipfile(path):
        return None
    strings: list[str] = []
    found = None
    try:
        with open(path, "rb") as handle:
            for opcode, arg, _ in pickletools.genops(handle):
                if opcode.name in ("GLOBAL", "INST") and found is None:
                    found = str(arg).replace(" ", ".")
                elif opcode.name == "STACK_GLOBAL" and found is None and len(strings) >= 2:
                    found = ".".join(strings[-2:])
                elif isinstance(arg, str):
                    strings.append(arg)
    except Exception:  # not a pickle (text that happens to start like one), or a damaged one
        return None
    return found


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
        # A run's config named its training files; an imported model's names none.
        return config_from_dict(state["config"], files="imported" not in state)
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
    except (RuntimeError, TypeError, AttributeError) as err:  # wrong shapes, or not a dict
        lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
        raise CheckpointError(
            f"{path}: its tensors do not fit its config ({'; '.join(lines[1:3] or lines)[:300]})"
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


def average_checkpoints(paths: Sequence[str | Path]) -> dict[str, Any]:
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
