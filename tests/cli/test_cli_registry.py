"""Each CLI command is one declaration beside its implementation (ojs_anyio._cli._registry):
the parser is built from the declarations, so a command can't be parsed without running
its own function, and a misspelled or doubly declared command fails at import.  No broker."""

from __future__ import annotations

import argparse

import pytest

from ojs_anyio import cli
from ojs_anyio._cli import _registry


def _leaves(parser: argparse.ArgumentParser, words: tuple[str, ...] = ()) -> dict[tuple[str, ...], object]:
    """Every command path of ``parser`` -> the declaration its parser carries."""
    found: dict[tuple[str, ...], object] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found.update(_leaves(sub, (*words, name)))
    if not found and words:
        found[words] = parser.get_default("declared")
    return found


def test_the_parser_is_the_declarations() -> None:
    leaves = _leaves(cli.build_parser())
    assert set(leaves) == set(_registry.COMMANDS)
    for words, declared in leaves.items():
        assert declared is _registry.COMMANDS[words], words
    assert {("worker",), ("queues",), ("dlq", "peek"), ("topology", "check"), ("demo",)} <= set(leaves)
    assert {("events", "dlq", "peek"), ("events", "dlq", "requeue"), ("events", "asyncapi")} <= set(leaves)


@pytest.mark.parametrize("words", sorted(_registry.COMMANDS), ids=" ".join)
def test_every_command_has_help(words: tuple[str, ...], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main([*words, "--help"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: ojs-anyio {' '.join(words)} ")


def test_parsed_arguments_point_at_their_declaration() -> None:
    args = cli.build_parser().parse_args(["dlq", "peek", "jobs", "-n", "3"])
    assert args.declared is _registry.COMMANDS[("dlq", "peek")] and args.n == 3
    args = cli.build_parser().parse_args(["events", "dlq", "peek", "orders", "-n", "2"])
    assert args.declared is _registry.COMMANDS[("events", "dlq", "peek")] and args.n == 2


def test_a_command_declared_twice_or_under_no_group_fails_at_once() -> None:
    async def run(args: argparse.Namespace) -> int:
        return 0

    with pytest.raises(RuntimeError, match="declared twice"):
        _registry.command("queues", help="again")(run)
    with pytest.raises(RuntimeError, match="no group 'nosuch'"):
        _registry.command("nosuch", "thing", help="x")(run)
    with pytest.raises(RuntimeError, match="declared twice"):
        _registry.group("dlq", help="again")
    with pytest.raises(RuntimeError, match="declared twice"):  # a group is not also a command
        _registry.command("events", "dlq", help="x")(run)
    with pytest.raises(RuntimeError, match="no group 'events nosuch'"):
        _registry.command("events", "nosuch", "thing", help="x")(run)
    assert ("nosuch", "thing") not in _registry.COMMANDS
