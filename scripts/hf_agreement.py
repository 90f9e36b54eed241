"""An exported transformers folder beside attn-mt on a whole test set: BLEU, chrF and the share
of identical lines, greedy and beam.

    attn-mt export --format hf --model RUN --out DIR
    python scripts/hf_agreement.py --model RUN --hf DIR [--beam 5] [--limit 500]

The sentences are the test split of the checkpoint's own config (or --src/--ref). attn-mt
translates with `Translator.translate` (per-sentence output limits, GNMT length penalty);
transformers with `model.generate(num_beams=B)` under the folder's generation_config.json (one
max_length, length ** penalty), as a user of the folder would. Rows with length penalty 0 show
the two searches with the same ranking.
"""

from __future__ import annotations

import argparse

import torch
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

import attn_mt
from attn_mt.data.corpora import split_files
from attn_mt.data.text import read_lines
from attn_mt.scores import score


def hf_translate(model, tokenizer, lines: list[str], beam: int, alpha: float | None) -> list[str]:
    """`generate` over batches of 32 sentences; `alpha` None keeps the folder's penalty."""
    options = {} if alpha is None else {"length_penalty": alpha}
    out: list[str] = []
    for start in range(0, len(lines), 32):
        batch = tokenizer(lines[start : start + 32], return_tensors="pt", padding=True)
        with torch.no_grad():
            ids = model.generate(**batch, num_beams=beam, **options)
        out += tokenizer.batch_decode(ids, skip_special_tokens=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="The run folder or checkpoint exported.")
    parser.add_argument("--hf", required=True, help="The folder `export --format hf` wrote.")
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--src", help="Source sentences (default: the test split).")
    parser.add_argument("--ref", help="Their references.")
    parser.add_argument("--limit", type=int, default=0, help="Only the first N sentences.")
    args = parser.parse_args()
    translator = attn_mt.load(args.model, device="cpu")
    files = (args.src, args.ref) if args.src else split_files(translator.config.data, "test")
    if files is None:
        parser.error("the checkpoint's config has no test split; give --src and --ref")
    src, refs = read_lines(files[0]), read_lines(files[1])
    if args.limit:
        src, refs = src[: args.limit], refs[: args.limit]
    model = AutoModelForSeq2SeqLM.from_pretrained(args.hf, local_files_only=True).eval()
    tokenizer = AutoTokenizer.from_pretrained(args.hf, local_files_only=True)
    alpha = translator.config.decode.length_penalty
    print(f"{len(src)} sentences; attn-mt length penalty {alpha} (GNMT), transformers its own")
    print("search                     attn-mt BLEU/chrF   transformers BLEU/chrF   identical")
    for beam, penalty in ((1, None), (args.beam, None), (args.beam, 0.0)):
        ours = translator.translate(src, beam=beam, length_penalty=penalty)
        theirs = hf_translate(model, tokenizer, src, beam, penalty)
        a, b = score(ours, refs), score(theirs, refs)
        same = sum(x == y for x, y in zip(ours, theirs, strict=True)) / len(src)
        name = f"beam {beam}" + (", length penalty 0" if penalty == 0.0 else "")
        print(
            f"{name:<26} {a.bleu:6.2f} / {a.chrf:5.2f}      {b.bleu:6.2f} / {b.chrf:5.2f}"
            f"           {same:6.1%}"
        )
    print(f"BLEU signature: {a.signatures['bleu']}")


if __name__ == "__main__":
    main()
