"""Source for any Python from 3.8 to 3.14 is read, whatever interpreter runs the analyser; the
guard against pathological nesting refuses only code that no Python accepts."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from subprocess import CompletedProcess

import pytest

from gradient_doctor.probes.static import lint_paths, lint_source
from gradient_doctor.probes.static.parsing import nesting_guard, parse_source

PEP701 = """\
from pathlib import Path
import torch


def save(model, out_dir, step):
    torch.save(model.state_dict(), f"{Path(out_dir) / "ckpt"}-{step}.pt")
    print(f"{"\\n".join(["a", "b"])} {f"{f"{step}"}"}")


def train(model, loader, optimizer, out_dir):
    for step, (x, y) in enumerate(loader):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        save(model, out_dir, step)
"""

NEWER_SYNTAX = {
    "pep701": 'x = f"{a["b"]}"\n',
    "pep695": "type Pair[T] = tuple[T, T]\ndef first[T](p: Pair[T]) -> T:\n    return p[0]\n",
    "pep696": "def f[T = int](x: T) -> T:\n    return x\n",
    "pep758": "try:\n    pass\nexcept ValueError, TypeError:\n    pass\n",
    "pep750": 'greeting = t"hello {name}"\n',
    "match": "match x:\n    case {'a': 1}:\n        pass\n",
}


def test_a_pep701_file_is_analysed_with_findings_at_the_right_lines() -> None:
    report = lint_source(PEP701, "train.py")
    assert report.error is None
    clip = [f for f in report.findings if f.id == "clip-after-step"]
    assert [(f.line, f.col) for f in clip] == [(16, 9)]
    assert clip[0].fix is not None


@pytest.mark.parametrize("name", sorted(NEWER_SYNTAX))
def test_newer_syntax_parses_and_passes_the_guard(name: str) -> None:
    source = NEWER_SYNTAX[name]
    assert nesting_guard(source) is None
    assert not isinstance(parse_source(source), str)


@pytest.mark.parametrize(
    ("source", "reason"),
    [
        ('x = f"{a["b"]}"\n' + "y = " + "(" * 5000 + "1" + ")" * 5000 + "\n", "brackets"),
        ('x = f"{a["b"]}"\n' + "y = " + "[" * 300 + "]" * 300 + "\n", "brackets"),
        (
            'x = f"{a["b"]}"\n'
            + "".join("    " * i + f"if a{i}:\n" for i in range(120))
            + "    " * 120
            + "pass\n",
            "indentation",
        ),
        ('x = f"{a["b"]}"\n' + "y = " + "-" * 5000 + "1\n", "unary"),
    ],
)
def test_pathological_nesting_is_refused_without_reaching_libcst(source: str, reason: str) -> None:
    guard = nesting_guard(source)
    assert guard is not None and reason.split()[0][:5] in guard
    report = lint_source(source, "deep.py")
    assert report.error is not None and "\n" not in report.error


def test_brackets_inside_strings_and_comments_do_not_count() -> None:
    source = (
        'a = "' + "(" * 500 + '"\n'
        "b = '''" + "[" * 500 + "'''\n"
        "# " + "{" * 500 + "\n"
        'c = f"{x!r:>{width}} {{literal}} {"(" * 3}"\n'
    )
    assert nesting_guard(source) is None


def test_a_real_syntax_error_keeps_cpythons_message() -> None:
    report = lint_source("for x in :\n", "bad.py")
    assert report.error is not None and report.error.startswith("syntax error at line 1:")


def test_cli_reads_newer_syntax_and_prints_a_syntax_error_once(
    cli: Callable[..., CompletedProcess[str]], tmp_path: Path
) -> None:
    good = tmp_path / "train.py"
    good.write_text(PEP701, encoding="utf-8")
    done = cli("lint", str(good))
    assert done.returncode == 1  # clip-after-step is critical
    assert "error" not in done.stderr
    assert f"{good}:16:9: clip-after-step" in done.stdout
    bad = tmp_path / "bad.py"
    bad.write_text("for x in :\n", encoding="utf-8")
    done = cli("lint", str(bad))
    assert done.returncode == 2
    both = done.stdout + done.stderr
    assert both.count("syntax error at line 1:") == 1


LEGACY_ASYNC_NAMES = """\
import torch


def train(model, loader, optimizer, accum):
    model.train()
    for i, (x, y) in enumerate(loader):
        x, y = x.cuda(async=True), y.cuda(async=True)
        loss = torch.nn.functional.cross_entropy(model(x), y) / accum
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        if (i + 1) % accum == 0:
            optimizer.step()
            optimizer.zero_grad()
