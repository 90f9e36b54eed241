"""A glossary: source terms and the target term each must become. A line that holds a source
term (as a whole word or words, in any case) gets its target term as a constraint: the steered
search (`steered.py`) then writes it. `translate --glossary FILE` reads one from a file of
`source<TAB>target` lines, the server takes one as a JSON object; both match it with
`Glossary.constraints`, the one rule of which term applies to which line.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from attn_mt.decode.controls import checked_text
from attn_mt.errors import UserError, named


@dataclass(frozen=True)
class Glossary:
    """Source terms and their target terms (`entries`), each source term once (case aside)."""

    entries: tuple[tuple[str, str], ...]
    # The source terms lower-cased, longest first, as one pattern over a lower-cased line, so
    # that of two terms starting at one place ("New York", "New") the longer is found.
    _pattern: re.Pattern[str] = field(init=False, repr=False, compare=False)
    _targets: dict[str, str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        targets = {source.lower(): target for source, target in self.entries}
        terms = sorted(targets, key=len, reverse=True)
        alternatives = "|".join(map(re.escape, terms)) or "(?!)"  # none: never matches
        pattern = re.compile(rf"(?<!\w)(?:{alternatives})(?!\w)")
        object.__setattr__(self, "_pattern", pattern)
        object.__setattr__(self, "_targets", targets)

    @classmethod
    def of(cls, terms: Mapping[str, str], where: str = "glossary") -> Glossary:
        """A glossary of `terms` (source term -> target term); a UserError naming `where` and
        the term for one that is empty, holds a TAB or a line break, or is given twice."""
        entries: dict[str, tuple[str, str]] = {}
        for source, target in terms.items():
            pair = (
                checked_text(source, f"{where}: a source term"),
                checked_text(target, f"{where}: a target term"),
            )
            given = entries.setdefault(pair[0].lower(), pair)
            if given[1] != pair[1]:
                raise UserError(
                    f"{where}: {given[0]!r} -> {given[1]!r} and {pair[0]!r} -> {pair[1]!r}: "
                    "one source term (case aside) with two targets; keep one"
                )
        return cls(tuple(entries.values()))

    @classmethod
    def read(cls, path: Path) -> Glossary:
        """The glossary of a UTF-8 file of `source<TAB>target` lines (blank lines skipped); a
        UserError naming the file and the line for any other line."""
        try:
            text = path.read_text(encoding="utf-8-sig")
        except UnicodeDecodeError as err:
            bad = err.object[: err.start].count(b"\n") + 1
            raise UserError(f"--glossary {named(path)}: line {bad} is not UTF-8 text") from None
        except OSError as err:
            reason = err.strerror or err
            raise UserError(f"--glossary {named(path)}: cannot read ({reason})") from None
        terms: dict[str, str] = {}
        for number, line in enumerate(text.split("\n"), start=1):
            if not line.strip():
                continue
            where = f"--glossary {named(path)} line {number}"
            fields = line.split("\t")
            if len(fields) != 2:
                raise UserError(
                    f"{where}: give 'source term<TAB>target term' ({len(fields)} fields)"
                )
            source = checked_text(fields[0], f"{where}: the source term")
            if source in terms:
                raise UserError(f"{where}: {source!r} is given on an earlier line too; keep one")
            terms[source] = checked_text(fields[1], f"{where}: the target term")
        return cls.of(terms, f"--glossary {named(path)}")

    def terms(self, line: str) -> list[str]:
        """The target terms of the source terms `line` holds, in the order they occur, each
        once."""
        found = (self._targets[m.group()] for m in self._pattern.finditer(line.lower()))
        return list(dict.fromkeys(found))

    def constraints(
        self, lines: Sequence[str], given: Sequence[Sequence[str]] | None = None
    ) -> list[list[str]]:
        """Each line's terms: those `given` for it, then its glossary terms not among them."""
        given = given or [()] * len(lines)
        return [
            list(dict.fromkeys([*terms, *self.terms(line)]))
            for line, terms in zip(lines, given, strict=True)
        ]

    def digest(self) -> str:
        """The sha256 of the entries: which glossary made a translation, in a short string."""
        return hashlib.sha256(json.dumps(self.entries).encode("utf-8")).hexdigest()
