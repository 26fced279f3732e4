"""Whole-script fixtures: golden scripts stay silent, buggy scripts report exactly what is expected.

``tests/fixtures/static/golden/*.py`` are correct training scripts in every style the analyser
must understand; they may only produce info findings listed in their ``allowed_info``.
``tests/fixtures/static/buggy/*.py`` hold one mistake each (named in the file name); their
``*.expected.json`` lists every ``{id, line}`` the analyser must report. Every fix offered is
applied with an independent diff applier, must give a parsable script, and re-analysing that
script must no longer report the finding.
"""

from __future__ import annotations

import ast
import keyword
import re
from collections import Counter

import pytest
from _static_io_support import (
    BUGGY,
    GOLDEN,
    SHAPES_BUGGY,
    SHAPES_GOLDEN,
    Fixture,
    apply_unified_diff,
    load_fixtures,
)

from gradient_doctor.knowledge.findings import Finding, severity_at_least
from gradient_doctor.probes.static import all_rules, lint_paths, lint_source
from gradient_doctor.probes.static.walk import read_source

GOLDEN_FIXTURES = load_fixtures(GOLDEN) + load_fixtures(SHAPES_GOLDEN)
BUGGY_FIXTURES = load_fixtures(BUGGY) + load_fixtures(SHAPES_BUGGY)

# The styles the issue asks the golden set to cover, by file name.
REQUIRED_GOLDEN = {
    "nanogpt_style",
    "accelerate_accumulate",
    "lightning_automatic",
    "lightning_manual",
    "deepspeed_engine",
    "classic_clip",
    "classic_accumulation_leftover",
    "amp_unscale",
    "amp_cuda_legacy",
    "ddp_no_sync",
    "trainer_class",
    "train_and_eval",
    "lstm_clip",
    "cnn_no_clip",
    "rl_policy_gradient",
}


def _severity_of() -> dict[str, str]:
    return {rule.id: rule.severity for rule in all_rules()}


def _lint(fixture: Fixture) -> tuple[str, list[Finding]]:
    report = lint_paths([fixture.path])
    assert len(report.files) == 1
    file = report.files[0]
    assert file.error is None, f"{fixture.name}: {file.error}"
    return read_source(fixture.path), file.findings


def _describe(findings: list[Finding]) -> str:
    return "\n".join(f"  {f.line}:{f.col} {f.id} [{f.severity}] {f.message}" for f in findings)


def test_golden_set_covers_every_required_style() -> None:
    names = {f.name for f in GOLDEN_FIXTURES}
    assert names >= REQUIRED_GOLDEN, f"missing golden fixtures: {REQUIRED_GOLDEN - names}"


def test_every_static_rule_has_two_buggy_fixtures_in_different_styles() -> None:
    styles: dict[str, set[str]] = {}
    for fixture in BUGGY_FIXTURES:
        for rule_id in {e["id"] for e in fixture.expected}:
            styles.setdefault(rule_id, set()).add(fixture.style)
    missing = {
        rule.id: sorted(styles.get(rule.id, set()))
        for rule in all_rules()
        if len(styles.get(rule.id, set())) < 2
    }
    assert not missing, f"rules with fewer than two fixture styles: {missing}"


def test_fixture_expectations_name_real_rules_and_lines() -> None:
    severity = _severity_of()
    for fixture in [*GOLDEN_FIXTURES, *BUGGY_FIXTURES]:
        lines = fixture.path.read_text(encoding="utf-8").splitlines()
        for entry in fixture.expected:
            assert entry["id"] in severity, f"{fixture.name}: unknown id {entry['id']}"
            assert 1 <= entry["line"] <= len(lines) and lines[entry["line"] - 1].strip()
        for rule_id in fixture.allowed_info:
            # An info rule, or a louder rule that says info when it cannot tell (a DDP implied
            # only by accelerator.prepare()); the golden test still refuses any warning.
            assert rule_id in severity, f"{fixture.name}: unknown id {rule_id}"


