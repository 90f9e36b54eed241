"""scripts/profile_step.py (bench/step_profile.py) on the CPU at a toy size: every timed row and
profile comes out, its figures agree with each other; it and scripts/bench_kernels.py say in
one line that what they were asked needs CUDA. bench_train's WMT workload at the same size
times the Trainer's own update and the one plain step."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from attn_mt.config.file import config_from_dict
from attn_mt.model import loss as model_loss
from attn_mt.precision import INDUCTOR_OPTIONS, has_inductor_setting
from attn_mt.train.loop import UpdateStep
from bench import kernels, profiled, step_profile, train
from bench.inductor import inductor_settings
from bench.reference import Reference
from bench.steps import PlainStep
from bench.workload import wmt_dropout

ROOT = Path(__file__).resolve().parents[2]

# tiny.yaml's model (1+1 layers of 32): Dynamo traces nn.Transformer layer by layer, so a
# larger model's trace would be most of this file's time
TOY = ["--config", str(ROOT / "configs" / "tiny.yaml"), "--size", "config", "--vocab", "300",
       "--batch-tokens", "400", "--pairs", "2000"]  # fmt: skip
STAGES = "mix_order_reduction_allow_multi_stages"  # an Inductor setting profiled on CUDA


def test_eager_profile_reports_every_model_and_shape(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """In bf16 with the bf16 stream and an Inductor setting: its rows and files are named for
    them, and the setting holds while it runs (for the process, and over attn-mt's own
    options), then no longer. nn.Transformer comes eagerly and compiled (Dynamo's eager
    backend here: the CPU's Inductor would take minutes); the compiled one's graphs are its
    own, made in its warm-up: the timed windows, whose shapes the warm-ups saw, add none."""
    compile_ = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: compile_(fn, backend="eager", **kw))
    out = tmp_path / "profile"
    config, before = torch._inductor.config, dict(INDUCTOR_OPTIONS)
    key, default = f"triton.{STAGES}", getattr(config.triton, STAGES)
    seen = []
    chunk = model_loss.projection_chunk

    def noted(device_type: str) -> int:  # what every loss chunk of a run saw
        seen.append((getattr(config.triton, STAGES), INDUCTOR_OPTIONS.get("cpu", {}).get(key)))
        return chunk(device_type)

    monkeypatch.setattr(model_loss, "projection_chunk", noted)
    step_profile.main([*TOY, "--quick", "--mode", "eager", "--reference", "--count-shapes",
                       "--device", "cpu", "--precision", "bf16", "--bf16-stream",
                       "--compiled-reference", "--inductor", f"{key}=0",
                       "--projection-chunk", "40000", "--out", str(out)])  # fmt: skip
    assert seen and set(seen) == {(False, False)}
    assert getattr(config.triton, STAGES) is default
    assert before == INDUCTOR_OPTIONS  # as they were
    lines = capsys.readouterr().out.strip().splitlines()
    report = json.loads(lines[-1])
    assert report["bf16_stream"] is True and report["precision"] == "bf16"
    assert report["inductor"] == {key: False}
    assert report["projection_chunk"] == 2**22 == chunk("cpu")
    assert report == json.loads((out / "eager_bf16_stream_inductor.json").read_text())
    rows = [json.loads(line[len("result ") :]) for line in lines if line.startswith("result {")]
    assert {row.pop("row"): row for row in rows} == {  # what gpu_check.py keeps of a stopped run
        key: value for key, value in report.items() if key.endswith(("fixed", "bucketed"))
    }
    shapes = report["distinct_shapes"]
    counts = [shapes[f"x{m}"] for m in (1, 8, 16, 32, 64)]
    assert counts == sorted(counts, reverse=True)  # rounding up merges shapes, never splits
    assert counts[-1] >= 1 and counts[0] <= shapes["batches"]
    ours = f"attn-mt bf16 stream triton.{STAGES}=False"
    chunked = f"{ours} projection_chunk=40000"  # the same model, its loss in smaller chunks
    for model in (ours, chunked, "nn.Transformer", "nn.Transformer compiled"):
        for kind in ("fixed", "bucketed"):
            row = report[f"{model} {kind}"]
            assert row["ms_per_step"] > 0 and row["tgt_tokens_per_s"] > 0
            assert 0 < row["host_queued_share"] <= 1
            assert row["host_lead_ms"] is None and row["device_waited_share"] is None  # CUDA's
            assert ("profile" in row) == model.startswith("attn-mt")  # attn-mt's alone
    assert report["graphs"] == 0 and report["reference_graphs"] >= 1  # attn-mt ran eagerly
    assert report["graphs_after_warmup"] == 0 and report["reference_warmup_s"] > 0
    for kind in ("fixed", "bucketed"):
        profile = report[f"{ours} {kind}"]["profile"]
        assert profile["steps"] == 2 and profile["aten_ops_per_step"] > 50
        assert profile["device_busy_ms_per_step"] is None  # no CUDA kernels on the CPU
        more = report[f"{chunked} {kind}"]["profile"]["aten_ops_per_step"]
        assert more > profile["aten_ops_per_step"]  # more chunks: more operations per update
        for name in (
            f"eager_bf16_stream_inductor_{kind}",
            f"eager_bf16_stream_inductor_chunk40000_{kind}",
        ):
            text = (out / f"{name}_profile.txt").read_text()
            assert "by device time" in text and "aten::mm" in text
            assert (out / f"{name}_trace.json.gz").stat().st_size > 0


def test_reference_only_times_nn_transformer_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--reference-only` (what gpu_check's compiled nn.Transformer check asks, after the step
    profile timed attn-mt): no attn-mt row, no attn-mt warm-up; without a reference to time,
    one line and exit 2."""
    step_profile.main([*TOY, "--quick", "--mode", "eager", "--reference", "--reference-only",
                       "--device", "cpu", "--out", str(tmp_path)])  # fmt: skip
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    rows = {key for key in report if key.endswith(("fixed", "bucketed"))}
    assert rows == {"nn.Transformer fixed", "nn.Transformer bucketed"}
    assert "warmup_s" not in report and report["nn.Transformer fixed"]["ms_per_step"] > 0
    with pytest.raises(SystemExit) as stop:
        step_profile.main([*TOY, "--reference-only", "--device", "cpu", "--out", str(tmp_path)])
    assert stop.value.code == 2
    assert "--reference-only needs --reference" in capsys.readouterr().err


def test_profile_steps_zero_times_without_profiling(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--profile-steps 0` times every row and profiles none (no profile, no files); a
    negative count is one line and exit 2, before anything is built."""
    step_profile.main([*TOY, "--quick", "--mode", "eager", "--profile-steps", "0",
                       "--device", "cpu", "--out", str(tmp_path)])  # fmt: skip
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for kind in ("fixed", "bucketed"):
        assert report[f"attn-mt {kind}"]["ms_per_step"] > 0
        assert "profile" not in report[f"attn-mt {kind}"]
    assert not list(tmp_path.glob("*_profile.txt")) and not list(tmp_path.glob("*trace*"))
    with pytest.raises(SystemExit) as stop:
        step_profile.main([*TOY, "--profile-steps", "-1", "--device", "cpu",
                           "--out", str(tmp_path)])  # fmt: skip
    assert stop.value.code == 2 and "--profile-steps must be" in capsys.readouterr().err


def test_host_leads_tell_a_waiting_device_from_one_behind() -> None:
    """A device that reached each mark as the host queued it (the host sets the pace) leads by
    nothing; one still working through earlier marks leads by its backlog. The figures leave
    each window's first mark out (it is their clocks' origin) and say where the device
    waited."""
    host_s = [100.0, 100.010, 100.020, 100.030]  # the host's clock at each mark, seconds
    assert profiled.host_leads(host_s, [0.0, 10.0, 20.0, 30.0]) == pytest.approx([0] * 4, abs=1e-9)
    behind = profiled.host_leads(host_s, [0.0, 14.0, 31.0, 52.5])
    assert behind == pytest.approx([0, 4, 11, 22.5])
    windows = [{"leads": [0.0, 0.02, 9.0, 12.0]}, {"leads": [0.0, 0.05]}]
    figures = profiled.lead_figures(windows)
    assert figures["host_lead_ms"] == pytest.approx((0.05 + 9.0) / 2)  # of 0.02, 0.05, 9, 12
    assert figures["device_waited_share"] == 0.5
    assert profiled.lead_figures([{"leads": None}]) == {
        "host_lead_ms": None, "device_waited_share": None,
    }  # fmt: skip


@pytest.mark.parametrize("activation_dropout", [None, 0.05])
def test_reference_drops_where_attn_mt_does(activation_dropout: float | None) -> None:
    """nn.Transformer's reference takes attn-mt's three dropout rates (the feed-forward hidden
    layer's is model.dropout's unless model.activation_dropout is set), and the WMT workload's
    are the base preset's: Vaswani et al.'s, on embeddings and sub-layer outputs alone."""
    keys = dict(dropout=0.2, attention_dropout=0.1, activation_dropout=activation_dropout)
    raw = {"data": {"dataset": "multi30k"}, "model": {**keys, "d_model": 16, "heads": 2}}
    ref = Reference(config_from_dict(raw).model, vocab=50)
    feed_forward = 0.2 if activation_dropout is None else activation_dropout
    layers = [*ref.core.encoder.layers, *ref.core.decoder.layers]
    assert ref.dropout.p == 0.2 and len(layers) == 6  # the config's 3 + 3
    for layer in layers:
        assert layer.dropout.p == feed_forward  # between linear1 and linear2
        residual = [layer.dropout1, layer.dropout2, getattr(layer, "dropout3", layer.dropout1)]
        assert {module.p for module in residual} == {0.2}
        attentions = [layer.self_attn, getattr(layer, "multihead_attn", layer.self_attn)]
        assert {attention.dropout for attention in attentions} == {0.1}
    assert wmt_dropout() == dict(dropout=0.1, activation_dropout=0, attention_dropout=0)


def test_bench_train_times_the_trainers_update_and_the_plain_step(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The projected loss's turns are the Trainer's own update (`UpdateStep.apply` once an
    update), the full logits' the plain step, an update a batch each: a warm-up of every timed
    shape, then one window of one update a shape. A row per loss and shape, and their ratios."""
    applied, plain = [], []
    apply, call = UpdateStep.apply, PlainStep.__call__

    def counted_apply(self, *args, **kwargs):
        applied.append(self)
        return apply(self, *args, **kwargs)

    def counted_call(self, batches, phase=None):
        plain.append(len(batches))
        return call(self, batches, phase)

    monkeypatch.setattr(UpdateStep, "apply", counted_apply)
    monkeypatch.setattr(PlainStep, "__call__", counted_call)
    train.main([*TOY, "--quick", "--precisions", "fp32", "--device", "cpu"])
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    rows = [(r["loss"], r["compiled"], r["shapes"]) for r in report["results"]]
    assert rows == [(loss, False, kind) for loss in ("logits", "projected")
                    for kind in ("fixed", "bucketed")]  # fmt: skip
    assert all(r["tokens_per_s"] > 0 and r["graphs"] == 0 for r in report["results"])
    assert len(applied) == sum(plain) == 2 + 2  # the warm-up's two shapes, then a window each
    assert len(set(map(id, applied))) == 1  # one UpdateStep, the Trainer's, for its turns
    assert set(report["projected_over_logits"]) == {"400 fp32 fixed", "400 fp32 bucketed"}


NEEDS_CUDA = [
    (
        "profile_step.py",
        [*TOY, "--device", "cpu", "--mode", "cudagraphs"],
        "--mode cudagraphs needs CUDA",
    ),
    ("bench_kernels.py", [], "needs CUDA (the kernels compared are CUDA's)"),
]


@pytest.mark.parametrize(
    ("script", "args", "message"), NEEDS_CUDA, ids=["profile_step", "bench_kernels"]
)
def test_without_cuda_is_one_clear_line(
    script: str, args: list[str], message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # as on a machine without a GPU
    command = [sys.executable, str(ROOT / "scripts" / script), *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].endswith(message)


def test_layernorm_variants_name_settings_inductor_has() -> None:
    """bench_kernels.py's variants patch Inductor settings by name: a misspelt one would be
    skipped as an older torch's on the GPU, so each must exist in this torch's Inductor."""
    names = [key for _, settings in kernels.LAYERNORM_VARIANTS.values() for key in settings]
    assert "triton.mix_order_reduction" in names
    assert all(has_inductor_setting(name) for name in names)
    assert not has_inductor_setting("triton.mix_order_reductions")
    assert not has_inductor_setting("no_such_group.persistent_reductions")


def test_inductor_settings_are_read_as_their_type_and_a_wrong_one_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--inductor KEY=VALUE`: a flag from 1/0 or true/false, a number as an int; a misspelt
    key, a value of the wrong kind or a pair without `=` stops profile_step.py before any
    work with one line and exit 2."""
    read = inductor_settings
    assert read([f"triton.{STAGES}=1", "coordinate_descent_tuning=false"]) == {
        f"triton.{STAGES}": True, "coordinate_descent_tuning": False,
    }  # fmt: skip
    assert read(["triton.mix_order_reduction_split_size=32"]) == {
        "triton.mix_order_reduction_split_size": 32
    }
    for wrong, message in [
        ("triton.mix_order_reductions=1", "not an Inductor setting"),
        (f"triton.{STAGES}=yes", "is a flag"),
        ("triton.mix_order_reduction_split_size=big", "is a number"),
        (f"triton.{STAGES}", "give KEY=VALUE"),
    ]:
        with pytest.raises(ValueError, match=message):
            read([wrong])
    with pytest.raises(SystemExit) as stop:
        step_profile.main([*TOY, "--inductor", "triton.nope=1", "--out", str(tmp_path)])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].endswith(
        "--inductor triton.nope: not an Inductor setting of torch " + torch.__version__
    )
    assert not list(tmp_path.iterdir())  # nothing written
