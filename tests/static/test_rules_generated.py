"""Tests generated from each rule's own VALID / INVALID examples.

Every INVALID example must give exactly the expected finding(s) of its rule at the expected
line(s); every VALID example must give none of that rule. The rule set itself must match the
catalogue: one rule per red flag whose ``where`` includes S, with the catalogue's severity.
"""

from __future__ import annotations

import pytest

from gradient_doctor.knowledge import load_knowledge
from gradient_doctor.probes.static import all_rules, lint_source
from gradient_doctor.probes.static.base import Invalid, Rule

RULES = all_rules()
VALID_CASES = [
    pytest.param(rule, code, id=f"{rule.id}-valid-{index}")
    for rule in RULES
    for index, code in enumerate(rule.valid)
]
INVALID_CASES = [
    pytest.param(rule, example, id=f"{rule.id}-invalid-{index}")
    for rule in RULES
    for index, example in enumerate(rule.invalid)
]


def _static_red_flags() -> dict[str, str]:
    entries = load_knowledge().by_kind("red-flag")
    return {e.id: e.severity for e in entries if "S" in e.where}


def test_one_rule_per_static_red_flag_with_catalogue_severity() -> None:
    expected = _static_red_flags()
    assert len(expected) == 23
    assert {rule.id: rule.severity for rule in RULES} == expected


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.id)
def test_rule_is_documented_and_has_examples(rule: Rule) -> None:
    for attribute in ("message", "what", "why", "example", "use_instead", "fix_safety"):
        text = getattr(rule, attribute)
        assert isinstance(text, str) and text.strip(), attribute
    assert len(rule.valid) >= 2
    assert len(rule.invalid) >= 2
    assert all(isinstance(example, Invalid) and example.lines for example in rule.invalid)


@pytest.mark.parametrize(("rule", "example"), INVALID_CASES)
def test_invalid_example_reports_expected_lines(rule: Rule, example: Invalid) -> None:
    report = lint_source(example.code, "example.py")
    assert report.error is None
    lines = sorted(f.line for f in report.findings if f.id == rule.id)
    assert lines == list(example.lines)
    for finding in report.findings:
        if finding.id != rule.id:
            continue
        assert finding.severity == rule.severity
        assert finding.origin == "static"
        assert finding.path == "example.py"
        assert finding.col is not None and finding.col >= 1
        assert finding.end_line is not None and finding.end_line >= finding.line
        # Messages are filled in: no template field is left.
        assert "{" not in finding.message and "}" not in finding.message
        # Evidence never carries syntax nodes, only plain JSON values.
        assert all(
            isinstance(v, str | int | float | list | bool | type(None))
            for v in finding.evidence.values()
        )


@pytest.mark.parametrize(("rule", "code"), VALID_CASES)
def test_valid_example_is_silent_for_its_rule(rule: Rule, code: str) -> None:
    report = lint_source(code, "example.py")
    assert report.error is None
    assert [f.line for f in report.findings if f.id == rule.id] == []


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.id)
def test_select_runs_only_the_selected_rule(rule: Rule) -> None:
    example = rule.invalid[0]
    report = lint_source(example.code, select=[rule.id])
    assert {f.id for f in report.findings} == {rule.id}
    ignored = lint_source(example.code, ignore=[rule.id])
    assert rule.id not in {f.id for f in ignored.findings}


def test_every_snippet_id_is_a_known_fix_snippet() -> None:
    from gradient_doctor.templates.snippets import list_snippets

    known = {getattr(s, "id", s) for s in list_snippets()}
    assert {rule.snippet_id for rule in RULES} <= known
