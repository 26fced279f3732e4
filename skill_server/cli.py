"""``gradient-doctor`` command line.

Each sub-command lives in its own module under ``skill_server.commands`` and exposes
``NAME``, ``HELP``, ``add_arguments(parser)`` and ``run(args) -> int``. Modules are discovered,
not listed, so adding a command is adding a file.

Exit codes (design.md): 0 nothing at or above ``--fail-on``, 1 findings at or above it,
2 usage or input error with a one-line reason on stderr.

Commands that run a script (``probe``, ``check``) share one rule, :func:`add_script_arguments`:
options go before or after SCRIPT, everything after ``--`` is the script's own argv, and the
script runs in its own folder unless ``--cwd`` says otherwise.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from gradient_doctor.skill_server import commands

EXIT_OK = 0
EXIT_FINDINGS = 1
EXIT_USAGE = 2

#: Commands after which the program ends without tearing the interpreter down (see
#: :func:`entry`): ``probe`` holds the result models and the knowledge base, whose teardown
#: takes some 30 ms of a probe's wall time, and leaves nothing to finalise (its output is
#: written and flushed, its run folder removed).
_EXIT_WITHOUT_TEARDOWN = frozenset({"probe"})


class UsageError(Exception):
    """A bad argument or unreadable input: reported as one line on stderr, exit 2."""


def plots_folder(folder: str | None) -> Path | None:
    """The ``--plots`` folder, created before the run so a bad path fails fast (exit 2)."""
    if folder is None:
        return None
    path = Path(folder).expanduser()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        reason = exc.strerror or exc
        raise UsageError(f"cannot create the --plots folder {path}: {reason}") from None
    return path


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        print(f"gradient-doctor: error: {message}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)


def _module_names() -> list[str]:
    """The modules of ``skill_server.commands`` (its ``.py`` files), sorted. Not
    ``pkgutil.iter_modules``: it imports ``inspect``, some 5 ms before a probed script starts."""
    names: set[str] = set()
    for folder in commands.__path__:
        try:
            files = os.listdir(folder)
        except OSError:
            continue
        names.update(f[:-3] for f in files if f.endswith(".py") and f[:-3].isidentifier())
    return sorted(names)


def _command_names() -> list[str]:
    return [name for name in _module_names() if not name.startswith("_")]


SCRIPT_USAGE = "%(prog)s SCRIPT [options] [-- SCRIPT_ARGS...]"
SCRIPT_RULES = """\
Options may come before or after SCRIPT; everything after `--` goes to the script as its own
arguments. The script runs in its own folder (the folder that holds SCRIPT) unless --cwd names
another; relative paths inside it resolve from there, the same for probe, check and the MCP
tools. It runs with the project's interpreter: --python, else a .venv or venv found from the
script's folder upwards, else $VIRTUAL_ENV, else $CONDA_PREFIX, else gradient-doctor's own; the
report says which one ran and why."""


def add_script_arguments(parser: argparse.ArgumentParser, script_help: str) -> None:
    """SCRIPT plus the options of where and how it runs (``--python``, ``--cwd``,
    ``--max-memory``); the script's own arguments come after ``--`` (see :func:`main`)."""
    parser.usage = SCRIPT_USAGE
    parser.add_argument("script", metavar="SCRIPT", help=script_help)
    parser.set_defaults(script_args=[], _takes_script_args=True)
    parser.add_argument(
        "--python",
        metavar="PATH",
        default=None,
        help="interpreter that runs the script: a path, a command on PATH or a virtualenv "
        "folder (default: the project's .venv/venv from the script's folder up, then "
        "$VIRTUAL_ENV, then $CONDA_PREFIX, then gradient-doctor's own)",
    )
    parser.add_argument(
        "--cwd",
        metavar="DIR",
        default=None,
        help="working folder of the script (default: the script's own folder)",
    )
    parser.add_argument(
        "--max-memory",
        metavar="SIZE",
        default=None,
        help="cap the script's address space, e.g. 8G or 512M (a run that hits it gets the "
        "status out-of-memory); no cap by default",
    )


