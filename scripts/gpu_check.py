"""The first-GPU-run checklist (docs/gpu.md): every check prints one line and adds its figures
to one report, OUT/gpu_check.md (and OUT/gpu_check.json).

    bash scripts/gpu_check.sh                     # installs the project, then runs this
    python scripts/gpu_check.py --out DIR         # the checks alone

On a machine without a CUDA GPU it runs the checks that need none, says so and exits 0.
With a GPU it exits 1 if a check failed. Each check is given what is left of --minutes.
`--only WORD ...` runs the checks whose names hold one of the words (the rest read `skipped`),
for a short lease spent on what is not yet measured.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))  # bench_train, its wmt_shape

from bench_train import loss_ratios  # noqa: E402

from attn_mt.checkpoint import load_checkpoint  # noqa: E402
from attn_mt.configfile import load_config  # noqa: E402
from attn_mt.decode.search import (  # noqa: E402
    _StepDecoder,
    beam_search,
    greedy_search,
    max_output_lengths,
)
from attn_mt.model.attention import causal_mask  # noqa: E402
from attn_mt.model.transformer import LayerSpec, Transformer, build_model  # noqa: E402
from attn_mt.model.vocab import BOS_ID, PAD_ID  # noqa: E402
from attn_mt.precision import (  # noqa: E402
    DTYPES,
    autocast_context,
    avoid_cudnn_attention,
    configure_kernels,
    has_inductor_setting,
    resolve_precision,
    set_cuda_environment,
)
from attn_mt.train.loss import PROJECTION_CHUNK_GPU, label_smoothed_loss  # noqa: E402

CONFIGS = ROOT / "configs"
VOCAB = 32000  # a WMT-sized joint vocabulary for the memory figures
Figures = dict[str, Any]


class CheckFailed(Exception):
    """A check ran and found something wrong; the message says what."""


@dataclass
class Check:
    name: str
    run: Callable[[Context], Figures]
    gpu_only: bool


@dataclass
class Context:
    out: Path
    device: torch.device
    deadline: float  # time.monotonic() at which the budget ends
    only: tuple[str, ...] = ()  # words a check's name must hold one of; empty: every check
    results: list[dict[str, Any]] = field(default_factory=list)

    def seconds_left(self) -> float:
        return self.deadline - time.monotonic()

    def chosen(self, check: Check) -> bool:
        return not self.only or any(holds(check.name, word) for word in self.only)


def holds(name: str, word: str) -> bool:
    """Whether a check's name holds `word` (an --only word), case ignored."""
    return word.lower() in name.lower()


# ---------------------------------------------------------------------------------------------
# Helpers


def tiny_model(device: torch.device, seed: int = 0) -> Transformer:
    """A 3+3-layer model, random weights, dropout off: the Multi30k config's width on CUDA,
    a quarter of it on the CPU (where it only has to be quick)."""
    torch.manual_seed(seed)
    d_model = 256 if device.type == "cuda" else 64
    layer = LayerSpec(d_model=d_model, heads=4, d_ff=4 * d_model)
    return Transformer(1000, 1000, layer, 3, 3).to(device)


