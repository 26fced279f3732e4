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


def _command_modules() -> list[ModuleType]:
    found = []
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda i: i.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{commands.__name__}.{info.name}")
        if hasattr(module, "run") and hasattr(module, "NAME"):
            found.append(module)
    return found


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="gradient-doctor",
        description="Find and fix gradient failures in PyTorch training scripts.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for module in _command_modules():
        p = sub.add_parser(module.NAME, help=module.HELP, description=module.HELP)
        module.add_arguments(p)
        p.set_defaults(_run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
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
