"""The gated patterns of ``knowledge._regex``: a gate only skips scans that would find nothing."""

from __future__ import annotations

import re
from pathlib import Path
from typing import cast

import pytest
import yaml

from gradient_doctor.knowledge import (
    _code,
    _errors,
    _numbers,
    _regex,
    _text,
    matcher,
    matcher_frames,
    rerank,
)

EVAL_FILE = Path(__file__).with_name("match_eval.yaml")


@pytest.mark.parametrize(
    ("pattern", "flags", "literals"),
    [
        (r"\b(?:fine|healthy|ok)\b", re.IGNORECASE, None),  # "ok" is too short to gate on
        (r"\b(?:fine|healthy|okay)\b", re.IGNORECASE, {"fine", "healthy", "okay"}),
        (r"loss\s+(?:is\s+)?NaN", 0, {"loss"}),
        (r"NaN(?:s)?\s+in\s+the\s+Gradients", re.IGNORECASE, {"gradients"}),
        (r"(?:grad|gradient)s?\s+norm", 0, {"grad"}),  # "grad" is inside "gradient"
        (r"(?:clip)?ping|max_norm", 0, {"ping", "max_norm"}),  # an optional part is no need
        (r"(?:abcd|xyz)yz", 0, {"abcd", "xyz"}),  # the more selective of two required parts
        (r"(?:abc|\w+)def", 0, {"def"}),  # a branch with a free alternative needs nothing
        (r"\w+ing", 0, {"ing"}),
        (r"(?i:loss)\s+nan", 0, {"nan"}),  # a local case flag: that part is not used
        (r"[a-z]+\d+", 0, None),
        (r"stra\u00dfe", re.IGNORECASE, {"stra"}),  # the non-ASCII letter ends a literal
    ],
)
def test_required_literals(pattern: str, flags: int, literals: set[str] | None) -> None:
    found = _regex.required_literals(re.compile(pattern, flags))
    assert (None if found is None else set(found)) == literals


def test_gated_pattern_answers_as_the_pattern() -> None:
    gated = cast(_regex.Gated, _regex.compile(r"\b(?:exploding|vanishing)\s+grad\w*", re.I))
    assert isinstance(gated, _regex.Gated)
    gated.prepare()
    assert set(gated.literals or ()) == {"vanishing", "exploding"}
    assert gated.search("EXPLODING gradients!") is not None
    assert gated.search("the loss is fine") is None
    assert gated.findall("vanishing grads, exploding gradients") == [
        "vanishing grads",
        "exploding gradients",
    ]
    assert gated.sub("X", "nothing here") == "nothing here"
    assert gated.split("a vanishing grad b") == ["a ", " b"]
    assert gated.groups == 0  # anything else is the pattern's own


def test_letters_that_fold_to_ascii_are_scanned() -> None:
    # Under re.IGNORECASE the long s matches "s" though it does not lower-case to it.
    gated = _regex.compile(r"\bloss\b", re.IGNORECASE)
    cast(_regex.Gated, gated).prepare()
    assert gated.search("lo\u017fs") is not None
    assert gated.search("lo\u017fs") is not None  # also from the cache of the last text


def _gated_patterns() -> list[tuple[str, _regex.Gated]]:
    found: list[tuple[str, _regex.Gated]] = []

    def visit(name: str, value: object) -> None:
        if isinstance(value, _regex.Gated):
            value.prepare()
            if value.literals is not None:
                found.append((name, value))
        elif isinstance(value, dict):
            for key, item in value.items():
                visit(f"{name}[{key}]", item)
        elif isinstance(value, (tuple, list)):
            for index, item in enumerate(value):
                visit(f"{name}[{index}]", item)

    for module in (_code, _errors, _numbers, _text, matcher, matcher_frames, rerank):
        for name, value in vars(module).items():
            visit(f"{module.__name__}.{name}", value)
    return found


@pytest.mark.slow
def test_no_gate_skips_a_match_in_the_eval_texts() -> None:
    """Every gated pattern of the matcher, on every eval text (as written, upper-cased and
    line by line): where the gate says no match can exist, the pattern finds none."""
    patterns = _gated_patterns()
    assert len(patterns) > 100
    items = yaml.safe_load(EVAL_FILE.read_text(encoding="utf-8"))["items"]
    texts = [item["text"] + "\n" + (item.get("code") or "") for item in items]
    texts += [text.upper() for text in texts[::7]]
    wrong = [
        (name, text[:80])
        for text in texts
        for name, gated in patterns
        if not gated._may_match(text) and gated.regex.search(text) is not None
    ]
    assert not wrong, wrong[:5]
