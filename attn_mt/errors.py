"""The one exception family a user can cause, which `cli/app.py` prints as a single line, and
the set of characters that break a line."""

import unicodedata
from pathlib import PurePath

# Every character `str.splitlines` ends a line at, not only a file's \n and \r: the one set that
# messages quote, per-line inputs refuse and outputs turn into spaces.
LINE_BREAKS = frozenset("\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029")


def named(name: str | PurePath) -> str:
    """A file or corpus name as a message shows it: as it is, or quoted as Python writes it
    (`'a\\nb'`) when it holds a control character or line break, so the message stays one
    line and the name stays exact."""
    text = str(name)
    if any(map(_needs_escape, text)):
        return repr(text)
    return text


def one_line(message: str) -> str:
    """`message` with any line break or control character left in it (a name no check quoted)
    written as its escape, for the single `attn-mt: error:` line."""
    if not any(map(_needs_escape, message)):
        return message
    return "".join(repr(c)[1:-1] if _needs_escape(c) else c for c in message)


def _needs_escape(char: str) -> bool:
    """Whether a one-line message writes `char` as its escape: a line break or a control
    character."""
    return char in LINE_BREAKS or unicodedata.category(char) == "Cc"


class UserError(Exception):
    """A mistake the user can fix (bad config, missing file, bad checkpoint): no traceback."""


class ConfigError(UserError):
    """The YAML config or a `--set` override is invalid."""


class DataError(UserError):
    """A corpus file is missing, malformed or mismatched."""


class CheckpointError(UserError):
    """A checkpoint is missing, corrupt, unsafe, or does not fit its config."""
