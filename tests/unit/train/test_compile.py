"""train.compile: one graph for every batch shape; `auto` picks by timing without changing what
is trained; a failing compiler means one warning and eager training; under DDP (two gloo
processes on the CPU, `accumulate: 2`) compiled equal to eager (tests/helpers/compile_worker.py
runs both in one torchrun launch)."""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from helpers.toy import toy_config_dict

from attn_mt import distributed
from attn_mt.config.file import config_from_dict
from attn_mt.config.schema import Config
from attn_mt.model import loss as loss_module
from attn_mt.train import loop, speed
from attn_mt.train.setup import setup

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
    trainer = setup(toy_config(compile=True, max_steps=6, batch_tokens=256, warmup=1))
    assert trainer.run().step == 6
    assert len(shapes) >= 3, shapes
    assert len(counted_compile) == 2, counted_compile  # the model's, the loss chunk's (`fuse`)


def test_bucketed_shapes_recompile_at_most_twice(toy_config, scripted_validation) -> None:
    """Over a run's many bucketed batch shapes, Dynamo's own counters see at most two graphs
    of the model (one for the first shape, one dynamic) and as few recompiles, and one of the
    loss chunk (`SmoothedObjective.fuse`, dynamic from the start)."""
    counters = torch._dynamo.utils.counters
    torch._dynamo.reset()
    counters.clear()
    scripted_validation()
    cfg = toy_config(compile="true", max_steps=12, batch_tokens=200, warmup=1)
    trainer = setup(cfg)
    seen = set()
    rows = trainer.source.batches[:12]
    for r in rows:
        lengths = trainer.source.shards.lengths[r].max(axis=0)
        seen.add((len(r), *lengths.tolist()))
    torch.compile = functools.partial(torch.compile, backend="eager")  # restored below
    try:
        assert trainer.run().step == 12
    finally:
        torch.compile = torch.compile.func
        torch._dynamo.reset()
    assert len(seen) >= 8, seen  # the run met many (rows, source, target) shapes
    assert counters["stats"]["unique_graphs"] <= 3, dict(counters["stats"])
    assert sum(counters["recompiles"].values()) <= 2, dict(counters["recompiles"])


def slower(monkeypatch: pytest.MonkeyPatch, which: str) -> list[str]:
    """Make `speed.timed_passes` report `which` mode ("eager" or "compiled") far slower (1000 s),
    after really running it; returns the modes timed, in order."""
    timed = speed.timed_passes
    modes: list[str] = []

    def rigged(forward, *args):
        took = timed(forward, *args)
        compiled = isinstance(forward.module, torch._dynamo.OptimizedModule)
        mode = "compiled" if compiled else "eager"
        modes.append(mode)
        return took + (1e6 if mode == which else 0.0)

    monkeypatch.setattr(speed, "timed_passes", rigged)
    return modes


def with_dropout(toy_data: dict[str, Path], out_dir: Path, **train) -> Config:
    """The toy config with attention dropout on, so that a timing which drew random numbers
    would show. (Not `model.dropout`: the CPU's own 16-bit draw is a graph break, and tracing
    the dozens of graphs between them took most of this test's time.)"""
    raw = toy_config_dict(toy_data, out_dir, **train)
    raw["model"]["attention_dropout"] = 0.1
    return config_from_dict(raw)


def trained(cfg: Config) -> tuple[loop.Trainer, str]:
    trainer = setup(cfg)
    trainer.run()
    return trainer, (Path(cfg.train.out_dir) / "train.log").read_text()


@pytest.mark.parametrize("slow", ["compiled", "eager"])
def test_auto_keeps_the_faster_and_trains_as_if_asked(
    toy_data, monkeypatch, scripted_validation, counted_compile, slow, tmp_path
) -> None:
    """`auto` times both modes on real batches (forward and backward, dropout on), then trains
    bit for bit as the run that asked for the chosen mode outright."""
    scripted_validation()
    chosen = "eager" if slow == "compiled" else "compiled"
    modes = slower(monkeypatch, slow)
    common = dict(max_steps=2, batch_tokens=256, warmup=1, accumulate=2)
    auto, log = trained(with_dropout(toy_data, tmp_path / "auto", compile="auto", **common))
    assert modes == ["compiled", "eager", "compiled"]  # the compiling call, then one each
    assert auto.progress.compiled == chosen
    assert f"train.compile auto: {chosen} (measured; " in log
    assert "ms/update eager" in log and "ms/update compiled" in log
    asked = "false" if chosen == "eager" else "true"
    monkeypatch.undo()
    scripted_validation()
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="eager"))
    plain, _ = trained(with_dropout(toy_data, tmp_path / "asked", compile=asked, **common))
    for (name, a), (_, b) in zip(
        auto.model.state_dict().items(), plain.model.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), name


