"""The environment torch's CPU libraries read once, which the `attn-mt` command sets where it
starts, before torch loads (`import attn_mt` leaves the environment alone: a library user sets
these before Python starts). A value the user set is kept.

- `THP_MEM_ALLOC_ENABLE=1`: large CPU tensors on transparent huge pages; without it every fresh
  activation or logits buffer is page-faulted in 4 KiB at a time.
- `ONEDNN_PRIMITIVE_CACHE_CAPACITY` and `LRU_CACHE_CAPACITY` (ideep's cache, in front of
  oneDNN's): each keeps a kernel per matrix-product shape, with memory of its own. The token
  counts of length-bucketed batches change at every update, and a validation's search makes
  hundreds of shapes, so at the libraries' own capacity (1,024 each) a training run's memory
  grew with every new shape and its heap fragmented around the long-lived entries (figures:
  docs/performance.md, "Training memory"). KERNEL_CACHE still holds the products of one
  update of the default model, forward and backward, which reuse them.
- `OMP_WAIT_POLICY=PASSIVE`: a thread of torch's OpenMP pool (which MKL and oneDNN share) that
  reaches a barrier first sleeps instead of spinning. By default libgomp spins some 300,000
  times before it sleeps: on an idle machine that saves a wake-up per operation, but beside
  other busy processes the spinning thread burns the CPU time its partner needs to reach the
  barrier, and each of a search's thousands of small operations waits for a thread the
  kernel has set aside. Beside other CPU-bound processes a search slowed many times more
  than the CPU share it lost with the spinning default, far less with passive waits (side by
  side: docs/performance.md, "A busy machine"). Intel's OpenMP reads the same variable.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

KERNEL_CACHE = 128  # kernels per cache
DEFAULTS = {
    "THP_MEM_ALLOC_ENABLE": "1",
    "ONEDNN_PRIMITIVE_CACHE_CAPACITY": str(KERNEL_CACHE),
    "LRU_CACHE_CAPACITY": str(KERNEL_CACHE),
    "OMP_WAIT_POLICY": "PASSIVE",
}


def set_cpu_environment(environ: MutableMapping[str, str] = os.environ) -> None:
    """Set each of DEFAULTS in `environ` that is not set there already."""
    for name, value in DEFAULTS.items():
        environ.setdefault(name, value)
