"""Decoding speed and memory: attn-mt against CTranslate2 on the same weights, each called the
way its users call it, every row in a fresh process of its own (its peak RSS is its own).

attn-mt      `Translator.translate` over the whole list: its own length batching
             (decode.batch_tokens), per-sentence output limits; float32 (the default:
             weights prepacked for oneDNN where a product timed at load runs clearly faster
             so, `prepack="auto"`), f32-pack (always prepacked, `prepack=True`), f32-plain
             (never: nn.Linear, MKL), bf16 autocast, and int8 (`translate --quantize int8`,
             torch's dynamic quantization).
CTranslate2  the checkpoint exported by `attn-mt export` (float32, and int8), then one
             `translate_batch` call over the whole list with the exported decode.json (its
             fixed max_decoding_length), its own length sorting, max_batch_size=64,
             intra_threads = --threads.

SentencePiece encoding and decoding are inside the timing for both, after a warm-up on a few
sentences. The table gives sentences/s, target tokens/s, seconds, peak RSS and BLEU; the
agreement (share of lines identical to attn-mt float32 with the same search) is reported
apart, since the engines rank length-penalised hypotheses slightly differently.

    python scripts/bench_decode.py --model runs/multi30k_de_en [--quick] [--threads 2]
    python scripts/bench_decode.py --model ckpt.pt --src sentences.txt --limit 500

--quick times 100 sentences. It never trains: --model must name a trained run folder or
checkpoint. The sentences default to the test split of the checkpoint's own config (Multi30k
test_2016_flickr for a multi30k run).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

import attn_mt
from attn_mt.data.corpora import split_files
from attn_mt.data.text import read_lines
from attn_mt.errors import UserError
from attn_mt.export.ct2 import export_ctranslate2
from attn_mt.precision import resolve_precision
from attn_mt.scores import score
from bench.common import ROOT, cpu_name

QUICK_SENTENCES = 100
WARMUP_SENTENCES = 8
CT2_MAX_BATCH_SIZE = 64  # sentences per batch, CTranslate2's usual setting
PACKED = "f32-pack"  # float32 with weights prepacked for oneDNN (load(..., prepack=True))
PLAIN = "f32-plain"  # float32 through nn.Linear, MKL (load(..., prepack=False))
ENTRY = ROOT / "scripts" / "bench_decode.py"  # a row's own process runs it with --row


@dataclass
class Row:
    """One timed configuration, run in a process of its own, and what it produced."""

    engine: str  # "attn-mt" or "CTranslate2"
    beam: int
    variant: str  # "float32", "bf16", "int8"
    seconds: float = 0.0
    outputs: list[str] | None = None
    tokens: int = 0  # target tokens produced, <eos> excluded
    base_rss_mib: float = 0.0  # the process before loading the engine (Python, torch, ...)
    peak_rss_mib: float = 0.0

    @property
    def search(self) -> str:
        return "greedy" if self.beam == 1 else f"beam {self.beam}"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="A trained run folder or .pt checkpoint.")
    parser.add_argument("--src", help="Source sentences, one per line (default: the test split).")
    parser.add_argument("--ref", help="References for --src, to report BLEU.")
    parser.add_argument("--limit", type=int, help="Use the first N sentences.")
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_SENTENCES} sentences.")
    parser.add_argument("--beam", type=int, default=5, help="Beam size of the beam rows.")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--row", help=argparse.SUPPRESS)  # internal: run one row (JSON)
    return parser.parse_args()


def hardware() -> dict[str, str]:
    """The machine the timings belong to."""
    import ctranslate2

    return {
        "cpu": cpu_name(),
        "logical_cores": str(os.cpu_count()),
        "torch": torch.__version__,
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "ctranslate2": ctranslate2.__version__,
        "python": platform.python_version(),
    }


def load_sentences(args: argparse.Namespace, translator) -> tuple[list[str], list[str] | None]:
    """The source lines (blank ones dropped) and their references, if known."""
    if args.src:
        src, refs = read_lines(args.src), read_lines(args.ref) if args.ref else None
    else:
        files = split_files(translator.config.data, "test")
        if files is None:
            raise UserError("the checkpoint's config has no test split; give --src FILE")
        src, refs = read_lines(files[0]), read_lines(files[1])
    keep = [i for i, line in enumerate(src) if line.strip()]
    limit = args.limit or (QUICK_SENTENCES if args.quick else len(keep))
    keep = keep[:limit]
    return [src[i] for i in keep], [refs[i] for i in keep] if refs else None


# ---------------------------------------------------------------------------------------------
# One row, in its own process


def run_row(row: Row, model: str, lines: list[str], threads: int, ct2_folder: str | None) -> Row:
    """Load the engine, warm it up, time it on `lines`; fills seconds, outputs, tokens, RSS."""
    torch.set_num_threads(threads)
    row.base_rss_mib = peak_rss_mib()
    if row.engine == "attn-mt":
        translate = attn_mt_engine(model, row)
    else:
        assert ct2_folder is not None  # a CTranslate2 row always names its export
        translate = ctranslate2_engine(Path(ct2_folder), row, threads)
    translate(lines[:WARMUP_SENTENCES])
    start = time.perf_counter()
    row.outputs, row.tokens = translate(lines)
    row.seconds = time.perf_counter() - start
    row.peak_rss_mib = peak_rss_mib()
    return row


def peak_rss_mib() -> float:
    """This process's peak resident memory so far (ru_maxrss is in KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def attn_mt_engine(model: str, row: Row):
    precision = "bf16" if row.variant == "bf16" else "fp32"
    quantize = "int8" if row.variant == "int8" else None
    prepack = {PACKED: True, PLAIN: False}.get(row.variant, "auto")
    translator = attn_mt.load(
        model, device="cpu", precision=precision, quantize=quantize, prepack=prepack
    )

    def translate(lines: list[str]) -> tuple[list[str], int]:
        best = [n[0] for n in translator.translate_nbest(lines, beam=row.beam)]
        return [t.text for t in best], sum(len(t.tokens) for t in best)

    return translate


