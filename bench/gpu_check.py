"""The first-GPU-run checklist (docs/gpu.md): every check prints one line and adds its figures
to one report, OUT/gpu_check.md (and OUT/gpu_check.json).

    bash scripts/gpu_check.sh                     # installs the project, then runs this
    python scripts/gpu_check.py --out DIR         # the checks alone

On a machine without a CUDA GPU it runs the checks that need none, says so and exits 0.
With a GPU it exits 1 if a check failed. Each check is given what is left of --minutes.
`--only WORD ...` runs the checks whose names hold one of the words (the rest read `skipped`),
for a short GPU session spent on what is not yet measured. The checks: bench/checks.py (in this
process) and bench/check_runs.py (attn-mt or a benchmark in a process of its own).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
import traceback
from pathlib import Path
from typing import Any

import torch

from attn_mt.precision import avoid_cudnn_attention, set_cuda_environment
from bench.check_runs import (
    auto_compile_run,
    bench,
    compiled_reference,
    deterministic_resume,
    kernel_bench,
    nccl_one_process,
    short_run,
    step_profile,
    wmt_base_bench,
)
from bench.checks import (
    Check,
    CheckFailed,
    Context,
    cached_decoding,
    decoding,
    environment,
    holds,
    mask_free_attention,
    numerics,
    peak_memory,
    presets,
    read_later,
)
from bench.common import ROOT

CHECKS = [
    Check("environment", environment, gpu_only=False),
    Check("GPU presets load", presets, gpu_only=False),
    Check("WMT base bench: compile off/on, projected vs logits", wmt_base_bench, gpu_only=True),
    Check("compiled base step profile", step_profile, gpu_only=True),
    Check("kernels: attention, layer norm", kernel_bench, gpu_only=True),
    Check("compiled nn.Transformer", compiled_reference, gpu_only=True),
    Check("base-size train.compile auto, phase seconds", auto_compile_run, gpu_only=True),
    Check("update read one later vs at once", read_later, gpu_only=True),
    Check("cached == full decoding", cached_decoding, gpu_only=False),
    Check("mask-free decoder == masked", mask_free_attention, gpu_only=False),
    Check("decoding: host reads, ms per step", decoding, gpu_only=False),
    Check("CPU vs CUDA one step", numerics, gpu_only=True),
    Check("deterministic exact resume", deterministic_resume, gpu_only=True),
    Check("NCCL, one process", nccl_one_process, gpu_only=True),
    Check("Multi30k fp16 run", short_run("fp16"), gpu_only=True),
    Check("Multi30k bf16 run", short_run("bf16"), gpu_only=True),
    Check("bench_train default size", bench("config"), gpu_only=True),
    Check("bench_train base size", bench("base"), gpu_only=True),
    Check("peak memory base/big", peak_memory, gpu_only=True),
]


# ---------------------------------------------------------------------------------------------
# Running and reporting


def run_checks(ctx: Context) -> None:
    for check in CHECKS:
        result: dict[str, Any] = {"check": check.name}
        start = time.monotonic()
        if not ctx.chosen(check):
            result.update(status="skipped", why="not chosen by --only")
        elif check.gpu_only and ctx.device.type != "cuda":
            result.update(status="skipped", why="needs a CUDA GPU")
        elif ctx.seconds_left() <= 0:
            result.update(status="skipped", why="out of time (--minutes)")
        else:
            try:
                result.update(status="pass", figures=check.run(ctx))
            except CheckFailed as error:
                result.update(status="FAIL", why=str(error))
            except subprocess.TimeoutExpired as error:  # the budget ran out, nothing failed
                why = f"stopped after {error.timeout:.0f} s, what was left of --minutes"
                result.update(status="timeout", why=why)
            except Exception as error:  # a bug or a CUDA error: keep going, report it
                result.update(status="FAIL", why=repr(error), trace=traceback.format_exc()[-2000:])
        result["seconds"] = round(time.monotonic() - start, 1)
        ctx.results.append(result)
        print(f"gpu_check: {result['status']:<7} {check.name} ({result['seconds']} s)", flush=True)
        if result["status"] != "skipped":  # a run cut short keeps what its checks found
            write_report(ctx)


def write_report(ctx: Context) -> Path:
    lines = [
        "# gpu_check report",
        "",
        f"Written {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.",
    ]
    lines += ["", "| check | result | seconds |", "|---|---|---|"]
    lines += [f"| {r['check']} | {r['status']} | {r['seconds']} |" for r in ctx.results]
    for r in ctx.results:
        lines += ["", f"## {r['check']}: {r['status']}", ""]
        if "why" in r:
            lines.append(r["why"])
        for key, value in r.get("figures", {}).items():
            lines.append(f"- {key}: {value}")
        if "trace" in r:
            lines += ["```", r["trace"], "```"]
    report = ctx.out / "gpu_check.md"
    report.write_text("\n".join(lines) + "\n")
    (ctx.out / "gpu_check.json").write_text(json.dumps(ctx.results, indent=1, default=str) + "\n")
    return report


def main() -> int:
    """Run the checks chosen; the exit status: 1 if one failed on a GPU, else 0."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "gpu_check")
    parser.add_argument("--minutes", type=float, default=28.0, help="budget for all checks")
    parser.add_argument("--cpu-only", action="store_true", help="as on a machine without a GPU")
    parser.add_argument(
        "--only", nargs="+", default=(), metavar="WORD", help="the checks whose names hold a word"
    )
    args = parser.parse_args()
    names = [check.name for check in CHECKS]
    unknown = [w for w in args.only if not any(holds(name, w) for name in names)]
    if unknown:
        parser.error(f"--only {' '.join(unknown)} names no check; the checks: {', '.join(names)}")
    args.out.mkdir(parents=True, exist_ok=True)
    set_cuda_environment()  # before CUDA starts, as `attn-mt train` does
    avoid_cudnn_attention()  # as training and translation do
    gpu = torch.cuda.is_available() and not args.cpu_only
    device = torch.device("cuda" if gpu else "cpu")
    ctx = Context(args.out, device, time.monotonic() + 60 * args.minutes, tuple(args.only))
    run_checks(ctx)
    report = write_report(ctx)
    print(f"gpu_check: report in {report}")
    if not gpu:
        why = "--cpu-only" if args.cpu_only else "no CUDA GPU here"
        print(f"gpu_check: the rest needs a GPU ({why}): ran the CPU-side checks only")
        return 0
    return 1 if any(r["status"] == "FAIL" for r in ctx.results) else 0
