"""A pretrained model's shape on the CPU: `attn-mt import` of a MarianMT folder of opus-mt-de-en's
shapes and flags (74M parameters, a 58,101-entry vocabulary; built here with transformers' own
classes and seeded random weights, `bench/marian.py`), its parity with
`MarianMTModel.generate`, and attn-mt's search against CTranslate2 converting the same folder
with its own converter (`ct2-transformers-converter`).

import    `attn-mt import FOLDER --out RUN` in a process of its own: wall seconds and peak RSS,
          beside the size of model.safetensors.
parity    the first --parity lines of Multi30k test_2016_flickr (de): attn-mt's best output
          (float32, weights as imported, no prepacking, decode.recase and decode.protect off;
          and with them on, attn-mt's default) against `generate` with the folder's
          generation_config.json, one line at a time, greedy (and beams 4 and 5 on the first
          --parity-beam lines): the share of lines whose pieces are identical.
speed     --lines sentences, every row in a fresh process: attn-mt (`Translator.translate`
          over the whole list, its own batching, float32 prepacked where faster and int8;
          with and without a lexical shortlist, `attn-mt shortlist` on Multi30k's training
          pairs) and CTranslate2 (one `translate_batch` call, its own length sorting,
          max_batch_size 64, intra_threads --threads, float32 and int8), greedy and beam 5.
          Both read the same source pieces (SentencePiece inside the timing, a warm-up
          before it) under the same output limit; sentences/s, target tokens/s, peak RSS.

The random weights do not translate: the folder's </s> bias (`--eos-bias`) ends outputs at
varied lengths, and generation_config.json's max_length is set to --max-length for both
engines. Speed and agreement hold for such a model; BLEU does not (the shortlist's cost in BLEU
is measured on a trained model: docs/pretrained.md).

    python scripts/bench_marian.py --quick              # 100 lines, parity on 20
    python scripts/bench_marian.py --lines 1000 --parity 500 --threads 2

The last line is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from bench.common import ROOT, cpu_name
from bench.data import run as run_measured
from bench.marian import build_folder
from bench.marian_data import read_lines

ENTRY = ROOT / "scripts" / "bench_marian.py"
WARMUP = 8
CT2_MAX_BATCH_SIZE = 64


@dataclass
class Row:
    engine: str  # "attn-mt" or "CTranslate2"
    beam: int
    variant: str  # "float32" or "int8"
    shortlist: bool = False
    seconds: float = 0.0
    tokens: int = 0
    peak_rss_mib: float = 0.0
    outputs: list[list[str]] | None = None  # pieces

    @property
    def name(self) -> str:
        search = "greedy" if self.beam == 1 else f"beam {self.beam}"
        return f"{self.engine} {search} {self.variant}{' +shortlist' if self.shortlist else ''}"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=Path("/tmp/attn-mt-bench-marian"))
    parser.add_argument("--lines", type=int, default=1000, help="Sentences timed.")
    parser.add_argument("--parity", type=int, default=500, help="Lines compared greedily.")
    parser.add_argument(
        "--parity-beam", type=int, default=100, help="Lines compared with beams 4 and 5."
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-length", type=int, default=32)
    parser.add_argument("--eos-bias", type=float, default=4.0)
    parser.add_argument("--quick", action="store_true", help="100 lines timed, parity on 20.")
    parser.add_argument("--skip", default="", help="Comma-separated: import,parity,speed.")
    parser.add_argument("--row", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.lines, args.parity, args.parity_beam = 100, 20, 5
    return args


def prepared(args: argparse.Namespace) -> dict[str, Path]:
    """The folder, its import, its CTranslate2 conversions and the shortlist (kept in --work)."""
    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    folder = work / "opus-mt-de-en"
    if not (folder / "model.safetensors").exists():
        build_folder(folder, "opus-mt", eos_bias=args.eos_bias)
    path = folder / "generation_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "max_length": args.max_length}))
    paths = {"folder": folder, "run": work / "run", "shortlist": work / "lex.txt"}
    for variant, quantization in (("float32", "float32"), ("int8", "int8")):
        out = work / f"ct2-{variant}"
        if not (out / "model.bin").exists():
            converter = Path(sys.executable).parent / "ct2-transformers-converter"
            subprocess.run(
                [str(converter), "--model", str(folder), "--output_dir", str(out),
                 "--quantization", quantization, "--copy_files", "source.spm", "target.spm",
                 "--force"],
                check=True, capture_output=True,
            )  # fmt: skip
        paths[f"ct2-{variant}"] = out
    return paths


def measure_import(paths: dict[str, Path]) -> dict:
    """`attn-mt import` in its own process: seconds and peak RSS, and the checkpoint's size."""
    shutil.rmtree(paths["run"], ignore_errors=True)
    seconds, rss = run_measured(
        [sys.executable, "-m", "attn_mt", "import", str(paths["folder"]), "--out",
         str(paths["run"])],
        ROOT, paths["run"].parent / "cache",
    )  # fmt: skip
    size = (paths["folder"] / "model.safetensors").stat().st_size / 2**20
    return {"seconds": round(seconds, 1), "peak_rss_mib": round(rss), "checkpoint_mib": round(size)}


