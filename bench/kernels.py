"""The kernels behind a slow compiled step on CUDA, one at a time (docs/gpu.md).

`attention`: torch's fused attention at the WMT shape (bf16, 8 heads of 64, ~25,600 tokens a
batch: rows = tokens / length), forward and backward, per kernel: flash against
memory-efficient for causal self-attention, and memory-efficient with a key-padding mask.
`layernorm`: six post-norm residual blocks as the WMT presets have them, LN(x +
dropout(linear(x))) with a float32 residual under bf16 autocast (as attn-mt's layers run),
forward and backward, eagerly and through torch.compile with dynamic or static shapes;
without Inductor's mix-order reductions (which fuse the rows' and the columns' sums of the
layer-norm backward into one kernel), without persistent reductions, with coordinate-descent
tuning; with the mix-order split size tuned, or several pipeline stages allowed or held to
one: ms per pass and the device time of the layer-norm backward kernels (a large share of a
compiled base step's: docs/gpu.md).
The most telling variants come first, since each compiles. A variant this torch's Inductor
has no setting for is named with its unknown settings and skipped.

    python scripts/bench_kernels.py                      # both, on CUDA
    python scripts/bench_kernels.py --only attention

Each result is one line as it comes (`result {"name": ..., ...}`); the last line is one JSON
object with them all.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from attn_mt.precision import avoid_cudnn_attention, has_inductor_setting
from bench.common import timed_window

TOKENS = 25_600
HEADS, HEAD_DIM, D_MODEL = 8, 64, 512


def timed_ms(run, passes: int = 20, warmup: int = 3) -> float:
    """Milliseconds per `run()`, the device synchronised at the window's edges only."""
    for _ in range(warmup):
        run()
    seconds, _ = timed_window(lambda: [run() for _ in range(passes)], torch.device("cuda"))
    return 1e3 * seconds / passes


def kernel_ms(run, word: str) -> dict:
    """Device milliseconds of one `run()`: all kernels, and those whose name holds `word`."""
    run()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    total, matched, names = 0.0, 0.0, set()
    for event in prof.profiler.kineto_results.events():
        if event.is_user_annotation() or event.device_type() != torch.autograd.DeviceType.CUDA:
            continue
        total += event.duration_ns() / 1e6
        if word in event.name():
            matched += event.duration_ns() / 1e6
            names.add(event.name()[:100])
    return {"device_ms": total, f"{word}_ms": matched, "kernels": sorted(names)[:4]}


def attention(lengths: list[int]) -> dict:
    """ms per forward and backward of each kernel choice, per sequence length."""
    results = {}
    choices = {
        "causal flash": (SDPBackend.FLASH_ATTENTION, "causal"),
        "causal efficient": (SDPBackend.EFFICIENT_ATTENTION, "causal"),
        "masked efficient": (SDPBackend.EFFICIENT_ATTENTION, "mask"),
        "no mask flash": (SDPBackend.FLASH_ATTENTION, None),
        "no mask efficient": (SDPBackend.EFFICIENT_ATTENTION, None),
    }
    for length in lengths:
        rows = TOKENS // length
        shape = (rows, HEADS, length, HEAD_DIM)
        q, k, v = (
            torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            for _ in range(3)
        )
        grad = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
        kept = torch.randint(length // 2, length + 1, (rows,), device="cuda")
        mask = (torch.arange(length, device="cuda") < kept[:, None])[:, None, None, :]
        for name, (backend, rule) in choices.items():
            kwargs: dict[str, Any] = {"is_causal": True} if rule == "causal" else {}
            if rule == "mask":
                kwargs["attn_mask"] = mask  # (B, 1, 1, S), True = attend

            def run(backend=backend, kwargs=kwargs, qkv=(q, k, v), grad=grad) -> None:
                with sdpa_kernel(backend):
                    out = F.scaled_dot_product_attention(*qkv, **kwargs)
                out.backward(grad)

            try:
                figure: object = timed_ms(run)
            except RuntimeError as err:  # a kernel that refuses the shape
                figure = f"failed: {str(err).splitlines()[0][:100]}"
            key = f"attention T={length} B={rows} {name}"
            results[key] = figure
            print("result", json.dumps({"name": key, "ms": figure}), flush=True)
            q.grad = k.grad = v.grad = None
    return results


class Block(nn.Module):
    """LN(x + dropout(linear(x))): a post-norm sub-layer, a stand-in for the sub-layer."""

    def __init__(self) -> None:
        super().__init__()
        self.norm, self.linear = nn.LayerNorm(D_MODEL), nn.Linear(D_MODEL, D_MODEL)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x + F.dropout(self.linear(x), 0.1, training=True))


