"""What a training step's milliseconds are made of: the WMT workload of `bench_train.py --vocab`
under torch.profiler, one `--mode` per process.

The model at `--size` over a `--vocab` vocabulary on synthetic pairs of WMT's lengths in
attn-mt's length buckets of `--batch-tokens`, each update the Trainer's own (`UpdateStep`:
its loss, `projected_loss`, fused AdamW and gradient clipping). `--mode`: `eager`; `compiled`
(as train.compile compiles the update, the loss's chunks fused); `cudagraphs` (the same with
`mode="reduce-overhead"`: each batch shape is recorded once as a CUDA graph and replayed, so a
step launches a few graphs instead of hundreds of kernels).

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
With `--reference`, eager `nn.Transformer` (bench/reference.py, its full logits and loss
through the plain step: the Trainer's update cannot train it) is timed on the same batches;
with `--compiled-reference` also the same through torch.compile (the model and its loss in one
graph); `--reference-only` times those alone, for a run that compares them with an earlier
profile's.
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
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from attn_mt.config.schema import Config
from attn_mt.data.batching import Batch, length_batches
from attn_mt.model import loss as model_loss
from attn_mt.model.transformer import build_model
from attn_mt.precision import DTYPES, configure_kernels, inductor_options, set_cuda_environment
from attn_mt.train.loop import UpdateStep
from attn_mt.train.setup import make_optimizer
from bench.common import (
    DEFAULT_CONFIG,
    ROOT,
    SIZES,
    compiled_graphs,
    hardware_name,
    spec_peak,
    step_flops,
    sync,
)
from bench.inductor import inductor_settings, process_settings
from bench.profiled import Phases, lead_figures, profiled
from bench.reference import Reference
from bench.steps import Phase, PlainStep, Turn, compile_step, trainer_step, trainer_updates
from bench.workload import sized_config, timed_batches, wmt_lengths

MODES = ("eager", "compiled", "cudagraphs")


@contextlib.contextmanager
def chunked(elements: int | None) -> Iterator[None]:
    """`elements` logit elements per chunk of the trainer's loss inside (its forward makes the
    chunks and their gradients; backward only scales them); None: the trainer's own."""
    saved = model_loss.projection_chunk
    if elements is not None:
        model_loss.projection_chunk = lambda device_type: elements
    try:
        yield
    finally:
        model_loss.projection_chunk = saved


def attn_mt_turn(step: UpdateStep, mode: str, elements: int | None = None) -> Turn:
    """The Trainer's update `step` as a turn; in `cudagraphs` mode each update begins a new
    step of the CUDA graphs (the last one's outputs may be reused); with `elements` per
    chunk of its loss (`chunked`)."""

    def turn(batches: list[Batch], phase: Phase | None = None) -> int:
        def told(name: str) -> None:
            if name == "forward+loss" and mode == "cudagraphs":
                torch.compiler.cudagraph_mark_step_begin()
            if phase is not None:
                phase(name)

        with chunked(elements):
            return trainer_updates(step, batches, told)

    return turn


def warmed_up(cfg: Config, args, device, warm: list[Batch], report: dict) -> UpdateStep:
    """attn-mt's Trainer update in `--mode`, compiled where asked, warmed up on `warm`; its
    warm-up seconds (compiling in them) and graphs go into `report`."""
    model = build_model(cfg, args.vocab, args.vocab).to(device).train()
    step = trainer_step(model, cfg.train, report["precision"])
    start, before = time.perf_counter(), compiled_graphs()  # the process may have made some
    if args.mode != "eager":
        cudagraphs = torch._inductor.list_mode_options("reduce-overhead")
        with process_settings(cudagraphs if args.mode == "cudagraphs" else {}, device.type):
            compile_step(step, warm[:1])  # its graphs keep the options they were made with
    attn_mt_turn(step, args.mode)(warm)
    sync(device)
    report["warmup_s"] = time.perf_counter() - start
    report["graphs"] = compiled_graphs() - before
    print(f"warm-up: {report['warmup_s']:.1f} s, {report['graphs']} graph(s)", flush=True)
    return step


def reference_turns(cfg: Config, args, device, warm: list[Batch], report: dict) -> dict:
    """`nn.Transformer` through the plain step (the Trainer's update cannot train it) eagerly
    with `--reference` and through torch.compile with `--compiled-reference`, warmed up on
    `warm`: {row name: turn}. The compiled one's warm-up seconds (compiling in them) and
    graphs go into `report`."""
    ref = Reference(cfg.model, args.vocab).to(device).train()
    optimizer = make_optimizer(ref, cfg.train)
    dtype, t = DTYPES[report["precision"]], cfg.train
    turns = {}
    asked = {"nn.Transformer": args.reference, "nn.Transformer compiled": args.compiled_reference}
    for name in (name for name, wanted in asked.items() if wanted):
        compiled = name.endswith("compiled")
        start, graphs = time.perf_counter(), compiled_graphs()
        turns[name] = PlainStep(ref, optimizer, dtype, t.clip_norm, t.label_smoothing, compiled)
        turns[name](warm)
        sync(device)
        if compiled:
            report["reference_warmup_s"] = time.perf_counter() - start
            report["reference_graphs"] = compiled_graphs() - graphs
    return turns


