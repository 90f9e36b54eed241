"""Devices and number formats: which device to run on, which autocast dtype, and the context
that applies it. Training, translation and the benchmarks all ask here, so they agree.
"""

from __future__ import annotations

import contextlib

import torch

from attn_mt.errors import UserError

# train.precision -> the autocast dtype (None: plain float32, no autocast)
DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def resolve_device(name: str = "auto") -> torch.device:
    """'auto' -> CUDA if present else CPU; asking for an absent GPU is a UserError."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise UserError(f"--device {name}: unknown device; use auto, cpu, cuda or cuda:N") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise UserError(f"--device {name}: no CUDA GPU is available here; use --device cpu")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise UserError(
                f"--device {name}: only {torch.cuda.device_count()} CUDA device(s) are visible"
            )
    elif device.type != "cpu":
        raise UserError(f"--device {name}: unsupported device type; use auto, cpu or cuda")
    return device


def resolve_precision(requested: str, device: torch.device, option: str = "train.precision") -> str:
    """'auto' -> bf16 where the device runs it natively, else fp16 (CUDA) or fp32 (CPU); an
    unknown name, or fp16 off CUDA, is a UserError naming `option` (the key or flag that set it)."""
    if requested not in (*DTYPES, "auto"):
        raise UserError(f"{option} {requested}: unknown; use one of fp32, bf16, fp16, auto")
    if requested == "fp16" and device.type != "cuda":
        raise UserError(f"{option} fp16 needs a CUDA GPU; use bf16 or fp32 on the CPU")
    if requested != "auto":
        return requested
    if device.type == "cuda":
        return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    return "bf16" if torch.backends.mkldnn.is_available() and _cpu_has_bf16() else "fp32"


def _cpu_has_bf16() -> bool:
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def autocast_context(device: torch.device, dtype: torch.dtype | None):
    """torch.autocast for bf16/fp16, or a no-op for fp32 (dtype None)."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)
