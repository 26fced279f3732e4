"""Applying the analyser's unified diffs in memory (``probes.verify.patching``)."""

from __future__ import annotations

import difflib
from pathlib import Path

import pytest

from gradient_doctor.knowledge.findings import Finding, Fix
from gradient_doctor.probes.static import lint_source
from gradient_doctor.probes.verify.patching import (
    PatchError,
    apply_chosen,
    apply_diff,
    choose_patch,
)

REPO = Path(__file__).resolve().parents[2]
SOURCE = "".join(f"line {n}\n" for n in range(1, 21))


def diff(before: str, after: str) -> str:
    return "".join(
        difflib.unified_diff(
            before.splitlines(keepends=True),
            after.splitlines(keepends=True),
            fromfile="a/train.py",
            tofile="b/train.py",
        )
    )


def test_a_diff_round_trips_to_the_text_it_was_made_from() -> None:
    after = SOURCE.replace("line 3\n", "line three\n").replace("line 17\n", "")
    assert apply_diff(SOURCE, diff(SOURCE, after)) == after


def test_hunks_shifted_by_an_earlier_edit_still_land_on_their_lines() -> None:
    first = SOURCE.replace("line 2\n", "line 2\nnew a\nnew b\n")
    second = SOURCE.replace("line 15\n", "line fifteen\n")
    once = apply_diff(SOURCE, diff(SOURCE, first))
    assert apply_diff(once, diff(SOURCE, second)) == first.replace("line 15\n", "line fifteen\n")


def test_a_hunk_that_does_not_match_the_text_is_refused() -> None:
    patch = diff(SOURCE, SOURCE.replace("line 9\n", "line nine\n"))
    with pytest.raises(PatchError, match="does not match"):
        apply_diff(SOURCE.replace("line 8\n", "line eight\n"), patch)
    with pytest.raises(PatchError, match="no hunks"):
        apply_diff(SOURCE, "--- a/x\n+++ b/x\n")


def test_a_missing_final_newline_is_kept() -> None:
    before = "a\nb\nc"
    # git writes the marker line; difflib leaves the last line without its end.
    marked = (
        "--- a/t.py\n+++ b/t.py\n@@ -1,3 +1,3 @@\n a\n b\n-c\n\\ No newline at end of file\n"
        "+C\n\\ No newline at end of file\n"
    )
    assert apply_diff(before, marked) == "a\nb\nC"
    assert apply_diff(before, diff(before, "a\nB\nc")) == "a\nB\nc"


def _finding(rule: str, line: int, patch: str | None) -> Finding:
    fix = Fix(description="fix", diff=patch) if patch is not None else None
    return Finding(id=rule, severity="critical", message="m", line=line, fix=fix)


def test_choose_the_combined_patch_or_the_chosen_findings() -> None:
    first = diff(SOURCE, SOURCE.replace("line 2\n", "line two\n"))
    second = diff(SOURCE, SOURCE.replace("line 18\n", "line eighteen\n"))
    both = diff(SOURCE, SOURCE.replace("line 2\n", "line two\n").replace("line 18\n", "line 18!\n"))
    findings = [_finding("a", 2, first), _finding("b", 18, second), _finding("c", 5, None)]

    combined = choose_patch(findings, both)
    assert combined.combined and combined.diffs == [both] and combined.targets == ["a", "b"]
    only_b = choose_patch(findings, both, ["b"])
    assert only_b.targets == ["b"] and only_b.diffs == [second]
    assert apply_chosen(SOURCE, only_b) == SOURCE.replace("line 18\n", "line eighteen\n")
    assert choose_patch(findings, both, ["b", "a"]).combined
    with pytest.raises(ValueError, match="no patch for c"):
        choose_patch(findings, both, ["c"])
    nothing = choose_patch([_finding("c", 5, None)], None)
    assert nothing.diffs == [] and nothing.reason


def test_overlapping_finding_patches_name_the_findings() -> None:
    one = diff(SOURCE, SOURCE.replace("line 5\n", "line five\n"))
    two = diff(SOURCE, SOURCE.replace("line 6\n", "line six\n"))
    findings = [_finding("a", 5, one), _finding("b", 6, two), _finding("c", 19, None)]
    chosen = choose_patch(findings, None, ["a", "b"])
    with pytest.raises(PatchError, match="overlap"):
        apply_chosen(SOURCE, chosen)


def test_the_analysers_own_combined_patch_applies_to_the_example() -> None:
    path = REPO / "examples" / "buggy_train.py"
    text = path.read_text(encoding="utf-8")
    combined = lint_source(text, "examples/buggy_train.py").combined_diff
    assert combined
    patched = apply_diff(text, combined)
    assert "(loss / ACCUM_STEPS).backward()" in patched
    compile(patched, str(path), "exec")
