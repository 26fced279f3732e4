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


@pytest.mark.parametrize(
    ("pattern", "flags", "twin"),
    [
        (r"\b(?:fine|healthy|ok)\b", re.IGNORECASE, True),
        (r"(?<!not\s)[a-z_]+\s*=\s*\d+|^loss$", re.IGNORECASE | re.MULTILINE, True),
        (r"[^x]\W\d", re.IGNORECASE, True),
        (r"\bfine\b", 0, False),  # case already matters: nothing to gain
        (r"loss\s+NaN", re.IGNORECASE, False),  # an upper-case letter
        (r"[A-Z]\w+", re.IGNORECASE, False),  # an upper-case range
        (r"[!-~]+", re.IGNORECASE, False),  # a range holding upper-case letters
        (r"(?-i:loss)\s+nan", re.IGNORECASE, False),  # a local case flag
        (r"\u212a", re.IGNORECASE, False),  # the Kelvin sign matches "k" ignoring case
        (r"[\u2000-\u2200]", re.IGNORECASE, False),  # a range holding it
        (r"(a)?(?(1)b|c)", re.IGNORECASE, False),  # a conditional group: not read
    ],
)
def test_lower_case_twin(pattern: str, flags: int, twin: bool) -> None:
    found = _regex.lower_case_twin(re.compile(pattern, flags))
    assert (found is not None) == twin
    if found is not None:
        assert found.pattern == pattern and not found.flags & re.IGNORECASE


def test_twin_scans_answer_as_the_pattern() -> None:
    """A pattern with a lookbehind, anchors and word boundaries, on texts in mixed case: each
    method answers as the pattern does (the twin only says where the first match starts)."""
    source = r"(?<!no\s)\b(?:nan|inf)s?\b|^step\s+\d+$"
    regex = re.compile(source, re.IGNORECASE | re.MULTILINE)
    gated = cast(_regex.Gated, _regex.compile(source, re.IGNORECASE | re.MULTILINE))
    gated.prepare()
    assert gated.twin is not None
    texts = [
        "No NaN here, but then NaNs at step 3 and INF later",
        "STEP 12\nstep 13 ok\nStep 14",
        "no nan, no inf",
        "nothing at all",
        "Ünïcode text: NaN \u017fteps",  # not ASCII: the pattern scans it itself
        "",
    ]
    for text in texts:
        expected = regex.search(text)
        found = gated.search(text)
        assert (found and found.span()) == (expected and expected.span()), text
        assert [m.span() for m in gated.finditer(text)] == [m.span() for m in regex.finditer(text)]
        assert gated.findall(text) == regex.findall(text)
        assert gated.sub("#", text) == regex.sub("#", text)
        assert gated.split(text) == regex.split(text)
        from_five, expected_from_five = gated.search(text, 5), regex.search(text, 5)
        assert (from_five and from_five.span()) == (
            expected_from_five and expected_from_five.span()
        )


def _gated_patterns(with_twin: bool = False) -> list[tuple[str, _regex.Gated]]:
    found: list[tuple[str, _regex.Gated]] = []

    def visit(name: str, value: object) -> None:
        if isinstance(value, _regex.Gated):
            value.prepare()
            if (value.twin if with_twin else value.literals) is not None:
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


@pytest.mark.slow
def test_no_twin_moves_a_match_in_the_eval_texts() -> None:
    """Every pattern of the matcher that has a lower-case twin, on every eval text (as written,
    and with every third letter upper-cased): the first match starts where the pattern's does,
    and a text the twin finds nothing in holds no match."""
    patterns = _gated_patterns(with_twin=True)
    assert len(patterns) > 100
    items = yaml.safe_load(EVAL_FILE.read_text(encoding="utf-8"))["items"]
    texts = [item["text"] + "\n" + (item.get("code") or "") for item in items]
    texts += [
        "".join(c.upper() if i % 3 == 0 else c for i, c in enumerate(text)) for text in texts[::5]
    ]
    wrong = []
    for text in texts:
        lowered = text.lower()
        for name, gated in patterns:
            twin, expected = (
                cast(re.Pattern[str], gated.twin).search(lowered),
                gated.regex.search(text),
            )
            if text.isascii() and (twin and twin.start()) != (expected and expected.start()):
                wrong.append((name, text[:80]))
    assert not wrong, wrong[:5]
