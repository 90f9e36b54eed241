"""Precision and kernel settings for the GPU, tested with `torch.cuda` mocked: `auto` picks bf16
only where it is native, TF32 and deterministic kernels, the environment CUDA reads at start."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from helpers.toy import invoke, toy_config_dict, write_lines

from attn_mt import precision
from attn_mt.precision import configure_kernels, resolve_precision, set_cuda_environment

CUDA = torch.device("cuda", 0)
ENV = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "CUBLAS_WORKSPACE_CONFIG")


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """None of the variables CUDA reads at start are set (monkeypatch restores them)."""
    for name in ENV:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.fixture
def kernel_settings():
    """Restores the process-wide kernel settings a test changes."""
    saved = (
        torch.backends.cuda.matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
        torch.are_deterministic_algorithms_enabled(),
        torch.backends.cudnn.deterministic,
        torch.backends.cudnn.benchmark,
        torch.backends.cuda.cudnn_sdp_enabled(),
    )
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved[:2]
    if torch.are_deterministic_algorithms_enabled() != saved[2]:  # its import is slow
        torch.use_deterministic_algorithms(saved[2])
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = saved[3:5]
    torch.backends.cuda.enable_cudnn_sdp(saved[5])


@pytest.mark.parametrize(
    ("capability", "expected"),
    [((6, 0), "fp16"), ((7, 0), "fp16"), ((7, 5), "fp16"), ((8, 0), "bf16"), ((9, 0), "bf16")],
)
def test_auto_picks_bf16_only_where_the_card_has_it_natively(monkeypatch, capability, expected):
    """V100 (7.0) and T4 (7.5) emulate bf16, and torch's is_bf16_supported says yes there."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert resolve_precision("auto", CUDA) == expected
    assert resolve_precision("fp32", CUDA) == "fp32"  # an explicit choice is kept


def test_cuda_environment_defaults_and_what_the_user_set(clean_env):
    set_cuda_environment()
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert "CUBLAS_WORKSPACE_CONFIG" not in os.environ  # only for deterministic runs
    set_cuda_environment(deterministic=True)
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == precision.CUBLAS_WORKSPACE

    clean_env.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:128")
    clean_env.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
    set_cuda_environment(deterministic=True)
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:128"
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"

    clean_env.delenv("PYTORCH_CUDA_ALLOC_CONF")
    clean_env.setenv("PYTORCH_ALLOC_CONF", "backend:native")  # torch's newer name
    set_cuda_environment()
    assert "PYTORCH_CUDA_ALLOC_CONF" not in os.environ


@pytest.mark.parametrize(
    ("deterministic", "tf32", "fast"),
    [(False, True, True), (False, False, False), (True, True, False)],
)
def test_tf32_on_by_default_off_when_asked_or_deterministic(
    clean_env, kernel_settings, deterministic, tf32, fast
):
    configure_kernels(deterministic, tf32)
    assert torch.backends.cuda.matmul.allow_tf32 is fast
    assert torch.backends.cudnn.allow_tf32 is fast
    assert torch.are_deterministic_algorithms_enabled() is deterministic
    assert torch.backends.cudnn.deterministic is deterministic
    assert not torch.backends.cudnn.benchmark
    assert ("CUBLAS_WORKSPACE_CONFIG" in os.environ) is deterministic


def test_attention_keeps_off_cudnn_whose_plans_are_per_shape(kernel_settings):
    """Training and validation on a GPU change shape at nearly every call; cuDNN's attention
    sets up a plan per shape, so the trainer (through configure_kernels) turns it off."""
    torch.backends.cuda.enable_cudnn_sdp(True)
    configure_kernels(deterministic=False, tf32=True)
    assert not torch.backends.cuda.cudnn_sdp_enabled()
    assert torch.backends.cuda.flash_sdp_enabled()  # the kernels that serve instead stay on
    assert torch.backends.cuda.mem_efficient_sdp_enabled()


