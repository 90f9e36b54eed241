"""What a training step's milliseconds are made of: the WMT workload of `bench_train.py --vocab`
under torch.profiler, one `--mode` per process.

The model at `--size` over a `--vocab` vocabulary, the trainer's loss (`SmoothedObjective`,
`projected_loss`), on synthetic pairs of WMT's lengths in attn-mt's length buckets of
`--batch-tokens`, fused AdamW and gradient clipping as in `bench_train.py`. `--mode`:
`eager`; `compiled` (torch.compile as train.compile runs it, the loss's chunks fused);
`cudagraphs` (the same with `mode="reduce-overhead"`: each batch shape is recorded once as a
CUDA graph and replayed, so a step launches a few graphs instead of hundreds of kernels).

After `--warmup` updates (each timed shape at least once), it reports for one batch shape
repeated (`fixed`) and bucketed batches of varied shapes (`bucketed`):
- ms per step, target tokens/s and MFU (against the data sheet on a known GPU) unprofiled;
- the host's share: when the host had queued the window's last update, against when the
  device finished it (near 1: the device waits on the host);
- on CUDA, how far the host ran ahead of the device as it queued each phase of an update
  (forward, backward, optimizer; a CUDA event each): the median lead in ms, and the share of
  phases at which the device had nothing queued and waited on the host (`device_waited_share`;
  near 0 with a lead of a step or more: the device sets the pace; near 1: the host does);
- then `--profile-steps` steps under torch.profiler (0: none): aten operations and (on CUDA) kernels
  launched per step, the time the device was busy per step (the union of its kernels'
  intervals), the top kernels by device time and the top host operations, on CUDA each
  kernel with its launch, registers and occupancy (`read_trace.py`), and a Chrome trace
  (`--out`/MODE_SHAPES_profile.txt and _trace.json.gz; open the trace in Perfetto).
With `--reference`, eager `nn.Transformer` (bench_train's `Reference`, its full logits and
loss) is timed on the same batches; with `--compiled-reference` also the same through
torch.compile (the model and its loss in one graph, as `compiled` compiles attn-mt's);
`--reference-only` times those alone, for a run that compares them with an earlier profile's.
`--inductor KEY=VALUE` (repeatable) sets an Inductor setting for the whole process before
anything compiles (`cpp_wrapper=1`), over the trainer's own (`precision.INDUCTOR_OPTIONS`:
`triton.mix_order_reduction=1` times the former default); its rows and files are named with
it.
`--projection-chunk N` (repeatable) also times attn-mt, the same model in the same process,
with N logit elements per chunk of the trainer's loss (in place of the trainer's
`projection_chunk`: fewer, larger chunks are fewer calls from the host and hold more
memory), its rows named with it. On CUDA each row has the peak memory of its own windows
(`peak_mib`; every model of the process stays in memory; the report's is the process's).
`--count-shapes` counts the distinct batch shapes of one epoch of the bucketed corpus, as
they are and with lengths rounded up to multiples.

    python scripts/profile_step.py --device cuda --size base --vocab 32000 --mode compiled
    python scripts/profile_step.py --size config --vocab 8000 --batch-tokens 2000 --quick

The last line is one JSON object with every figure (also `--out`/MODE.json).
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_kernels import inductor_settings  # noqa: E402
from bench_train import (  # noqa: E402
    DTYPES,
    SIZES,
    Reference,
    compiled_graphs,
    logits_loss,
    spec_peak,
    step_flops,
    sync,
    wmt_dropout,
)
from read_trace import kernel_kind, kernel_rows, load_events  # noqa: E402
from read_trace import table as trace_table  # noqa: E402
from wmt_shape import timed_batches, wmt_lengths  # noqa: E402

from attn_mt.configfile import config_from_dict, load_config  # noqa: E402
from attn_mt.data.batching import Batch, length_batches  # noqa: E402
from attn_mt.model.transformer import build_model  # noqa: E402
from attn_mt.precision import (  # noqa: E402
    configure_kernels,
    inductor_options,
    set_cuda_environment,
)
from attn_mt.train import loss as trainer_loss  # noqa: E402
from attn_mt.train.loss import SmoothedObjective  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MODES = ("eager", "compiled", "cudagraphs")


def objective_step(model, mode: str, options: dict[str, Any]):
    """`step(batch, dtype)` -> the summed loss of the trainer's objective in `mode`, compiled
    with the Inductor settings `options` (the trainer's, --inductor's over them)."""
    objective = SmoothedObjective(model, 0.1)
    module: Callable[..., Any]  # the objective, or torch.compile's wrapper of it
    if mode == "eager":
        module = objective
    else:
        if mode == "cudagraphs":  # torch.compile takes a mode or options, not both
            options = options | torch._inductor.list_mode_options("reduce-overhead")
        module = torch.compile(objective, options=options or None)
    objective.fuse(mode != "eager", options)

    def step(batch: Batch, dtype: torch.dtype) -> torch.Tensor:
        if mode == "cudagraphs":  # a new update: the graphs' outputs of the last may be reused
            torch.compiler.cudagraph_mark_step_begin()
        objective.tokens = batch.num_tgt_tokens
        with torch.autocast(batch.src.device.type, dtype=dtype, enabled=dtype != torch.float32):
            return module(batch.src, batch.tgt_in, batch.tgt_out)[0]

    return step


def with_chunk(step, elements: int):
    """`step` with `elements` logit elements per chunk of the trainer's loss (its forward makes
    the chunks and their gradients; backward only scales them), the setting restored after."""

    def chunk(device_type: str) -> int:
        return elements

    def chunked(batch: Batch, dtype: torch.dtype) -> torch.Tensor:
        saved = trainer_loss.projection_chunk
        trainer_loss.projection_chunk = chunk
        try:
            return step(batch, dtype)
        finally:
            trainer_loss.projection_chunk = saved

    return chunked


def reference_steps(cfg, args, device, warm, dtype, report: dict) -> dict:
    """`nn.Transformer` (bench_train's `Reference`) eagerly with `--reference` and through
    torch.compile with `--compiled-reference`, warmed up on `warm`: {row name: (step, its
    parameters, its optimizer)}. The compiled one's warm-up seconds (compiling in them) go
    into `report`."""
    ref = Reference(cfg.model, args.vocab).to(device).train()
    params = list(ref.parameters())
    optimizer = torch.optim.AdamW(params, lr=1e-4, fused=device.type == "cuda")

    def step(batch: Batch, dtype: torch.dtype) -> torch.Tensor:
        return logits_loss(ref, batch, dtype)

    steps = {}
    if args.reference:
        steps["nn.Transformer"] = step
    if args.compiled_reference:
        steps["nn.Transformer compiled"] = torch.compile(step)
    models = {}
    for name, fn in steps.items():
        start, graphs = time.perf_counter(), compiled_graphs()
        updates(fn, params, optimizer, warm, dtype)
        sync(device)
        if name.endswith("compiled"):
            report["reference_warmup_s"] = time.perf_counter() - start
            report["reference_graphs"] = compiled_graphs() - graphs
        models[name] = (fn, params, optimizer)
    return models


def warmed_up(cfg, args, device, warm, dtype, report: dict) -> tuple:
    """attn-mt's (step, parameters, optimizer) in `--mode` with the Inductor settings of
    `report` (`inductor`), warmed up on `warm`; its warm-up seconds (compiling in them) and
    graphs go into `report`."""
    model = build_model(cfg, args.vocab, args.vocab).to(device).train()
    params = list(model.parameters())
    optimizer = torch.optim.AdamW(params, lr=1e-4, fused=device.type == "cuda")
    step = objective_step(model, args.mode, report["inductor"])
    start, before = time.perf_counter(), compiled_graphs()  # the process may have made some
    updates(step, params, optimizer, warm, dtype)
    sync(device)
    report["warmup_s"] = time.perf_counter() - start
    report["graphs"] = compiled_graphs() - before
    print(f"warm-up: {report['warmup_s']:.1f} s, {report['graphs']} graph(s)", flush=True)
    return step, params, optimizer


def updates(step, params, optimizer, batches, dtype, label: bool = False, marks=None) -> int:
    """One update per batch as the trainer makes it; no synchronisation. Returns tgt tokens.
    `label`: each phase a profiler range; `marks` (a list, CUDA): (host seconds, CUDA event)
    appended as each phase is queued."""
    tokens = 0
    for batch in batches:
        with phase("forward+loss", label, marks):
            loss = step(batch, dtype)
        with phase("backward", label, marks):
            (loss / batch.num_tgt_tokens).backward()
        with phase("clip+adamw", label, marks):
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        tokens += batch.num_tgt_tokens
    return tokens


@contextlib.contextmanager
def phase(name: str, label: bool, marks: list | None):
    """A phase of an update: a profiler range with `label`; with `marks`, a CUDA event queued
    at its start and the host's clock just after."""
    if marks is not None:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        marks.append((time.perf_counter(), event))
    with torch.profiler.record_function(name) if label else contextlib.nullcontext():
        yield


def host_leads(host_s: list[float], device_ms: list[float]) -> list[float]:
    """How far the host was ahead of the device at each mark, in ms: when the device reached
    the mark after the host queued it. Both clocks count from the first mark, queued onto an
    idle device. Near 0: the device had nothing else queued and waited on the host."""
    pairs = zip(host_s, device_ms, strict=True)
    return [device - 1e3 * (host - host_s[0]) for host, device in pairs]


WAITED_MS = 0.1  # a lead under this: the device had nothing queued (an event's launch: ~10 µs)


def lead_figures(windows: list[dict]) -> dict:
    """Over the windows' marks (each window's first apart: its clocks' origin), the median
    lead of the host in ms and the share of marks at which the device waited on the host;
    None without CUDA."""
    leads = [lead for w in windows if w["leads"] for lead in w["leads"][1:]]
    if not leads:
        return {"host_lead_ms": None, "device_waited_share": None}
    waited = sum(lead < WAITED_MS for lead in leads) / len(leads)
    return {"host_lead_ms": float(np.median(leads)), "device_waited_share": waited}


def timed(step, params, optimizer, batches, dtype, device) -> dict:
    """Seconds of a window of updates, the host's queueing time, the tokens and, on CUDA, how
    far the host ran ahead of the device as each phase of an update was queued (`leads`)."""
    marks: list | None = [] if device.type == "cuda" else None
    sync(device)
    start = time.perf_counter()
    tokens = updates(step, params, optimizer, batches, dtype, marks=marks)
    queued = time.perf_counter() - start
    sync(device)
    took = time.perf_counter() - start
    leads = None
    if marks:
        first = marks[0][1]
        leads = host_leads([h for h, _ in marks], [first.elapsed_time(e) for _, e in marks])
    return {"seconds": took, "queued": queued, "tokens": tokens, "leads": leads}


def profiled(step, params, optimizer, batches, dtype, device, out: Path, name: str) -> dict:
    """Kernels per step, the device's busy time per step and the profile's tables."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    sync(device)
    with torch.profiler.profile(activities=activities) as prof:
        start = time.perf_counter()
        updates(step, params, optimizer, batches, dtype, label=True)
        sync(device)
        wall = time.perf_counter() - start
    intervals, kernels, copies, host_ops = [], 0, 0, 0
    by_kind: dict[str, float] = {}
    for event in prof.profiler.kineto_results.events():
        if event.is_user_annotation():  # the labels' spans, on the GPU's timeline too
            continue
        if event.device_type() != torch.autograd.DeviceType.CUDA:
            host_ops += event.name().startswith("aten::")
            continue
        begin = event.start_ns()
        intervals.append((begin, begin + event.duration_ns()))
        kind = kernel_kind(event.name())
        by_kind[kind] = by_kind.get(kind, 0.0) + event.duration_ns() / 1e6 / len(batches)
        if event.name().startswith(("Memcpy", "Memset")):
            copies += 1
        else:
            kernels += 1
    busy = _union_ns(intervals) / 1e9
    n = len(batches)
    sort = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    averages = prof.key_averages()  # seconds to build on a long profile: once for both
    table = averages.table(sort_by=sort, row_limit=40, max_name_column_width=70)
    host = averages.table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=70)
    head = f"{n} updates profiled, wall {wall:.3f} s"
    trace = out / f"{name}_trace.json"
    prof.export_chrome_trace(str(trace))
    try:  # a table to read, not a figure: its failing must not stop the profile's run
        by_kernel = kernel_rows(load_events(trace), n)  # none on the CPU
        launches = f"\n\nkernels (read_trace.py)\n{trace_table(by_kernel, 40)}" if by_kernel else ""
    except (ValueError, KeyError, TypeError) as err:
        launches = f"\n\nkernels: the trace could not be read ({err!r})"
    (out / f"{name}_profile.txt").write_text(
        f"{head}\n\nby device time\n{table}\n\nby host time\n{host}{launches}\n"
    )
    with trace.open("rb") as raw, gzip.open(str(trace) + ".gz", "wb") as packed:
        shutil.copyfileobj(raw, packed)
    trace.unlink()
    cuda = device.type == "cuda"
    return {
        "steps": n,
        "profiled_wall_ms_per_step": 1e3 * wall / n,
        "aten_ops_per_step": host_ops / n,
        "device_busy_ms_per_step": 1e3 * busy / n if cuda else None,
        "kernels_per_step": kernels / n if cuda else None,
        "copies_per_step": copies / n if cuda else None,
        "kernel_ms_per_step": dict(sorted(by_kind.items(), key=lambda kv: -kv[1])) or None,
    }


def _union_ns(intervals: list[tuple[int, int]]) -> int:
    total, end = 0, None
    for begin, stop in sorted(intervals):
        if end is None or begin > end:
            total += stop - begin
            end = stop
        elif stop > end:
            total += stop - end
            end = stop
    return total


def count_shapes(lengths: np.ndarray, batch_tokens: int) -> dict:
    """Distinct (rows, source length, target length) shapes of one epoch's batches, as made
    and with lengths rounded up to multiples of 8, 16, 32 and 64."""
    rows = length_batches(lengths, batch_tokens)
    counts = {}
    for multiple in (1, 8, 16, 32, 64):
        shapes = set()
        for picked in rows:
            src, tgt = lengths[picked, 0].max() + 1, lengths[picked, 1].max() + 1  # + <eos>/<bos>
            src, tgt = (-(-int(x) // multiple) * multiple for x in (src, tgt))
            shapes.add((len(picked), src, tgt))
        counts[f"x{multiple}"] = len(shapes)
    counts["batches"] = len(rows)
    return counts


def parse(argv: list[str] | None) -> tuple[argparse.Namespace, torch.device, dict[str, Any]]:
    """The arguments, the device and the --inductor settings, every value checked (one line
    and exit 2 for a wrong one) before anything is built."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(ROOT / "configs" / "multi30k_de_en.yaml"))
    parser.add_argument("--device", default="auto")
    parser.add_argument("--size", choices=tuple(SIZES), default="base")
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--batch-tokens", type=int, default=25000)
    parser.add_argument("--pairs", type=int, default=500_000)
    parser.add_argument("--precision", choices=tuple(DTYPES), default=None,
                        help="default: bf16 on CUDA, fp32 on the CPU")  # fmt: skip
    parser.add_argument("--mode", choices=MODES, default="compiled")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--window", type=int, default=40, help="updates per timed window")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--profile-steps", type=int, default=None,
                        help="updates profiled a row, 0: none (8; 2 with --quick)")  # fmt: skip
    parser.add_argument("--reference", action="store_true", help="also eager nn.Transformer")
    parser.add_argument("--compiled-reference", action="store_true",
                        help="also nn.Transformer through torch.compile")  # fmt: skip
    parser.add_argument("--reference-only", action="store_true",
                        help="time the references alone, not attn-mt")  # fmt: skip
    parser.add_argument("--count-shapes", action="store_true")
    parser.add_argument("--bf16-stream", action="store_true", help="train.bf16_stream (bf16 only)")
    parser.add_argument("--inductor", action="append", default=[], metavar="KEY=VALUE",
                        help="an Inductor setting for the whole process (repeatable)")  # fmt: skip
    parser.add_argument("--projection-chunk", type=int, action="append", default=[],
                        metavar="N", help="also time attn-mt with N logit elements per chunk "
                        "of the trainer's loss, in the same process (repeatable)")  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="CPU smoke: tiny windows")
    parser.add_argument("--out", default=str(ROOT / "runs" / "profile_step"))
    args = parser.parse_args(argv)
    if args.quick:
        args.warmup, args.window, args.rounds = 2, 2, 1
    if args.profile_steps is None:
        args.profile_steps = 2 if args.quick else 8
    auto = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(auto if args.device == "auto" else args.device)
    if args.mode == "cudagraphs" and device.type != "cuda":
        parser.error("--mode cudagraphs needs CUDA")
    if args.reference_only and not (args.reference or args.compiled_reference):
        parser.error("--reference-only needs --reference or --compiled-reference")
    if any(n < 1 for n in args.projection_chunk):
        parser.error("--projection-chunk must be at least 1")
    if args.profile_steps < 0:
        parser.error("--profile-steps must be 0 (no profile) or more")
    try:
        settings = inductor_settings(args.inductor)
    except ValueError as err:
        parser.error(f"--inductor {err}")
    return args, device, settings