def build_lexicon(paths: dict[str, Path]) -> dict:
    """`attn-mt shortlist` on Multi30k de-en's training pairs with the import's tokenizers."""
    config = ROOT / "configs" / "multi30k_de_en.yaml"
    start = time.perf_counter()
    paths["shortlist"].unlink(missing_ok=True)
    done = subprocess.run(
        [sys.executable, "-m", "attn_mt", "shortlist", "-c", str(config), "-m", str(paths["run"]),
         "-o", str(paths["shortlist"])],
        cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    if done.returncode:
        sys.exit(f"bench_marian: attn-mt shortlist failed: {done.stderr[-2000:]}")
    return {"seconds": round(time.perf_counter() - start, 1), "said": done.stdout.strip()}


def measure_parity(paths: dict[str, Path], lines: list[str], beam_lines: int, threads: int) -> dict:
    """The share of lines attn-mt translates as `generate` does: greedy on `lines`, beams 4
    and 5 on the first `beam_lines` of them (transformers' beam search, a line at a time, is
    slow)."""
    from transformers import MarianMTModel, MarianTokenizer

    import attn_mt

    torch.set_num_threads(threads)
    folder = paths["folder"]
    tokenizer = MarianTokenizer.from_pretrained(folder)
    model = MarianMTModel.from_pretrained(folder).eval()
    piece = {i: p for p, i in json.loads((folder / "vocab.json").read_text()).items()}
    special = (tokenizer.pad_token_id, tokenizer.eos_token_id)
    # The model's search (decode.recase and decode.protect off), and attn-mt's defaults: a line
    # whose output lost one of its numbers is read again without its numbers (put back after),
    # which a random model always loses.
    translator = attn_mt.load(
        paths["run"], device="cpu", prepack=False, decode={"recase": "off", "protect": "off"}
    )
    default = attn_mt.load(paths["run"], device="cpu", prepack=False)
    figures = {}
    every = lines
    for beam in (1, 4, 5):
        lines = every if beam == 1 else every[:beam_lines]
        start = time.perf_counter()
        theirs = []
        for line in lines:
            with torch.no_grad():
                ids = model.generate(**tokenizer([line], return_tensors="pt"), num_beams=beam)[0]
            theirs.append([piece[i] for i in ids.tolist()[1:] if i not in special])
        hf_seconds = time.perf_counter() - start
        found = translator.translate_nbest(lines, beam=beam)
        ours = [translator.tgt_tokenizer.pieces(best.tokens) for best, *_ in found]
        same = sum(a == b for a, b in zip(ours, theirs, strict=True))
        found = default.translate_nbest(lines, beam=beam)
        as_default = [default.tgt_tokenizer.pieces(best.tokens) for best, *_ in found]
        figures["greedy" if beam == 1 else f"beam{beam}"] = {
            "identical": same,
            "identical_with_text_rules_on": sum(
                a == b for a, b in zip(as_default, theirs, strict=True)
            ),
            "lines": len(lines),
            "mean_output_pieces": round(sum(map(len, theirs)) / len(lines), 1),
            "generate_seconds": round(hf_seconds, 1),
        }
        print(f"parity {beam=}: {same}/{len(lines)} identical", flush=True)
    return figures


# ---------------------------------------------------------------------------------------------
# Speed rows, each in a process of its own


def run_row(row: Row, paths: dict[str, str], lines: list[str], threads: int) -> Row:
    torch.set_num_threads(threads)
    translate = attn_mt_engine(row, paths) if row.engine == "attn-mt" else ct2_engine(row, paths)
    translate(lines[:WARMUP])
    start = time.perf_counter()
    row.outputs = translate(lines)
    row.seconds = time.perf_counter() - start
    row.tokens = sum(map(len, row.outputs))
    row.peak_rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return row


def attn_mt_engine(row: Row, paths: dict[str, str]):
    import attn_mt

    decode = {"shortlist": paths["shortlist"]} if row.shortlist else None
    quantize = "int8" if row.variant == "int8" else None
    translator = attn_mt.load(paths["run"], device="cpu", quantize=quantize, decode=decode)

    def translate(lines: list[str]) -> list[list[str]]:
        found = translator.translate_nbest(lines, beam=row.beam)
        return [translator.tgt_tokenizer.pieces(best.tokens) for best, *_ in found]

    return translate


def ct2_engine(row: Row, paths: dict[str, str]):
    """As CTranslate2's documentation runs an OPUS-MT model: the source pieces and </s>."""
    import ctranslate2
    import sentencepiece as spm

    folder = Path(paths[f"ct2-{row.variant}"])
    threads = torch.get_num_threads()
    engine = ctranslate2.Translator(str(folder), device="cpu", intra_threads=threads)
    source = spm.SentencePieceProcessor(model_file=str(folder / "source.spm"))
    max_length = json.loads((Path(paths["folder"]) / "generation_config.json").read_text())
    # max_length counts the decoder's start and the </s>; max_decoding_length neither
    limit = max_length["max_length"] - 2

    def translate(lines: list[str]) -> list[list[str]]:
        tokens = [pieces + ["</s>"] for pieces in source.encode(lines, out_type=str)]
        results = engine.translate_batch(
            tokens,
            beam_size=row.beam,
            max_batch_size=CT2_MAX_BATCH_SIZE,
            max_decoding_length=limit,
            length_penalty=1.0,
        )
        return [r.hypotheses[0] for r in results]

    return translate


def in_child(row: Row, args: argparse.Namespace, paths: dict[str, Path], lines: Path) -> Row:
    spec = {"row": asdict(row), "paths": {k: str(v) for k, v in paths.items()},
            "lines": str(lines)}  # fmt: skip
    command = [sys.executable, str(ENTRY), "--threads", str(args.threads), "--row",
               json.dumps(spec)]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    if done.returncode:
        sys.exit(f"bench_marian: the row {row.name} failed:\n{done.stderr[-3000:]}")
    return Row(**json.loads(done.stdout.splitlines()[-1]))


def child_main(args: argparse.Namespace) -> None:
    spec = json.loads(args.row)
    lines = Path(spec["lines"]).read_text(encoding="utf-8").splitlines()
    row = run_row(Row(**spec["row"]), spec["paths"], lines, args.threads)
    print(json.dumps(asdict(row)))


def measure_speed(args, paths: dict[str, Path], lines: list[str]) -> list[dict]:
    lines_file = args.work / "lines.txt"
    lines_file.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    rows = []
    for beam in (1, 5):
        plan = [
            Row(engine, beam, variant, shortlist)
            for variant in ("float32", "int8")
            for engine, shortlist in (("CTranslate2", False), ("attn-mt", False), ("attn-mt", True))
        ]
        for row in plan:
            rows.append(in_child(row, args, paths, lines_file))
            print(f"{rows[-1].name}: {rows[-1].seconds:.1f} s", flush=True)
    figures = []
    for row in rows:
        ct2 = next(r for r in rows if r.engine == "CTranslate2" and r.beam == row.beam
                   and r.variant == row.variant)  # fmt: skip
        base = next(r for r in rows if r.engine == "attn-mt" and r.beam == row.beam
                    and r.variant == row.variant and not r.shortlist)  # fmt: skip
        assert row.outputs is not None and base.outputs is not None and ct2.outputs is not None
        figures.append({
            "row": row.name,
            "seconds": round(row.seconds, 2),
            "sentences_per_s": round(len(lines) / row.seconds, 1),
            "tokens_per_s": round(row.tokens / row.seconds),
            "peak_rss_mib": round(row.peak_rss_mib),
            "time_over_ct2_same_precision": round(row.seconds / ct2.seconds, 2),
            "same_as_attn_mt_full_softmax": round(
                sum(a == b for a, b in zip(row.outputs, base.outputs, strict=True)) / len(lines), 3
            ),
            "same_as_ct2": round(
                sum(a == b for a, b in zip(row.outputs, ct2.outputs, strict=True)) / len(lines), 3
            ),
        })  # fmt: skip
    return figures


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.row:
        return child_main(args)
    skip = set(filter(None, args.skip.split(",")))
    hardware = {"cpu": cpu_name(), "logical_cores": os.cpu_count(), "torch": torch.__version__,
                "python": platform.python_version(), "threads": args.threads}  # fmt: skip
    print(f"hardware: {hardware}", flush=True)
    paths = prepared(args)
    report: dict = {"bench": "marian", "hardware": hardware, "max_length": args.max_length}
    if "import" not in skip or not (paths["run"] / "checkpoints" / "best.pt").exists():
        report["import"] = measure_import(paths)
        print(f"import: {report['import']}", flush=True)
    lines = read_lines("de", "test_2016_flickr", max(args.lines, args.parity))
    if "parity" not in skip:
        report["parity"] = measure_parity(
            paths, lines[: args.parity], args.parity_beam, args.threads
        )
    if "speed" not in skip:
        report["shortlist"] = build_lexicon(paths)
        print(f"shortlist: {report['shortlist']['said']}", flush=True)
        report["speed"] = measure_speed(args, paths, lines[: args.lines])
        for figure in report["speed"]:
            print(
                f"{figure['row']:<36} {figure['sentences_per_s']:>7.1f} sent/s "
                f"{figure['tokens_per_s']:>6} tok/s {figure['peak_rss_mib']:>5} MiB  "
                f"x{figure['time_over_ct2_same_precision']:.2f} CT2's time  "
                f"same as full softmax {figure['same_as_attn_mt_full_softmax']:.1%}"
            )
    print(json.dumps(report))
