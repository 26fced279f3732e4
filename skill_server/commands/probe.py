"""``gradient-doctor probe``: run a training script for N steps under the gradient probe."""

from __future__ import annotations

import argparse
import contextlib
import gc
import sys
import threading
from pathlib import Path
from typing import Any

from gradient_doctor.skill_server.cli import (
    EXIT_FINDINGS,
    EXIT_OK,
    SCRIPT_RULES,
    UsageError,
    add_script_arguments,
    launch_of,
    plots_folder,
)

NAME = "probe"
HELP = (
    "Run a PyTorch training script for a few optimizer steps under gradient hooks and "
    "diagnose what its gradients do."
)

FAIL_ON_CHOICES = ("critical", "warning", "info", "never")

EPILOG = """\
The script runs unmodified in a child process, is stopped after --steps optimizer steps, and is
never written to. Its stdout/stderr are kept out of the report (only a traceback tail). It runs
under a supervisor: signals it sends its parent are ignored, processes it leaves behind
(daemons, double forks) are stopped at the end, and the gradient-doctor token variables are
removed from its environment (everything else, e.g. CUDA_VISIBLE_DEVICES, HF_HOME, stays).
torch keeps the thread count it would have in a plain run (the probe measures the script as it
runs); on a busy machine, OMP_NUM_THREADS=1 in the environment steadies both alike.

exit status:
  0  the probe measured the run (status ok or stopped) and no finding is at or above
     --fail-on (default: critical)
  1  a finding at or above --fail-on, OR the run could not be measured cleanly: status
     script-error (the script raised; its traceback tail is in the report), timeout,
     out-of-memory or no-training-loop. These are results about the script, reported in the
     output, so they are not usage errors; they still fail CI because nothing was verified.
  2  usage or input error with a one-line reason on stderr: the script does not exist, is not
     a readable text file, an option is out of range, the --profile is unknown,
     --device cuda without a CUDA device, or the interpreter does not exist, is not Python,
     has no torch or a torch older than the probe supports.
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the options of ``gradient-doctor probe``."""
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = SCRIPT_RULES + "\n\n" + EPILOG
    add_script_arguments(parser, "the training script to run")
    parser.add_argument("--steps", type=int, default=30, help="optimizer steps (default: 30)")
    parser.add_argument(
        "--timeout", type=float, default=120.0, help="wall-clock limit in seconds (default: 120)"
    )
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument(
        "--sample-every",
        type=int,
        default=10,
        metavar="K",
        help="richer statistics (max |g|, mean, std, zeros, ‖w‖, dead units) every K steps "
        "(default: 10)",
    )
    parser.add_argument(
        "--profile", default=None, help="threshold profile (default: the knowledge default)"
    )
    parser.add_argument(
        "--nproc",
        type=int,
        default=None,
        metavar="N",
        help="launch N ranks the way `torchrun --nproc-per-node N` does (DDP/FSDP scripts): "
        "every rank is probed, rank 0 merges them (sharded norms, diverging ranks, "
        "all-reduces per step)",
    )
    parser.add_argument(
        "--plots",
        default=None,
        metavar="DIR",
        help="also write PNG pictures into DIR: gradient flow per layer, total norm over "
        "steps, dead units per layer, ranks",
    )
    parser.add_argument("--format", choices=("markdown", "json"), default="markdown")
    parser.add_argument(
        "--fail-on",
        choices=FAIL_ON_CHOICES,
        default="critical",
        help="lowest severity that makes the exit status 1 (default: critical; never: only "
        "an unmeasured run does)",
    )


