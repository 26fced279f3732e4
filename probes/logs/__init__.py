"""Diagnose a training run from the log it already wrote (``gradient-doctor logs``).

Console output of common trainers (nanoGPT ``iter N: loss X``, the Hugging Face Trainer's dict
lines, plain ``print``/Accelerate ``key value`` lines), CSV tables (Lightning's ``metrics.csv``),
JSON Lines, the HF ``trainer_state.json``, our own ``GradientMonitor`` JSONL, and TensorBoard
event files (with the optional ``tensorboard`` package) are read as a stream into the step series
the runtime probe produces, in bounded memory, and judged by the same signal modules
(``probes.runtime.signals``) with the same threshold profiles. Nothing is run and the log is
never written to. This package never imports torch.

    report = diagnose_log("train.log")          # LogReport: findings, series found, counts
"""

from __future__ import annotations

from gradient_doctor.probes.logs.formats import all_formats
from gradient_doctor.probes.logs.formats.base import LogReadError
from gradient_doctor.probes.logs.reader import LogRun, read_log
from gradient_doctor.probes.logs.report import LogReport, build_report, diagnose_log

__all__ = [
    "LogReadError",
    "LogReport",
    "LogRun",
    "all_formats",
    "build_report",
    "diagnose_log",
    "read_log",
]