def test_train_command_sets_the_cuda_environment_before_training(
    clean_env, toy_data: dict[str, Path], tmp_path: Path
):
    """`attn-mt train` sets the allocator and cuBLAS variables before anything starts CUDA."""
    import yaml

    import attn_mt.train.setup as training_setup
    from attn_mt.train import loop

    seen = {}

    def fake_train(cfg, resume, device, monitor):
        seen.update({name: os.environ.get(name) for name in ENV})
        seen["cuda started"] = torch.cuda.is_initialized()
        return loop.TrainResult(0, None, "bleu", "max_steps", tmp_path)

    clean_env.setattr(training_setup, "train", fake_train)
    raw = toy_config_dict(toy_data, tmp_path / "run", deterministic=True)
    config = write_lines(tmp_path / "c.yaml", [yaml.safe_dump(raw)])
    result = invoke("train", "--config", config)
    assert result.exit_code == 0, result.output
    assert seen == {
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
        "PYTORCH_ALLOC_CONF": None,
        "CUBLAS_WORKSPACE_CONFIG": precision.CUBLAS_WORKSPACE,
        "cuda started": False,
    }


def test_trainer_setup_applies_the_kernel_settings(clean_env, kernel_settings, toy_config):
    """The training loop's setup applies train.deterministic (TF32 off with it)."""
    from attn_mt.train.setup import setup

    configure_kernels(deterministic=False, tf32=True)
    setup(toy_config(deterministic=True))
    assert torch.are_deterministic_algorithms_enabled()
    assert not torch.backends.cuda.matmul.allow_tf32


def test_inductor_options_are_the_devices_and_only_what_this_torch_has(monkeypatch) -> None:
    assert precision.inductor_options("cuda") == {"triton.mix_order_reduction": False}
    assert precision.inductor_options("cpu") == {}
    wanted = {"triton.persistent_reductions": True, "triton.no_such_setting": 1}
    monkeypatch.setitem(precision.INDUCTOR_OPTIONS, "cuda", wanted)
    assert precision.inductor_options("cuda") == {"triton.persistent_reductions": True}


@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated")  # Inductor's
def test_inductor_options_hold_for_the_lazily_compiled_backward(monkeypatch) -> None:
    """Given to torch.compile, the CUDA settings hold while Inductor schedules the backward
    too, which it compiles at the first backward(), outside torch.compile's call: each check
    for a mix-order fusion, forward and backward, sees them (here on the CPU, where the
    setting is read though it changes nothing). So attn-mt sets them per compile, not for
    the whole process."""
    from torch._inductor import config, scheduler

    seen: list[bool] = []
    checks = scheduler.MixOrderReduction.can_fuse.__func__

    def noted(cls, node1, node2) -> bool:
        seen.append(config.triton.mix_order_reduction)
        return checks(cls, node1, node2)

    monkeypatch.setattr(scheduler.MixOrderReduction, "can_fuse", classmethod(noted))
    step = torch.compile(
        lambda x, w: torch.nn.functional.layer_norm(x, (8,)) * w,
        options=precision.inductor_options("cuda"),
    )
    x, w = torch.randn(4, 8, requires_grad=True), torch.randn(8, requires_grad=True)
    torch._dynamo.reset()
    # A cached graph skips the scheduler. The CPU's vector instructions are taken from its flags
    # (cpp.vec_isa_ok): Inductor would otherwise build and load a test program for each kind,
    # which took most of this test's time, and none of which the scheduling reads.
    try:
        with config.patch({"fx_graph_cache": False, "cpp.vec_isa_ok": True}):
            out = step(x, w)
            forward, seen[:] = list(seen), []
            out.sum().backward()
    finally:
        torch._dynamo.reset()  # and its counters, whose graph count others read
    assert forward and seen, "Inductor checked no fusion: this test checks nothing"
    assert not any(forward + seen), (forward, seen)