LAYERNORM_VARIANTS = {  # name: (torch.compile's dynamic, or None for eager; Inductor settings)
    "eager": (None, {}),
    "compiled dynamic": (True, {}),
    # Inductor may fuse the rows' reduction (the input's gradient) with the columns' (the
    # weight's and bias's) into one "mix-order" kernel; turning it off says whether the slow
    # kernel is one. Its pipeline stages come last (docs/gpu.md: they changed nothing).
    "compiled dynamic, no mix-order reduction": (True, {"triton.mix_order_reduction": False}),
    "compiled dynamic, no persistent reductions": (True, {"triton.persistent_reductions": False}),
    "compiled dynamic, coordinate-descent tuning": (True, {"coordinate_descent_tuning": True}),
    "compiled static": (False, {}),
    "compiled dynamic, mix-order split size tuned": (
        True,
        {"triton.mix_order_reduction_autotune_split_size": True},
    ),
    "compiled dynamic, mix-order multi-stage": (
        True,
        {"triton.mix_order_reduction_allow_multi_stages": True},
    ),
    "compiled dynamic, mix-order one stage": (
        True,
        {"triton.mix_order_reduction_allow_multi_stages": False},
    ),
}


def layernorm(length: int) -> dict:
    """ms per forward and backward of six blocks, and their layer-norm backward kernels."""
    results = {}
    blocks = nn.Sequential(*[Block() for _ in range(6)]).cuda()
    for name, (dynamic, settings) in LAYERNORM_VARIANTS.items():
        unknown = [key for key in settings if not has_inductor_setting(key)]
        if unknown:  # an older torch's Inductor
            print("result", json.dumps({"name": f"layernorm {name}", "unknown": unknown}))
            continue
        torch._dynamo.reset()
        x = torch.randn(TOKENS // length, length, D_MODEL, device="cuda", requires_grad=True)
        module = blocks if dynamic is None else torch.compile(blocks, dynamic=dynamic)
        if dynamic:
            torch._dynamo.mark_dynamic(x, 0)
            torch._dynamo.mark_dynamic(x, 1)

        def run(module=module, x=x) -> None:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                out = module(x)
            out.float().sum().backward()

        start = time.perf_counter()
        with torch._inductor.config.patch(settings):  # compiles (forward, backward) here
            run()
            torch.cuda.synchronize()
            first = time.perf_counter() - start
            row = {"ms": timed_ms(run), "first_pass_s": first}
            row |= kernel_ms(run, "layer_norm_backward")
        results[f"layernorm {name}"] = row
        print("result", json.dumps({"name": f"layernorm {name}", **row}), flush=True)
    return results


def main(argv: list[str] | None = None) -> None:
    """Parse the options and time the kernels they name (CUDA only)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=("attention", "layernorm"), default=None)
    parser.add_argument("--lengths", type=int, nargs="+", default=[28, 56, 112],
                        help="sequence lengths of the attention turns")  # fmt: skip
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("needs CUDA (the kernels compared are CUDA's)")
    avoid_cudnn_attention()  # as attn-mt runs
    report = {"hardware": torch.cuda.get_device_name(), "torch": torch.__version__}
    print(f"{report['hardware']}, torch {report['torch']}", flush=True)
    if args.only in (None, "attention"):
        report |= attention(args.lengths)
    if args.only in (None, "layernorm"):
        report |= layernorm(28)
    print(json.dumps(report))