def row_figures(windows: list[dict], steps: int, flops: float, spec: float | None) -> dict:
    """A row's figures from its timed windows of `steps` updates in all (`flops` of matrix
    products; `spec`: the data sheet's FLOP/s, None where unknown)."""
    seconds = sum(w["seconds"] for w in windows)
    return {
        "ms_per_step": 1e3 * seconds / steps,
        "tgt_tokens_per_s": sum(w["tokens"] for w in windows) / seconds,
        "host_queued_share": sum(w["queued"] for w in windows) / seconds,
        "mfu_spec": flops / seconds / spec if spec else None,
        **lead_figures(windows),
    }


def time_rows(models: dict, files: dict, shapes: dict, cfg, args, device, report: dict) -> None:
    """Each model on each kind of batches: `--rounds` timed windows, then `--profile-steps`
    profiled updates for attn-mt's (`files`: their files' names); each row into `report` and
    printed as it is done (`result {...}`: what gpu_check keeps of a stopped run)."""
    cuda, dtype = device.type == "cuda", DTYPES[report["precision"]]
    spec = spec_peak(report["hardware"], report["precision"]) if cuda else None
    peak = 0  # bytes, the process's before the row now timed
    for kind, batches in shapes.items():
        flops = args.rounds * sum(step_flops(cfg.model, args.vocab, b) for b in batches)
        for name, (fn, ps, opt) in models.items():
            if cuda:
                peak = max(peak, torch.cuda.max_memory_allocated(device))
                torch.cuda.reset_peak_memory_stats(device)
            windows = [timed(fn, ps, opt, batches, dtype, device) for _ in range(args.rounds)]
            row = row_figures(windows, args.rounds * len(batches), flops, spec)
            if name in files and args.profile_steps:
                profile_batches = batches[: args.profile_steps]
                row["profile"] = profiled(fn, ps, opt, profile_batches, dtype, device,
                                          Path(args.out), f"{files[name]}_{kind}")  # fmt: skip
            if cuda:
                row["peak_mib"] = torch.cuda.max_memory_allocated(device) / 2**20
            report[f"{name} {kind}"] = row
            print("result", json.dumps({"row": f"{name} {kind}", **row}), flush=True)
    if cuda:
        report["peak_mib"] = max(peak, torch.cuda.max_memory_allocated(device)) / 2**20


