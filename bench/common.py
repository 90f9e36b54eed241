"""What every benchmark shares: the machine's name, the matrix-product peak that MFU is
measured against (measured here, and a known GPU's data sheet), the FLOPs of a training step,
a timed window of work and its peak memory.

Timings are ratios measured side by side in one process; an absolute figure goes with the
hardware it was measured on (`hardware_name`).
"""

from __future__ import annotations

import functools
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch import nn

from attn_mt.data.batching import Batch
from attn_mt.decode.packed import PackedLinear
from attn_mt.kernels import packing_available
from attn_mt.model.vocab import PAD_ID

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = ROOT / "configs" / "multi30k_de_en.yaml"
SIZES = {  # --size: model keys over the config's (Vaswani et al.'s transformer-base and -big)
    "config": {},
    "base": {"d_model": 512, "heads": 8, "encoder_layers": 6, "decoder_layers": 6, "d_ff": 2048},
    "big": {"d_model": 1024, "heads": 16, "encoder_layers": 6, "decoder_layers": 6, "d_ff": 4096},
}
# Data-sheet dense peaks in TFLOP/s (no sparsity): (bf16/fp16 tensor cores, fp32 as TF32 where
# the card has it). The first name found in the device's name counts, so longer names first.
SPEC_TFLOPS = {
    "H100 PCIe": (756.0, 378.0),
    "H200": (989.0, 494.0),
    "H100": (989.0, 494.0),
    "B200": (2250.0, 1100.0),
    "A100": (312.0, 156.0),
    "L40S": (362.0, 183.0),
    "L4": (121.0, 60.0),
    "A10": (125.0, 62.5),
    "V100": (125.0, 15.7),  # fp16 only: bf16 is emulated
    "T4": (65.0, 8.1),
}
Result = TypeVar("Result")


def cpu_name() -> str:
    """The CPU's model name (Linux's /proc/cpuinfo), else what `platform` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def hardware_name(device: torch.device) -> str:
    """The GPU's name on CUDA, the CPU's elsewhere: what a timing was measured on."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name()


def spec_peak(hardware: str, precision: str) -> float | None:
    """The data-sheet peak FLOP/s of a known GPU in `precision`, or None."""
    for name, (half, fp32) in SPEC_TFLOPS.items():
        if name in hardware:
            return 1e12 * (fp32 if precision == "fp32" else half)
    return None


def sync(device: torch.device) -> None:
    """Wait for the device (CUDA runs asynchronously; the CPU has nothing to wait for)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_window(run: Callable[[], Result], device: torch.device) -> tuple[float, Result]:
    """Seconds of `run()` and its result, the device synchronised only before and after."""
    sync(device)
    start = time.perf_counter()
    result = run()
    sync(device)
    return time.perf_counter() - start, result


def matmul_peak(dtype: torch.dtype | None, device: torch.device, seconds: float) -> float:
    """FLOP/s of large square matrix products in `dtype` (None: float32): the peak MFU is
    measured against, the best over sizes a training step's products reach (a GPU is far from
    its peak at 2048). On the CPU in float32, the faster of MKL (`a @ b`, what nn.Linear
    runs) and oneDNN with a prepacked weight (what decoding uses where it pays): on some CPUs
    MKL reaches far less than oneDNN, so MKL alone would overstate the MFU
    (docs/performance.md)."""
    dtype = dtype or torch.float32
    sizes = (4096, 8192) if device.type == "cuda" else (1024, 2048)
    products = []
    for n in sizes:
        a = torch.randn(n, n, device=device).to(dtype)
        b = torch.randn(n, n, device=device).to(dtype)
        products.append((n, functools.partial(torch.matmul, a, b)))
        if device.type == "cpu" and dtype == torch.float32 and packing_available():
            layer = nn.Linear(n, n, bias=False)
            layer.weight.data = b.t().contiguous()  # layer(a) = a @ b
            products.append((n, functools.partial(PackedLinear(layer), a)))
    best = 0.0
    for n, product in products:
        four = functools.partial(_repeat, product, 4)
        stop = time.perf_counter() + seconds / len(products)
        while time.perf_counter() < stop:
            best = max(best, 4 * 2 * n**3 / timed_window(four, device)[0])
    return best


def _repeat(run: Callable[[], object], times: int) -> None:
    for _ in range(times):
        run()


def step_flops(model_cfg: Any, vocab: int, batch: Batch) -> float:
    """Matrix-product FLOPs of one training step (forward + backward = 3x forward) of a
    `model:` config over `vocab` on the padded batch, counting what the kernels compute:
    projections, attention, output layer."""
    d, f = model_cfg.d_model, model_cfg.d_ff
    rows, s = batch.src.shape
    t = batch.tgt_in.size(1)
    src_tok, tgt_tok = rows * s, rows * t
    enc = src_tok * (4 * d * d + 2 * d * f) + rows * 2 * s * s * d  # projections, QK^T and AV
    dec = tgt_tok * (4 * d * d + 2 * d * d + 2 * d * f) + rows * 2 * t * t * d  # self + q,o
    dec += src_tok * 2 * d * d + rows * 2 * t * s * d  # cross K, V on the memory; cross scores
    forward = 2 * (model_cfg.encoder_layers * enc + model_cfg.decoder_layers * dec)
    forward += 2 * tgt_tok * d * vocab  # output projection
    return 3.0 * forward


def peak_memory(run: Callable[[], Result], device: torch.device) -> tuple[Result, float | None]:
    """`run()`'s result and the MiB it adds at its peak: CUDA's allocator counter (read on
    the host: no synchronisation), or on Linux the process's high-water mark (VmHWM, reset
    through /proc/self/clear_refs); None where neither can be read."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        result = run()
        return result, (torch.cuda.max_memory_allocated(device) - base) / 2**20
    try:
        Path("/proc/self/clear_refs").write_text("5")
        base = status_kib("VmRSS")
    except OSError:
        return run(), None
    result = run()
    return result, (status_kib("VmHWM") - base) / 1024


def status_kib(field: str) -> int:
    """A KiB figure of this process's /proc/self/status (VmRSS, VmHWM); OSError off Linux."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise OSError(f"no {field} in /proc/self/status")


def padding_share(batches: list[Batch]) -> float:
    """Pad positions / all positions over source and target of `batches`."""
    total = sum(b.src.numel() + b.tgt_out.numel() for b in batches)
    pads = sum(int((b.src == PAD_ID).sum() + (b.tgt_out == PAD_ID).sum()) for b in batches)
    return pads / total


def compiled_graphs() -> int:
    """The graphs torch.compile has made in this process so far (pieces between graph breaks;
    each recompile adds more)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])