@pytest.mark.parametrize("fixture", GOLDEN_FIXTURES, ids=lambda f: f.name)
def test_golden_script_has_no_warning_or_critical(fixture: Fixture) -> None:
    _, findings = _lint(fixture)
    loud = [f for f in findings if severity_at_least(f.severity, "warning")]
    assert not loud, f"{fixture.name} ({fixture.style}) is correct code:\n{_describe(loud)}"
    unexpected_info = [f for f in findings if f.id not in fixture.allowed_info]
    assert not unexpected_info, (
        f"{fixture.name}: info findings not recorded as applying:\n{_describe(unexpected_info)}"
    )


@pytest.mark.parametrize("fixture", BUGGY_FIXTURES, ids=lambda f: f.name)
def test_buggy_script_reports_exactly_the_expected_findings(fixture: Fixture) -> None:
    _, findings = _lint(fixture)
    expected = {(e["id"], e["line"]) for e in fixture.expected}
    reported = {(f.id, f.line) for f in findings}
    missing = expected - reported
    assert not missing, f"{fixture.name}: missing {sorted(missing)}; got:\n{_describe(findings)}"
    extra_loud = [
        f
        for f in findings
        if severity_at_least(f.severity, "warning") and (f.id, f.line) not in expected
    ]
    assert not extra_loud, f"{fixture.name}: unexpected findings:\n{_describe(extra_loud)}"
    extra_info = [
        f
        for f in findings
        if f.severity == "info"
        and (f.id, f.line) not in expected
        and f.id not in fixture.allowed_info
    ]
    assert not extra_info, f"{fixture.name}: unexpected info findings:\n{_describe(extra_info)}"


