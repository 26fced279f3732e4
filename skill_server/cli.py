"""``gradient-doctor`` command line.

Each sub-command lives in its own module under ``skill_server.commands`` and exposes
``NAME``, ``HELP``, ``add_arguments(parser)`` and ``run(args) -> int``. Modules are discovered,
not listed, so adding a command is adding a file.

Exit codes (design.md): 0 nothing at or above ``--fail-on``, 1 findings at or above it,
2 usage or input error with a one-line reason on stderr.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from collections.abc import Sequence
from types import ModuleType

from gradient_doctor.skill_server import commands

EXIT_OK = 0
EXIT_FINDINGS = 1
EXIT_USAGE = 2


class UsageError(Exception):
    """A bad argument or unreadable input: reported as one line on stderr, exit 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        print(f"gradient-doctor: error: {message}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)


def _command_names() -> list[str]:
    return sorted(
        info.name
        for info in pkgutil.iter_modules(commands.__path__)
        if not info.name.startswith("_")
    )


def _command_modules(names: Sequence[str] | None = None) -> list[ModuleType]:
    found = []
    for name in _command_names() if names is None else names:
        module = importlib.import_module(f"{commands.__name__}.{name}")
        if hasattr(module, "run") and hasattr(module, "NAME"):
            found.append(module)
    return found


def build_parser(modules: Sequence[ModuleType] | None = None) -> argparse.ArgumentParser:
    """The command-line parser over ``modules`` (default: every command)."""
    parser = _Parser(
        prog="gradient-doctor",
        description="Find and fix gradient failures in PyTorch training scripts.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for module in _command_modules() if modules is None else modules:
        p = sub.add_parser(module.NAME, help=module.HELP, description=module.HELP)
        module.add_arguments(p)
        p.set_defaults(_run=module.run)
    return parser


def _only_module(argv: Sequence[str]) -> list[ModuleType] | None:
    """The module of the command that runs, when the command line starts with its name.

    Start-up then imports that module alone (``match`` needs neither the MCP SDK nor anyio
    nor the knowledge models); help, a typo or no command get the full parser.
    """
    if not argv or argv[0].startswith("-") or argv[0] not in _command_names():
        return None
    modules = _command_modules([argv[0]])
    return modules if [m.NAME for m in modules] == [argv[0]] else None


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(_only_module(arguments))
    args = parser.parse_args(arguments)
    if not getattr(args, "_run", None):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        return int(args._run(args))
    except UsageError as exc:
        print(f"gradient-doctor: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("gradient-doctor: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
