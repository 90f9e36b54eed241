"""A training process for tests/e2e/test_distributed.py, started by torchrun.

It trains with `attn_mt.train.loop.Trainer` as `attn-mt train` does, records the corpus rows of
every batch this rank takes, and saves what the rank ended with to OUT/rank{RANK}.pt.

    torchrun --nproc_per_node 2 tests/helpers/ddp_worker.py CONFIG OUT [--sigterm-at N]

--sigterm-at N: rank 0 sends SIGTERM to torchrun while taking its N-th batch (as a cluster
scheduler would) and waits until torchrun has passed it on, so the run stops after update N.

    torchrun --nproc_per_node 2 tests/helpers/ddp_worker.py --commands COMMANDS.json

--commands: each `attn-mt` command of the JSON list (each a list of arguments) in turn, run as
`python -m attn_mt` runs it (`attn_mt.cli.main`), in one launch: torch is imported and the
processes start once for all the commands, each of which sets up its own process group (at a
store of its own). Before each command, rank 0 writes `COMMAND_MARK` and its index on a line
of stderr.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import signal
import socket
import sys
import time
from pathlib import Path
from unittest import mock

import torch
from torch.nn.parallel import DistributedDataParallel

from attn_mt import distributed
from attn_mt.cli import main as attn_mt_main
from attn_mt.config.file import load_config
from attn_mt.data.batching import Batch
from attn_mt.decode.translator import Translator
from attn_mt.train import measure as measure_module
from attn_mt.train.loop import Trainer
from attn_mt.train.setup import setup

COMMAND_MARK = "ddp_worker: command"  # then its index in the list


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


def run_commands(path: Path) -> None:
    """Run each `attn-mt` command listed in the JSON file `path`, in order, as `attn-mt` would;
    a command that fails ends the process as it would end `attn-mt`.

    Each command's process group meets at a store of its own, as a launch of its own would:
    rank 0 serves it on a free port, which it posts in torchrun's store for the others. At
    torchrun's store, a group would find the keys of the one before (their names start again
    from the same count), and a rank would connect to an address its peer has left."""
    rank = int(os.environ["RANK"])
    agent = torch.distributed.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False
    )
    for index, args in enumerate(json.loads(path.read_text())):
        if rank == 0:
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", 0))
                agent.set(f"ddp_worker/{index}", str(probe.getsockname()[1]))
            print(f"{COMMAND_MARK} {index}", file=sys.stderr, flush=True)
        port = agent.get(f"ddp_worker/{index}").decode()
        own_store = {"MASTER_PORT": port, "TORCHELASTIC_USE_AGENT_STORE": "False"}
        with (
            mock.patch.dict(os.environ, own_store),
            mock.patch.object(sys, "argv", ["attn-mt", *args]),
        ):
            attn_mt_main()


def main() -> None:
    if sys.argv[1:2] == ["--commands"]:
        run_commands(Path(sys.argv[2]))
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("config", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--sigterm-at", type=int, default=0)
    args = parser.parse_args()
    # torchrun's SIGTERM may land after `run()` has restored the handlers: keep the dump.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with distributed.process_group(torch.device("cpu")) as (world, device):
        trainer = setup(load_config(args.config, []), world, device)
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
