"""A training process for tests/test_distributed.py, started by torchrun.

It trains with `attn_mt.train.loop.Trainer` as `attn-mt train` does, records the corpus rows of
every batch this rank takes, and saves what the rank ended with to OUT/rank{RANK}.pt.

    torchrun --nproc_per_node 2 tests/ddp_worker.py CONFIG OUT [--sigterm-at N]

--sigterm-at N: rank 0 sends SIGTERM to torchrun while taking its N-th batch (as a cluster
scheduler would) and waits until torchrun has passed it on, so the run stops after update N.
"""

from __future__ import annotations

import argparse
import gc
import os
import signal
import time
from pathlib import Path

import torch
from torch.nn.parallel import DistributedDataParallel

from attn_mt import distributed
from attn_mt.config.file import load_config
from attn_mt.data.batching import Batch
from attn_mt.decode.translator import Translator
from attn_mt.train import measure as measure_module
from attn_mt.train.loop import Trainer


def record_batches(trainer: Trainer, sigterm_at: int = 0) -> list[tuple[int, list[int]]]:
    """Make `trainer` note the (epoch, corpus rows) of each batch it takes, in a list it returns.

    sigterm_at: on rank 0, send SIGTERM to the parent (torchrun) while taking that batch.
    """
    rows: list[tuple[int, list[int]]] = []
    take = trainer.source.next

    def next_batch() -> Batch:
        batch = take()
        rows.append((trainer.source.epoch, batch.ids))
        if trainer.world.is_main and len(rows) == sigterm_at:
            os.kill(os.getppid(), signal.SIGTERM)
            deadline = time.monotonic() + 20
            while trainer.signals.name is None and time.monotonic() < deadline:
                time.sleep(0.01)
        return batch

    trainer.source.next = next_batch
    return rows


def record_collectives(trainer: Trainer) -> list[str]:
    """Make `trainer` note, in order, each forward pass of its objective ("forward") and each
    `torch.distributed.all_reduce` ("all_reduce", or "all_reduce_async" for one started
    without waiting), in a list it returns."""
    events: list[str] = []
    forward, all_reduce = trainer.objective.forward, torch.distributed.all_reduce

    def noted_forward(*args, **kwargs):
        events.append("forward")
        return forward(*args, **kwargs)

    def noted_all_reduce(*args, **kwargs):
        events.append("all_reduce_async" if kwargs.get("async_op") else "all_reduce")
        return all_reduce(*args, **kwargs)

    trainer.objective.forward = noted_forward
    torch.distributed.all_reduce = noted_all_reduce
    return events


def record_validation_search() -> dict[str, list]:
    """Note how many sentences each `Translator.translate` call of this rank gets ("searched")
    and what the validation search returns on this rank ("sentences" in, "hyps" out)."""
    noted: dict[str, list] = {"searched": [], "sentences": [], "hyps": []}
    translate, shared_search = Translator.translate, measure_module.shared_search

    def counted(self, sentences, *args, **kwargs):
        noted["searched"].append(len(sentences))
        return translate(self, sentences, *args, **kwargs)

    def kept(search, sentences, world):
        hyps = shared_search(search, sentences, world)
        noted["sentences"].append(list(sentences))
        noted["hyps"].append(hyps)
        return hyps

    Translator.translate = counted
    measure_module.shared_search = kept
    return noted


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("config", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--sigterm-at", type=int, default=0)
    args = parser.parse_args()
    # torchrun's SIGTERM may land after `run()` has restored the handlers: keep the dump.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with distributed.process_group(torch.device("cpu")) as (world, device):
        trainer = Trainer(load_config(args.config, []), world, device)
        rows = record_batches(trainer, args.sigterm_at)
        events = record_collectives(trainer)
        search = record_validation_search()
        result = trainer.run()
    # Without a collection: a wrapper alive here kept the process group alive past teardown.
    wrappers = sum(isinstance(o, DistributedDataParallel) for o in gc.get_objects())
    args.out.mkdir(parents=True, exist_ok=True)
    torch.save(
        {
            "step": result.step,
            "stopped_by": result.stopped_by,
            "world_size": trainer.world.size,
            "params": trainer.model.state_dict(),
            "rows": rows,
            "events": events,
            **search,
            "lengths": trainer.corpus.lengths.tolist(),
            "wrappers_after_teardown": wrappers,
        },
        args.out / f"rank{trainer.world.rank}.pt",
    )


if __name__ == "__main__":
    main()
