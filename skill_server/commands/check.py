"""``gradient-doctor check SCRIPT``: the one-shot diagnosis from the terminal.

Static analysis + a short run under the gradient probe + the described symptom, merged into
the Gradient Health Report (Markdown) or its JSON form. ``--verify`` also proves the patch by
running it (``probes.verify``): a patched scratch copy and the original run alike and are
compared. Exit codes: 0 nothing at or above ``--fail-on``, 1 issues at or above it, 2 usage or
input error.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path

import anyio

from gradient_doctor.knowledge.findings import severity_at_least
from gradient_doctor.skill_server.cli import (
    EXIT_FINDINGS,
    EXIT_OK,
    SCRIPT_RULES,
    UsageError,
    add_script_arguments,
    launch_of,
    plots_folder,
)
from gradient_doctor.skill_server.safety import (
    DEVICE_PATTERN,
    MAX_PROBE_STEPS,
    MAX_PROBE_TIMEOUT_S,
    InputError,
    PathPolicy,
    check_script_args,
    check_text,
)

NAME = "check"
HELP = "Diagnose a training script: static red flags + a short probed run, with fixes."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``check`` options."""
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = SCRIPT_RULES
    add_script_arguments(parser, "training script to check")
    parser.add_argument(
        "--no-probe", action="store_true", help="only read the script; do not run it"
    )
    parser.add_argument(
        "--steps", type=int, default=30, help="optimizer steps to observe (default 30)"
    )
    parser.add_argument(
        "--timeout", type=float, default=120.0, help="probe wall-clock limit, seconds (default 120)"
    )
    parser.add_argument(
        "--device", default="auto", help="auto, cpu, cuda, cuda:N or mps (default auto)"
    )
    parser.add_argument("--description", default=None, help="what goes wrong, in your words")
    parser.add_argument(
        "--verify",
        action="store_true",
        help="prove the patch by running it: apply it to a scratch copy (never your file), "
        "probe the original and the copy with the same steps, folder, arguments and seed, and "
        "compare them (fixed, improved, unchanged, worse, broken or no-patch); about twice the "
        "time of one probe",
    )
    parser.add_argument(
        "--verify-ids",
        metavar="ID[,ID...]",
        default=None,
        help="verify only the patches of these finding ids (implies --verify; default: the "
        "combined patch)",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=0,
        help="with --verify: the seed of random, torch and numpy in both runs (default 0)",
    )
    parser.add_argument(
        "--plots",
        default=None,
        metavar="DIR",
        help="also write PNG pictures into DIR: the probe's (gradient flow, total norm, dead "
        "units) and, with --verify, verification.png (loss and norms before and after)",
    )
    parser.add_argument(
        "--format", choices=("markdown", "json"), default="markdown", help="output format"
    )
    parser.add_argument(
        "--fail-on",
        choices=("critical", "warning", "info"),
        default="critical",
        help="exit 1 when an issue is at least this severe (default critical)",
    )


def run(args: argparse.Namespace) -> int:
    """Run the diagnosis and print the report."""
    from gradient_doctor.probes.runtime import ProbeInputError
    from gradient_doctor.skill_server import diagnosis as diag
    from gradient_doctor.skill_server import images

    if not 1 <= args.steps <= MAX_PROBE_STEPS:
        raise UsageError(f"--steps must be between 1 and {MAX_PROBE_STEPS}")
    if not 0 < args.timeout <= MAX_PROBE_TIMEOUT_S:
        raise UsageError(f"--timeout must be above 0 and at most {MAX_PROBE_TIMEOUT_S:g}")
    if not re.match(DEVICE_PATTERN, args.device):
        raise UsageError("--device must be auto, cpu, cuda, cuda:N or mps")
    verify_ids = _verify_ids(args.verify_ids)
    verify = args.verify or verify_ids is not None
    if verify and args.no_probe:
        raise UsageError("--verify runs the script: it cannot be combined with --no-probe")
    plots_dir = plots_folder(args.plots)
    try:
        # The terminal user may name any file they can read; only the server confines paths.
        policy = PathPolicy.from_roots([Path(Path.cwd().anchor)])
        script = policy.resolve_file(str(Path(args.script).absolute()) if args.script else "")
        workdir = policy.resolve_dir(str(Path(args.cwd).absolute())) if args.cwd else None
        request = diag.DiagnoseRequest(
            script=script,
            display_path=display_path(args.script),
            patch_dir=None if Path(display_path(args.script)).is_absolute() else str(Path.cwd()),
            description=check_text(args.description, "--description") if args.description else None,
            run_probe=not args.no_probe,
            steps=args.steps,
            timeout_s=args.timeout,
            device=args.device,
            args=check_script_args(args.script_args),
            cwd=workdir,
            launch=launch_of(args),
            verify=verify,
            verify_ids=verify_ids,
            seed=args.seed,
        )
        progress = _progress_printer(verify) if sys.stderr.isatty() else None
        with images.collecting(plots_dir is not None) as pictures:
            result = anyio.run(lambda: diag.diagnose(request, on_progress=progress))
    except InputError as exc:
        raise UsageError(str(exc)) from None
    except ProbeInputError as exc:
        raise UsageError(str(exc)) from None
    if args.format == "json":
        print(result.model_dump_json(indent=2))
    else:
        print(diag.render_report(result), end="")
    if plots_dir is not None:
        _write_pictures(pictures, plots_dir)
    worst = result.worst_severity
    if result.verification is not None and result.verification.unsafe:
        # The patch the report offers broke the script: never a passing check.
        return EXIT_FINDINGS
    return EXIT_FINDINGS if worst and severity_at_least(worst, args.fail_on) else EXIT_OK


def _verify_ids(text: str | None) -> list[str] | None:
    if text is None:
        return None
    ids = [part.strip() for part in text.split(",") if part.strip()]
    if not ids:
        raise UsageError("--verify-ids needs at least one finding id")
    return ids


def _write_pictures(pictures: list[tuple[str, bytes]], folder: Path) -> None:
    """Write the pictures the run drew and name them on stderr."""
    written = []
    try:
        for name, png in pictures:
            path = folder / name
            path.write_bytes(png)
            written.append(str(path))
    except OSError as exc:
        sys.stderr.write(f"gradient-doctor check: could not write plots: {exc}\n")
        return
    sys.stderr.write(
        ("plots: " + ", ".join(written)) if written else "plots: none (no step was measured)"
    )
    sys.stderr.write("\n")


def _progress_printer(verify: bool) -> Callable[[int, int], None]:
    what = "steps (original + patched copy)" if verify else "steps"

    def show(done: int, total: int) -> None:
        end = "\n" if done >= total else ""
        print(f"\rprobe: {done}/{total} {what}", end=end, file=sys.stderr, flush=True)

    return show


def display_path(given: str) -> str:
    """The script path as the report names it: relative to the working folder when inside it.

    The patch's ``a/`` and ``b/`` paths are built from it, and ``git apply`` / ``patch -p1``
    resolve them from the folder they run in: an absolute path given on the command line
    (as assistants do) would otherwise make a patch that applies from ``/`` only.
    """
    path = Path(os.path.normpath(given))
    if not path.is_absolute():
        return given
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return given
