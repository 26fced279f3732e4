"""Garbled input never makes the static analyser raise: it always returns a report.

Random bytes, random text, truncated and shuffled real training scripts, token soup from the
training-loop vocabulary and pathologically nested code go through ``lint_source`` and
``lint_paths``; each must come back as a report whose findings point inside the text, or whose
error is one line.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from _static_io_support import BUGGY, GOLDEN
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gradient_doctor.probes.static import lint_paths, lint_source
from gradient_doctor.probes.static.report import FileReport

SCRIPTS = [
    p.read_text(encoding="utf-8") for p in sorted([*GOLDEN.glob("*.py"), *BUGGY.glob("*.py")])
]

FUZZ = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

VOCABULARY = [
    "loss",
    "loss.backward()",
    "optimizer.step()",
    "optimizer.zero_grad()",
    "scaler",
    "scaler.scale(loss).backward()",
    "scaler.unscale_(optimizer)",
    "scaler.step(optimizer)",
    "scaler.update()",
    "torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)",
    "clip_grad_value_",
    "model.no_sync()",
    "with",
    "for",
    "in",
    "range(N)",
    "if",
    "else",
    ":",
    "(i + 1) % N == 0",
    "loss = loss / N",
    "loss /= N",
    "def",
    "class",
    "return",
    "self",
    "scheduler.step()",
    "accelerator.backward(loss)",
    "engine.step()",
    "=",
    "(",
    ")",
    "[",
    "]",
    ",",
    ".",
    "/",
    "*",
    "%",
    "\n",
    "\n    ",
    "\n        ",
    "import torch",
    "lambda",
    "yield",
    "micro_step",
    "p.grad /= N",
    "torch.log(x)",
    "nn.LSTM(1, 2)",
    "GradScaler()",
    "@",
    "not",
]


def _check(report: FileReport, source: str) -> None:
    assert isinstance(report, FileReport)
    if report.error is not None:
        assert report.error.strip() and "\n" not in report.error
        return
    line_count = max(source.count("\n") + 1, 1)
    for finding in report.findings:
        assert finding.line is not None and 1 <= finding.line <= line_count + 1
        assert finding.message


@FUZZ
@given(st.binary(max_size=2000))
def test_random_bytes_through_lint_paths(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "fuzz.py"
        path.write_bytes(data)
        report = lint_paths([path])
    assert len(report.files) == 1
    assert report.files[0].error is None or "\n" not in report.files[0].error


@FUZZ
@given(st.text(max_size=2000))
def test_random_text(source: str) -> None:
    _check(lint_source(source, "fuzz.py"), source)


@FUZZ
@given(st.sampled_from(SCRIPTS), st.floats(min_value=0.0, max_value=1.0))
def test_truncated_real_scripts(script: str, fraction: float) -> None:
    source = script[: int(len(script) * fraction)]
    _check(lint_source(source, "truncated.py"), source)


@FUZZ
@given(st.sampled_from(SCRIPTS), st.data())
def test_shuffled_lines_of_real_scripts(script: str, data: st.DataObject) -> None:
    """Swapping, dropping and repeating lines keeps most of it parsable: the rules run on
    orders of calls no real script has."""
    lines = script.splitlines(keepends=True)
    for _ in range(data.draw(st.integers(1, 6))):
        i = data.draw(st.integers(0, len(lines) - 1))
        j = data.draw(st.integers(0, len(lines) - 1))
        action = data.draw(st.sampled_from(["swap", "drop", "repeat"]))
        if action == "swap":
            lines[i], lines[j] = lines[j], lines[i]
        elif action == "drop" and len(lines) > 1:
            del lines[i]
        else:
            lines.insert(j, lines[i])
    source = "".join(lines)
    _check(lint_source(source, "shuffled.py"), source)


@FUZZ
@given(st.lists(st.sampled_from(VOCABULARY), max_size=200), st.sampled_from([" ", "", "\n"]))
def test_token_soup(tokens: list[str], separator: str) -> None:
    source = separator.join(tokens)
    _check(lint_source(source, "soup.py"), source)


NESTING = {
    "parens": lambda n: "x = " + "(" * n + "1" + ")" * n + "\n",
    "brackets": lambda n: "x = " + "[" * n + "]" * n + "\n",
    "unary": lambda n: "x = " + "-" * n + "1\n",
    "calls": lambda n: "x = f" + "()" * n + "\n",
    "attributes": lambda n: "x = a" + ".b" * n + "\n",
    "strings": lambda n: "x = " + " ".join(['"a"'] * n) + "\n",
    "binops": lambda n: "loss = " + " + ".join(["loss"] * n) + "\nloss.backward()\n",
    "blocks": lambda n: (
        "".join("    " * i + f"for i{i} in range(2):\n" for i in range(n))
        + "    " * n
        + "loss.backward()\n"
    ),
}


@pytest.mark.slow  # near the parser's limits libcst needs up to ~2 s per example
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(sorted(NESTING)), st.integers(min_value=1, max_value=6000))
def test_deeply_nested_code(shape: str, depth: int) -> None:
    source = NESTING[shape](depth)
    _check(lint_source(source, "deep.py"), source)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "deep.py"
        path.write_text(source, encoding="utf-8")
        (file,) = lint_paths([path]).files
    _check(file, source)
