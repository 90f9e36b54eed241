"""What one line's output must hold, checked: terms that must appear (lexical constraints), a
forced output prefix and words that must not appear, segmented as every target line is
(`attn_mt.data.ids.target_ids`) into `Controls`, with a one-line error naming the first bad
line. The steered beam search (`steered.py`) then keeps them.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass, field

from attn_mt.data.ids import target_ids
from attn_mt.data.tokenizer import Tokenizer
from attn_mt.errors import LINE_BREAKS, UserError


@dataclass
class Controls:
    """What one line's output must hold: every term (piece ids each), the prefix it starts
    with, and none of the `avoid` piece sequences."""

    terms: list[list[int]] = field(default_factory=list)
    prefix: list[int] = field(default_factory=list)
    avoid: list[list[int]] = field(default_factory=list)

    def banks(self) -> int:
        """Dynamic beam allocation's banks: one per number of term tokens met, 0 included."""
        return sum(len(term) for term in self.terms) + 1

    def needed_length(self) -> int:
        """Output tokens the search may need: the prefix, every term token, and <eos>."""
        return len(self.prefix) + self.banks()


def line_controls(
    tokenizer: Tokenizer,
    lines: int,
    constraints: Sequence[Sequence[str]] | None,
    prefixes: Sequence[str | None] | None,
    avoid: Sequence[str],
    limit: int,
    first_line: int = 1,
) -> list[Controls | None]:
    """The Controls of each of `lines` lines (None: plain search), terms and prefixes segmented
    as target lines (`target_ids`); a UserError names the first bad line."""
    for name, given in (("constraints", constraints), ("prefixes", prefixes)):
        if given is not None and (isinstance(given, str) or len(given) != lines):
            raise UserError(f"{name}: give one entry per line ({lines}), [] or None for none")
    avoid_ids = target_ids(tokenizer, [checked_text(a, "avoided word") for a in avoid])
    if any(not ids for ids in avoid_ids):
        raise UserError("avoid: an avoided word is empty")
    result: list[Controls | None] = []
    for i in range(lines):
        number = first_line + i
        terms = [
            checked_text(t, f"line {number}: a term") for t in (constraints or [()] * lines)[i]
        ]
        prefix = (prefixes or [None] * lines)[i]
        prefix = checked_text(prefix, f"line {number}: the prefix") if prefix else ""
        if not (terms or prefix or avoid_ids):
            result.append(None)
            continue
        term_ids = target_ids(tokenizer, terms)
        prefix_ids = target_ids(tokenizer, [prefix])[0] if prefix else []
        controls = Controls(term_ids, prefix_ids, avoid_ids)
        for what, text, ids in [
            *(("a term", t, i) for t, i in zip(terms, term_ids, strict=True)),
            *([("the prefix", prefix, controls.prefix)] if prefix else []),
        ]:
            _written_as_given(tokenizer, f"line {number}: {what}", text, ids)
        for what, ids in [*zip(terms, term_ids, strict=True), (prefix, controls.prefix)]:
            if any(_contains(ids, bad) for bad in avoid_ids):
                raise UserError(f"line {number}: {what!r} holds an avoided word")
        if controls.needed_length() > limit:
            raise UserError(
                f"line {number}: the prefix and terms take {controls.needed_length() - 1} "
                f"tokens, more than an output may hold ({limit - 1}, as decode.max_input_len)"
            )
        result.append(controls)
    return result


def character(char: str) -> str:
    """`char` as U+XXXX and its Unicode name, for a message (controls have no name)."""
    name = unicodedata.name(char, "")
    return f"U+{ord(char):04X} {name}".rstrip()


def checked_text(text: object, what: str) -> str:
    """`text` stripped, or a UserError if it is not a non-empty one-line str."""
    if not isinstance(text, str):
        raise UserError(f"{what}: {text!r} is not a str")
    if "\t" in text or "\n" in text or "\r" in text:
        raise UserError(f"{what} {text!r} holds a TAB or line break")
    breaks = [c for c in text if c in LINE_BREAKS]
    if breaks:
        raise UserError(f"{what} {text!r} holds a line break ({character(breaks[0])})")
    if not text.strip():
        raise UserError(f"{what} is empty")
    return text.strip()


def _written_as_given(tokenizer: Tokenizer, what: str, text: str, ids: Sequence[int]) -> None:
    """A UserError naming the first character of `text` that its pieces `ids` do not write back
    (SentencePiece's NFKC normalisation turns fullwidth forms into ASCII and composes combining
    marks; a character outside the vocabulary becomes <unk>), so no term is met only as a
    different string."""
    written = tokenizer.decode([ids])[0]
    given = " ".join(text.split())  # runs of spaces are one space in any output
    if written == given:
        return
    at = next(
        (i for i, (a, b) in enumerate(zip(given, written, strict=False)) if a != b), len(written)
    )
    at = min(at, len(given) - 1)
    if at + 1 < len(given) and unicodedata.combining(given[at + 1]):
        at += 1  # the mark that composed with its base, not the base
    raise UserError(
        f"{what} {text!r} holds {character(given[at])}, which the target vocabulary does not "
        f"write as given (it writes {written!r}); give the text as the output would hold it"
    )


def _contains(seq: Sequence[int], part: Sequence[int]) -> bool:
    """True if `part` occurs in `seq` as a contiguous run."""
    return any(list(seq[i : i + len(part)]) == list(part) for i in range(len(seq) - len(part) + 1))
