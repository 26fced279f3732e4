"""``gradient-doctor logs``: diagnose a run from the log it already wrote (nothing is run)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from gradient_doctor.knowledge.findings import severity_at_least
from gradient_doctor.skill_server.cli import (
    EXIT_FINDINGS,
    EXIT_OK,
    EXIT_USAGE,
    UsageError,
    plots_folder,
)

NAME = "logs"
HELP = (
    "Diagnose a training run from the log it already wrote (console output, CSV, JSONL, "
    "TensorBoard): loss divergence, spikes, the first NaN, rising or decaying norms, clipping."
)
FAIL_ON_CHOICES = ("critical", "warning", "info", "never")

EPILOG = """\
formats (detected from the file; --log-format forces one):
  nanogpt           iter 100: loss 2.3456, time 12.34ms
  hf-trainer        the Hugging Face Trainer's {'loss': 0.69, 'grad_norm': 1.0, ...} lines
  hf-trainer-state  the Hugging Face trainer_state.json (log_history)
  console           print/logging/Accelerate lines: step 10 | loss 2.31 | grad_norm 0.5 | lr 1e-3
  csv               CSV/TSV with a header (Lightning CSVLogger metrics.csv, pandas, ...)
  jsonl             JSON Lines with loss / grad_norm / lr keys
  gradient-monitor  the JSONL of GradientMonitor and of the Trainer/Lightning callbacks
  tensorboard       events.out.tfevents.* files or a folder of them (needs the optional
                    tensorboard package: pip install 'gradient-doctor[tensorboard]')
A folder is read as TensorBoard event files when it has some, else its newest metrics.csv,
trainer_state.json or *.jsonl. Files ending in .gz are decompressed as they are read.

The log is read as a stream in bounded memory: the first and last steps and every anomaly's
neighbourhood (spikes, the first non-finite value, GradScaler scale drops) are kept exactly,
the steps in between are sampled evenly; counts (steps, spikes, non-finite steps) are exact.
Column names are mapped tolerantly (train/loss, train_loss, grad_norm, total_norm, gnorm, lr,
learning_rate, lr-AdamW, scale, loss_scale, ...); evaluation values (val_loss, eval_loss) are
not training steps and are skipped.

exit status:
  0  every log was read and no finding is at or above --fail-on (default: critical)
  1  a finding at or above --fail-on
  2  a log could not be read (missing, empty, binary, unrecognised format), with one line on
     stderr per such log; the others are still reported
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the options of ``gradient-doctor logs``."""
    from gradient_doctor.probes.logs.formats import all_formats

    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = EPILOG
    parser.add_argument(
        "paths", nargs="+", metavar="PATH", help="log files, or folders of TensorBoard event files"
    )
    parser.add_argument("--format", choices=("markdown", "json"), default="markdown")
    parser.add_argument(
        "--log-format",
        choices=[f.id for f in all_formats()],
        default=None,
        help="read every PATH as this format instead of detecting it",
    )
    parser.add_argument(
        "--plots",
        default=None,
        metavar="DIR",
        help="also write a PNG per log into DIR: loss, gradient norm, learning rate (and "
        "GradScaler scale) over steps, with the first non-finite step and spikes marked",
    )
    parser.add_argument(
        "--max-norm",
        type=float,
        default=None,
        metavar="X",
        help="the max_norm the run clipped at, when the log does not record it (e.g. the HF "
        "Trainer's max_grad_norm, default 1.0): the logged norm is read as the norm before "
        "clipping, and the clipping checks run",
    )
    parser.add_argument(
        "--profile", default=None, help="threshold profile (default: the knowledge default)"
    )
    parser.add_argument(
        "--fail-on",
        choices=FAIL_ON_CHOICES,
        default="critical",
        help="lowest severity that makes the exit status 1 (default: critical)",
    )


def _write_plots(report: Any, folder: Path) -> None:
    from gradient_doctor.probes.logs.plots import write_plots

    try:
        written = write_plots(report, folder)
    except Exception as exc:  # a picture must not cost the report
        sys.stderr.write(f"gradient-doctor logs: could not write plots: {exc}\n")
        return
    if written:
        sys.stderr.write("plots: " + ", ".join(str(p) for p in written) + "\n")


def run(args: argparse.Namespace) -> int:
    """Read each log, print its report; see the exit status in the command's help."""
    from gradient_doctor.probes.logs import LogReadError, diagnose_log

    if args.max_norm is not None and not args.max_norm > 0:
        raise UsageError(f"--max-norm must be a positive number, not {args.max_norm}")
    plots = plots_folder(args.plots)
    reports = []
    failed = False
    for path in args.paths:
        try:
            report = diagnose_log(
                path, profile=args.profile, log_format=args.log_format, max_norm=args.max_norm
            )
        except LogReadError as exc:
            print(f"gradient-doctor: error: {exc}", file=sys.stderr)
            failed = True
            continue
        except KeyError as exc:  # an unknown --profile
            raise UsageError(str(exc.args[0] if exc.args else exc)) from None
        except MemoryError:
            print(f"gradient-doctor: error: {path}: out of memory while reading", file=sys.stderr)
            failed = True
            continue
        except Exception as exc:  # never a traceback: one line naming the log
            print(
                f"gradient-doctor: error: {path}: could not be read "
                f"({type(exc).__name__}: {' '.join(str(exc).split())[:300]})",
                file=sys.stderr,
            )
            failed = True
            continue
        reports.append(report)
        if plots is not None:
            _write_plots(report, plots)
    _print(reports, args.format, several=len(args.paths) > 1)
    if failed:
        return EXIT_USAGE
    if args.fail_on != "never" and any(
        severity_at_least(f.severity, args.fail_on) for r in reports for f in r.findings
    ):
        return EXIT_FINDINGS
    return EXIT_OK


def _print(reports: list[Any], output: str, *, several: bool) -> None:
    if output == "json":
        if not reports and not several:
            return
        data = [r.model_dump(mode="json") for r in reports]
        sys.stdout.write(json.dumps(data if several else data[0], indent=2) + "\n")
        return
    from gradient_doctor.skill_server.views_logs import logs_markdown

    sys.stdout.write("\n".join(logs_markdown(r) for r in reports))
