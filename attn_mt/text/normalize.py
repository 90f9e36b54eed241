"""The characters a line is normalised in before the model, and the final punctuation an output
keeps.

SentencePiece's own normaliser (NFKC and its `nmt` rules) already writes every kind of space
(no-break, thin, ideographic), tabs, zero-width spaces, byte-order, direction and Arabic letter
marks as one space or nothing, in training and translation alike. What it keeps, and the model
then reads as byte pieces it hardly ever saw, is `INVISIBLE`: soft hyphens, word joiners, the
Mongolian vowel separator, invisible operators, bidirectional embeddings, overrides and
isolates; `invisible` removes them, and `prepare` reads the training pairs through it too
(Multi30k holds none, so its shards are unchanged). The zero-width joiner stays: it joins emoji
and shapes Indic scripts.

Typographic quotes and dashes carry meaning (German writes „so“) and stay when the source
vocabulary holds them, that is when the training sources wrote them; one it lacks is written as
the nearest it holds (`typographic`): « » and “ ” as ", an em dash as an en dash or -, a minus
as -.

A source without final punctuation gives an output without (`without_final_punct`, the rule
data.augment's `no_final_punct` writes its pairs by too).
"""

from __future__ import annotations

import re
from collections.abc import Callable

INVISIBLE = frozenset(
    "\u00ad\u180e\u2060\u2061\u2062\u2063\u2064"
    "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
)
_INVISIBLE = {ord(c): None for c in INVISIBLE}
# Each typographic character and what to write instead, in order of preference, where the
# source vocabulary lacks it.
TYPOGRAPHIC = {
    "“": '"',
    "”": '"',
    "„": '"',
    "‟": '"',
    "«": '"',
    "»": '"',
    "″": '"',
    "‘": "'",
    "’": "'",
    "‚": "'",
    "‛": "'",
    "‹": "'",
    "›": "'",
    "′": "'",
    "—": "–-",
    "―": "–-",
    "‒": "–-",
    "–": "-",
    "‐": "-",
    "‑": "-",
    "−": "-",
}
# Sentence-final punctuation (`without_final_punct`), and what may close a sentence after it.
FINAL_PUNCT = ".!?;:…。！？；：؟।"
CLOSING = "\"'»”’)]"
_ANY_INVISIBLE = re.compile(f"[{''.join(sorted(INVISIBLE))}]")


def invisible(line: str) -> str:
    """`line` without the invisible characters SentencePiece keeps (`INVISIBLE`)."""
    return line.translate(_INVISIBLE) if _ANY_INVISIBLE.search(line) else line


def typographic(known: Callable[[str], bool]) -> dict[int, str]:
    """The `str.translate` table of the typographic characters a vocabulary lacks (`known`
    says whether it holds a character): each to the first of its replacements it holds."""
    table = {}
    for char, options in TYPOGRAPHIC.items():
        if not known(char):
            chosen = next((o for o in options if known(o)), options[-1])
            table[ord(char)] = chosen
    return table


def without_final_punct(line: str) -> str:
    """`line` without the punctuation that ends it (before any closing quotes or brackets,
    which stay)."""
    stripped = line.rstrip()
    body = stripped.rstrip(CLOSING)
    kept = body.rstrip(FINAL_PUNCT).rstrip()
    return kept + stripped[len(body) :] if kept and kept != body else line


def final_punct(line: str) -> str:
    """The run of final punctuation that ends `line` (after it only spaces), or ""."""
    stripped = line.rstrip()
    return stripped[len(stripped.rstrip(FINAL_PUNCT)) :]