def test_buggy_findings_point_into_the_script_and_name_the_users_code() -> None:
    for fixture in BUGGY_FIXTURES:
        source, findings = _lint(fixture)
        lines = source.splitlines()
        for finding in findings:
            assert finding.path == str(fixture.path)
            assert finding.line is not None and 1 <= finding.line <= len(lines)
            text = lines[finding.line - 1]
            assert finding.col is not None and 1 <= finding.col <= len(text) + 1
            # The message names something written on the offending line, and a line number.
            names = {n for n in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", text) if len(n) > 2}
            names -= set(keyword.kwlist)
            assert any(name in finding.message for name in names), (fixture.name, finding.message)
            assert re.search(r"\bline \d+", finding.message), (fixture.name, finding.message)


def _fixable(fixtures: list[Fixture]) -> list[tuple[Fixture, int]]:
    return [(fixture, n) for fixture in fixtures for n in range(len(fixture.expected))]


@pytest.mark.parametrize(
    ("fixture", "index"),
    _fixable(BUGGY_FIXTURES),
    ids=lambda v: v.name if hasattr(v, "name") else str(v),
)
def test_fix_round_trip(fixture: Fixture, index: int) -> None:
    """Each offered fix applies exactly, parses, and removes the finding it is for."""
    source, findings = _lint(fixture)
    target = fixture.expected[index]
    matching = [f for f in findings if (f.id, f.line) == (target["id"], target["line"])]
    if not matching:
        # test_buggy_script_reports_exactly_the_expected_findings fails for this already.
        pytest.skip(f"{fixture.name}: {target} not reported, so there is no fix to check")
    finding = matching[0]
    if finding.fix is None or not finding.fix.diff:
        pytest.skip(f"no patch offered for {finding.id} in {fixture.name}")
    patched = apply_unified_diff(source, finding.fix.diff)
    assert patched != source
    ast.parse(patched)
    after = lint_source(patched, str(fixture.path)).findings
    before_count = Counter(f.id for f in findings)[finding.id]
    after_count = Counter(f.id for f in after)[finding.id]
    assert after_count < before_count, (
        f"{fixture.name}: {finding.id} still reported after its fix:\n{_describe(after)}"
    )
    new_loud = {f.id for f in after if severity_at_least(f.severity, "warning")} - {
        f.id for f in findings
    }
    assert not new_loud, f"{fixture.name}: the fix introduced {sorted(new_loud)}"


@pytest.mark.parametrize("fixture", BUGGY_FIXTURES, ids=lambda f: f.name)
def test_combined_diff_applies_and_parses(fixture: Fixture) -> None:
    source = read_source(fixture.path)
    report = lint_source(source, str(fixture.path))
    fixes = [f for f in report.findings if f.fix is not None and f.fix.diff]
    if len(fixes) == 1:
        # A single fix cannot conflict with anything, so the combined diff must exist.
        assert report.combined_diff, f"{fixture.name}: one fix but no combined_diff"
    if not report.combined_diff:
        pytest.skip(f"{fixture.name}: no combined diff ({len(fixes)} fixes)")
    patched = apply_unified_diff(source, report.combined_diff)
    ast.parse(patched)
    remaining = Counter(f.id for f in lint_source(patched, str(fixture.path)).findings)
    for finding in fixes:
        assert remaining[finding.id] < Counter(f.id for f in report.findings)[finding.id]


# The fix kinds the issue requires, by the rule that offers them.
REQUIRED_FIX_KINDS = {
    "clip-after-step": "move clipping between backward and step",
    "clip-before-backward": "move clipping between backward and step",
    "amp-clip-without-unscale": "insert scaler.unscale_(opt) before clipping",
    "accum-unscaled-loss": "divide the loss by the accumulation variable",
    "accum-missing-zero-grad": "add zero_grad after the accumulation step",
    "accum-zero-grad-every-microstep": "move zero_grad out of the micro-step",
    "accum-clip-every-microstep": "move clipping into the update branch",
    "amp-step-bypasses-scaler": "optimizer.step() -> scaler.step(optimizer)",
    "ddp-accum-without-no-sync": "wrap micro-steps in no_sync()",
    "unstable-loss-op": "epsilon / clamp for log, division, sqrt",
    "value-clipping": "clip_grad_value_ -> clip_grad_norm_ (unsafe)",
}


@pytest.mark.parametrize("rule_id", sorted(REQUIRED_FIX_KINDS))
def test_required_fix_kind_is_offered_on_some_fixture(rule_id: str) -> None:
    offered = []
    for fixture in BUGGY_FIXTURES:
        if rule_id not in {e["id"] for e in fixture.expected}:
            continue
        _, findings = _lint(fixture)
        offered += [f.fix for f in findings if f.id == rule_id and f.fix and f.fix.diff]
    assert offered, f"no fixture gets a patch for {rule_id} ({REQUIRED_FIX_KINDS[rule_id]})"
    if rule_id == "value-clipping":
        assert all(not fix.safe for fix in offered), "norm clipping changes behaviour: unsafe"


def test_user_files_are_not_modified() -> None:
    before = {f.path: f.path.read_bytes() for f in [*GOLDEN_FIXTURES, *BUGGY_FIXTURES]}
    lint_paths([GOLDEN, BUGGY, SHAPES_GOLDEN, SHAPES_BUGGY])
    assert {path: path.read_bytes() for path in before} == before


def test_snippet_ids_of_findings_exist() -> None:
    """A fix or evidence that points at a fix snippet names one that templates/ can render."""
    from gradient_doctor.templates.snippets import list_snippets

    known = {spec.id for spec in list_snippets()}
    named = set()
    for file in lint_paths([BUGGY]).files:
        for finding in file.findings:
            if finding.fix is not None and finding.fix.snippet_id:
                named.add(finding.fix.snippet_id)
            if isinstance(finding.evidence.get("snippet_id"), str):
                named.add(finding.evidence["snippet_id"])
    assert named, "no finding names a fix snippet"
    assert named <= known, f"unknown snippet ids: {sorted(named - known)}"
