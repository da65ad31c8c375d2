"""`ddtree-bench` command line: one typer app, one module per command in this package.

`main()` turns every failure into the exit-code contract: 0 success, 1 the command ran and found a
failure (`RunFailed`), 2 bad input (`UsageError`, bad flags). Errors print one `error: ...` line on
stderr, optionally followed by a `hint: ...` line; `--debug` (anywhere on the line, or
DDTREE_BENCH_DEBUG=1) shows the traceback instead.
Every module in this package is imported so that it can register its commands on `app`.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import signal
import sys
import threading
import traceback

from ddtree_bench.cli.app import app, state
from ddtree_bench.errors import INTERRUPT, RunFailed, UsageError, sigterm_to_interrupt

for _m in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
    if _m.name not in ("app",):
        importlib.import_module(f"{__name__}.{_m.name}")


def _fail(code: int, message: str, hint: str | None = None) -> None:
    print(f"error: {message}", file=sys.stderr)
    if hint:
        print(f"hint: {hint}", file=sys.stderr)
    sys.exit(code)


def _interrupted() -> None:
    """Ctrl-C: exit 130; SIGTERM: exit 143 (128 + the signal, as a shell reports it); the command's hint, if any."""
    if INTERRUPT["sigterm"]:
        _fail(143, "terminated (SIGTERM)", INTERRUPT["hint"])
    _fail(130, "interrupted", INTERRUPT["hint"])


def take_debug(args: list[str]) -> tuple[list[str], bool]:
    """`--debug` anywhere on the line (before or after the subcommand, before a bare `--`): taken out of
    the arguments, so every subcommand accepts it as the crash hint says."""
    end = args.index("--") if "--" in args else len(args)
    found = "--debug" in args[:end]
    return [a for a in args[:end] if a != "--debug"] + args[end:], found


def _click_kind(e: BaseException) -> str | None:
    """Classify click's exceptions by class name: typer >= 0.2x vendors its own copy of click,
    so isinstance checks against the `click` package miss them."""
    for cls in type(e).__mro__:
        if cls.__name__ in ("NoArgsIsHelpError", "Exit", "Abort", "UsageError", "ClickException"):
            return cls.__name__
    return None


def main(argv: list[str] | None = None) -> None:
    args, debug_flag = take_debug(list(sys.argv[1:] if argv is None else argv))
    debug = debug_flag or os.environ.get("DDTREE_BENCH_DEBUG") == "1"
    state["debug"] = debug
    INTERRUPT.update(sigterm=False, hint=None)
    if args[:1] != ["serve"] and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, sigterm_to_interrupt)  # finally blocks run (servers stop, staging is dropped)
    try:
        rv = app(args=args, prog_name="ddtree-bench", standalone_mode=False)
        if rv == 130:  # typer turns KeyboardInterrupt (Ctrl-C, or SIGTERM) into a returned 130
            _interrupted()
    except (UsageError, RunFailed) as e:
        if debug or state.get("debug"):
            traceback.print_exc()
        _fail(e.exit_code, str(e), e.hint)
    except KeyboardInterrupt:
        _interrupted()
    except BrokenPipeError:
        sys.exit(0)
    except Exception as e:
        kind = _click_kind(e)
        if kind == "NoArgsIsHelpError":  # `ddtree-bench baseline` with nothing after it: show help
            print(e.ctx.get_help())
            sys.exit(0)
        if kind == "Exit":
            sys.exit(e.exit_code)
        if kind == "Abort":
            _interrupted()
        if kind in ("UsageError", "ClickException"):
            ctx = getattr(e, "ctx", None)
            cmd = ctx.command_path if ctx is not None else "ddtree-bench"
            _fail(2, e.format_message(), f"see '{cmd} --help'" if kind == "UsageError" else None)
        if debug or state.get("debug"):  # an unexpected bug: one line unless --debug
            traceback.print_exc()
            sys.exit(1)
        _fail(1, f"internal error: {type(e).__name__}: {e}", "rerun with --debug for the traceback, and please report it")
