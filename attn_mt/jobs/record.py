"""The record beside a partial translation (`FILE.partial.json`, jobs/partial.py): its format,
the digests it keeps of the input lines and checkpoints, how two records' settings differ, and
the check that a record read back is sound before anything goes by it. No torch here.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from attn_mt.errors import UserError, named

FORMAT = "attn-mt partial translation 1"


def line_digest() -> Any:
    """The running digest of the input lines a part has translated (`add_lines`)."""
    return hashlib.sha256()


def add_lines(digest: Any, lines: Iterable[str]) -> None:
    """Add input lines (as read: text without the line break) to `digest`."""
    for line in lines:
        digest.update(line.encode("utf-8", "surrogatepass") + b"\n")


def line_sha(line: str) -> str:
    """The sha256 of one input line, as a line finished ahead keeps it."""
    digest = line_digest()
    add_lines(digest, [line])
    return str(digest.hexdigest())


def file_digest(path: Path) -> str:
    """The sha256 of a file's bytes (a checkpoint: which model made a partial translation)."""
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def _flat(settings: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"decode": {"beam": 5}} -> {"decode.beam": 5}: the settings as one level of names."""
    flat: dict[str, Any] = {}
    for name, value in settings.items():
        if isinstance(value, dict) and value:
            flat |= _flat(value, f"{prefix}{name}.")
        else:
            flat[f"{prefix}{name}"] = value
    return flat


def difference(made: dict[str, Any], wanted: dict[str, Any]) -> str | None:
    """The first setting in which a partial translation's record differs from this run's,
    as words (None: the same settings)."""
    old, new = _flat(made), _flat(wanted)
    for name in sorted(old.keys() | new.keys()):
        if old.get(name) != new.get(name):
            if name.startswith("models"):
                return "other model checkpoints (their sha256 differ)"
            return f"{name} {json.dumps(old.get(name))}, this run {json.dumps(new.get(name))}"
    return None


def read_record(path: Path, data: Path, target: Path) -> dict[str, Any]:
    """The record `path` beside the partial translation `data` of `target`, checked whole: one
    that cannot be read, is another program's or is damaged (a key missing, a count that is not
    one) is refused, with the way out: delete it."""
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        why = f"unreadable: {getattr(err, 'strerror', None) or err}"
    else:
        if not isinstance(found, dict) or found.get("format") != FORMAT:
            why = f'not a record of attn-mt\'s (no "format": "{FORMAT}")'
        elif (wrong := damage(found)) is not None:
            why = f"damaged: {wrong}"
        else:
            return found
    also = f" and {named(data)} (its lines are translated again)" if os.path.lexists(data) else ""
    raise UserError(
        f"{named(path)}: {why}; attn-mt cannot tell what was translated: "
        f"delete it{also} to translate {named(target)} from the start"
    )


def _count(value: Any) -> bool:
    """Whether `value` is a count: an int (not a bool) of at least 0."""
    return type(value) is int and value >= 0


def damage(record: dict[str, Any]) -> str | None:
    """What is wrong with a record of attn-mt's format, in words; None for a sound one."""
    if not isinstance(record.get("settings"), dict):
        return '"settings" is not a mapping'
    part, done = record.get("part"), record.get("done")
    if not isinstance(part, dict) or not _count(part.get("start")):
        return '"part.start" is not a line number'
    stop = part.get("stop")
    if stop is not None and not (_count(stop) and stop >= part["start"]):
        return '"part.stop" is not a line number after part.start'
    if not isinstance(done, dict):
        return '"done" is not a mapping'
    for key in ("lines", "bytes"):
        if not _count(done.get(key)):
            return f'"done.{key}" is {json.dumps(done.get(key))}, not a count'
    if not isinstance(done.get("input_sha256"), str | None):
        return '"done.input_sha256" is not a digest'
    ahead = record.get("ahead", [])
    if not isinstance(ahead, list):
        return '"ahead" is not a list'
    for entry in ahead:
        sound = isinstance(entry, dict) and _count(entry.get("line"))
        sound = sound and entry["line"] >= done["lines"]
        if not (sound and isinstance(entry.get("input_sha256"), str)) or not isinstance(
            entry.get("text"), str
        ):
            return f'"ahead" holds {json.dumps(entry)[:60]}, not a line finished ahead'
    return None


def lines_words(part: dict[str, Any]) -> str:
    """`part` as words: `3-10 (shard 2/4)` for its 1-based first and last line."""
    stop = part.get("stop")
    span = f"{part['start'] + 1}-{'end' if stop is None else stop}"
    return span + (f" (--shard {part['shard']})" if part.get("shard") else "")
