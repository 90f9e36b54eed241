"""Decoding speed: attn-mt against the same checkpoint exported to CTranslate2, in one run.

For greedy search and beam search it times attn-mt with the key/value cache on and off, and
CTranslate2 float32 and int8 (exported into a temporary folder), all on the same sentences with
the same number of threads, and reports sentences/s, target tokens/s and the time ratio
attn-mt / CTranslate2. It prints a table and ends with one JSON line of every figure.

    python scripts/bench_decode.py --model runs/multi30k_de_en [--quick] [--threads 4]
    python scripts/bench_decode.py --model ckpt.pt --src sentences.txt --limit 500

--quick times 100 sentences and leaves out attn-mt's uncached beam search (quadratic in the
output length, by far the slowest row), to finish within a minute.
It never trains: --model must name a trained run folder or checkpoint. The sentences default to
the test split of the checkpoint's own config (Multi30k test_2016_flickr for a multi30k run).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

import attn_mt
from attn_mt.data import read_lines, split_files
from attn_mt.errors import UserError
from attn_mt.evaluate import score
from attn_mt.export import export_ctranslate2, translate_as_attn_mt

QUICK_SENTENCES = 100
WARMUP_SENTENCES = 8


@dataclass
class Row:
    """One timed configuration and what it produced."""

    engine: str  # "attn-mt" or "CTranslate2"
    beam: int
    variant: str  # "cache on", "cache off", "float32", "int8"
    seconds: float
    outputs: list[str]
    tokens: int  # target tokens produced, <eos> excluded

    @property
    def search(self) -> str:
        return "greedy" if self.beam == 1 else f"beam {self.beam}"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="A trained run folder or .pt checkpoint.")
    parser.add_argument("--src", help="Source sentences, one per line (default: the test split).")
    parser.add_argument("--ref", help="References for --src, to report BLEU.")
    parser.add_argument("--limit", type=int, help="Use the first N sentences.")
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"{QUICK_SENTENCES} sentences, and no uncached beam search (the slowest row).",
    )
    parser.add_argument("--beam", type=int, default=5, help="Beam size of the beam rows.")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    return parser.parse_args()


def hardware() -> dict[str, str]:
    """The machine the timings belong to."""
    cpu = platform.processor() or platform.machine()
    if Path("/proc/cpuinfo").is_file():
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    import ctranslate2

    return {
        "cpu": cpu,
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


def time_attn_mt(translator, lines: list[str], beam: int, use_cache: bool) -> Row:
    """attn-mt's own search (`Translator.translate_nbest`), after a warm-up."""
    translator.translate_nbest(lines[:WARMUP_SENTENCES], beam=beam, use_cache=use_cache)
    start = time.perf_counter()
    best = [n[0] for n in translator.translate_nbest(lines, beam=beam, use_cache=use_cache)]
    seconds = time.perf_counter() - start
    variant = "cache on" if use_cache else "cache off"
    tokens = sum(len(t.tokens) for t in best)
    return Row("attn-mt", beam, variant, seconds, [t.text for t in best], tokens)