def ctranslate2_engine(folder: Path, row: Row, threads: int):
    """As a CTranslate2 user runs our export: its decode.json, one call, its own batching."""
    import ctranslate2
    import sentencepiece as spm

    engine = ctranslate2.Translator(str(folder), device="cpu", intra_threads=threads)
    src_sp = spm.SentencePieceProcessor(model_file=str(folder / "source.model"))
    tgt_sp = spm.SentencePieceProcessor(model_file=str(folder / "target.model"))
    options = json.loads((folder / "decode.json").read_text())
    options.update(beam_size=row.beam, max_batch_size=CT2_MAX_BATCH_SIZE)

    def translate(lines: list[str]) -> tuple[list[str], int]:
        results = engine.translate_batch(src_sp.encode(lines, out_type=str), **options)
        hyps = [r.hypotheses[0] for r in results]
        return tgt_sp.decode(hyps), sum(map(len, hyps))

    return translate


def in_child(row: Row, args: argparse.Namespace, lines_file: Path, folder: Path | None) -> Row:
    """Run `row` in a fresh Python process (the entry script with --row) and read its result."""
    spec = {"row": asdict(row), "lines": str(lines_file), "ct2": str(folder) if folder else None}
    command = [sys.executable, str(ENTRY), "--model", str(args.model), "--threads",
               str(args.threads), "--row", json.dumps(spec)]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"bench_decode: the {row.engine} {row.variant} {row.search} row failed:\n"
                 f"{done.stderr[-2000:]}")  # fmt: skip
    return Row(**json.loads(done.stdout.splitlines()[-1]))


def child_main(args: argparse.Namespace) -> None:
    spec = json.loads(args.row)
    lines = Path(spec["lines"]).read_text(encoding="utf-8").splitlines()
    row = run_row(Row(**spec["row"]), args.model, lines, args.threads, spec["ct2"])
    print(json.dumps(asdict(row)))


# ---------------------------------------------------------------------------------------------
# The run


def main() -> None:
    """Run the rows (or, with --row, one row in this process); a user's mistake is one line."""
    try:
        args = parse_args()
        if args.row:
            return child_main(args)
        compare(args)
    except UserError as err:
        print(f"bench_decode: error: {err}", file=sys.stderr)
        sys.exit(2)


