"""scripts/gpu_check.sh without a GPU: it runs the CPU-side checks, says the rest needs a GPU,
writes its report and exits 0; the checklist's parts (bench/gpu_check.py, checks.py,
check_runs.py) each on their own."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from helpers import REPO

from attn_mt.model.vocab import PAD_ID
from bench import check_runs, checks, gpu_check
from bench.checks import Check, CheckFailed, Context
from bench.inductor import inductor_settings

pytestmark = pytest.mark.slow

CPU_CHECKS = [
    "environment",
    "GPU presets load",
    "cached == full decoding",
    "mask-free decoder == masked",
    "decoding: host reads, ms per step",
]


def test_gpu_check_runs_its_cpu_part_and_exits_0(tmp_path: Path):
    env = {**os.environ, "PYTHON": sys.executable, "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run(
        ["bash", "scripts/gpu_check.sh", "--out", str(tmp_path), "--cpu-only"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "the rest needs a GPU (--cpu-only)" in proc.stdout
    results = json.loads((tmp_path / "gpu_check.json").read_text())
    status = {r["check"]: r["status"] for r in results}
    assert [name for name, s in status.items() if s == "pass"] == CPU_CHECKS, results
    assert set(status.values()) == {"pass", "skipped"}
    assert all(r["why"] == "needs a CUDA GPU" for r in results if r["status"] == "skipped")
    report = (tmp_path / "gpu_check.md").read_text()
    assert "| cached == full decoding | pass |" in report
    assert "| deterministic exact resume | skipped |" in report


def test_a_check_stopped_by_the_budget_is_out_of_time_not_a_failure(monkeypatch, tmp_path):
    """A check whose subprocess ran past what was left of --minutes is 'timeout'; only a real
    failure is FAIL (which makes the exit code 1)."""

    def too_long(ctx):
        raise subprocess.TimeoutExpired(["attn-mt", "train"], timeout=62.3)

    def wrong(ctx):
        raise CheckFailed("gradients differ")

    listed = [
        Check("slow", too_long, gpu_only=False),
        Check("broken", wrong, gpu_only=False),
    ]
    monkeypatch.setattr(gpu_check, "CHECKS", listed)
    ctx = Context(tmp_path, torch.device("cpu"), deadline=float("inf"))
    gpu_check.run_checks(ctx)
    status = {r["check"]: (r["status"], r["why"]) for r in ctx.results}
    assert status["slow"] == ("timeout", "stopped after 62 s, what was left of --minutes")
    assert status["broken"] == ("FAIL", "gradients differ")


def test_the_report_holds_each_check_as_it_ends(monkeypatch, tmp_path):
    """A run cut short (the machine taken back, the process killed) keeps the figures of the checks
    that ended: the report is written after each one, not only at the end."""

    def killed(ctx):
        raise KeyboardInterrupt  # as a kill would end the process mid-check

    listed = [
        Check("first", lambda ctx: {"ms": 1.5}, gpu_only=False),
        Check("second", killed, gpu_only=False),
    ]
    monkeypatch.setattr(gpu_check, "CHECKS", listed)
    ctx = Context(tmp_path, torch.device("cpu"), deadline=float("inf"))
    with pytest.raises(KeyboardInterrupt):
        gpu_check.run_checks(ctx)
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert [(r["check"], r["status"], r["figures"]) for r in report] == [
        ("first", "pass", {"ms": 1.5})
    ]
    assert "- ms: 1.5" in (tmp_path / "gpu_check.md").read_text()


def test_the_nccl_check_starts_a_one_rank_group_and_all_reduces(monkeypatch):
    """The NCCL check's own process group (a torchrun of one process starts none), run here with
    gloo on the CPU: a group starts, one all_reduce runs in it, and it is destroyed."""
    reduced = []
    all_reduce = dist.all_reduce

    def spy(tensor, *args, **kwargs):
        reduced.append((dist.get_world_size(), tensor.device.type))
        return all_reduce(tensor, *args, **kwargs)

    monkeypatch.setattr(dist, "all_reduce", spy)
    assert not dist.is_initialized()
    figures = check_runs.one_process_all_reduce("gloo", torch.device("cpu"))
    assert figures == {"backend": "gloo", "all_reduce": "equal"}
    assert reduced == [(1, "cpu")]
    assert not dist.is_initialized()


def test_only_runs_the_chosen_checks_and_names_the_rest_skipped(monkeypatch, tmp_path):
    ran = []
    listed = [
        Check(name, lambda ctx, name=name: ran.append(name) or {}, gpu_only=False)
        for name in ("Multi30k bf16 run", "Multi30k fp16 run", "peak memory base/big")
    ]
    monkeypatch.setattr(gpu_check, "CHECKS", listed)
    ctx = Context(tmp_path, torch.device("cpu"), float("inf"), only=("BF16", "memory"))
    gpu_check.run_checks(ctx)
    assert ran == ["Multi30k bf16 run", "peak memory base/big"]
    skipped = [r for r in ctx.results if r["status"] == "skipped"]
    assert [(r["check"], r["why"]) for r in skipped] == [
        ("Multi30k fp16 run", "not chosen by --only")
    ]


def test_only_with_a_word_no_check_holds_is_an_error_before_any_check(tmp_path: Path):
    proc = subprocess.run(
        [sys.executable, "scripts/gpu_check.py", "--out", str(tmp_path), "--only", "bf16", "nope"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "--only nope names no check" in proc.stderr
    assert not (tmp_path / "gpu_check.json").exists()


def test_gpu_check_uses_the_repository_venv_when_python3_has_no_torch(tmp_path: Path):
    """With PYTHON unset and a python3 on PATH that cannot import torch, the script runs with
    .venv/bin/python (make setup's) instead of stopping: its --only check then answers."""
    if not (REPO / ".venv" / "bin" / "python").exists():
        pytest.fail("no .venv: run the tests through `make test`, which creates it")
    bare = tmp_path / "bin"
    bare.mkdir()
    (bare / "python3").write_text("#!/bin/sh\nexit 1\n")  # a Python without torch
    (bare / "python3").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "PYTHON"}
    env["PATH"] = f"{bare}{os.pathsep}{env.get('PATH', '')}"
    proc = subprocess.run(
        ["bash", "scripts/gpu_check.sh", "--out", str(tmp_path), "--only", "no-such-check"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "has no torch" not in proc.stderr, proc.stderr
    assert "no-such-check" in proc.stderr, proc.stdout + proc.stderr


def test_train_log_figures_read_a_real_run(trained_run):
    """What the base-size check reports, read from a real train.log (the toy run, 2
    validations): the train.compile line, each validation's seconds by phase, and the
    closing timesheet."""
    log = (trained_run / "train.log").read_text()
    figures = check_runs.train_log_figures(log)
    assert figures["compile"] == "train.compile false: eager (asked)"
    parts = re.findall(r"([a-z -]+) [\d.:]+(?: s)? \([\d.]+%\)", figures.pop("time"))
    assert [p.strip(", ") for p in parts] == ["start-up", "updates", "checkpoints", "validation"]
    valid = {k: v for k, v in figures.items() if k != "compile"}
    assert list(valid) == ["valid step 200", "valid step 400"]
    for seconds in valid.values():
        total, phases = seconds.split(" s: ")
        parts = dict(p.split(" ") for p in phases.split(", "))
        assert set(parts) >= {"loss", "search", "score"}
        assert float(total) == pytest.approx(sum(map(float, parts.values())), abs=0.2)


def test_bench_turns_keep_the_rows_a_stopped_turn_printed_and_skip_the_rest(tmp_path):
    """The WMT bench runs each mode in its own process: every turn's `result` rows are kept,
    including those a turn printed before the budget stopped it; the turns after it are not
    run, and a turn that fails fails the check."""

    def turn(rows: list[int], then: str = "") -> list[str]:
        lines = "".join(f"print('result', json.dumps({{'n': {n}}}), flush=True);" for n in rows)
        return [sys.executable, "-c", f"import json, sys, time; print('noise'); {lines} {then}"]

    ctx = Context(tmp_path, torch.device("cpu"), deadline=time.monotonic() + 5)
    rows, outcome = check_runs.bench_turns(
        ctx, {"a": turn([1, 2]), "b": turn([3], "time.sleep(60)"), "c": turn([4])}
    )
    assert rows == [{"n": 1}, {"n": 2}, {"n": 3}]
    assert outcome["a"] == "done"
    assert outcome["b"].startswith("stopped after")
    assert outcome["c"] == "not run: out of time (--minutes)"
    assert "result" in (tmp_path / "bench_train_b.txt").read_text()

    ctx = Context(tmp_path, torch.device("cpu"), deadline=time.monotonic() + 60)
    rows, _ = check_runs.bench_turns(ctx, {"k": turn([5])}, prefix="bench_kernels")
    assert rows == [{"n": 5}] and (tmp_path / "bench_kernels_k.txt").exists()
    with pytest.raises(CheckFailed, match="bad: exited 3"):
        check_runs.bench_turns(ctx, {"ok": turn([1]), "bad": turn([], "sys.exit(3)")})


def test_compiled_reference_keeps_its_own_rows_apart_from_the_step_profiles(monkeypatch, tmp_path):
    """The compiled nn.Transformer check runs profile_step.py again, without attn-mt: its
    report holds nn.Transformer's rows alone, so attn-mt's are the step profile's, and its
    files go to a folder of their own. The step profile tries each Inductor setting that takes
    work off the host in a turn of its own, its rows named with the setting; one this torch
    lacks is left out."""
    commands = []

    def bench_turns(ctx, turns, prefix):
        commands.extend(turns.values())
        rows = []
        for name, command in turns.items():
            models = ["attn-mt"]
            if "--inductor" in command:  # named as profile_step.py names them
                tried = inductor_settings([command[command.index("--inductor") + 1]])
                models = [" ".join(["attn-mt", *(f"{k}={v}" for k, v in tried.items())])]
            if "--projection-chunk" in command:  # the same model again, in the same process
                models.append(f"attn-mt projection_chunk={command[-1]}")
            if "--reference-only" in command:
                models = []
            if "--reference" in command:
                models.append("nn.Transformer")
            if "--compiled-reference" in command:
                models.append("nn.Transformer compiled")
            rows += [{"row": f"{m} {kind}", "turn": name} for m in models
                     for kind in ("fixed", "bucketed")]  # fmt: skip
        return rows, {name: "done" for name in turns}

    monkeypatch.setattr(check_runs, "bench_turns", bench_turns)
    monkeypatch.setitem(check_runs.INDUCTOR_TURNS, "a later torch's", "triton.not_in_this_torch=1")
    ctx = Context(tmp_path, torch.device("cpu"), deadline=time.monotonic() + 60)
    profile, reference = check_runs.step_profile(ctx), check_runs.compiled_reference(ctx)
    assert list(profile["turns"]) == ["compiled", "mix-order reductions", "C++ wrapper"]
    assert "attn-mt cpp_wrapper=True bucketed" in profile
    mixed = profile["attn-mt triton.mix_order_reduction=True fixed"]
    assert mixed["turn"] == "mix-order reductions"
    smaller = check_runs.PROJECTION_CHUNK_GPU // 4  # beside the default, in the same process
    assert profile[f"attn-mt projection_chunk={smaller} fixed"]["turn"] == "compiled"
    assert profile["attn-mt fixed"]["turn"] == "compiled"
    assert set(reference) == {"nn.Transformer compiled fixed", "nn.Transformer compiled bucketed",
                              "turns"}  # fmt: skip
    outs = [command[command.index("--out") + 1] for command in commands]
    assert len(set(outs)) == 2 and outs[-1].endswith("profile_reference")
    assert commands[-1][commands[-1].index("--profile-steps") + 1] == "1"


def test_the_numerics_check_compares_the_trainers_gradients(monkeypatch, tmp_path):
    """The CPU-against-CUDA check, run here on the CPU against itself: the gradients of the
    Trainer's forward and backward (`UpdateStep.backward`) are those of the same update in
    fp32, bit for bit, and near them in bf16; every parameter has one."""
    monkeypatch.setattr(checks, "configure_kernels", lambda **kwargs: None)  # the process's
    figures = checks.numerics(Context(tmp_path, torch.device("cpu"), float("inf")))
    assert figures["fp32 loss rel diff"] == 0 and figures["fp32 worst grad rel diff"] == 0
    assert 0 < figures["bf16 worst grad rel diff"] <= 5e-2
    batch = checks.random_batch(4, 6, 5)
    assert batch.num_tgt_tokens == int((batch.tgt_out != PAD_ID).sum()) < 4 * 5  # padded rows
    torch.manual_seed(0)
    model = checks.tiny_model(torch.device("cpu"))
    found = checks.gradients(model, batch, "fp32")
    assert set(found["grads"]) == {name for name, _ in model.named_parameters()}
    assert found["loss"] > 0