def timed(turn: Turn, batches: list[Batch], device) -> dict:
    """Seconds of a window of updates, the host's queueing time, the tokens and, on CUDA, how
    far the host ran ahead of the device as each phase of an update was queued (`leads`)."""
    phases = Phases(marks=[] if device.type == "cuda" else None)
    sync(device)
    start = time.perf_counter()
    tokens = turn(batches, phases)
    phases.close()
    queued = time.perf_counter() - start
    sync(device)
    return {"seconds": time.perf_counter() - start, "queued": queued, "tokens": tokens,
            "leads": phases.leads()}  # fmt: skip


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
    parser.add_argument("--config", default=str(DEFAULT_CONFIG))
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


def time_rows(turns: dict, files: dict, shapes: dict, cfg, args, device, report: dict) -> None:
    """Each turn on each kind of batches: `--rounds` timed windows, then `--profile-steps`
    profiled updates for attn-mt's (`files`: their files' names); each row into `report` and
    printed as it is done (`result {...}`: what gpu_check keeps of a stopped run)."""
    cuda = device.type == "cuda"
    spec = spec_peak(report["hardware"], report["precision"]) if cuda else None
    peak = 0  # bytes, the process's before the row now timed
    for kind, batches in shapes.items():
        flops = args.rounds * sum(step_flops(cfg.model, args.vocab, b) for b in batches)
        for name, turn in turns.items():
            if cuda:
                peak = max(peak, torch.cuda.max_memory_allocated(device))
                torch.cuda.reset_peak_memory_stats(device)
            windows = [timed(turn, batches, device) for _ in range(args.rounds)]
            row = row_figures(windows, args.rounds * len(batches), flops, spec)
            if name in files and args.profile_steps:
                profile_batches = batches[: args.profile_steps]
                row["profile"] = profiled(turn, profile_batches, device, Path(args.out),
                                          f"{files[name]}_{kind}")  # fmt: skip
            if cuda:
                row["peak_mib"] = torch.cuda.max_memory_allocated(device) / 2**20
            report[f"{name} {kind}"] = row
            print("result", json.dumps({"row": f"{name} {kind}", **row}), flush=True)
    if cuda:
        report["peak_mib"] = max(peak, torch.cuda.max_memory_allocated(device)) / 2**20


def main(argv: list[str] | None = None) -> None:
    """Parse the options, time and profile each row, write the report."""
    set_cuda_environment()  # the allocator the trainer runs with, before CUDA starts
    args, device, settings = parse(argv)
    with process_settings(settings, device.type):  # before anything compiles
        run(args, device, settings)


def run(args, device: torch.device, settings: dict[str, Any]) -> None:
    """The profile of `args` on `device` with the --inductor `settings` in force."""
    precision = args.precision or ("bf16" if device.type == "cuda" else "fp32")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = sized_config(args.config, args.size, wmt=True, bf16_stream=args.bf16_stream)
    configure_kernels(deterministic=False, tf32=cfg.train.tf32)
    hardware = hardware_name(device)
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
                    "inductor": inductor_options(device.type),
                    "projection_chunk": model_loss.projection_chunk(device.type)}  # fmt: skip
    lengths = wmt_lengths(args.pairs)
    shapes, warm = timed_batches(lengths, args.vocab, args.batch_tokens, args.window,
                                 args.warmup, device)  # fmt: skip
    if args.count_shapes:
        report["distinct_shapes"] = count_shapes(lengths, args.batch_tokens)
        print("distinct batch shapes in one epoch:", report["distinct_shapes"], flush=True)
    torch.manual_seed(cfg.train.seed)
    turns: dict[str, Turn] = {}
    files = {ours: label}  # the profile files of attn-mt's rows
    if not args.reference_only:
        step = warmed_up(cfg, args, device, warm, report)
        turns[ours] = attn_mt_turn(step, args.mode)
        for elements in args.projection_chunk:
            name = f"{ours} projection_chunk={elements}"
            turns[name] = attn_mt_turn(step, args.mode, elements)
            turns[name](warm)  # compiles for the chunk's shape
            files[name] = f"{label}_chunk{elements}"
    if args.reference or args.compiled_reference:
        turns |= reference_turns(cfg, args, device, warm, report)
    graphs = compiled_graphs()  # before the timed windows: what they add are recompiles
    time_rows(turns, files, shapes, cfg, args, device, report)
    report["graphs_after_warmup"] = compiled_graphs() - graphs
    (out / f"{label}.json").write_text(json.dumps(report, indent=1))
    print(json.dumps(report))
