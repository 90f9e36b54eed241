"""Spans kept verbatim: URLs, e-mail addresses, @handles, #tags, file paths, inline `code` and
emoji are taken out of a line before the model reads it and put back into its output; so are
the numbers that `numbers` picks (those the model's vocabulary spells piece by piece; every
one, where the model's output of the whole line lost one).

A span takes the punctuation written against it (`(https://x.de)`, `info@x.de,`), but for the
line's final punctuation, which stays in the text the model reads (`Mehr unter https://x.de.`
is read `Mehr unter.`). Put back, a span goes where the word alignment leads, as `format: html`
places inline tags (`documents/markup.py`): after the output of the source word before it (at
the line's start, before the first output word); one written against the word after it
(`👍Super`) before that word's output; one at the end before the output's final punctuation;
spans keep their order.

A number (`28`, `1.000`, `3,5`, `10:30`, `24/7`; not one inside a word, `T4` or `3D`) counts as
kept when the output holds it as written, with `.` and `,` swapped, or (where they group
thousands) without them: `1.000` as `1,000` or `1000`, `3,5` as `3.5`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from attn_mt.text.normalize import final_punct

_EXTENSIONS = (
    "pdf|txt|csv|tsv|json|ya?ml|xml|html?|md|py|js|ts|sh|log|ini|cfg|conf|zip|gz|tar|png|"
    "jpe?g|gif|svg|docx?|xlsx?|pptx?|exe|mp3|mp4|wav"
)
# One emoji: a pictograph (flags are two regional indicators; skin tones follow), with its
# variation selector, joined to more by zero-width joiners; or a keycap (1️⃣).
_PICTOGRAPH = "[\U0001f000-\U0001faff\u2600-\u27bf\u2b00-\u2bff\u2300-\u23ff]"
_EMOJI = f"(?:[0-9#*]\ufe0f?\u20e3|{_PICTOGRAPH}\ufe0f?(?:\u200d{_PICTOGRAPH}\ufe0f?)*)+"
# Tried left to right; at one place, the first kind that matches.
KINDS = {
    "code": r"`[^`\n]+`",
    "url": r"(?:\b(?i:https?|ftp)://|\b(?i:www)\.)[^\s<>\"`]+",
    "email": r"\b[\w.+-]+@[\w-]+(?:\.[\w-]+)*\.[^\W\d_]{2,}\b",
    "path": r"(?<![\w/\\.])(?:~?/|\.\.?/|[A-Za-z]:\\)[^\s<>\"`]+"
    rf"|\b[\w-]+(?:\.[\w-]+)*\.(?i:{_EXTENSIONS})\b",
    "handle": r"(?<![\w@])@\w{1,39}\b",
    "tag": r"(?<![\w#&])#\w*[^\W\d_]\w*",
    "emoji": _EMOJI,
}
_NUMBER = r"(?<![\w.,:/])\d+(?:[.,:/]\d+)*(?![\w/])"
SPANS = re.compile("|".join(f"(?P<{kind}>{rule})" for kind, rule in KINDS.items()))
WITH_NUMBERS = re.compile(f"{SPANS.pattern}|(?P<number>{_NUMBER})")  # last: 1️⃣ is an emoji
NUMBER = re.compile(_NUMBER)
# What every span holds one of: a line without any is searched no further (most lines).
_CANDIDATE = re.compile(rf"[`@#/\\]|\b(?i:www)\.|\.(?i:{_EXTENSIONS})\b|{_PICTOGRAPH}|\u20e3")
Picked = Callable[[str], bool] | None  # which numbers are spans (None: none)
# Punctuation a URL or path does not end in (unless it closes a bracket it opened).
_TRAILING = ".,;:!?'\"”’»)]}>"
_OPENS = {")": "(", "]": "[", "}": "{"}


@dataclass
class Span:
    """A span taken out of a line: its text (with the punctuation written against it), kind,
    the words of the text the model reads before it (`gap`), what it is written against
    ("left": the word before, "right": the word after, "": spaces), whether it comes after
    the last word (`end`), and the line's words it covers."""

    text: str
    kind: str
    gap: int
    glue: str
    end: bool
    words: list[int] = field(default_factory=list)


@dataclass
class Taken:
    """A line with its spans taken out: the text the model reads, the spans in line order,
    and each word of the text's number among the line's words."""

    text: str
    spans: list[Span]
    words: list[int]


def _word_at(text: str, offset: int) -> int:
    """The number (from 0) among `text`'s words of the word at, or just before, `offset`."""
    before = len(text[:offset].split())
    going_on = offset > 0 and offset < len(text) and not text[offset - 1].isspace()
    return before - 1 if going_on or (offset == len(text) and before) else before


def _trimmed(text: str) -> str:
    """A URL or path without the punctuation that ends the sentence around it."""
    while text and text[-1] in _TRAILING:
        opener = _OPENS.get(text[-1])
        if opener and text.count(opener) >= text.count(text[-1]):
            break
        text = text[:-1]
    return text