def _prepare_diagnosis(markdown: bool) -> None:
    """Import the runner (pydantic models, the diagnosis) and start loading the knowledge base
    while the script's interpreter starts, in a thread of lower priority: on a busy machine this
    bookkeeping (some 0.15 s of CPU) then waits for the script rather than slowing it, and the
    main thread keeps its own priority for the report at the end. ``markdown``: also compile
    the report's template (jinja2, the snippets' module: some 30 ms that would otherwise come
    after the run). A failure here is left for the main thread's own import to report.

    The cyclic garbage collector is off while the modules are imported (their objects are not
    garbage; its passes over them cost some 5 % of the import time) and the survivors are then
    frozen, so that later collections during the run do not walk them again."""
    from gradient_doctor.probes.runtime.launch import lower_thread_priority

    def prepare() -> None:
        lower_thread_priority()
        gc.disable()
        try:
            with contextlib.suppress(Exception):
                from gradient_doctor.probes.runtime import runner  # noqa: F401
                from gradient_doctor.probes.runtime.signals.base import warm_knowledge

                warm_knowledge()  # its thread inherits this thread's priority
                if markdown:
                    from gradient_doctor.skill_server.views_probe import prepare_markdown

                    prepare_markdown()
        finally:
            gc.freeze()
            gc.enable()

    preparation = threading.Thread(target=prepare, name="gd-prepare", daemon=True)
    preparation.start()
    preparation.join()


def run(args: argparse.Namespace) -> int:
    """Run the probe and print the report; see the exit status in the command's help.

    Start-up order matters for the wall time: the script is launched with the standard
    library alone (``probes.runtime.launch``), and the runner, its models, the knowledge base
    and the diagnosis are imported while the script's interpreter starts and imports torch."""
    from gradient_doctor.probes.runtime.launch import ProbeInputError, start_probe

    plots_dir = plots_folder(args.plots)
    try:
        if args.profile is not None:
            _check_profile(args.profile)  # before anything runs: an unknown name is exit 2
        started = start_probe(
            args.script,
            args.script_args,
            steps=args.steps,
            timeout_s=args.timeout,
            device=args.device,
            sample_every=args.sample_every,
            nproc=args.nproc,
            cwd=args.cwd,
            launch=launch_of(args),
        )
        try:
            _prepare_diagnosis(markdown=args.format == "markdown")
            from gradient_doctor.probes.runtime.runner import complete_probe

            result = complete_probe(started, profile=args.profile)
            _write_report(result, args.format)  # while a thread removes the run's folder
        finally:
            # Idempotent: stops the run only if something above failed; waits for the folder.
            started.close()
    except ProbeInputError as exc:
        raise UsageError(str(exc)) from None
    if plots_dir is not None:
        _write_plots(result, plots_dir)
    if not result.ok:
        return EXIT_FINDINGS
    from gradient_doctor.knowledge.findings import severity_at_least

    if args.fail_on != "never" and any(
        severity_at_least(f.severity, args.fail_on) for f in result.findings
    ):
        return EXIT_FINDINGS
    return EXIT_OK


def _write_report(result: Any, output_format: str) -> None:
    """The report on stdout: JSON, or the markdown a person reads."""
    if output_format == "json":
        sys.stdout.write(result.model_dump_json(indent=2) + "\n")
        return
    from gradient_doctor.skill_server.views_probe import probe_markdown

    sys.stdout.write(probe_markdown(result))


def _check_profile(name: str) -> None:
    """A usage error for an unknown ``--profile`` (loads the knowledge base's profiles)."""
    from gradient_doctor.probes.runtime.diagnose import resolve_profile

    try:
        resolve_profile(name, warm=False)
    except KeyError as exc:
        raise UsageError(str(exc.args[0]) if exc.args else str(exc)) from None


def _write_plots(result: Any, folder: Path) -> None:
    """Draw the pictures (matplotlib is imported only here) and name them on stderr."""
    from gradient_doctor.probes.runtime.plots import write_plots

    try:
        written = write_plots(result, folder)
    except OSError as exc:
        sys.stderr.write(f"gradient-doctor probe: could not write plots: {exc}\n")
        return
    if written:
        sys.stderr.write("plots: " + ", ".join(str(p) for p in written) + "\n")
    else:
        sys.stderr.write("plots: none (no optimizer step was measured)\n")
