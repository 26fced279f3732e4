"""Walking paths and reading sources: one-line reasons for unreadable files, the rest go on."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gradient_doctor.probes.static.walk import (
    MAX_FILE_BYTES,
    SourceError,
    check_syntax,
    decode_source,
    iter_python_files,
    lint_paths,
    read_source,
)

TRAINING_SNIPPET = """\
import torch


def train(model, loader, optimizer):
    for x, y in loader:
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
"""


def _write(path: Path, content: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return path


def _relative(paths: list[tuple[Path, bool]], root: Path) -> list[str]:
    return [p.relative_to(root).as_posix() for p, _ in paths]


def test_walk_finds_python_files_recursively_in_sorted_order(tmp_path: Path) -> None:
    for name in ["b.py", "a.py", "pkg/z.py", "pkg/sub/m.py", "notes.txt", "data.json", "pkg/w.pyw"]:
        _write(tmp_path / name, "x = 1\n")
    found = list(iter_python_files([tmp_path]))
    assert _relative(found, tmp_path) == ["a.py", "b.py", "pkg/w.pyw", "pkg/z.py", "pkg/sub/m.py"]
    assert all(not explicit for _, explicit in found)


@pytest.mark.parametrize(
    "skipped", [".venv", ".git", "__pycache__", "node_modules", ".hidden", "venv", ".tox"]
)
def test_walk_skips_environments_caches_and_hidden_directories(
    tmp_path: Path, skipped: str
) -> None:
    _write(tmp_path / "train.py", "x = 1\n")
    _write(tmp_path / skipped / "lib" / "module.py", "x = 1\n")
    assert _relative(list(iter_python_files([tmp_path])), tmp_path) == ["train.py"]


def test_walk_reports_each_file_once_and_keeps_explicit_files(tmp_path: Path) -> None:
    script = _write(tmp_path / "train.py", "x = 1\n")
    readme = _write(tmp_path / "README.md", "# hi\n")
    found = list(iter_python_files([tmp_path, script, readme, str(script)]))
    assert [(p.name, explicit) for p, explicit in found] == [
        ("train.py", False),
        ("README.md", True),
    ]


def test_read_source_keeps_line_endings_and_exact_text(tmp_path: Path) -> None:
    text = "import torch\r\nx = 1  \r\n\r\ny = 'é'\r\n"
    path = _write(tmp_path / "crlf.py", text.encode("utf-8"))
    assert read_source(path) == text


def test_read_source_drops_only_the_utf8_bom(tmp_path: Path) -> None:
    path = _write(tmp_path / "bom.py", b"\xef\xbb\xbfx = 'caf\xc3\xa9'\n")
    assert read_source(path) == "x = 'café'\n"


def test_read_source_honours_a_pep263_coding_cookie(tmp_path: Path) -> None:
    path = _write(tmp_path / "latin.py", b"# -*- coding: latin-1 -*-\nname = 'caf\xe9'\n")
    assert read_source(path) == "# -*- coding: latin-1 -*-\nname = 'café'\n"


@pytest.mark.parametrize(
    ("name", "content", "reason"),
    [
        ("notes.txt", "x = 1\n", "not a Python file (.txt)"),
        ("Makefile", "all:\n\techo hi\n", "not a Python file (no suffix)"),
        ("blob.py", b"\x00\x01\x02binary\x00", "binary file (contains NUL bytes)"),
        (
            "undecodable.py",
            b"x = '\xff\xfe caf\xe9'\n",
            "binary or undecodable file: byte 0xff on line 1",
        ),
        ("bad_cookie.py", b"# -*- coding: klingon -*-\nx = 1\n", "cannot decode"),
    ],
)
def test_read_source_explains_unreadable_files(
    tmp_path: Path, name: str, content: str | bytes, reason: str
) -> None:
    path = _write(tmp_path / name, content)
    with pytest.raises(SourceError) as excinfo:
        read_source(path)
    message = str(excinfo.value)
    assert reason in message
    assert "\n" not in message


def test_read_source_accepts_an_explicit_python_script_without_suffix(tmp_path: Path) -> None:
    path = _write(tmp_path / "train", "#!/usr/bin/env python3\nx = 1\n")
    assert read_source(path, named_explicitly=True) == "#!/usr/bin/env python3\nx = 1\n"
    with pytest.raises(SourceError, match="not a Python file"):
        read_source(path, named_explicitly=False)


def test_read_source_refuses_huge_files_without_reading_them(tmp_path: Path) -> None:
    path = tmp_path / "huge.py"
    with open(path, "wb") as handle:
        handle.truncate(MAX_FILE_BYTES + 1)  # sparse: costs no disk
    with pytest.raises(
        SourceError, match=r"file too large to analyse \(5\.0 MB; the limit is 5 MB\)"
    ):
        read_source(path)


def test_read_source_missing_and_directory(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="no such file or directory"):
        read_source(tmp_path / "absent.py")
    with pytest.raises(SourceError, match="is a directory"):
        read_source(tmp_path)


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root can read mode-000 files")
def test_read_source_unreadable_file(tmp_path: Path) -> None:
    path = _write(tmp_path / "secret.py", "x = 1\n")
    path.chmod(0)
    try:
        with pytest.raises(SourceError, match="cannot read: Permission denied"):
            read_source(path)
    finally:
        path.chmod(0o644)


def test_decode_source_round_trips_utf8() -> None:
    text = "# Grüße\nloss = loss / N  # ∑\n"
    assert decode_source(text.encode("utf-8")) == text


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("def f(:\n    pass\n", "syntax error at line 1:"),
        ("x = " + "(" * 300 + "1" + ")" * 300 + "\n", "syntax error"),
        ("x = " + "-" * 5000 + "1\n", "nested too deeply"),
    ],
)
def test_check_syntax_gives_one_line_reasons(source: str, expected: str) -> None:
    reason = check_syntax(source)
    assert reason is not None and expected in reason and "\n" not in reason


def test_check_syntax_accepts_valid_code() -> None:
    assert check_syntax(TRAINING_SNIPPET) is None


def test_lint_paths_reports_bad_files_and_analyses_the_rest(tmp_path: Path) -> None:
    _write(tmp_path / "a_good.py", TRAINING_SNIPPET)
    _write(tmp_path / "b_syntax.py", "for x in :\n")
    _write(tmp_path / "c_binary.py", b"\x00\x00\x00")
    _write(tmp_path / "d_deep.py", "x = " + "(" * 5000 + "1" + ")" * 5000 + "\n")
    _write(tmp_path / "e_empty.py", "")
    report = lint_paths([tmp_path])
    by_name = {Path(f.path).name: f for f in report.files}
    assert list(by_name) == ["a_good.py", "b_syntax.py", "c_binary.py", "d_deep.py", "e_empty.py"]
    assert by_name["a_good.py"].error is None
    assert "clip-after-step" in {f.id for f in by_name["a_good.py"].findings}
    assert (by_name["b_syntax.py"].error or "").startswith("syntax error at line 1:")
    assert (by_name["c_binary.py"].error or "").startswith("binary file")
    assert (by_name["d_deep.py"].error or "").startswith("syntax error")
    assert by_name["e_empty.py"].error is None and by_name["e_empty.py"].findings == []


def test_lint_paths_paths_are_shown_as_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _write(tmp_path / "src" / "train.py", TRAINING_SNIPPET)
    monkeypatch.chdir(tmp_path)
    report = lint_paths(["src"])
    assert [f.path for f in report.files] == [os.path.join("src", "train.py")]
    assert all(f.path == os.path.join("src", "train.py") for f in report.findings)


def test_lint_paths_accepts_a_single_path_and_missing_paths(tmp_path: Path) -> None:
    script = _write(tmp_path / "train.py", TRAINING_SNIPPET)
    assert [f.path for f in lint_paths(script).files] == [str(script)]
    missing = lint_paths([tmp_path / "nope.py"]).files
    assert missing[0].error == "no such file or directory"


def test_lint_paths_select_and_ignore(tmp_path: Path) -> None:
    script = _write(tmp_path / "train.py", TRAINING_SNIPPET)
    assert {f.id for f in lint_paths([script], ignore=["clip-after-step"]).findings} <= {
        "no-grad-monitoring"
    }
    assert {f.id for f in lint_paths([script], select=["clip-after-step"]).findings} == {
        "clip-after-step"
    }
    with pytest.raises(ValueError, match="clip-after-stp"):
        lint_paths([script], select=["clip-after-stp"])


def test_lint_paths_never_writes_the_files(tmp_path: Path) -> None:
    script = _write(tmp_path / "train.py", TRAINING_SNIPPET)
    before = (script.read_bytes(), script.stat().st_mtime_ns)
    lint_paths([tmp_path])
    assert (script.read_bytes(), script.stat().st_mtime_ns) == before
