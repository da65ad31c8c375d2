"""The two kinds of failure every command reports the same way.

`UsageError` is bad input (flags, files, config, an unreachable server before any request): the CLI
prints one `error: ...` line (and an optional `hint: ...` line) and exits 2. `RunFailed` means the
command ran and found a failure (a gate regression, a run whose every request failed): exit 1.
An interruption is a KeyboardInterrupt either way, so `finally` blocks stop servers and drop staging
directories; `sigterm_to_interrupt` turns SIGTERM into one and notes it in `INTERRUPT` (exit 143, not
Ctrl-C's 130), where a command may also leave a hint (e.g. the sweep's `--resume` line).
Nothing here knows about typer; `cli/` maps these to exit codes.
"""

from __future__ import annotations


class UsageError(Exception):
    """Bad input. Exit code 2. `hint` is an optional second line telling the user what to do."""

    exit_code = 2

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.hint = hint


class RunFailed(Exception):
    """The command ran and found a failure. Exit code 1."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.hint = hint


INTERRUPT: dict = {"sigterm": False, "hint": None}   # how the command was interrupted, and what to tell the user


def sigterm_to_interrupt(signum, frame) -> None:
    """A SIGTERM handler: raise KeyboardInterrupt in the main thread, noting that SIGTERM did it."""
    INTERRUPT["sigterm"] = True
    raise KeyboardInterrupt
