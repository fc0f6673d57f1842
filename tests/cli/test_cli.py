"""The ``initpipe`` dispatcher: subcommands, usage errors, exit codes."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from initpipe import cli
from initpipe.cli import app
from initpipe.errors import UsageError


def test_help_lists_graph_and_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--help"]) == 0
    assert "graph" in capsys.readouterr().out


def test_no_subcommand_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([]) == 2
    assert "Error: the following arguments are required: COMMAND" in capsys.readouterr().err


def test_unknown_subcommand_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["grpah"]) == 2
    err = capsys.readouterr().err
    assert err.splitlines()[-1].startswith("Error: argument COMMAND: invalid choice: 'grpah'")


def test_bad_flag_says_error_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["graph", "--format", "gif"]) == 2
    assert "Error: argument -f/--format: invalid choice: 'gif'" in capsys.readouterr().err


def test_adding_a_subcommand_is_one_function(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A function appended to COMMANDS is dispatched, and its UsageError exits 2."""
    seen: list[argparse.Namespace] = []

    def handler(args: argparse.Namespace) -> int:
        seen.append(args)
        if args.fail:
            raise UsageError("frobnicate needs a config")
        return 7

    def add_frobnicate(sub: Any) -> None:
        p = sub.add_parser("frobnicate")
        p.add_argument("--fail", action="store_true")
        p.set_defaults(handler=handler)

    monkeypatch.setattr(app, "COMMANDS", [*app.COMMANDS, add_frobnicate])
    assert cli.main(["frobnicate"]) == 7
    assert seen[0].command == "frobnicate"
    assert cli.main(["frobnicate", "--fail"]) == 2
    assert capsys.readouterr().err == "Error: frobnicate needs a config\n"


def test_graph_help_documents_every_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["graph", "--help"]) == 0
    out = capsys.readouterr().out
    for flag in (
        "--format",
        "--output",
        "--phase",
        "--focus",
        "--check",
        "--trace",
        "--blame",
        "--diff",
        "TARGET",
    ):
        assert flag in out
