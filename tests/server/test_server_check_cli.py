"""``gradient-doctor check`` through the real command line (``run_cli``)."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from subprocess import CompletedProcess

import pytest
from server_helpers import REPO

Cli = Callable[..., CompletedProcess[str]]


def test_check_no_probe_finds_the_example_bugs_and_exits_1(cli: Cli) -> None:
    result = cli("check", "examples/buggy_train.py", "--no-probe")
    assert result.returncode == 1, result.stderr
    report = result.stdout
    assert report.startswith("## Gradient Health Report")
    assert "accum-unscaled-loss" in report and "clip-after-step" in report
    assert "| Static red flags |" in report and "❌" in report
    assert "```diff" in report


def test_check_json_is_the_diagnosis(cli: Cli) -> None:
    result = cli("check", "examples/buggy_train.py", "--no-probe", "--format", "json")
    assert result.returncode == 1, result.stderr
    data = json.loads(result.stdout)
    assert data["worst_severity"] == "critical"
    assert data["probe_status"] is None
    ids = [issue["id"] for issue in data["issues"]]
    assert len(ids) == len(set(ids))
    lines = (REPO / "examples/buggy_train.py").read_text().splitlines()
    clip = next(i for i in data["issues"] if i["id"] == "clip-after-step")
    line = int(clip["locations"][0].rsplit(":", 1)[1])
    assert "clip_grad_norm_" in lines[line - 1]


def test_fail_on_controls_the_exit_code(cli: Cli) -> None:
    healthy = cli("check", "examples/healthy_train.py", "--no-probe")
    assert healthy.returncode == 0, healthy.stdout + healthy.stderr
    assert "clip-after-step" not in healthy.stdout
    strict = cli("check", "examples/healthy_train.py", "--no-probe", "--fail-on", "info")
    data = json.loads(
        cli("check", "examples/healthy_train.py", "--no-probe", "--format", "json").stdout
    )
    expected = 1 if data["issues"] else 0
    assert strict.returncode == expected


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("check", "does/not/exist.py"), "no such file"),
        (("check", "examples"), "directory"),
        (("check", "examples/buggy_train.py", "--steps", "0"), "--steps"),
        (("check", "examples/buggy_train.py", "--format", "xml"), "invalid choice"),
        (("check", "examples/buggy_train.py", "--device", "tpu"), "--device"),
        (("check", "examples/buggy_train.py", "--timeout", "-1"), "--timeout"),
    ],
)
def test_bad_input_exits_2_with_one_line(cli: Cli, args: tuple[str, ...], fragment: str) -> None:
    result = cli(*args)
    assert result.returncode == 2
    assert fragment in result.stderr
    assert "Traceback" not in result.stderr


def test_binary_file_exits_2(cli: Cli, tmp_path: Path) -> None:
    script = tmp_path / "model.py"
    script.write_bytes(b"\x7fELF\x00\x00binary")
    result = cli("check", str(script), "--no-probe")
    assert result.returncode == 2 and "binary" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_check_runs_the_example_under_the_probe(cli: Cli) -> None:
    result = cli("check", "examples/buggy_train.py", "--steps", "12", "--format", "json")
    assert result.returncode == 1, result.stderr
    data = json.loads(result.stdout)
    assert data["probe_status"] in ("ok", "stopped"), data["summary"]
    assert data["probe_steps"] == 12
    merged = [i for i in data["issues"] if {"static", "runtime"} <= set(i["sources"])]
    assert merged, [(i["id"], i["sources"]) for i in data["issues"]]


@pytest.mark.slow
def test_check_healthy_example_under_the_probe_is_not_critical(cli: Cli) -> None:
    result = cli("check", "examples/healthy_train.py", "--steps", "12")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Runtime probe" in result.stdout


def test_the_reported_patch_applies_and_fixes_the_critical_issues(cli: Cli, tmp_path: Path) -> None:
    (tmp_path / "examples").mkdir()
    shutil.copy(REPO / "examples/buggy_train.py", tmp_path / "examples/buggy_train.py")
    before = cli("check", "examples/buggy_train.py", "--no-probe", "--format", "json", cwd=tmp_path)
    assert before.returncode == 1, before.stderr
    diff = json.loads(before.stdout)["combined_diff"]
    (tmp_path / "fix.diff").write_text(diff)
    applied = subprocess.run(
        ["git", "apply", "fix.diff"], cwd=tmp_path, capture_output=True, text=True
    )
    assert applied.returncode == 0, applied.stderr
    after = cli("check", "examples/buggy_train.py", "--no-probe", "--format", "json", cwd=tmp_path)
    assert after.returncode == 0, after.stdout
    remaining = {issue["id"] for issue in json.loads(after.stdout)["issues"]}
    assert not remaining & {"accum-unscaled-loss", "clip-after-step"}


HOSTILE = REPO / "tests" / "fixtures" / "isolation"


@pytest.mark.slow
@pytest.mark.parametrize("options_first", [False, True])
def test_check_takes_options_on_either_side_and_runs_in_the_scripts_folder(
    cli: Cli, tmp_path: Path, options_first: bool
) -> None:
    seen = tmp_path / "seen.json"
    script = str(HOSTILE / "reports_cwd.py")
    options = ["--steps", "3", "--format", "json"]
    words = [*options, script] if options_first else [script, *options]
    result = cli("check", *words, "--", str(seen), cwd=tmp_path)
    assert result.returncode in (0, 1), result.stderr
    data = json.loads(result.stdout)
    assert data["probe_steps"] == 3
    assert "reports_cwd.py" in data["script"]
    assert data["probe_interpreter"] and "virtualenv" in data["probe_interpreter"]
    ran = json.loads(seen.read_text())
    # Same rule as probe and MCP: the script's own folder, not the caller's.
    assert ran == {"cwd": str(HOSTILE), "argv": [str(seen)]}
    report = cli("check", script, "--steps", "3", "--", str(seen), cwd=tmp_path)
    assert "**Interpreter:**" in report.stdout


@pytest.mark.slow
def test_check_cwd_option(cli: Cli, tmp_path: Path) -> None:
    seen = tmp_path / "seen.json"
    result = cli(
        "check", str(HOSTILE / "reports_cwd.py"), "--steps", "2", "--cwd", str(tmp_path),
        "--", str(seen),
    )  # fmt: skip
    assert result.returncode in (0, 1), result.stderr
    assert json.loads(seen.read_text())["cwd"] == str(tmp_path)


def test_check_stray_positional_is_refused(cli: Cli) -> None:
    result = cli("check", "examples/buggy_train.py", "examples/healthy_train.py", "--no-probe")
    assert result.returncode == 2
    assert "unrecognized arguments: examples/healthy_train.py" in result.stderr
    assert "go after `--`" in result.stderr


def test_double_dash_on_a_command_without_a_script_is_refused(cli: Cli) -> None:
    result = cli("match", "loss is nan", "--", "x")
    assert result.returncode == 2 and "runs no script" in result.stderr


def _patch_of(report: str) -> str:
    return report.split("```diff\n", 1)[1].split("```", 1)[0]


@pytest.mark.skipif(shutil.which("patch") is None, reason="needs GNU patch")
@pytest.mark.parametrize("inside_cwd", [True, False])
def test_the_printed_apply_command_applies_the_patch_of_an_absolute_path(
    cli: Cli, tmp_path: Path, inside_cwd: bool
) -> None:
    """Assistants pass absolute paths: the instruction printed with the patch must work."""
    project = tmp_path / "project"
    project.mkdir()
    script = project / "train.py"
    shutil.copy(REPO / "examples/buggy_train.py", script)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    result = cli("check", str(script), "--no-probe", cwd=project if inside_cwd else elsewhere)
    assert result.returncode == 1, result.stderr
    report = result.stdout
    (tmp_path / "fix.patch").write_text(_patch_of(report))
    if inside_cwd:
        assert "--- a/train.py" in report and f"in `{project}`" in report
        command = ["patch", "-p1", "-i", str(tmp_path / "fix.patch")]
        where = project
    else:
        assert "`patch -p1 -d / < fix.patch`" in report
        command = ["patch", "-p1", "-d", "/", "-i", str(tmp_path / "fix.patch")]
        where = elsewhere
    subprocess.run(command, cwd=where, check=True, capture_output=True)
    assert "(loss / ACCUM_STEPS).backward()" in script.read_text()


BRANCHY_UPDATE = """\
import torch