def time_ctranslate2(folder: Path, variant: str, translator, lines, beam, threads) -> Row:
    """CTranslate2 with our decode settings; tokenization is inside the timing, as in ours.

    Our output limit is per sentence (a * source length + b tokens, <eos> included), the
    engine's per call, so sentences are sent in groups of one limit.
    """
    import ctranslate2

    engine = ctranslate2.Translator(str(folder), device="cpu", intra_threads=threads)
    cfg = translator.config.decode
    src_sp, tgt_sp = translator.src_tokenizer.sp, translator.tgt_tokenizer.sp
    options = dict(
        beam_size=beam,
        length_penalty=cfg.length_penalty,
        max_input_length=cfg.max_input_len + 1,
        max_batch_size=max(cfg.batch_tokens // beam, 1),
        batch_type="tokens",
    )

    def run(batch: list[str]) -> tuple[list[str], int]:
        pieces = src_sp.encode(batch, out_type=str)
        hyps = [
            r.hypotheses[0] for r in translate_as_attn_mt(engine, translator, pieces, **options)
        ]
        return tgt_sp.decode(hyps), sum(map(len, hyps))

    run(lines[:WARMUP_SENTENCES])
    start = time.perf_counter()
    outputs, tokens = run(lines)
    return Row("CTranslate2", beam, variant, time.perf_counter() - start, outputs, tokens)


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    try:
        import ctranslate2  # noqa: F401
    except ImportError:
        raise UserError("this benchmark needs ctranslate2: pip install 'attn-mt[ct2]'") from None
    translator = attn_mt.load(args.model, device="cpu")
    lines, refs = load_sentences(args, translator)
    info = hardware()
    print(
        f"hardware: {info['cpu']} ({info['logical_cores']} logical cores), "
        f"torch {info['torch']} [{info['torch_cpu_capability']}], "
        f"ctranslate2 {info['ctranslate2']}; {args.threads} thread(s), device cpu"
    )
    print(f"model: {args.model}; {len(lines)} sentences")

    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as tmp:
        folders = {
            variant: export_ctranslate2(args.model, Path(tmp) / variant, quantization=q)
            for variant, q in (("float32", "none"), ("int8", "int8"))
        }
        for beam in sorted({1, args.beam}):
            for use_cache in (True, False):
                if use_cache or beam == 1 or not args.quick:
                    rows.append(time_attn_mt(translator, lines, beam, use_cache))
            for variant, folder in folders.items():
                rows.append(
                    time_ctranslate2(folder, variant, translator, lines, beam, args.threads)
                )
    report(rows, lines, refs, args, info)


def report(rows: list[Row], lines, refs, args, info) -> None:
    """The table, then one JSON line."""
    baseline = {
        row.beam: row for row in rows if row.engine == "attn-mt" and row.variant == "cache on"
    }
    figures = []
    header = (
        f"{'engine':<12} {'search':<7} {'variant':<9} {'sent/s':>8} {'tok/s':>9} "
        f"{'seconds':>8} {'BLEU':>6} {'same':>6} {'attn-mt/CT2 time':>17}"
    )
    print(header)
    print("-" * len(header))
    for row in rows:
        base = baseline[row.beam]
        ratio = base.seconds / row.seconds if row.engine == "CTranslate2" else None
        same = sum(a == b for a, b in zip(row.outputs, base.outputs, strict=True)) / len(lines)
        bleu = score(row.outputs, refs).bleu if refs else None
        figures.append(
            {
                "engine": row.engine,
                "beam": row.beam,
                "variant": row.variant,
                "seconds": round(row.seconds, 4),
                "sentences_per_s": round(len(lines) / row.seconds, 2),
                "tokens_per_s": round(row.tokens / row.seconds, 1),
                "target_tokens": row.tokens,
                "bleu": None if bleu is None else round(bleu, 2),
                "same_as_attn_mt_cached": round(same, 4),
                "time_ratio_attn_mt_over_ct2": None if ratio is None else round(ratio, 2),
            }
        )
        print(
            f"{row.engine:<12} {row.search:<7} {row.variant:<9} "
            f"{len(lines) / row.seconds:>8.1f} {row.tokens / row.seconds:>9.0f} "
            f"{row.seconds:>8.2f} {'-' if bleu is None else f'{bleu:.2f}':>6} "
            f"{same:>6.0%} {'-' if ratio is None else f'{ratio:.2f}x':>17}"
        )
    if args.quick:
        print("--quick: attn-mt beam search without the cache was not timed.")
    print(
        "'same': share of lines identical to attn-mt (cache on) with the same search; "
        "'attn-mt/CT2 time': attn-mt (cache on) seconds / CTranslate2 seconds."
    )
    print(
        json.dumps(
            {
                "bench": "decode",
                "model": str(args.model),
                "sentences": len(lines),
                "threads": args.threads,
                "quick": args.quick,
                "device": "cpu",
                "hardware": info,
                "rows": figures,
            }
        )
    )


if __name__ == "__main__":
    try:
        main()
    except UserError as err:
        print(f"bench_decode: error: {err}", file=sys.stderr)
        sys.exit(2)
