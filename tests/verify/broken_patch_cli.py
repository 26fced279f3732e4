"""The ``gradient-doctor`` CLI with a deliberately broken patch injected (tests only).

``python broken_patch_cli.py KIND gradient-doctor-args...`` runs the real CLI in this process
after wrapping the static analyser so that, for the text of the checked script as read, the
combined patch it offers is replaced by a broken one:

- ``runtime``: the real combined patch plus a call that does not exist
  (``optimizer.step()`` becomes ``optimizer.step_now()``): the patched copy fails at its first
  update, where the original trains;
- ``syntax``: the real combined patch plus an unclosed bracket: the patched text does not parse;
- ``stale``: the real combined patch with one context line changed: it does not apply;
- ``one-branch``: for a script whose update is ``if ...: optimizer.step() else: <manual update>``
  followed by a clip (``branch_update.py``), the patch the analyser withholds: the clip moved
  in front of ``optimizer.step()`` only, marked safe. The other path then never clips.

Nothing in the product reads this; the test suite runs it as a subprocess, like the CLI.
"""

from __future__ import annotations

import difflib
import sys

from gradient_doctor.knowledge.findings import Fix
from gradient_doctor.probes import static
from gradient_doctor.probes.verify.patching import apply_diff


def _diff(before: str, after: str, path: str) -> str:
    return "".join(
        difflib.unified_diff(
            before.splitlines(keepends=True),
            after.splitlines(keepends=True),
            fromfile=f"a/{path}",
            tofile=f"b/{path}",
        )
    )


def broken(kind: str, source: str, combined: str, path: str) -> str:
    """A broken version of ``combined`` (see the module docstring)."""
    patched = apply_diff(source, combined)
    if kind in ("runtime", "syntax"):
        # The statement itself (the last one: docstrings may name it too).
        head, found, tail = patched.rpartition("optimizer.step()\n")
        assert found, "the script has no optimizer.step() statement"
        call = "optimizer.step_now()\n" if kind == "runtime" else "optimizer.step(\n"
        return _diff(source, head + call + tail, path)
    if kind == "stale":
        lines = combined.splitlines(keepends=True)
        for index, line in enumerate(lines):
            if line.startswith(" ") and line.strip():
                lines[index] = " # a line the script does not have\n"
                return "".join(lines)
    raise SystemExit(f"unknown kind {kind!r}")


def one_branch(source: str, path: str) -> str:
    """The one-branch clip move described in the module docstring, as a diff."""
    lines = source.splitlines(keepends=True)
    clip = next(i for i, line in enumerate(lines) if "clip_grad_norm_(" in line)
    step = next(i for i, line in enumerate(lines) if line.strip() == "optimizer.step()")
    indent = lines[step][: len(lines[step]) - len(lines[step].lstrip())]
    moved = indent + lines[clip].lstrip()
    rest = [line for i, line in enumerate(lines) if i != clip]
    rest.insert(step, moved)
    return _diff(source, "".join(rest), path)


def main() -> int:
    kind, words = sys.argv[1], sys.argv[2:]
    real_lint = static.lint_source

    def lint_source(source: str, path: str, **options: object) -> object:
        report = real_lint(source, path, **options)  # type: ignore[arg-type]
        # Only the original text gets the broken patch: the patched copy is analysed for real.
        if kind == "one-branch":
            finding = next((f for f in report.findings if f.id == "clip-after-step"), None)
            if finding is not None and finding.fix is None:
                diff = one_branch(source, path)
                finding.fix = Fix(description="Clip before the optimizer's step.", diff=diff)
                report.combined_diff = diff
            return report
        if report.combined_diff and "step_now" not in source:
            report.combined_diff = broken(kind, source, report.combined_diff, path)
        return report

    static.lint_source = lint_source  # type: ignore[assignment]
    from gradient_doctor.skill_server.cli import main as cli_main

    return cli_main(words)


if __name__ == "__main__":
    sys.exit(main())
