"""The one exception family a user can cause; `cli/app.py` prints it as a single line."""

import unicodedata
from pathlib import PurePath

# str.splitlines() ends a line at these besides the control characters (category Cc)
_BREAKS = frozenset("\u2028\u2029")


def named(name: str | PurePath) -> str:
    """A file or corpus name as a message shows it: as it is, or quoted as Python writes it
    (`'a\\nb'`) when it holds a control character or line break, so the message stays one
    line and the name stays exact."""
    text = str(name)
    if any(unicodedata.category(c) == "Cc" or c in _BREAKS for c in text):
        return repr(text)
    return text


def one_line(message: str) -> str:
    """`message` with any line break or control character left in it (a name no check quoted)
    written as its escape, for the single `attn-mt: error:` line."""
    if not any(unicodedata.category(c) == "Cc" or c in _BREAKS for c in message):
        return message
    return "".join(
        repr(c)[1:-1] if unicodedata.category(c) == "Cc" or c in _BREAKS else c for c in message
    )


class UserError(Exception):
    """A mistake the user can fix (bad config, missing file, bad checkpoint): no traceback."""


class ConfigError(UserError):
    """The YAML config or a `--set` override is invalid."""


class DataError(UserError):
    """A corpus file is missing, malformed or mismatched."""


class CheckpointError(UserError):
    """A checkpoint is missing, corrupt, unsafe, or does not fit its config."""
