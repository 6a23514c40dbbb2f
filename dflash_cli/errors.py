"""The one exception type the CLI turns into a one-line error and a non-zero exit."""


class DflashError(Exception):
    """A user-facing failure: bad input, missing file, unsupported checkpoint."""


class Interrupted(Exception):
    """Ctrl-C, after the command has shown what it finished: the CLI prints this one line and exits 130."""
