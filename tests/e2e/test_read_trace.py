"""scripts/read_trace.py (bench/trace.py) on traces laid out as torch.profiler writes them on
CUDA (kineto's Chrome trace: a `kernel` event's args hold its grid, block, registers and
occupancy): its rows add up to the trace's device time, and each says what the trace says of
its kernel."""

from __future__ import annotations

import gzip
import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench import trace as read_trace

ROOT = Path(__file__).resolve().parents[2]

LN_BACKWARD = "triton_per_fused_native_dropout_backward_native_layer_norm_backward_7"
ATTENTION = "fmha_cutlassB_bf16_aligned_64x64_k64_sm80(AttentionBackwardKernel)"
GEMM = "nvjet_sm90_tst_128x128_64x6_2x1_v_bz_splitK_NTT"


def kernel(name: str, ts: float, dur: float, grid: list[int], block: list[int], **more: Any):
    args = {"device": 0, "stream": 7, "grid": grid, "block": block, **more}
    return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": ts, "dur": dur,
            "args": args}  # fmt: skip


def step_trace(steps: int, seed: int) -> tuple[list[dict[str, Any]], dict[str, list[float]]]:
    """A trace of `steps` updates, each with its host range and its copy on the GPU's timeline,
    random kernel durations; and each kernel's durations, to check the rows against."""
    rng = random.Random(seed)
    events: list[dict[str, Any]] = [{"ph": "M", "name": "process_name", "pid": 0, "args": {}}]
    durations: dict[str, list[float]] = {}
    ts = 0.0
    for _ in range(steps):
        for cat in ("user_annotation", "gpu_user_annotation"):  # only the host's counts
            events.append({"ph": "X", "cat": cat, "name": "forward+loss", "ts": ts, "dur": 9.0})
        events.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": ts, "dur": 3.0})
        launches = [
            (LN_BACKWARD, [1470, 1, 1], [64, 1, 1], {"registers per thread": 235}, 2),
            (ATTENTION, [735, 8, 1], [128, 1, 1], {"registers per thread": 167}, 3),
            (GEMM, [rng.choice([132, 264]), 1, 1], [384, 1, 1], {}, 4),
        ]
        for name, grid, block, extra, calls in launches:
            for _ in range(calls):
                dur = rng.uniform(5.0, 200.0)
                occupancy = {"est. achieved occupancy %": rng.choice([13, 19])}
                events.append(kernel(name, ts, dur, grid, block, **extra, **occupancy))
                durations.setdefault(name, []).append(dur)
                ts += dur
        memset = {"ph": "X", "cat": "gpu_memset", "name": "Memset (Device)", "ts": ts, "dur": 1.5}
        events.append(memset | {"args": {"device": 0}})
        durations.setdefault("Memset (Device)", []).append(1.5)
    return events, durations


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_rows_add_up_to_the_traces_device_time(seed: int) -> None:
    steps = 3
    events, durations = step_trace(steps, seed)
    assert read_trace.steps_in(events) == steps  # the host's ranges, not their GPU copies
    rows = read_trace.kernel_rows(events, steps)
    assert [row["name"] for row in rows] == sorted(durations, key=lambda n: -sum(durations[n]))
    total = sum(row["ms_per_step"] for row in rows)
    assert total == pytest.approx(sum(map(sum, durations.values())) / 1e3 / steps)
    for row in rows:
        done = durations[row["name"]]
        assert row["calls_per_step"] * steps == len(done)
        assert row["us_per_call"] == pytest.approx(sum(done) / len(done))
        assert row["kind"] == read_trace.kernel_kind(row["name"])
    by_name = {row["name"]: row for row in rows}
    ln, attention, gemm = by_name[LN_BACKWARD], by_name[ATTENTION], by_name[GEMM]
    assert (ln["launch"], ln["launches"], ln["registers"]) == ("1470 x 64", 1, 235)
    assert (attention["launch"], attention["registers"]) == ("735x8 x 128", 167)
    assert gemm["launches"] in (1, 2) and gemm["registers"] is None
    memset = by_name["Memset (Device)"]  # no launch figures in the trace
    assert (memset["launch"], memset["launches"], memset["occupancy_pct"]) == ("", 0, None)
    assert 13 <= ln["occupancy_pct"] <= 19  # weighted by duration: between the two values


