"""`start_run`: the one way a training run starts, for `attn-mt train`, `attn-mt distill` and a
notebook alike. What can be checked without torch is checked first (the run folder: a run not
overwritten, something to resume), so a mistake is one line within a second; then the CUDA
environment is set (read once, when CUDA starts) and the run is set up and trains
(`setup.train`, where the rest of the set-up reads on in order). This module imports no torch:
the CLI imports it before a mistake is known.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from attn_mt.config.schema import Config
from attn_mt.runfolder import check_run_start, is_locked
from attn_mt.world import world_from_env

if TYPE_CHECKING:  # torch: imported once the run folder is known to be good
    from attn_mt.train.loop import TrainResult
    from attn_mt.train.runlog import Monitor


def start_run(
    cfg: Config, resume: bool = False, device: str = "auto", monitor: Monitor | None = None
) -> TrainResult:
    """Train the run `cfg` describes (a new one, or with `resume` the one in its out_dir), in
    this process or as one rank under torchrun; `monitor` follows it as it goes (a progress
    display: `train.runlog.Monitor`)."""
    # Rank 0 holds the folder (the others would see it being written); a folder a running
    # train holds is left to the lock, whose message names that process.
    if world_from_env().is_main and not is_locked(cfg.train.out_dir):
        check_run_start(cfg.train.out_dir, resume)
    from attn_mt.precision import set_cuda_environment  # torch, from here on

    set_cuda_environment(cfg.train.deterministic)
    from attn_mt.train.setup import train

    return train(cfg, resume=resume, device=device, monitor=monitor)
