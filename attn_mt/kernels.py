"""Which CPU kernels multiply a float32 linear layer: MKL (`nn.Linear`) or oneDNN
(`torch.ops.mkldnn._linear_pointwise`). Training (`train/onednn.py`) and decoding
(`decode/packed.py`) each ask once per process, by timing both on this CPU, and both ask
the one rule here, so they agree on what "oneDNN pays" means.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable

import torch
from torch import nn

# oneDNN is chosen where its best round takes < 90% of MKL's: a clear win, not timing noise on
# a shared machine. The measured cases keep their answer at this margin: the layers of a
# training step took 0.76 of MKL's time on the AVX-512 EPYC (chosen) and 0.96 held to AVX2
# (not chosen at 0.95 either); docs/performance.md.
ONEDNN_GAIN = 0.9
ROUNDS = 5  # interleaved rounds, after one warm-up call of each


@functools.cache
def packing_available() -> bool:
    """Whether this torch build and CPU run oneDNN's linear product, on a weight reordered
    into its layout (tried once on a small layer, the caller's random stream untouched: a
    training run asks between its seed and its updates)."""
    try:
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            layer, x = nn.Linear(8, 4), torch.randn(3, 8)
            packed = torch.ops.mkldnn._reorder_linear_weight(layer.weight, None)
            product = torch.ops.mkldnn._linear_pointwise(x, packed, layer.bias, "none", [], "")
            return torch.allclose(product, layer(x), atol=1e-5)
    except (AttributeError, RuntimeError, NotImplementedError):
        return False


def onednn_wins(mkl: Callable[[], object], onednn: Callable[[], object], calls: int = 1) -> bool:
    """Whether `onednn` runs clearly faster than `mkl` (the same work through each) on this
    CPU: each called once to warm up (oneDNN builds its kernels, MKL its buffers), then ROUNDS
    interleaved rounds of `calls` calls each (a few for a product too small to time alone);
    oneDNN wins where its best round takes < ONEDNN_GAIN of MKL's."""
    best = {mkl: float("inf"), onednn: float("inf")}
    for work in best:
        work()
    for _ in range(ROUNDS):
        for work in best:
            start = time.perf_counter()
            for _ in range(calls):
                work()
            best[work] = min(best[work], time.perf_counter() - start)
    return best[onednn] < ONEDNN_GAIN * best[mkl]
