"""The static analyser: reads a training script (libcst) and reports each red flag at its line.

Never imports torch.
"""

from __future__ import annotations

from probes.static.engine import all_rules, lint_source
from probes.static.report import FileReport, LintReport
from probes.static.walk import lint_paths

__all__ = ["FileReport", "LintReport", "all_rules", "lint_paths", "lint_source"]