def random_batch(rows: int, src_len: int, tgt_len: int, vocab: int = 1000, seed: int = 0):
    """Right-padded random (src, tgt_in, tgt_out) on the CPU, rows of varied lengths."""
    gen = torch.Generator().manual_seed(seed)
    src = torch.randint(4, vocab, (rows, src_len), generator=gen)
    tgt = torch.randint(4, vocab, (rows, tgt_len + 1), generator=gen)
    tgt[:, 0] = BOS_ID
    for row in range(1, rows, 2):  # every other row shorter: padding on both sides
        src[row, src_len // 2 :] = PAD_ID
        tgt[row, tgt_len // 2 :] = PAD_ID
    return src, tgt[:, :-1], tgt[:, 1:]


def gradients(model: Transformer, batch, device: torch.device, precision: str) -> Figures:
    """Loss and gradients of one teacher-forced step of `model` on `batch`."""
    src, tgt_in, tgt_out = (t.to(device) for t in batch)
    model.zero_grad(set_to_none=True)
    with autocast_context(device, DTYPES[precision]):
        logits = model(src, tgt_in)  # (B, T, V)
    loss, _ = label_smoothed_loss(logits, tgt_out, 0.1)
    tokens = int((tgt_out != PAD_ID).sum())
    (loss / tokens).backward()
    # every parameter takes part in the loss: each has a gradient after backward()
    grads = {
        n: cast(torch.Tensor, p.grad).detach().float().cpu() for n, p in model.named_parameters()
    }
    return {"loss": float(loss.detach()) / tokens, "grads": grads}


def worst_relative(ours: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> float:
    """max over tensors of |ours - reference| / |reference| (Frobenius norms)."""
    return max(
        float((ours[n] - ref).norm() / ref.norm().clamp_min(1e-12)) for n, ref in reference.items()
    )


def attn_mt(*args: str, timeout: float, torchrun: bool = False) -> subprocess.CompletedProcess:
    """`attn-mt ARGS` (or under a one-process torchrun) in a subprocess; output captured."""
    launcher = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1"]
    command = [sys.executable, *(launcher if torchrun else []), "-m", "attn_mt", *args]
    proc = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=max(timeout, 1)
    )
    if proc.returncode != 0:
        raise CheckFailed(f"`{' '.join(args[:3])}` exited {proc.returncode}: {proc.stderr[-400:]}")
    return proc


def train(ctx: Context, name: str, config: str, *sets: str, resume: bool = False, **kw):
    """`attn-mt train` of a shipped config into OUT/runs/NAME on the GPU."""
    out = ctx.out / "runs" / name
    args = ["train", "--config", str(CONFIGS / config), "--device", "cuda"]
    args += ["--set", f"train.out_dir={out}", *[a for s in sets for a in ("--set", s)]]
    attn_mt(*args, *(["--resume"] if resume else []), timeout=ctx.seconds_left(), **kw)
    return out


def metrics(run: Path, split: str) -> list[dict[str, Any]]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [m for m in map(json.loads, lines) if m["split"] == split]


# ---------------------------------------------------------------------------------------------
# Checks that also run on the CPU


def environment(ctx: Context) -> Figures:
    figures: Figures = {"torch": torch.__version__, "python": sys.version.split()[0]}
    figures["device"] = str(ctx.device)
    figures["auto precision"] = resolve_precision("auto", ctx.device)
    figures["PYTORCH_CUDA_ALLOC_CONF"] = os.environ.get("PYTORCH_CUDA_ALLOC_CONF")
    if ctx.device.type == "cuda":
        figures["gpu"] = torch.cuda.get_device_name(ctx.device)
        figures["capability"] = torch.cuda.get_device_capability(ctx.device)
        figures["cuda"] = torch.version.cuda
        figures["memory GiB"] = torch.cuda.get_device_properties(ctx.device).total_memory / 2**30
    return figures


def presets(ctx: Context) -> Figures:
    """The GPU configs load (the WMT14 data need not be here); their sizes and batches."""
    figures = {}
    for name in ("wmt14_en_de_base", "wmt14_en_de_big", "multi30k_de_en_gpu"):
        cfg = load_config(CONFIGS / f"{name}.yaml")
        m, t = cfg.model, cfg.train
        figures[name] = (
            f"d_model {m.d_model}, {m.encoder_layers}+{m.decoder_layers} layers, "
            f"{t.batch_tokens * t.accumulate} tokens per update, {t.max_steps} updates"
        )
    return figures


def cached_decoding(ctx: Context) -> Figures:
    """Step-by-step decoding with the key/value cache gives the whole-prefix logits."""
    configure_kernels(deterministic=False, tf32=False)
    model = tiny_model(ctx.device).eval()
    src, tgt_in, _ = random_batch(4, 12, 10)
    src, tgt = src[:, :6].to(ctx.device), tgt_in[:, :8].to(ctx.device)  # no padding: stepwise
    figures = {}
    for precision in ("fp32", "bf16") if ctx.device.type == "cuda" else ("fp32",):
        with torch.no_grad(), autocast_context(ctx.device, DTYPES[precision]):
            src_mask = (src != PAD_ID)[:, None, None, :]
            memory = model.encode(src, src_mask)
            full = model.decode(tgt, memory, src_mask).float()
            cache = model.new_cache()
            steps = [model.decode(tgt[:, i : i + 1], memory, src_mask, cache) for i in range(8)]
            cached = torch.cat(steps, dim=1).float()
        figures[f"{precision} max |diff|"] = float((full - cached).abs().max())
    if figures["fp32 max |diff|"] > 1e-4:
        raise CheckFailed(f"cached decoding differs from full decoding: {figures}")
    return figures


def mask_free_attention(ctx: Context) -> Figures:
    """The decoder's causal flag (flash on CUDA, forced there) equals causal & padding masks."""
    model = tiny_model(ctx.device).eval()
    src, tgt_in, _ = (t.to(ctx.device) for t in random_batch(4, 16, 16))
    precision = "bf16" if ctx.device.type == "cuda" else "fp32"
    with torch.no_grad(), autocast_context(ctx.device, DTYPES[precision]):
        src_mask = (src != PAD_ID)[:, None, None, :]
        memory = model.encode(src, src_mask)
        if ctx.device.type == "cuda":
            from torch.nn.attention import SDPBackend, sdpa_kernel

            # Through decode, as training and translation call it: flash takes no mask, so
            # a decoder that passed one to self-attention is an error here. Cross-attention is
            # given no source mask for this call (flash would refuse it too); not compared.
            with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
                model.decode(tgt_in, memory, None)
        mask_free = model.decode(tgt_in, memory, src_mask).float()
        self_mask = causal_mask(tgt_in.size(1), ctx.device) & (tgt_in != PAD_ID)[:, None, None]
        y = model.tgt_embed(tgt_in)
        for layer in model.decoder:
            y = layer(y, memory, self_mask, src_mask)
        masked = model.output(model.decoder_norm(y)).float()
    real = tgt_in != PAD_ID
    diff = float((mask_free - masked)[real].abs().max())
    if diff > (5e-2 if precision == "bf16" else 1e-4):
        raise CheckFailed(f"the mask-free decoder differs from the masked one by {diff}")
    return {"precision": precision, "max |diff| at real positions": diff}


HOST_READS = (
    "tolist",
    "item",
    "nonzero",
    "cpu",
    "numpy",
    "__bool__",
    "__float__",
    "__int__",
    "__index__",
)


@contextlib.contextmanager
def counted(owner: type, names: tuple[str, ...]) -> Iterator[list[str]]:
    """The names of the calls of `owner`'s methods `names` while inside, in order."""
    calls: list[str] = []
    saved = {name: owner.__dict__.get(name) for name in names}

    def counting(name: str, method: Callable) -> Callable:
        def call(self, *args, **kwargs):
            calls.append(name)
            return method(self, *args, **kwargs)

        return call

    for name in names:
        setattr(owner, name, counting(name, getattr(owner, name)))
    try:
        yield calls
    finally:
        for name, method in saved.items():
            if method is None:
                delattr(owner, name)
            else:
                setattr(owner, name, method)


def device_waits(work: Callable[[], object]) -> int:
    """How many times `work()` made the CPU wait for the GPU, as torch's sync debug mode
    counts them (each a warning)."""
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            work()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught)


def decoding(ctx: Context) -> Figures:
    """Greedy and beam-5 search of 128 random sources with the random model: milliseconds per
    step, and how often a step reads tensor values on the host (on a GPU each read waits for
    the device; docs/gpu.md)."""
    model = tiny_model(ctx.device).eval()
    src = random_batch(128, 20, 2)[0].to(ctx.device)
    limits = max_output_lengths(src, 1.0, 10)
    precision = "bf16" if ctx.device.type == "cuda" else "fp32"
    searches = {
        "greedy": lambda: greedy_search(model, src, limits),
        "beam 5": lambda: beam_search(model, src, limits, 5),
    }
    figures: Figures = {}
    for name, search in searches.items():
        with torch.no_grad(), autocast_context(ctx.device, DTYPES[precision]):
            search()  # warm-up
            with (
                counted(torch.Tensor, HOST_READS) as reads,
                counted(_StepDecoder, ("log_probs",)) as steps,
            ):
                search()
            if ctx.device.type == "cuda":
                torch.cuda.synchronize(ctx.device)
            start = time.perf_counter()
            search()
            if ctx.device.type == "cuda":
                torch.cuda.synchronize(ctx.device)
            seconds = time.perf_counter() - start
        figures[f"{name} ms per step"] = 1000 * seconds / len(steps)
        figures[f"{name} host reads per step"] = len(reads) / len(steps)
        if ctx.device.type == "cuda":
            with torch.no_grad(), autocast_context(ctx.device, DTYPES[precision]):
                figures[f"{name} device waits per step"] = device_waits(search) / len(steps)
    figures["precision"] = precision
    return figures


# ---------------------------------------------------------------------------------------------
# Checks that need the GPU


def numerics(ctx: Context) -> Figures:
    """One step on the CPU (fp32) and on CUDA (fp32 with TF32 off; bf16): loss and gradients."""
    configure_kernels(deterministic=False, tf32=False)
    torch.manual_seed(0)
    model = Transformer(1000, 1000, LayerSpec(d_model=256, heads=4, d_ff=1024), 3, 3)
    batch = random_batch(16, 24, 22)
    reference = gradients(model, batch, torch.device("cpu"), "fp32")
    model.to(ctx.device)
    figures, limits = {}, {"fp32": 1e-4, "bf16": 5e-2}
    for precision, limit in limits.items():
        ours = gradients(model, batch, ctx.device, precision)
        figures[f"{precision} loss rel diff"] = abs(ours["loss"] / reference["loss"] - 1)
        figures[f"{precision} worst grad rel diff"] = worst_relative(
            ours["grads"], reference["grads"]
        )
        if figures[f"{precision} worst grad rel diff"] > limit:
            raise CheckFailed(f"{precision} gradients differ from the CPU's: {figures}")
    configure_kernels(deterministic=False, tf32=True)
    return figures


def deterministic_resume(ctx: Context) -> Figures:
    """tiny.yaml with train.deterministic: 20 updates straight == 10 + resume to 20, bit for bit;
    and whether a second straight run without it differs."""
    sets = ("train.deterministic=true", "train.max_steps=20", "train.eval_every=10")
    straight = train(ctx, "det-straight", "tiny.yaml", *sets)
    train(ctx, "det-resumed", "tiny.yaml", *sets[:1], "train.max_steps=10", "train.eval_every=10")
    resumed = train(ctx, "det-resumed", "tiny.yaml", *sets, resume=True)
    loose = train(ctx, "nondet", "tiny.yaml", "train.max_steps=20", "train.eval_every=10")
    a, b, c = (
        load_checkpoint(r / "checkpoints" / "last.pt")["model"] for r in (straight, resumed, loose)
    )
    unequal = [name for name in a if not torch.equal(a[name], b[name])]
    if unequal:
        raise CheckFailed(f"resumed != straight with train.deterministic: {unequal[:3]}")
    differ = sum(not torch.equal(a[name], c[name]) for name in a)
    return {"resume bit-exact": True, "tensors that differ without deterministic": differ}


def short_run(precision: str) -> Callable[[Context], Figures]:
    def run(ctx: Context) -> Figures:
        start = time.monotonic()
        sets = (f"train.precision={precision}", "train.max_steps=600", "train.eval_every=600")
        out = train(ctx, f"multi30k-{precision}", "multi30k_de_en_gpu.yaml", *sets)
        last = metrics(out, "valid")[-1]
        trained = metrics(out, "train")
        if not all(map(lambda m: m["loss"] == m["loss"], trained)):
            raise CheckFailed(f"{precision}: a NaN training loss")
        figures: Figures = {k: last[k] for k in ("step", "loss", "bleu") if k in last}
        # train.log's last validation line ends with its seconds by phase.
        log = (out / "train.log").read_text()
        timings = re.findall(r"valid step .*BLEU .*\(best[^)]*\)\s+(.+)$", log, flags=re.M)
        figures["last validation"] = timings[-1] if timings else "no timing in train.log"
        return figures | {"minutes": (time.monotonic() - start) / 60}

    return run


def one_process_all_reduce(backend: str, device: torch.device) -> Figures:
    """A process group of `backend` with this process alone (world size 1), one all_reduce of
    a tensor on `device`, then the group destroyed."""
    import torch.distributed as dist

    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    try:
        values = torch.arange(4.0, device=device)
        dist.all_reduce(values)  # one rank: the sum is the tensor itself
        if not torch.equal(values.cpu(), torch.arange(4.0)):
            raise CheckFailed(f"{backend} all_reduce over one rank gave {values.tolist()}")
        return {"backend": dist.get_backend(), "all_reduce": "equal"}
    finally:
        dist.destroy_process_group()


def nccl_one_process(ctx: Context) -> Figures:
    """NCCL started for real (a one-rank group and an all_reduce on the GPU), then `attn-mt
    train` under a one-process torchrun (which needs no process group, so starts no NCCL)."""
    figures = one_process_all_reduce("nccl", ctx.device)
    figures["nccl version"] = str(torch.cuda.nccl.version())
    out = train(ctx, "nccl", "tiny.yaml", "train.max_steps=10", torchrun=True)
    log = (out / "train.log").read_text()
    if "1 process(es)" not in log:
        raise CheckFailed("the torchrun run did not log one process")
    return figures | {"torchrun steps": metrics(out, "train")[-1]["step"]}


def bench(size: str) -> Callable[[Context], Figures]:
    def run(ctx: Context) -> Figures:
        script = ROOT / "scripts" / "bench_train.py"
        args = [sys.executable, str(script), "--device", "cuda", "--quick", "--size", size]
        proc = subprocess.run(args, capture_output=True, text=True, timeout=ctx.seconds_left())
        if proc.returncode != 0:
            raise CheckFailed(f"bench_train.py exited {proc.returncode}: {proc.stderr[-400:]}")
        (ctx.out / f"bench_train_{size}.txt").write_text(proc.stdout)
        figures = json.loads(proc.stdout.strip().splitlines()[-1])
        return {
            f"{row['precision']} {model}": {
                k: row[model][k] for k in ("tokens_per_s", "mfu", "mfu_spec")
            }
            for row in figures["results"]
            for model in ("attn-mt", "nn.Transformer")
        }

    return run


BASE = ("model.d_model=512", "model.heads=8", "model.encoder_layers=6",
        "model.decoder_layers=6", "model.d_ff=2048")  # fmt: skip  # transformer-base


WMT_BENCH = ("--device", "cuda", "--size", "base", "--vocab", "32000", "--batch-tokens",
             "25000", "--precisions", "bf16", "--pairs", "500000", "--rounds", "2",
             "--batches", "20")  # fmt: skip
WMT_TURNS = {  # one process each: a budget that stops one keeps the rows of those before
    "eager": ("--compile", "off", "--loss", "both"),
    "compiled logits": ("--compile", "on", "--loss", "logits"),
    "compiled projected": ("--compile", "on", "--loss", "projected"),
}


def bench_turns(
    ctx: Context, turns: dict[str, list[str]], prefix: str = "bench_train"
) -> tuple[list[dict], dict[str, str]]:
    """Each turn's command (a scripts/*.py run) in turn with what is left of the budget: the
    `result` rows they printed, a turn the budget stopped keeping the rows it printed before,
    and each turn's outcome ("done", or why not). A turn that fails is a failed check. Each
    turn's output is kept as `prefix`_TURN.txt."""
    rows: list[dict] = []
    outcome: dict[str, str] = {}
    for name, command in turns.items():
        if ctx.seconds_left() <= 0:
            outcome[name] = "not run: out of time (--minutes)"
            continue
        try:
            proc = subprocess.run(command, capture_output=True, text=True,
                                  timeout=ctx.seconds_left())  # fmt: skip
            text, outcome[name] = proc.stdout, "done"
            if proc.returncode != 0:
                raise CheckFailed(f"{name}: exited {proc.returncode}: {proc.stderr[-400:]}")
        except subprocess.TimeoutExpired as error:  # what it printed so far still counts
            printed = error.stdout or ""
            text = printed.decode(errors="replace") if isinstance(printed, bytes) else printed
            outcome[name] = f"stopped after {error.timeout:.0f} s, what was left of --minutes"
        (ctx.out / f"{prefix}_{name.replace(' ', '_')}.txt").write_text(text)
        rows += [json.loads(line[len("result ") :]) for line in text.splitlines()
                 if line.startswith("result {")]  # fmt: skip
    return rows, outcome


def wmt_base_bench(ctx: Context) -> Figures:
    """bench_train at transformer-base over a 32k vocabulary on WMT-shaped batches of 25,000
    tokens, bf16: the full logits and projected_loss, eager, then each torch.compile'd (tokens/s,
    ms/step, peak MiB, MFU of the data sheet, the compile's warm-up seconds and graphs), and
    the speed ratios of compiled to eager and projected to logits."""
    script = str(ROOT / "scripts" / "bench_train.py")
    turns = {name: [sys.executable, script, *WMT_BENCH, *more] for name, more in WMT_TURNS.items()}
    results, outcome = bench_turns(ctx, turns)
    keys = ("tokens_per_s", "step_ms", "peak_mib", "warmup_s", "graphs", "mfu_spec")
    mode = {True: "compiled", False: "eager"}
    figures: Figures = {
        f"{r['batch_tokens']} {r['loss']} {mode[r['compiled']]} {r['shapes']}": {
            k: r.get(k) for k in keys
        }
        for r in results
    }
    figures["projected/logits"] = loss_ratios(results, "loss", "logits", "projected")
    figures["compiled/eager"] = loss_ratios(results, "compiled", False, True)
    return figures | {"turns": outcome}


def step_profile(ctx: Context) -> Figures:
    """profile_step.py --mode compiled: transformer-base over a 32k vocabulary on 25,000-token
    WMT-shaped batches, bf16, the trainer's loss: ms/step, tokens/s, MFU of the data sheet,
    how far the host ran ahead of the device, and the profiled kernels' milliseconds per
    update by kind; in the same process the loss in 4x smaller chunks (more calls from the
    host), which keeps the default's choice checked; then a turn for each of INDUCTOR_TURNS'
    settings this torch has. Its tables and traces go to `--out`/profile_step/."""
    turns = {"compiled": ["--projection-chunk", str(PROJECTION_CHUNK_GPU // 4)]}
    for name, pair in INDUCTOR_TURNS.items():
        if has_inductor_setting(pair.partition("=")[0]):
            turns[name] = ["--inductor", pair]
    return profile_turns(ctx, turns, "profile_step")


def compiled_reference(ctx: Context) -> Figures:
    """profile_step.py --compiled-reference --reference-only: `nn.Transformer` through
    torch.compile on the step profile's batches, its full-logits loss in the same graph; attn-mt
    is not compiled and timed again (its rows are the step profile's). Its files go to
    `--out`/profile_reference/."""
    turn = {"compiled reference": ["--compiled-reference", "--reference-only"]}
    return profile_turns(ctx, turn, "profile_reference", profile_steps=1)


# Inductor settings, a step profile turn each over the trainer's (what each measured:
# docs/gpu.md): mix-order reductions, Inductor's own default, keep the trainer's choice
# checked; the C++ wrapper launches a graph's kernels from C++ instead of Python.
INDUCTOR_TURNS = {"mix-order reductions": "triton.mix_order_reduction=1",
                  "C++ wrapper": "cpp_wrapper=1"}  # fmt: skip


def profile_turns(
    ctx: Context, turns: dict[str, list[str]], folder: str, profile_steps: int = 5
) -> Figures:
    """profile_step.py --mode compiled at the WMT shape, once a turn with the turn's options:
    its rows by name, and each turn's outcome (`bench_turns`)."""
    script = str(ROOT / "scripts" / "profile_step.py")
    command = [sys.executable, script, "--device", "cuda", "--mode", "compiled",
               "--profile-steps", str(profile_steps), "--out", str(ctx.out / folder)]  # fmt: skip
    runs = {name: [*command, *options] for name, options in turns.items()}
    rows, outcome = bench_turns(ctx, runs, prefix=folder)
    return {row.pop("row"): row for row in rows} | {"turns": outcome}


def kernel_bench(ctx: Context) -> Figures:
    """bench_kernels.py: flash against memory-efficient attention at WMT lengths, then the
    layer-norm backward kernels of pre-norm blocks eager and compiled four ways; each part in
    its own process, so the budget stopping the second keeps the first."""
    script = str(ROOT / "scripts" / "bench_kernels.py")
    turns = {part: [sys.executable, script, "--only", part] for part in ("attention", "layernorm")}
    rows, outcome = bench_turns(ctx, turns, prefix="bench_kernels")
    return {row.pop("name"): row for row in rows} | {"turns": outcome}


def train_log_figures(log: str) -> Figures:
    """From a train.log: the train.compile line (the choice and, for auto, ms/update each way),
    each validation's seconds by phase, and where the run's time went (its closing timesheet:
    start-up, updates, validation, checkpoints, each with its share)."""
    chosen = re.findall(r"train\.compile \S+: .*$", log, flags=re.M)
    phases = re.findall(r"^\S+ \S+ (valid step \d+).*?\s{2}([\d.]+ s: .+)$", log, flags=re.M)
    sheet = re.findall(r"time in this process (.+)$", log, flags=re.M)
    return {
        "compile": chosen[-1] if chosen else "no train.compile line",
        **dict(phases),
        "time": sheet[-1] if sheet else "no timesheet line",
    }


def auto_compile_run(ctx: Context) -> Figures:
    """`attn-mt train` on Multi30k at transformer-base size with train.compile auto: what it
    chose and the ms/update it measured each way, validation's seconds by phase, the run's
    timesheet, and the share of the command's wall time that validation took."""
    start = time.monotonic()
    sets = (*BASE, "train.compile=auto", "train.max_steps=400", "train.eval_every=200",
            "train.valid_max_sentences=500")  # fmt: skip
    out = train(ctx, "base-compile-auto", "multi30k_de_en_gpu.yaml", *sets)
    wall = time.monotonic() - start
    figures = train_log_figures((out / "train.log").read_text())
    validated = sum(float(v.split(" s:")[0]) for k, v in figures.items() if k.startswith("valid"))
    return figures | {"wall s": wall, "validation share of wall": validated / wall}


def read_later(ctx: Context) -> Figures:
    """Multi30k at transformer-base size in this process, 300 updates logged every 100: each
    update read one update later (what the trainer does) against each read at once; target
    tokens/s of the last 200 and the last logged loss each way (bit-for-bit equality is
    tests/unit/train/test_pending.py's, on the CPU: here atomics make any two runs differ)."""
    from attn_mt.configfile import load_config
    from attn_mt.train.loop import Trainer

    figures = {}
    for mode in ("at once", "one later"):
        out = ctx.out / "runs" / f"read-{mode.replace(' ', '-')}"
        sets = (*BASE, "train.max_steps=300", "train.log_every=100", "train.eval_every=1000",
                f"train.out_dir={out}")  # fmt: skip
        trainer = Trainer(load_config(CONFIGS / "multi30k_de_en_gpu.yaml", sets), device=ctx.device)
        if mode == "at once":
            trainer._read_now = lambda: True  # type: ignore[method-assign]
        trainer.run()
        rows = metrics(out, "train")[1:]  # the first window holds the warm-up
        figures[f"tgt tok/s, read {mode}"] = sum(r["tokens_per_sec"] for r in rows) / len(rows)
        figures[f"loss at 300, read {mode}"] = rows[-1]["loss"]
    later, now = figures["tgt tok/s, read one later"], figures["tgt tok/s, read at once"]
    return figures | {"speed-up": later / now}


def peak_memory(ctx: Context) -> Figures:
    """One AdamW update of transformer-base and -big at a 32k vocabulary, at the config's batch
    of its longest sentences (max_len), with and without activation checkpointing."""
    figures = {}
    for name in ("wmt14_en_de_base", "wmt14_en_de_big"):
        cfg = load_config(CONFIGS / f"{name}.yaml")
        length = cfg.data.max_len
        batch = random_batch(max(1, cfg.train.batch_tokens // length), length, length, VOCAB)
        precision = resolve_precision(cfg.train.precision, ctx.device)
        for checkpointing in (False, True):
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(ctx.device)
            model = build_model(cfg, VOCAB, VOCAB).to(ctx.device)
            model.activation_checkpointing = checkpointing
            optimizer = torch.optim.AdamW(model.parameters(), fused=True)
            gradients(model, batch, ctx.device, precision)
            optimizer.step()
            torch.cuda.synchronize(ctx.device)
            key = f"{name} {precision}{' checkpointed' if checkpointing else ''} GiB"
            figures[key] = torch.cuda.max_memory_allocated(ctx.device) / 2**30
            del model, optimizer
    return figures


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
        if result["status"] != "skipped":  # a lease cut short keeps what its checks found
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


if __name__ == "__main__":
    sys.exit(main())