def test_failing_compiler_trains_eagerly_with_one_warning(
    toy_config, monkeypatch, scripted_validation, caplog
) -> None:
    def broken(graph, inputs):
        raise RuntimeError("no C++ compiler found")

    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend=broken))
    scripted_validation()
    trained_with = []  # the module the updates ran (the run lets it go as it ends)
    choose = speed.choose_compiled

    def noted(*args):
        forward = choose(*args)
        trained_with.append(forward.module)
        return forward

    monkeypatch.setattr(speed, "choose_compiled", noted)
    torch._dynamo.reset()
    try:
        trainer, log = trained(toy_config(compile="true", max_steps=2, batch_tokens=256))
    finally:
        torch._dynamo.reset()
    assert trainer.progress.compiled == "eager"
    assert len(trained_with) == 1
    assert not isinstance(trained_with[0], torch._dynamo.OptimizedModule)
    warnings = [line for line in log.splitlines() if "torch.compile failed" in line]
    assert len(warnings) == 1 and "training eagerly" in warnings[0], warnings
    assert "train.compile true: eager (failed)" in log


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
    # Neither DDP's setting nor Dynamo's trace through DDP's forward prints a warning (torch
    # 2.13 deprecated `broadcast_buffers`; Dynamo notes the profiler range DDP's forward opens).
    noted = re.findall(r".*(?:Warning|Profiler record function).*", proc.stderr)
    assert not noted, proc.stderr[-6000:]
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


class FusedLinear(torch.nn.Linear):
    """An objective's stand-in: notes whether `SmoothedObjective.fuse` was last turned on."""

    fused = False

    def fuse(self, on: bool) -> None:
        self.fused = on


@pytest.mark.parametrize(
    "setting, recorded, mode, why, compiles, timings",
    [
        ("auto", "eager", "eager", "resumed", 0, 0),  # as the run began: no compile, no timing
        ("auto", "compiled", "compiled", "resumed", 1, 1),  # compiled, tried once, not timed
        ("auto", "", "eager", "measured", 1, 3),  # the trial, then one timing each way
        ("true", "eager", "compiled", "asked", 1, 1),  # asked outright: obeyed on resume
        ("false", "compiled", "eager", "asked", 0, 0),
    ],
)
def test_choice_follows_the_setting_and_what_the_run_recorded(
    monkeypatch, setting, recorded, mode, why, compiles, timings
) -> None:
    compiled_modules, timed, options = [], [], []

    def fake_compile(module, **kwargs):
        compiled_modules.append(torch.nn.Sequential(module))
        options.append(kwargs["options"])
        return compiled_modules[-1]

    def fake_timed(forward, batches, updates):
        timed.append(forward.module)
        compiled = forward.module in compiled_modules
        return 2.0 if compiled else 1.0  # compiled slower: auto keeps eager

    monkeypatch.setattr(torch, "compile", fake_compile)
    monkeypatch.setattr(speed, "timed_passes", fake_timed)
    monkeypatch.setattr(speed, "inductor_options", lambda kind: {"for": kind})
    eager = FusedLinear(2, 2)
    forward, choice = speed.compile_choice(
        setting, recorded, speed.Forward(eager, eager), [], distributed.World()
    )
    module = forward.module
    assert (choice.mode, choice.why) == (mode, why)
    assert (module is eager) == (mode == "eager")
    assert eager.fused == (mode == "compiled"), "the loss is compiled with the model, only"
    assert (len(compiled_modules), len(timed)) == (compiles, timings)
    assert options == [{"for": "cpu"}] * compiles  # the device's Inductor settings
