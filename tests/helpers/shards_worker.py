"""A process of tests/test_shards.py's torchrun test: `shards_for_run`, then this rank's batches.

    torchrun --nproc_per_node 2 tests/shards_worker.py CONFIG OUT [--machines]

It counts the sentences this process encoded and writes OUT/rank{RANK}.json. --machines: each
process plays the only process of a machine of its own (local rank 0, its own prepared_dir).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from attn_mt import distributed
from attn_mt.config.file import load_config
from attn_mt.data import shardwriter
from attn_mt.data.epochs import ShardBatches
from attn_mt.data.prepare import shards_for_run


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("config", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--machines", action="store_true")
    args = parser.parse_args()
    cfg = load_config(args.config)
    world, _ = distributed.setup(torch.device("cpu"))
    if args.machines:
        world = distributed.World(world.rank, 0, world.size)
        cfg.data.prepared_dir = f"{cfg.data.prepared_dir}/machine{world.rank}"
    encoded: list[int] = []
    encode = shardwriter.encode_chunk
    shardwriter.encode_chunk = lambda task: encoded.append(len(task[2])) or encode(task)
    shards = shards_for_run(cfg, None, world, workers=1)
    source = ShardBatches.from_config(cfg, shards, world)
    batches = [source.next().ids for _ in range(len(source.batches))]
    args.out.mkdir(parents=True, exist_ok=True)
    report = {"encoded": sum(encoded), "folder": str(shards.folder), "digest": shards.digest}
    (args.out / f"rank{world.rank}.json").write_text(json.dumps({**report, "batches": batches}))
    distributed.teardown(world)


if __name__ == "__main__":
    main()
