"""The one exception family a user can cause; `cli/app.py` prints it as a single line."""


class UserError(Exception):
    """A mistake the user can fix (bad config, missing file, bad checkpoint): no traceback."""


class ConfigError(UserError):
    """The YAML config or a `--set` override is invalid."""


class DataError(UserError):
    """A corpus file is missing, malformed or mismatched."""


class CheckpointError(UserError):
    """A checkpoint is missing, corrupt, unsafe, or does not fit its config."""