def test_occupancy_is_weighted_by_duration_and_the_launch_is_the_most_frequent() -> None:
    events = [
        kernel(GEMM, 0, 30.0, [100, 1, 1], [256, 1, 1], **{"est. achieved occupancy %": 50}),
        kernel(GEMM, 30, 10.0, [200, 1, 1], [256, 1, 1], **{"est. achieved occupancy %": 90}),
        kernel(GEMM, 40, 10.0, [200, 1, 1], [256, 1, 1], **{"est. achieved occupancy %": 90}),
    ]
    (row,) = read_trace.kernel_rows(events, steps=1)
    assert row["occupancy_pct"] == pytest.approx((50 * 30 + 90 * 20) / 50)
    assert (row["launch"], row["launches"]) == ("200 x 256", 2)
    text = read_trace.table([row], top=5)
    assert "200 x 256 (+1)" in text and "matrix products" in text


def test_command_reads_a_gzipped_trace_and_refuses_what_is_not_one(tmp_path: Path) -> None:
    events, durations = step_trace(2, seed=3)
    path = tmp_path / "compiled_bucketed_trace.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"schemaVersion": 1, "traceEvents": events}, f)
    script = [sys.executable, str(ROOT / "scripts" / "read_trace.py")]
    done = subprocess.run([*script, str(path), "--json"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)
    assert {row["name"] for row in rows} == set(durations)
    assert sum(row["calls_per_step"] for row in rows) * 2 == sum(map(len, durations.values()))
    text = subprocess.run([*script, str(path), "--top", "2"], capture_output=True, text=True)
    assert text.returncode == 0 and len(text.stdout.strip().splitlines()) == 2 + 2  # head, 2 rows
    bad = tmp_path / "not_a_trace.json"
    bad.write_text("[1, 2]")
    cpu = tmp_path / "cpu_trace.json"
    cpu.write_text(json.dumps({"traceEvents": [e for e in events if e.get("cat") != "kernel"
                                               and e.get("cat") != "gpu_memset"]}))  # fmt: skip
    for args, message in (
        ([str(bad)], "has no traceEvents"),
        ([str(tmp_path / "missing.json.gz")], "is not a JSON trace"),
        ([str(cpu)], "holds no CUDA kernels"),
        ([str(path), "--steps", "0"], "--steps must be at least 1"),
    ):
        refused = subprocess.run([*script, *args], capture_output=True, text=True)
        assert refused.returncode == 2 and message in refused.stderr, refused.stderr
        assert "Traceback" not in refused.stderr


@pytest.mark.parametrize(
    ("name", "kind"),
    [  # kernel names from a compiled base step's CUDA trace (docs/history.md, "GPU sessions")
        ("fmha_cutlassB_bf16_aligned_64x64_k64_sm80(PyTorchMemEffAttention::"
         "AttentionBackwardKernel<cutlass::arch::Sm80, cutlass::bfloat16_t>::Params)", "attention"),
        ("void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits"
         "<64, 128, 128, 8, 4, false, false, cutlass::bfloat16_t>>", "attention"),
        ("nvjet_sm90_tst_128x128_64x6_2x1_v_bz_splitK_NTT", "matrix products"),
        ("void cublasLt::splitKreduce_kernel<32, 16, int, float>", "matrix products"),
        ("triton_per_fused__to_copy_add_native_dropout_backward_native_layer_norm_backward_view_7",
         "layer norm (fused)"),
        ("triton_red_fused__log_softmax__to_copy_arange_eq_exp_mean_prepare_softmax_online_sub_0",
         "loss chunk (fused)"),
        ("triton_poi_fused_native_dropout_relu_view_13", "dropout, ReLU (fused)"),
        ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<FusedAdamMathFunctor>",
         "clipping, AdamW"),
        ("void at::native::reduce_kernel<128, 4, at::native::ReduceOp<float>>", "other"),
        ("Memset (Device)", "memcpy, memset"),
    ],
)  # fmt: skip
def test_kernel_kinds_of_real_kernel_names(name: str, kind: str) -> None:
    assert read_trace.kernel_kind(name) == kind
