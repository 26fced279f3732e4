"""Round trip of every fix kind: the diff applies to the exact text, the result parses, and
re-analysing it no longer reports the finding (and reports nothing new)."""

from __future__ import annotations

import ast
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from gradient_doctor.knowledge.findings import Finding, severity_at_least
from gradient_doctor.probes.static import all_rules, lint_source
from gradient_doctor.probes.static.patches import apply_unified_diff

# The fix kinds the issue asks for, by the rule that offers them.
REQUIRED_FIX_KINDS = {
    "clip-after-step",  # move clipping between backward and step
    "clip-before-backward",
    "amp-clip-without-unscale",  # insert scaler.unscale_(opt) before clipping
    "accum-unscaled-loss",  # divide the loss by the accumulation variable
    "accum-missing-zero-grad",  # add zero_grad after the accumulation step
    "accum-zero-grad-every-microstep",  # move zero_grad out of the micro-step
    "accum-clip-every-microstep",  # move clipping into the update branch
    "amp-step-bypasses-scaler",  # optimizer.step() -> scaler.step(optimizer) (+ update)
    "ddp-accum-without-no-sync",  # skip the all-reduce on intermediate micro-steps
    "unstable-loss-op",  # epsilon / clamp
    "value-clipping",  # clip_grad_value_ -> clip_grad_norm_ (unsafe)
}

CASES = [
    pytest.param(rule.id, example.code, id=f"{rule.id}-{index}")
    for rule in all_rules()
    for index, example in enumerate(rule.invalid)
]


def _serious(findings: list[Finding]) -> Counter[str]:
    return Counter(f.id for f in findings if severity_at_least(f.severity, "warning"))


def _apply_with_patch_tool(tmp_path: Path, source: str, diff: str) -> str | None:
    """Apply ``diff`` with GNU patch (an applier independent of ours), when installed."""
    tool = shutil.which("patch")
    if tool is None:
        return None
    target = tmp_path / "script.py"
    target.write_bytes(source.encode())
    result = subprocess.run(
        [tool, "--batch", "--silent", "-p1", "-d", str(tmp_path)],
        input=diff.encode(),
        capture_output=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr.decode() + result.stdout.decode()
    return target.read_bytes().decode()


def _round_trip(rule_id: str, source: str, tmp_path: Path) -> Finding | None:
    report = lint_source(source, "script.py")
    fixed = [f for f in report.findings if f.id == rule_id and f.fix is not None]
    if not fixed:
        return None
    before = report.findings
    for finding in fixed:
        assert finding.fix is not None and finding.fix.diff is not None
        diff = finding.fix.diff
        assert diff.startswith("--- a/script.py\n+++ b/script.py\n")
        patched = apply_unified_diff(source, diff)
        by_tool = _apply_with_patch_tool(tmp_path, source, diff)
        if by_tool is not None:
            assert by_tool == patched
        ast.parse(patched)
        after = lint_source(patched, "script.py").findings
        assert Counter(f.id for f in after)[rule_id] < Counter(f.id for f in before)[rule_id]
        for other, count in _serious(after).items():
            assert count <= _serious(before)[other], f"the fix adds {other}"
    return fixed[0]


@pytest.mark.parametrize(("rule_id", "source"), CASES)
def test_every_offered_fix_round_trips(rule_id: str, source: str, tmp_path: Path) -> None:
    _round_trip(rule_id, source, tmp_path)


def test_every_required_fix_kind_is_offered(tmp_path: Path) -> None:
    offered = set()
    for rule in all_rules():
        for example in rule.invalid:
            if _round_trip(rule.id, example.code, tmp_path) is not None:
                offered.add(rule.id)
    assert offered >= REQUIRED_FIX_KINDS


def test_value_clipping_fix_is_marked_unsafe() -> None:
    source = "import torch\ntorch.nn.utils.clip_grad_value_(model.parameters(), 0.5)\n"
    (finding,) = lint_source(source).findings
    assert finding.fix is not None and finding.fix.safe is False
    assert "clip_grad_norm_(model.parameters(), max_norm=1.0)" in finding.fix.diff


CLIP_AFTER_STEP = (
    "import torch\n"
    "for x, y in loader:\n"
    "    loss = criterion(model(x), y)\n"
    "    loss.backward()\n"
    "    optimizer.step()\n"
    "    # keep the update stable\n"
    "    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # max norm\n"
    "    optimizer.zero_grad()\n"
)


def test_moved_statement_keeps_its_comments_and_the_file_keeps_its_bytes(
    tmp_path: Path,
) -> None:
    finding = _round_trip("clip-after-step", CLIP_AFTER_STEP, tmp_path)
    assert finding is not None and finding.fix is not None
    patched = apply_unified_diff(CLIP_AFTER_STEP, finding.fix.diff or "")
    lines = patched.splitlines()
    assert lines[4:7] == [
        "    # keep the update stable",
        "    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # max norm",
        "    optimizer.step()",
    ]
    assert sorted(lines) == sorted(CLIP_AFTER_STEP.splitlines())


def test_fix_on_crlf_file_without_trailing_newline(tmp_path: Path) -> None:
    source = CLIP_AFTER_STEP.replace("\n", "\r\n").removesuffix("\r\n")
    finding = _round_trip("clip-after-step", source, tmp_path)
    assert finding is not None and finding.fix is not None
    patched = apply_unified_diff(source, finding.fix.diff or "")
    assert "\r\n" in patched and "\n" not in patched.replace("\r\n", "")
    assert not patched.endswith("\n")


def test_loss_division_keeps_user_names_and_parenthesises(tmp_path: Path) -> None:
    source = (
        "for step, batch in enumerate(loader):\n"
        "    out = model(batch)\n"
        "    (out.loss + out.aux_loss).backward()\n"
        "    if (step + 1) % cfg.accum_steps == 0:\n"
        "        opt.step()\n"
        "        opt.zero_grad()\n"
    )
    finding = _round_trip("accum-unscaled-loss", source, tmp_path)
    assert finding is not None and finding.fix is not None
    patched = apply_unified_diff(source, finding.fix.diff or "")
    assert "    ((out.loss + out.aux_loss) / cfg.accum_steps).backward()\n" in patched
    assert "`cfg.accum_steps`" in finding.message


def test_combined_diff_applies_all_fixes_at_once(tmp_path: Path) -> None:
    source = (
        "import torch\n"
        "scaler = torch.amp.GradScaler('cuda')\n"
        "for i, (x, y) in enumerate(loader):\n"
        "    optimizer.zero_grad()\n"
        "    loss = criterion(model(x), y)\n"
        "    scaler.scale(loss).backward()\n"
        "    if (i + 1) % accum == 0 or i + 1 == len(loader):\n"
        "        scaler.step(optimizer)\n"
        "        scaler.update()\n"
        "        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n"
    )
    report = lint_source(source, "script.py")
    fixed = {f.id for f in report.findings if f.fix is not None}
    assert {"accum-unscaled-loss", "accum-zero-grad-every-microstep", "clip-after-step"} <= fixed
    assert report.combined_diff is not None
    patched = apply_unified_diff(source, report.combined_diff)
    by_tool = _apply_with_patch_tool(tmp_path, source, report.combined_diff)
    assert by_tool in (None, patched)
    ast.parse(patched)
    remaining = _serious(lint_source(patched).findings)
    assert not remaining & Counter(fixed)
