"""``gradient-doctor lint`` through the real command line (a fresh interpreter per call)."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from subprocess import CompletedProcess

import pytest
from _static_io_support import BUGGY, GOLDEN

pytestmark = pytest.mark.slow  # each call starts an interpreter (about a second)

Cli = Callable[..., CompletedProcess[str]]

CLIP_AFTER_STEP = BUGGY / "clip-after-step__flat_alias.py"  # critical at line 22
WARNING_ONLY = BUGGY / "accum-scheduler-per-microbatch__flat.py"  # warning at line 20


def _digest(folder: Path) -> dict[str, str]:
    return {
        str(p): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def test_text_output_and_exit_1_on_a_critical_finding(cli: Cli) -> None:
    done = cli("lint", str(CLIP_AFTER_STEP))
    assert done.returncode == 1, done.stderr
    assert f"{CLIP_AFTER_STEP}:22:13: clip-after-step " in done.stdout
    assert done.stdout.rstrip().splitlines()[-1].startswith("Found ")
    assert done.stderr == ""


def test_golden_folder_exits_0_and_user_files_are_untouched(cli: Cli) -> None:
    before = _digest(GOLDEN)
    done = cli("lint", str(GOLDEN), "--fail-on", "warning")
    assert done.returncode == 0, done.stdout + done.stderr
    assert _digest(GOLDEN) == before


def test_fail_on_thresholds(cli: Cli) -> None:
    assert cli("lint", str(WARNING_ONLY)).returncode == 0  # default: critical
    assert cli("lint", str(WARNING_ONLY), "--fail-on", "warning").returncode == 1
    assert cli("lint", str(CLIP_AFTER_STEP), "--fail-on", "never").returncode == 0


def test_json_output_on_a_folder(cli: Cli) -> None:
    done = cli("lint", str(BUGGY), "--format", "json")
    assert done.returncode == 1
    document = json.loads(done.stdout)
    paths = [f["path"] for f in document["files"]]
    assert paths == sorted(paths) and len(paths) == len(list(BUGGY.glob("*.py")))
    by_path = {f["path"]: f for f in document["files"]}
    findings = by_path[str(CLIP_AFTER_STEP)]["findings"]
    clip = next(f for f in findings if f["id"] == "clip-after-step")
    assert (clip["severity"], clip["line"], clip["col"]) == ("critical", 22, 13)
    assert clip["fix"] is None or clip["fix"]["diff"].startswith("--- a/")


def test_sarif_output_validates(cli: Cli) -> None:
    from test_formats import validate_sarif

    done = cli("lint", str(CLIP_AFTER_STEP), str(WARNING_ONLY), "--format", "sarif")
    assert done.returncode == 1
    document = json.loads(done.stdout)
    validate_sarif(document)
    results = document["runs"][0]["results"]
    assert {(r["ruleId"], r["level"]) for r in results} >= {
        ("clip-after-step", "error"),
        ("accum-scheduler-per-microbatch", "warning"),
    }


def test_markdown_output(cli: Cli) -> None:
    done = cli("lint", str(CLIP_AFTER_STEP), "--format", "markdown")
    assert done.returncode == 1
    assert done.stdout.startswith("# Gradient Doctor: static analysis")
    assert "CRITICAL `clip-after-step` at line 22" in done.stdout


def test_select_and_ignore(cli: Cli) -> None:
    selected = cli(
        "lint", str(BUGGY), "--format", "json", "--select", "value-clipping, clip-after-step"
    )
    ids = {f["id"] for file in json.loads(selected.stdout)["files"] for f in file["findings"]}
    assert ids == {"value-clipping", "clip-after-step"}
    ignored = cli("lint", str(CLIP_AFTER_STEP), "--ignore", "clip-after-step")
    assert ignored.returncode == 0 and ": clip-after-step " not in ignored.stdout


def test_unknown_rule_id_is_a_usage_error_naming_the_closest(cli: Cli) -> None:
    done = cli("lint", str(CLIP_AFTER_STEP), "--select", "clip-after-stpe")
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.strip() == (
        "gradient-doctor: error: --select: unknown rule id 'clip-after-stpe'; "
        "did you mean 'clip-after-step'?"
    )


def test_missing_path_is_a_usage_error(cli: Cli, tmp_path: Path) -> None:
    done = cli("lint", str(tmp_path / "nope.py"))
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1
    assert "nope.py: no such file or directory" in done.stderr
    assert "Traceback" not in done.stderr


def test_explicit_unparsable_file_is_exit_2_but_inside_a_folder_an_entry(
    cli: Cli, tmp_path: Path
) -> None:
    broken = tmp_path / "broken.py"
    broken.write_text("def train(:\n    pass\n")
    shutil.copy(CLIP_AFTER_STEP, tmp_path / "train.py")
    explicit = cli("lint", str(broken), str(tmp_path / "train.py"))
    assert explicit.returncode == 2
    (line,) = explicit.stderr.strip().splitlines()
    assert line.startswith(f"gradient-doctor: error: {broken}: syntax error at line 1:")
    assert "clip-after-step" in explicit.stdout  # the other file was still analysed
    walked = cli("lint", str(tmp_path), "--format", "json")
    assert walked.returncode == 1  # from the finding in train.py, not from broken.py
    entries = {Path(f["path"]).name: f for f in json.loads(walked.stdout)["files"]}
    assert entries["broken.py"]["error"].startswith("syntax error at line 1:")
    assert walked.stderr == ""


def test_output_file(cli: Cli, tmp_path: Path) -> None:
    out = tmp_path / "report.sarif"
    done = cli("lint", str(CLIP_AFTER_STEP), "--format", "sarif", "--output", str(out))
    assert done.returncode == 1 and done.stdout == ""
    assert json.loads(out.read_text())["version"] == "2.1.0"
    script = tmp_path / "train.py"
    shutil.copy(CLIP_AFTER_STEP, script)
    refused = cli("lint", str(script), "--output", str(script))
    assert refused.returncode == 2 and "refusing to overwrite" in refused.stderr
    walked = cli("lint", str(tmp_path), "--output", str(script))  # a file found by the walk
    assert walked.returncode == 2 and "refusing to overwrite" in walked.stderr
    assert script.read_bytes() == CLIP_AFTER_STEP.read_bytes()


def test_help_documents_formats_and_exit_codes(cli: Cli) -> None:
    done = cli("lint", "--help")
    assert done.returncode == 0
    for needle in (
        "--format",
        "sarif",
        "markdown",
        "--fail-on",
        "--select",
        "--ignore",
        "--output",
    ):
        assert needle in done.stdout
    assert "FILE NAMED ON THE COMMAND LINE" in done.stdout


def test_lint_never_imports_torch() -> None:
    code = (
        "import sys\n"
        "from skill_server.cli import main\n"
        f"main(['lint', {str(BUGGY)!r}, '--format', 'sarif', '--output', '/dev/null'])\n"
        "print('torch' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.stdout.strip() == "False", done.stderr


def test_folder_without_python_files_warns_and_exits_0(cli: Cli, tmp_path: Path) -> None:
    (tmp_path / "notes.md").write_text("# notes\n")
    done = cli("lint", str(tmp_path))
    assert done.returncode == 0
    assert done.stdout == "No findings in 0 analysed files.\n"
    assert done.stderr.strip() == "gradient-doctor: warning: no Python files found"
