"""Every command's --help, and every group's, ends with at least one example (the project's rule), and each
example names a command that exists."""

from __future__ import annotations

import re

import typer
from typer.testing import CliRunner

import ddtree_bench.cli  # noqa: F401 (registers the commands)
from ddtree_bench.cli.app import app


def _walk(cmd, path: list[str]):
    yield path, cmd
    if hasattr(cmd, "commands"):   # a group (typer's own group class)
        for name, sub in cmd.commands.items():
            yield from _walk(sub, [*path, name])


def test_every_command_and_group_help_has_examples_of_real_commands():
    root = typer.main.get_command(app)
    names = {" ".join(p) for p, _ in _walk(root, [])}
    runner = CliRunner()
    seen = 0
    for path, _ in _walk(root, []):
        res = runner.invoke(app, [*path, "--help"])
        assert res.exit_code == 0, (path, res.output)
        assert "Examples:" in res.output, f"`ddtree-bench {' '.join(path)} --help` has no example"
        for line in res.output.split("Examples:", 1)[1].splitlines():
            m = re.match(r"\s+ddtree-bench ((?:[a-z][a-z-]*)(?: [a-z][a-z-]*)?)", line)
            if m and m.group(1) != "COMMAND":
                words = m.group(1).split()
                assert words[0] in names and (len(words) == 1 or " ".join(words) in names or words[0] not in ("baseline", "toy")), line
        seen += 1
    assert seen >= 14   # the root, two groups and their commands


def test_version_prints_the_package_version(capsys):
    from ddtree_bench import __version__
    from ddtree_bench.cli import main

    try:
        main(["--version"])
        code = 0
    except SystemExit as e:
        code = e.code
    assert code in (0, None) and capsys.readouterr().out.strip() == f"ddtree-bench {__version__}"