def compare(args: argparse.Namespace) -> None:
    """Every row in a process of its own, then the report."""
    try:
        import ctranslate2  # noqa: F401
    except ImportError:
        raise UserError("this benchmark needs ctranslate2: pip install 'attn-mt[ct2]'") from None
    translator = attn_mt.load(args.model, device="cpu")
    lines, refs = load_sentences(args, translator)
    info = hardware()
    native_bf16 = resolve_precision("auto", torch.device("cpu")) == "bf16"
    print(
        f"hardware: {info['cpu']} ({info['logical_cores']} logical cores), "
        f"torch {info['torch']} [{info['torch_cpu_capability']}], "
        f"ctranslate2 {info['ctranslate2']}; {args.threads} thread(s), device cpu, "
        f"native bf16: {'yes' if native_bf16 else 'no'}"
    )
    print(f"model: {args.model}; {len(lines)} sentences; every row in its own process")
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as tmp:
        lines_file = Path(tmp) / "lines.txt"
        lines_file.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        folders = {
            variant: export_ctranslate2(args.model, Path(tmp) / variant, quantization=q)
            for variant, q in (("float32", "none"), ("int8", "int8"))
        }
        ours = ["float32", PACKED, PLAIN, "int8"] + (["bf16"] if native_bf16 else [])
        for beam in sorted({1, args.beam}):
            for variant in ours:
                rows.append(in_child(Row("attn-mt", beam, variant), args, lines_file, None))
            for variant, folder in folders.items():
                row = Row("CTranslate2", beam, variant)
                rows.append(in_child(row, args, lines_file, folder))
    report(rows, lines, refs, args, info)


def row_figures(row: Row, lines: list[str], refs: list[str] | None, baseline: Row,
                ct2: Row) -> dict:  # fmt: skip
    """A row's figures: its speed, memory and BLEU, its agreement with `baseline` (attn-mt
    float32 with the same search) and its time over `ct2` (CTranslate2 float32's)."""
    assert row.outputs is not None and baseline.outputs is not None  # run_row set them
    bleu = score(row.outputs, refs).bleu if refs else None
    same = sum(a == b for a, b in zip(row.outputs, baseline.outputs, strict=True))
    return {
        "engine": row.engine,
        "beam": row.beam,
        "variant": row.variant,
        "seconds": round(row.seconds, 3),
        "sentences_per_s": round(len(lines) / row.seconds, 2),
        "tokens_per_s": round(row.tokens / row.seconds, 1),
        "target_tokens": row.tokens,
        "peak_rss_mib": round(row.peak_rss_mib),
        "engine_rss_mib": round(row.peak_rss_mib - row.base_rss_mib),
        "bleu": None if bleu is None else round(bleu, 2),
        "same_as_attn_mt_float32": round(same / len(lines), 4),
        "time_over_ct2_float32": round(row.seconds / ct2.seconds, 2),
    }


def report(rows: list[Row], lines: list[str], refs: list[str] | None, args, info) -> None:
    """The timing table, the agreement, then one JSON line of every figure."""
    ours = {r.beam: r for r in rows if r.engine == "attn-mt" and r.variant == "float32"}
    theirs = {r.beam: r for r in rows if r.engine == "CTranslate2" and r.variant == "float32"}
    header = (
        f"{'engine':<12} {'search':<7} {'variant':<8} {'sent/s':>7} {'tok/s':>7} "
        f"{'seconds':>8} {'peak RSS':>9} {'engine':>8} {'BLEU':>6} {'time / CT2 float32':>19}"
    )
    print(header)
    print("-" * len(header))
    figures = []
    for row in rows:
        figures.append(row_figures(row, lines, refs, ours[row.beam], theirs[row.beam]))
        bleu = figures[-1]["bleu"]
        print(
            f"{row.engine:<12} {row.search:<7} {row.variant:<8} {len(lines) / row.seconds:>7.1f} "
            f"{row.tokens / row.seconds:>7.0f} {row.seconds:>8.2f} "
            f"{row.peak_rss_mib:>5.0f} MiB {row.peak_rss_mib - row.base_rss_mib:>4.0f} MiB "
            f"{'-' if bleu is None else f'{bleu:.2f}':>6} "
            f"{row.seconds / theirs[row.beam].seconds:>18.2f}x"
        )
    print(
        "peak RSS: the whole process (Python, torch, the engine); engine: its growth from "
        "loading the engine on"
    )
    print("\nagreement: share of lines identical to attn-mt float32 with the same search")
    for figure in figures:
        print(
            f"  {figure['engine']:<12} {'greedy' if figure['beam'] == 1 else 'beam'} "
            f"{figure['variant']:<8} {figure['same_as_attn_mt_float32']:.1%}"
        )
    print(
        json.dumps(
            {
                "bench": "decode",
                "model": str(args.model),
                "sentences": len(lines),
                "threads": args.threads,
                "device": "cpu",
                "ct2_max_batch_size": CT2_MAX_BATCH_SIZE,
                "hardware": info,
                "rows": figures,
            }
        )
    )
