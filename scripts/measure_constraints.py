"""Terminology constraints and word alignments, measured on one model and one test set.

Constraints: each sentence gets 1-2 terms drawn (seeded) from its reference, each a word or a
bigram of it; reported are the share of outputs holding every term, BLEU without and with the
terms, and the seconds of plain beam search against the constrained search over the same lines
in this one run (best of --repeat, after an untimed warm-up). Alignment (with --gold, Pharaoh
`i-j` lines of the true source-target word pairs): the alignment error rate of `--alignment`,
AER = 1 - 2|A & G| / (|A| + |G|) (every gold link counted as sure, Och & Ney 2003).

    python scripts/measure_constraints.py --model RUN --src test.src --ref test.tgt \
        [--gold test.align] [--beam 5] [--lines 500]

The last line is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from typing import cast

import sacrebleu

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: `bench`

import attn_mt  # noqa: E402
from attn_mt.data.text import read_lines  # noqa: E402
from attn_mt.decode.alignment import alignment_error_rate  # noqa: E402
from bench.common import cpu_name  # noqa: E402


def reference_terms(refs: list[str], seed: int) -> list[list[str]]:
    """1-2 terms per reference: a word or a bigram at random, not overlapping."""
    rng = random.Random(seed)
    terms = []
    for ref in refs:
        words, chosen = ref.split(), []
        used: set[int] = set()
        for _ in range(rng.randint(1, 2)):
            size = rng.choice((1, 2)) if len(words) > 1 else 1
            start = rng.randrange(len(words) - size + 1)
            span = set(range(start, start + size))
            if words and not span & used:
                used |= span
                chosen.append(" ".join(words[start : start + size]))
        terms.append(chosen)
    return terms


def timed(repeat: int, run) -> tuple[float, list]:
    """The best wall seconds of `repeat` calls of `run`, and its result."""
    best, result = float("inf"), None
    for _ in range(repeat):
        start = time.perf_counter()
        result = run()
        best = min(best, time.perf_counter() - start)
    assert result is not None, "--repeat must be at least 1"
    return best, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="run folder or .pt checkpoint")
    parser.add_argument("--src", required=True, type=Path)
    parser.add_argument("--ref", required=True, type=Path)
    parser.add_argument("--gold", type=Path, help="Pharaoh gold alignments of --src/--ref")
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--lines", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()

    translator = attn_mt.load(args.model, device="cpu")
    src, refs = read_lines(args.src)[: args.lines], read_lines(args.ref)[: args.lines]
    terms = reference_terms(refs, args.seed)
    # Warm-up, untimed: the first call pays one-time costs (kernel set-up, lazy imports), which
    # would otherwise fall on the plain run alone and flatter the constrained one.
    translator.translate(src[:32], beam=args.beam, constraints=terms[:32])
    plain_s, plain = timed(args.repeat, lambda: translator.translate(src, beam=args.beam))
    steered_s, steered = timed(
        args.repeat, lambda: translator.translate(src, beam=args.beam, constraints=terms)
    )
    held = sum(all(t in out for t in ts) for out, ts in zip(steered, terms, strict=True))
    figures = {
        "lines": len(src),
        "beam": args.beam,
        "terms": sum(map(len, terms)),
        "share_with_every_term": held / len(src),
        "share_with_every_term_unconstrained": sum(
            all(t in out for t in ts) for out, ts in zip(plain, terms, strict=True)
        )
        / len(src),
        "bleu_plain": round(sacrebleu.corpus_bleu(plain, [refs]).score, 2),
        "bleu_constrained": round(sacrebleu.corpus_bleu(steered, [refs]).score, 2),
        "seconds_plain": round(plain_s, 3),
        "seconds_constrained": round(steered_s, 3),
        "slowdown": round(steered_s / plain_s, 2),
        "cpu": cpu_name(),
    }
    if args.gold:
        found = translator.translate_nbest(src, beam=args.beam, alignment=True)
        gold = [
            [cast(tuple[int, int], tuple(map(int, pair.split("-")))) for pair in line.split()]
            for line in read_lines(args.gold)[: args.lines]
        ]
        # alignment=True: every translation carries its alignment
        aligned = [cast(list[tuple[int, int]], best[0].alignment) for best in found]
        figures["aer"] = round(alignment_error_rate(aligned, gold), 4)
    for name, value in figures.items():
        print(f"{name}: {value}")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