def find(line: str, numbers: Picked = None) -> list[tuple[int, int, str]]:
    """The spans of `line` as (start, end, kind), in order; the numbers that `numbers` picks
    among them."""
    found: list[tuple[int, int, str]] = []
    if not (numbers and NUMBER.search(line)) and not _CANDIDATE.search(line):
        return found
    for match in (WITH_NUMBERS if numbers else SPANS).finditer(line):
        kind = str(match.lastgroup)
        text = _trimmed(match.group()) if kind in ("url", "path") else match.group()
        if kind == "number" and numbers is not None and not numbers(text):
            continue
        if text:
            found.append((match.start(), match.start() + len(text), kind))
    return found


def take_out(line: str, numbers: Picked = None) -> Taken | None:
    """`line` without its spans (None: it has none), the numbers `numbers` picks among them;
    each span with the punctuation written against it up to a space, but the line's final
    punctuation."""
    found = find(line, numbers)
    if not found:
        return None
    body_end = len(line.rstrip()) - len(final_punct(line))
    bounds: list[tuple[int, int, str]] = []
    for number, (start, end, kind) in enumerate(found):
        low = bounds[-1][1] if bounds else 0
        high = found[number + 1][0] if number + 1 < len(found) else max(body_end, end)
        k = start
        while k > low and not line[k - 1].isspace() and not line[k - 1].isalnum():
            k -= 1
        start = k if k == 0 or line[k - 1].isspace() else start
        k = end
        while k < high and not line[k].isspace() and not line[k].isalnum():
            k += 1
        end = k if k == len(line) or line[k].isspace() or k == body_end else end
        bounds.append((start, end, kind))
    text, offsets, spans = "", list[int](), list[Span]()
    at = 0
    for start, end, kind in bounds:
        piece = line[at:start]
        if end == body_end and body_end < len(line.rstrip()):
            piece = piece.rstrip()  # the final punctuation joins the word before the span
        text += piece
        offsets += range(at, at + len(piece))
        left = start > 0 and not line[start - 1].isspace()
        right = end < body_end and not line[end].isspace()
        glue = "left" if left else "right" if right else ""
        words = list(range(_word_at(line, start), _word_at(line, end - 1) + 1))
        spans.append(Span(line[start:end], kind, len(text.split()), glue, False, words))
        at = end
    text += line[at:]
    offsets += range(at, len(line))
    model = " ".join(text.split())
    starts = [m.start() for m in re.finditer(r"\S+", text)]
    for span in spans:
        span.end = span.gap >= len(starts)
    return Taken(model, spans, [_word_at(line, offsets[s]) for s in starts])


def put_back(
    taken: Taken, text: str, alignment: Sequence[tuple[int, int]]
) -> tuple[str, list[tuple[int, int]]]:
    """The output `text` (of `taken.text`, with its Pharaoh `alignment`) with the spans put
    back, and the alignment of the line's words to the words of the result."""
    words = text.split()
    count = len(words)
    targets: dict[int, list[int]] = {}
    for source, target in alignment:
        targets.setdefault(source, []).append(target)
    positions: list[int] = []
    for span in taken.spans:
        if span.glue == "right" and targets.get(span.gap):
            place = min(targets[span.gap])
        elif span.end:
            place = count
        elif span.gap and targets.get(span.gap - 1):
            place = max(targets[span.gap - 1]) + 1
        else:
            later = [t for s, ts in targets.items() if s >= span.gap for t in ts]
            place = min(later, default=count)
        positions.append(min(max(place, positions[-1] if positions else 0), count))
    tail = ""
    if count and count in positions:  # the output's final punctuation stays last
        tail = final_punct(words[-1])
        words[-1] = words[-1][: len(words[-1]) - len(tail)]
    pieces: list[tuple[str, bool, int | None, Span | None]] = []  # text, space before, source
    glued = False
    for gap in range(count + 1):
        for span, place in zip(taken.spans, positions, strict=True):
            if place == gap:
                pieces.append((span.text, span.glue != "left" and not glued, None, span))
                glued = span.glue == "right"
        if gap < count:
            pieces.append((words[gap], not glued, gap, None))
            glued = False
    out, renumbered, span_words = "", dict[int, int](), list[tuple[int, int]]()
    for piece, space, word, held in pieces:
        if not piece:
            continue
        out += " " if out and space else ""
        first = len(out.split()) - (0 if space or not out else 1)
        out += piece
        if word is not None:
            renumbered[word] = max(first, 0)
        elif held is not None and held.glue == "":
            outputs = range(first, first + len(piece.split()))  # a word each, as in the line
            span_words += list(zip(held.words, outputs, strict=True))
    pairs = [(taken.words[s], renumbered[t]) for s, t in alignment if t in renumbered]
    return out + tail, sorted(pairs + span_words, key=lambda pair: pair[1])


def numbers(text: str) -> list[str]:
    """The numbers of `text`, as written, in order."""
    return NUMBER.findall(text)


def _forms(number: str) -> set[str]:
    """The ways an output may write `number`: as written, with `.` and `,` swapped, and
    without separators where they group thousands."""
    swapped = number.translate(str.maketrans(".,", ",."))
    groups = re.split(r"[.,]", number)
    grouping = len(groups) > 1 and all(len(g) == 3 for g in groups[1:]) and ":" not in number
    return {number, swapped} | ({"".join(groups)} if grouping else set())


def missing(source: Sequence[str], output: str) -> list[str]:
    """The numbers of `source` that `output` holds in none of their forms."""
    found = set(numbers(output))
    return [n for n in dict.fromkeys(source) if not _forms(n) & found]
