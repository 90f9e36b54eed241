"""Devices and number formats: which device to run on, which autocast dtype, and the context
that applies it; TF32, deterministic kernels, the CUDA allocator and Inductor's settings.
Training, translation and the benchmarks all ask here, so they agree.
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Any

import torch

from attn_mt.errors import UserError

# train.precision -> the autocast dtype (None: plain float32, no autocast)
DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
# The first CUDA compute capability with bf16 in its tensor cores (Ampere, A100); older cards
# (V100, T4) emulate it, slower than fp16, though `torch.cuda.is_bf16_supported()` says yes.
NATIVE_BF16_CAPABILITY = (8, 0)
# cuBLAS needs a fixed workspace to give the same sums every time (CUDA's reproducibility notes).
CUBLAS_WORKSPACE = ":4096:8"
# Blocks that grow in place instead of a new block per batch shape: less fragmentation when
# every batch has another length (torch's CUDA memory notes).
CUDA_ALLOC_CONF = "expandable_segments:True"
# Inductor's settings for what attn-mt compiles, by device type. CUDA: no mix-order
# reductions, which fuse a layer-norm backward's row sums (the input's gradient) and column
# sums (the weight's and bias's) into one kernel; that kernel was a compiled base step's
# slowest, and in two kernels the step is faster (docs/gpu.md, "What to expect").
INDUCTOR_OPTIONS: dict[str, dict[str, Any]] = {"cuda": {"triton.mix_order_reduction": False}}
MISSING = object()  # what `inductor_setting` gives for a key this torch's Inductor lacks

log = logging.getLogger("attn_mt")


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
        native = torch.cuda.get_device_capability(device) >= NATIVE_BF16_CAPABILITY
        return "bf16" if native else "fp16"
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


def inductor_setting(key: str) -> Any:
    """The current value of Inductor's setting `key` ("triton.persistent_reductions"), or
    MISSING."""
    import torch._inductor.config  # here: Inductor loads only where it is asked for

    value: Any = torch._inductor.config
    for part in key.split("."):
        value = getattr(value, part, MISSING)
        if value is MISSING:
            break
    return value


def has_inductor_setting(key: str) -> bool:
    """Whether this torch's Inductor has the setting `key`."""
    return inductor_setting(key) is not MISSING


def inductor_options(device_type: str) -> dict[str, Any]:
    """INDUCTOR_OPTIONS of `device_type`, for torch.compile's `options`, less any setting this
    torch's Inductor lacks (torch.compile refuses those). Given to each torch.compile, they
    hold for its graphs alone, the lazily compiled backward's too, not the whole process."""
    wanted = INDUCTOR_OPTIONS.get(device_type, {})
    return {key: value for key, value in wanted.items() if has_inductor_setting(key)}


def set_cuda_environment(deterministic: bool = False) -> None:
    """The settings CUDA reads once, when it starts: the allocator's expandable segments
    (unless the user set PYTORCH_CUDA_ALLOC_CONF or PYTORCH_ALLOC_CONF) and, for deterministic
    runs, cuBLAS's workspace (unless set). Call before the first CUDA tensor."""
    if "PYTORCH_CUDA_ALLOC_CONF" not in os.environ and "PYTORCH_ALLOC_CONF" not in os.environ:
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = CUDA_ALLOC_CONF
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)


def configure_kernels(deterministic: bool, tf32: bool) -> None:
    """TF32 for fp32 matrix products and convolutions on CUDA (`tf32` and not `deterministic`);
    with `deterministic`, torch's deterministic algorithms (an op without one is an error) and
    cuDNN's deterministic, unbenchmarked kernels. Set for the whole process."""
    if (
        deterministic
        and torch.cuda.is_initialized()
        and "CUBLAS_WORKSPACE_CONFIG" not in os.environ
    ):
        log.warning(
            "train.deterministic: CUDA started before CUBLAS_WORKSPACE_CONFIG was set; set it "
            "to %s in the environment (attn-mt train does) for bit-exact matrix products",
            CUBLAS_WORKSPACE,
        )
    set_cuda_environment(deterministic)
    set_tf32(tf32 and not deterministic)
    if torch.are_deterministic_algorithms_enabled() != deterministic:  # its import takes seconds
        torch.use_deterministic_algorithms(deterministic)
    torch.backends.cudnn.deterministic = deterministic
    torch.backends.cudnn.benchmark = False
    avoid_cudnn_attention()


def avoid_cudnn_attention() -> None:
    """Keep torch's scaled_dot_product_attention off cuDNN's kernel (flash or memory-efficient
    attention serve instead). cuDNN builds a plan for every new shape it sees, and an NMT batch
    has a new shape at almost every update and every decoding step, so the plans cost far more
    than the kernel saves (docs/gpu.md). Process-wide."""
    torch.backends.cuda.enable_cudnn_sdp(False)


def set_tf32(on: bool) -> None:
    """TF32 tensor cores for fp32 matrix products and convolutions on CUDA, process-wide
    (torch's default is off)."""
    torch.backends.cuda.matmul.allow_tf32 = on
    torch.backends.cudnn.allow_tf32 = on
