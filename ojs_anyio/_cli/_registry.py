"""The CLI's commands, each declared once, beside the function that implements it.

::

    @command("dlq", "peek", help="show the oldest dead jobs", arguments=_peek_arguments)
    async def cmd_dlq_peek(args): ...

A declaration names the command's words, its help, the function that adds its arguments
to its parser, and (by decorating it) the function that runs it.  ``ojs_anyio.cli`` builds
the parser from :data:`COMMANDS` and runs the declaration the parsed arguments point at:
there is no second table to keep in step.  Declaring a command twice, or a sub-command
under a group nobody declared, fails at import.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

__all__ = ["COMMANDS", "GROUPS", "Command", "Group", "command", "group", "sync_command"]

#: A command's runner, given the parsed arguments: an exit code, or the coroutine function
#: ``main`` runs under ``anyio.run`` (with the backend the arguments name).
Runner = Callable[[argparse.Namespace], "int | Callable[[], Coroutine[Any, Any, int]]"]
Arguments = Callable[[argparse.ArgumentParser], None]
_R = TypeVar("_R", bound=Runner)


def _no_arguments(parser: argparse.ArgumentParser) -> None:
    pass


@dataclass(frozen=True, slots=True)
class Command:
    #: The words that select it: ``("queues",)``, ``("dlq", "peek")``.
    words: tuple[str, ...]
    help: str
    description: str | None
    arguments: Arguments
    run: Runner
    #: ``"quiet"``: a one-shot command (its error line says what went wrong; library log
    #: lines would only repeat it); ``"service"``: logs per ``--log-level`` / ``--log-format``;
    #: ``"own"``: the runner sets logging up itself.
    logging: Literal["quiet", "service", "own"] = "quiet"
    #: Takes the common options (``--url``, ``--prefix``, ``--json``, ``--traceback``) and
    #: talks to a broker; ``False`` for a self-contained command (``demo``).
    broker: bool = True
    formatter: type[argparse.HelpFormatter] | None = field(default=None)


@dataclass(frozen=True, slots=True)
class Group:
    """Words with sub-commands (``("dlq",)``, ``("events", "dlq")``)."""

    words: tuple[str, ...]
    help: str
    metavar: str = "ACTION"


#: Every command, by its words (``--help`` lists them sorted).
COMMANDS: dict[tuple[str, ...], Command] = {}
#: Every group, by its words; a group's words minus the last are a group too.
GROUPS: dict[tuple[str, ...], Group] = {}


def _check_words(words: tuple[str, ...]) -> None:
    """Refuse words declared twice (as a group or a command) or under an undeclared group."""
    name = " ".join(words)
    if not words:
        raise RuntimeError("ojs-anyio: a command or group needs at least one word")
    if words in COMMANDS or words in GROUPS:
        raise RuntimeError(f"ojs-anyio {name}: declared twice")
    if len(words) > 1 and words[:-1] not in GROUPS:
        raise RuntimeError(f"ojs-anyio {name}: no group {' '.join(words[:-1])!r} declared")


def group(*words: str, help: str, metavar: str = "ACTION") -> Group:
    """Declare words that take sub-commands (before their first sub-command)."""
    _check_words(words)
    GROUPS[words] = g = Group(words, help, metavar)
    return g


def _register(cmd: Command) -> None:
    _check_words(cmd.words)
    COMMANDS[cmd.words] = cmd


def command(
    *words: str,
    help: str,
    description: str | None = None,
    arguments: Arguments = _no_arguments,
    logging: Literal["quiet", "service", "own"] = "quiet",
) -> Callable[[Callable[[argparse.Namespace], Coroutine[Any, Any, int]]], Callable[..., Any]]:
    """Declare an async command: the decorated ``async def f(args) -> int`` runs it."""

    def declare(
        fn: Callable[[argparse.Namespace], Coroutine[Any, Any, int]],
    ) -> Callable[[argparse.Namespace], Coroutine[Any, Any, int]]:
        def run(args: argparse.Namespace) -> Callable[[], Coroutine[Any, Any, int]]:
            return lambda: fn(args)

        _register(Command(words, help, description, arguments, run, logging))
        return fn

    return declare


def sync_command(
    *words: str,
    help: str,
    description: str | None = None,
    arguments: Arguments = _no_arguments,
    logging: Literal["quiet", "service", "own"] = "own",
    broker: bool = True,
    formatter: type[argparse.HelpFormatter] | None = None,
) -> Callable[[_R], _R]:
    """Declare a command whose decorated ``f(args)`` returns an exit code, or the coroutine
    function to run (``worker`` decides between one process and a supervisor)."""

    def declare(fn: _R) -> _R:
        _register(Command(words, help, description, arguments, fn, logging, broker, formatter))
        return fn

    return declare
