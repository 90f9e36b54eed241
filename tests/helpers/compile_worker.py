"""A training process for tests/unit/train/test_compile.py, started by torchrun: two runs in
one process group, eager then with train.compile, each rank's weights saved to OUT/RUN-rankR.pt.

    torchrun --nproc_per_node 2 tests/helpers/compile_worker.py EAGER.yaml COMPILED.yaml OUT

The compiled run uses torch.compile's "aot_eager" backend: Dynamo's capture through DDP (its
graph breaks at the gradient buckets), AOTAutograd's backward and `no_sync` through the
compiled wrapper, without Inductor's C++ code generation, which takes minutes on a small CPU.
Each run counts the `no_sync` calls it made.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import torch
from torch.nn.parallel import DistributedDataParallel

from attn_mt import distributed
from attn_mt.config.file import load_config
from attn_mt.train import speed
from attn_mt.train.setup import setup


def main() -> None:
    eager, compiled, out = map(Path, sys.argv[1:4])
    torch.compile = functools.partial(torch.compile, backend="aot_eager")
    no_sync = DistributedDataParallel.no_sync
    calls = []

    def counted(self):
        calls.append(1)
        return no_sync(self)

    DistributedDataParallel.no_sync = counted
    trained_with = []  # the module each run's updates ran (the run lets it go as it ends)
    choose = speed.choose_compiled

    def noted(*args):
        forward = choose(*args)
        trained_with.append(forward.module)
        return forward

    speed.choose_compiled = noted
    with distributed.process_group(torch.device("cpu")) as (world, device):
        for name, config in (("eager", eager), ("compiled", compiled)):
            calls.clear()
            trainer = setup(load_config(config, []), world, device)
            result = trainer.run()
            compiled_module = isinstance(trained_with.pop(), torch._dynamo.OptimizedModule)
            torch.save(
                {
                    "step": result.step,
                    "params": trainer.model.state_dict(),
                    "no_sync": len(calls),
                    "compiled": compiled_module,
                },
                out / f"{name}-rank{world.rank}.pt",
            )


if __name__ == "__main__":
    main()