def launch_of(args: argparse.Namespace) -> Any:
    """The probe's :class:`~gradient_doctor.probes.runtime.Launch` from the script options."""
    from gradient_doctor.probes.runtime.launch import Launch

    if args.max_memory is None:  # safety (and its dataclass import) only when a cap is asked
        return Launch(python=args.python)
    from gradient_doctor.skill_server.safety import InputError, parse_memory_size

    try:
        cap = parse_memory_size(args.max_memory)
    except InputError as exc:
        raise UsageError(f"--max-memory: {exc}") from None
    return Launch(python=args.python, max_memory=cap)


def _split_script_args(words: list[str]) -> tuple[list[str], list[str] | None]:
    """Words before the first ``--`` (after the command) and the script's words after it."""
    if "--" not in words:
        return words, None
    cut = words.index("--")
    return words[:cut], words[cut + 1 :]


def _command_modules(only: str | None = None) -> list[ModuleType]:
    """The command modules; ``only``: just that one (module file named like the command), so
    that ``serve`` starts without importing what the other commands need."""
    found = []
    for name in _command_names():
        if only is not None and name != only:
            continue
        module = importlib.import_module(f"{commands.__name__}.{name}")
        if hasattr(module, "run") and hasattr(module, "NAME"):
            found.append(module)
    return found


def installed_version() -> str:
    """The installed distribution's version (``importlib.metadata``), or ``0+unknown`` when
    the package runs from a checkout that was never installed."""
    from importlib import metadata

    try:
        return metadata.version("gradient-doctor")
    except metadata.PackageNotFoundError:
        return "0+unknown"


class _VersionAction(argparse.Action):
    """``--version``: print ``gradient-doctor VERSION`` and exit 0. The version is read only
    when asked for (reading the distribution's metadata costs start-up time of every call)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(
            option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=kwargs.get("help")
        )

    def __call__(self, parser: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> None:
        sys.stdout.write(f"gradient-doctor {installed_version()}\n")
        parser.exit(0)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command, or of the one named ``only`` (see :func:`_command_modules`)."""
    parser = _Parser(
        prog="gradient-doctor",
        description="Find and fix gradient failures in PyTorch training scripts.",
    )
    parser.add_argument(
        "--version", action=_VersionAction, help="print the installed version and exit"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for module in _command_modules(only):
        p = sub.add_parser(module.NAME, help=module.HELP, description=module.HELP)
        module.add_arguments(p)
        p.set_defaults(_run=module.run)
    return parser


def _only_command(words: Sequence[str]) -> str | None:
    """The command that runs, when the command line starts with its name (help, a typo or no
    command get the full parser)."""
    if not words or words[0].startswith("-") or words[0] not in _command_names():
        return None
    modules = _command_modules(words[0])
    return words[0] if [m.NAME for m in modules] == [words[0]] else None


def main(argv: Sequence[str] | None = None) -> int:
    words, script_args = _split_script_args(list(sys.argv[1:] if argv is None else argv))
    # Start-up time matters (`serve`: a client waits for the handshake; `match`: a person
    # waits): when the command line starts with a command's name, load that command alone.
    parser = build_parser(_only_command(words))
    args, extras = parser.parse_known_args(words)
    takes_script_args = getattr(args, "_takes_script_args", False)
    if extras:
        hint = "; a script's own arguments go after `--`" if takes_script_args else ""
        parser.error(f"unrecognized arguments: {' '.join(extras)}{hint}")
    if script_args is not None:
        if not takes_script_args:
            parser.error("`--` separates a script's own arguments; this command runs no script")
        args.script_args = script_args
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


def entry() -> None:
    """The program (the ``gradient-doctor`` console script, ``python -m``): :func:`main`, then
    exit. After the commands in :data:`_EXIT_WITHOUT_TEARDOWN` the output is flushed and the
    process ends at once (``os._exit``, as mypy does), skipping the interpreter's teardown."""
    words = sys.argv[1:]
    if words[:1] == ["probe"]:
        # The supervisor's interpreter starts beside the parsing (``probes.runtime.prestart``).
        from gradient_doctor.probes.runtime.prestart import prestart_supervisor

        prestart_supervisor()
    code = main()
    if words and words[0] in _EXIT_WITHOUT_TEARDOWN:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except (OSError, ValueError):
            sys.exit(code)  # let the normal exit report a closed pipe its own way
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    entry()