"""


def test_a_python36_file_with_async_as_a_name_is_analysed_without_a_patch(tmp_path: Path) -> None:
    # `x.cuda(async=True)` was valid until Python 3.7 made `async` a keyword; PyTorch code of
    # that era is full of it. The file is read, findings point at its own lines, and no patch is
    # offered against text the analyser had to rename to read.
    report = lint_source(LEGACY_ASYNC_NAMES, "main.py")
    assert report.error is None
    clip = [f for f in report.findings if f.id == "accum-clip-every-microstep"]
    assert [(f.line, f.col) for f in clip] == [(10, 9)]
    assert clip[0].fix is None
    assert "async" in clip[0].evidence["fix_withheld"]
    # A folder lint (with the project index, which CPython cannot parse this file for) too.
    (tmp_path / "main.py").write_text(LEGACY_ASYNC_NAMES, encoding="utf-8")
    (files,) = [r for r in lint_paths([str(tmp_path)]).files if r.path.endswith("main.py")]
    assert files.error is None
    assert [f.line for f in files.findings if f.id == "accum-clip-every-microstep"] == [10]


def test_messages_about_a_python36_file_quote_the_users_own_names() -> None:
    source = (
        "import torch\n\n\ndef train(model, loader, optimizer):\n"
        "    for x, y in loader:\n"
        "        optimizer.zero_grad()\n"
        "        torch.nn.functional.cross_entropy(model(x.cuda(async=True)), y).backward()\n"
        "        optimizer.step()\n"
    )
    findings = lint_source(source, "main.py").findings
    quoting = [f for f in findings if "x.cuda(async=True)" in f.message]
    assert quoting and quoting[0].evidence["backward"].startswith("torch.nn.functional")
    assert not any("asyn_" in f.message or "asyn_" in str(f.evidence) for f in findings)


@pytest.mark.parametrize(
    "source",
    [
        "def f(async=1):\n    return async\n",
        "async = 3\nawait = async + 1\n",
        "class async:\n    pass\n",
        "x.cuda(non_blocking=True, async=True)\n",
    ],
)
def test_async_and_await_as_names_are_read_in_place(source: str) -> None:
    parsed = parse_source(source)
    assert not isinstance(parsed, str) and parsed.legacy
    # Same length, so every later line and column still points into the user's text.
    assert len(parsed.module.code) == len(source)


def test_modern_async_code_and_real_errors_are_not_read_as_legacy() -> None:
    modern = parse_source("async def f(x):\n    async with x:\n        return await x\n")
    assert not isinstance(modern, str) and not modern.legacy
    broken = lint_source("x.cuda(async=True\n", "bad.py")
    assert broken.error is not None and broken.error.startswith("syntax error")


NOTEBOOK_EXPORT = """\
# -*- coding: utf-8 -*-
\"\"\"Fine-tuning notebook, downloaded as a .py file.\"\"\"

!nvidia-smi
!pip install -q transformers
%matplotlib inline

import torch


def train(model, loader, optimizer, scaler):
    for x, y in loader:
        with torch.autocast("cuda", dtype=torch.float16):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
        if False:
            !ls checkpoints
"""


def test_a_notebook_exported_with_shell_lines_is_analysed_without_a_patch(tmp_path: Path) -> None:
    # Colab's "Download .py" keeps `!pip install` and `%magic` lines, which no Python parses.
    # The file is read with those lines skipped, findings keep the user's line numbers, and no
    # patch is offered against text the analyser had to change to read.
    report = lint_source(NOTEBOOK_EXPORT, "notebook.py")
    assert report.error is None
    clip = [f for f in report.findings if f.id == "amp-clip-without-unscale"]
    assert [f.line for f in clip] == [16]
    assert clip[0].fix is None
    assert "notebook" in clip[0].evidence["fix_withheld"]
    (tmp_path / "notebook.py").write_text(NOTEBOOK_EXPORT, encoding="utf-8")
    (files,) = [r for r in lint_paths([str(tmp_path)]).files if r.path.endswith("notebook.py")]
    assert files.error is None
    assert [f.line for f in files.findings if f.id == "amp-clip-without-unscale"] == [16]


@pytest.mark.parametrize(
    "source",
    [
        "x = (1\n% 2)\ny = (\n",  # a continued `%` is an operator, and the file is still broken
        "x = 1 +\n!ls\n",
        "def f(:\n    pass\n!ls\n",  # a real error elsewhere is not hidden by skipping `!ls`
    ],
)
def test_shell_lines_do_not_hide_a_real_syntax_error(source: str) -> None:
    parsed = parse_source(source)
    assert isinstance(parsed, str) and parsed.startswith("syntax error")


def test_percent_continuation_lines_of_valid_code_are_untouched() -> None:
    parsed = parse_source("x = (10\n     % 3)\n")
    assert not isinstance(parsed, str) and not parsed.notebook
