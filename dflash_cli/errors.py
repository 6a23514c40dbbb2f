"""The one exception type the CLI turns into a one-line error and a non-zero exit."""


class DflashError(Exception):
    """A user-facing failure: bad input, missing file, unsupported checkpoint."""