def main(argv: list[str] | None = None) -> None:
    set_cuda_environment()  # the allocator the trainer runs with, before CUDA starts
    args, device, settings = parse(argv)
    torch._inductor.config.load_config(settings)  # before anything compiles
    precision = args.precision or ("bf16" if device.type == "cuda" else "fp32")
    dtype = DTYPES[precision]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    raw = load_config(args.config).to_dict()
    raw["model"].update(SIZES[args.size])
    raw["model"].update(wmt_dropout())
    raw["train"]["bf16_stream"] = args.bf16_stream
    cfg = config_from_dict(raw)
    configure_kernels(deterministic=False, tf32=cfg.train.tf32)
    hardware = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    tried = [f"{key}={value}" for key, value in settings.items()]
    stream = ["bf16 stream"] if args.bf16_stream else []
    ours = " ".join(["attn-mt", *stream, *tried])  # of its rows
    label = "_".join(
        [args.mode, *(["bf16_stream"] if stream else []), *(["inductor"] if tried else [])]
    )
    print(f"{hardware}, torch {torch.__version__}, {label}, {precision}", flush=True)
    report: dict = {"mode": args.mode, "hardware": hardware, "torch": torch.__version__,
                    "precision": precision, "size": args.size, "vocab": args.vocab,
                    "batch_tokens": args.batch_tokens, "bf16_stream": args.bf16_stream,
                    "inductor": inductor_options(device.type) | settings,
                    "projection_chunk": trainer_loss.projection_chunk(device.type)}  # fmt: skip
    lengths = wmt_lengths(args.pairs)
    shapes, warm = timed_batches(lengths, args.vocab, args.batch_tokens, args.window,
                                 args.warmup, device)  # fmt: skip
    if args.count_shapes:
        report["distinct_shapes"] = count_shapes(lengths, args.batch_tokens)
        print("distinct batch shapes in one epoch:", report["distinct_shapes"], flush=True)

    torch.manual_seed(cfg.train.seed)
    models = {}
    files = {ours: label}  # the profile files of attn-mt's rows
    if not args.reference_only:
        models[ours] = warmed_up(cfg, args, device, warm, dtype, report)
        for elements in args.projection_chunk:
            step, params, optimizer = models[ours]
            step = with_chunk(step, elements)
            updates(step, params, optimizer, warm, dtype)  # compiles for the chunk's shape
            name = f"{ours} projection_chunk={elements}"
            models[name], files[name] = (step, params, optimizer), f"{label}_chunk{elements}"
    if args.reference or args.compiled_reference:
        models |= reference_steps(cfg, args, device, warm, dtype, report)
    graphs = compiled_graphs()  # before the timed windows: what they add are recompiles
    time_rows(models, files, shapes, cfg, args, device, report)
    report["graphs_after_warmup"] = compiled_graphs() - graphs
    (out / f"{label}.json").write_text(json.dumps(report, indent=1))
    print(json.dumps(report))


if __name__ == "__main__":
    os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
    main()