model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
use_optimizer = True
for step in range(10):
    loss = model(torch.randn(8, 4)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    if use_optimizer:
        optimizer.step()
    else:
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-0.1)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
"""


def test_report_says_why_a_finding_has_no_patch_and_skips_static_evidence(
    cli: Cli, tmp_path: Path
) -> None:
    """The reason a patch was withheld is the user's next step: shown whole, on its own line.

    A static finding's evidence (the same calls and lines as its message) is not repeated.
    """
    (tmp_path / "train.py").write_text(BRANCHY_UPDATE)
    result = cli("check", "train.py", "--no-probe", cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    report = result.stdout
    assert "`clip-after-step`" in report
    line = next(x for x in report.splitlines() if "No patch offered:" in x)
    assert "`if use_optimizer:`" in line and "one path only" in line, line
    assert "Evidence (static)" not in report and "fix_withheld" not in report
    assert "```diff" not in report


@pytest.mark.slow
def test_verified_fix_adds_no_snippets_for_what_it_resolved(cli: Cli) -> None:
    """After a ``fixed`` verification the runtime issues it resolved need no code of their own.

    Unverified, the example's runtime issues (caused by the two bugs the patch fixes) each
    get a snippet, labelled with the issues it is for.
    """
    plain = cli("check", "examples/buggy_train.py", "--steps", "12", "--format", "json")
    assert plain.returncode == 1, plain.stderr
    blocks = json.loads(plain.stdout)["code_to_add"]
    assert blocks and all(block["for_ids"] for block in blocks)
    verified = cli("check", "examples/buggy_train.py", "--steps", "12", "--verify")
    assert verified.returncode == 1, verified.stderr
    report = verified.stdout
    assert "✅ **fixed**" in report
    assert "Snippet `" not in report, report.split("### Code to Add", 1)[1]
