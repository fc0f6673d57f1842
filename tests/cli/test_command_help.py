"""The commands' help: each names its command and says what it does in its module
docstring's first line (``tools._cli.command_parser``)."""

from __future__ import annotations

import pytest

from initpipe_vllm.tools import _cli, doctor, plan, startup


@pytest.mark.parametrize(
    ("module", "prog", "says"),
    [
        (plan, "initpipe plan", "What a vLLM worker would allocate for a model, planned on the"),
        (doctor, "initpipe doctor", "Which of initpipe's capabilities a vLLM supports"),
        (startup, "initpipe startup", "Where a whole vLLM start spends its time."),
    ],
)
def test_a_commands_help_is_its_docstrings_first_line(module: object, prog: str, says: str) -> None:
    parser = module.build_parser()  # type: ignore[attr-defined]
    assert parser.prog == prog
    assert parser.description.startswith(says)
    assert "`" not in parser.description  # reST markup stays in the reference
    assert parser.format_help().startswith(f"usage: {prog} ")


def test_a_bad_option_is_a_usage_error_not_an_exit() -> None:
    parser = _cli.command_parser("``initpipe x``: does ``y``.\n\nWhat belongs here: ...")
    assert (parser.prog, parser.description) == ("initpipe x", "Does y.")
    with pytest.raises(_cli.UsageError, match="unrecognized arguments: --nope"):
        plan.build_parser().parse_args(["--model", "m", "--num-blocks", "1", "--nope"])
