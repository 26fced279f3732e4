"""The static analyser: reads a training script (libcst) and reports each red flag at its line.

Never imports torch.
"""

from __future__ import annotations

from gradient_doctor.probes.static.engine import all_rules, lint_source
from gradient_doctor.probes.static.report import FileReport, LintReport
from gradient_doctor.probes.static.walk import lint_paths

__all__ = ["FileReport", "LintReport", "all_rules", "lint_paths", "lint_source"]
