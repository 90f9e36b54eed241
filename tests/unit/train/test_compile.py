"""train.compile: one graph for every batch shape; under DDP (two gloo processes on the CPU,
`accumulate: 2`) compiled equal to eager (tests/helpers/compile_worker.py runs both in one
torchrun launch)."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from helpers.toy import toy_config_dict

from attn_mt.train import loop
from attn_mt.train import loss as loss_module

REPO = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent
STEPS = 3


@pytest.fixture
def counted_compile(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, ...]]:
    """torch.compile with a backend that runs the captured graph as it is and notes the input
    shapes of each graph it is given; Dynamo's caches are emptied before and after."""
    graphs: list[tuple[int, ...]] = []

    def backend(graph: torch.fx.GraphModule, inputs: list) -> object:
        graphs.append(tuple(tuple(x.shape) for x in inputs if isinstance(x, torch.Tensor)))
        return graph.forward

    torch._dynamo.reset()
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend=backend))
    yield graphs
    torch._dynamo.reset()


def test_compiled_training_compiles_once_over_batch_shapes(
    toy_config, monkeypatch, scripted_validation, counted_compile
) -> None:
    """Every batch has other rows and lengths; the compiled model is captured once for all."""
    shapes = set()
    loss = loss_module.projected_loss

    def noted(hidden, *args, **kwargs):
        shapes.add(tuple(hidden.shape[:2]))  # (B, T)
        return loss(hidden, *args, **kwargs)

    monkeypatch.setattr(loss_module, "projected_loss", noted)
    scripted_validation()
    trainer = loop.Trainer(toy_config(compile=True, max_steps=6, batch_tokens=256, warmup=1))
    assert trainer.run().step == 6
    assert len(shapes) >= 3, shapes
    assert len(counted_compile) == 1, counted_compile


def write_config(toy_data: dict[str, Path], folder: Path, name: str, compile: bool) -> Path:
    raw = toy_config_dict(
        toy_data,
        folder / name,
        compile=compile,
        accumulate=2,
        max_steps=STEPS,
        batch_tokens=256,
        warmup=1,
        eval_every=1000,
        valid_max_sentences=4,
        threads=1,
    )
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_compiled_ddp_with_accumulation_equals_eager(toy_data, tmp_path: Path) -> None:
    configs = [write_config(toy_data, tmp_path, n, n == "compiled") for n in ("eager", "compiled")]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    worker = REPO / "tests" / "helpers" / "compile_worker.py"
    proc = subprocess.run(
        [str(BIN / "torchrun"), "--standalone", "--nproc_per_node=2", str(worker)]
        + [*map(str, configs), str(tmp_path)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-6000:]
    for rank in (0, 1):
        eager, compiled = (
            torch.load(tmp_path / f"{name}-rank{rank}.pt", weights_only=True)
            for name in ("eager", "compiled")
        )
        assert (eager["step"], compiled["step"]) == (STEPS, STEPS)
        assert (eager["compiled"], compiled["compiled"]) == (False, True)
        # One no_sync per update (the first of its two batches), reached through the wrapper.
        assert eager["no_sync"] == compiled["no_sync"] == STEPS
        for key, weight in eager["params"].items():
            torch.testing.assert_close(compiled["params"][key], weight, rtol=1e-4, atol=1e-5)
