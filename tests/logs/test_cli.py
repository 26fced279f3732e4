"""``gradient-doctor logs`` as a user runs it: a subprocess, its output, its exit status."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from logs_paths import FIXTURES

from gradient_doctor.skill_server.cli import main

EXE = [sys.executable, "-m", "gradient_doctor.skill_server", "logs"]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    return subprocess.run(
        [*EXE, *args], capture_output=True, text=True, timeout=120, env=env, check=False
    )


def test_markdown_report_of_a_nan_run_with_plots(tmp_path: Path) -> None:
    result = _run(str(FIXTURES / "accelerate_nan.log"), "--plots", str(tmp_path))
    assert result.returncode == 1, result.stderr  # a critical finding
    out = result.stdout
    assert "## Training log:" in out and "`console`" in out
    assert "| First non-finite value | step 120 (loss)" in out
    assert "`nan-loss-before-backward` (step 120)" in out
    assert "### What the log allowed" in out
    # What a check lacked is said in words, not as the step series' field names.
    lacked = [line for line in out.splitlines() if line.startswith("- Not checked")]
    assert lacked and all("the log lacks" in line for line in lacked), lacked
    assert not any("grad_norm_before_clip" in line or "layer_grad_norms" in line for line in lacked)
    pictures = list(tmp_path.glob("*.png"))
    assert len(pictures) == 1 and pictures[0].read_bytes()[:4] == b"\x89PNG"
    assert "plots:" in result.stderr and "Traceback" not in result.stderr


def test_json_report_of_two_logs_and_a_healthy_exit(tmp_path: Path) -> None:
    result = _run(
        str(FIXTURES / "table_healthy.csv"),
        str(FIXTURES / "hf_healthy_trainer_state.json"),
        "--format",
        "json",
    )
    assert result.returncode == 0, result.stderr
    reports = json.loads(result.stdout)
    assert [r["format"] for r in reports] == ["csv", "hf-trainer-state"]
    assert reports[0]["steps_read"] == 160
    assert reports[0]["series"]["step"][:3] == [1, 2, 3]
    assert {f["id"] for f in reports[0]["findings"]} == {"healthy"}


def test_max_norm_turns_on_the_clipping_checks() -> None:
    result = _run(str(FIXTURES / "hf_healthy.log"), "--max-norm", "0.05", "--format", "json")
    report = json.loads(result.stdout)
    assert "clipped" in report["series_found"]
    assert report["summary"]["clipped_fraction"] > 0.9
    assert "clip-too-aggressive" in {f["id"] for f in report["findings"]}
    assert result.returncode == 0  # a warning is below the default --fail-on critical
    assert _run(str(FIXTURES / "hf_healthy.log"), "--max-norm", "-1").returncode == 2


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "no such file or folder"),
        (b"", "the file is empty"),
        (bytes(range(256)) * 8, "a binary file, not a training log"),
        (b"hello\nworld\n", "not a training log this reader recognises; it expects one of"),
    ],
)
def test_unreadable_inputs_get_one_line(
    tmp_path: Path, content: bytes | None, message: str
) -> None:
    path = tmp_path / "train.log"
    if content is not None:
        path.write_bytes(content)
    result = _run(str(path))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""


def test_a_bad_log_among_good_ones_is_named_and_the_rest_reported(tmp_path: Path) -> None:
    empty = tmp_path / "empty.log"
    empty.write_text("")
    result = _run(str(FIXTURES / "nanogpt_healthy.log"), str(empty))
    assert result.returncode == 2
    assert "empty.log: the file is empty" in result.stderr
    assert "nanogpt" in result.stdout


def test_a_missing_tensorboard_package_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # import fails as if not installed
    monkeypatch.setitem(sys.modules, "tensorboard.backend.event_processing", None)
    assert main(["logs", str(FIXTURES / "tb_healthy")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "pip install 'gradient-doctor[tensorboard]'" in err[0]


def test_gzip_logs_and_a_forced_format(tmp_path: Path) -> None:
    import gzip

    packed = tmp_path / "train.log.gz"
    packed.write_bytes(gzip.compress((FIXTURES / "nanogpt_nan.log").read_bytes()))
    result = _run(str(packed), "--format", "json", "--log-format", "console")
    report = json.loads(result.stdout)
    assert report["format"] == "console"
    assert report["counts"]["first_nonfinite_step"] == 120


@pytest.mark.parametrize(
    ("lines", "shown", "unseen"),
    [
        (  # the norm is logged and still finite when the loss turns NaN
            [
                "step 1 loss 2.3 grad_norm 1.1",
                "step 2 loss 2.1 grad_norm 1.0",
                "step 3 loss nan grad_norm 1.05",
                "step 4 loss nan grad_norm nan",
            ],
            "gradient norm logged at that step is still finite (1.05)",
            "does not show the batch (inputs) or the weights",
        ),
        (  # only the loss is logged
            ["step 1 loss 2.3", "step 2 loss 2.1", "step 3 loss nan"],
            "the first non-finite value in the log.",
            "does not show the gradient norm, the batch (inputs) or the weights",
        ),
        (  # both turn NaN on the same line: no order can be read
            [
                "step 1 loss 2.3 grad_norm 1.1",
                "step 2 loss 2.1 grad_norm 1.0",
                "step 3 loss nan grad_norm nan",
            ],
            "both turn non-finite at step 3, so the log cannot tell which came first",
            "does not show the batch (inputs) or the weights",
        ),
    ],
)
def test_a_nan_loss_in_a_log_claims_only_what_the_log_shows(
    tmp_path: Path, lines: list[str], shown: str, unseen: str
) -> None:
    log = tmp_path / "train.log"
    log.write_text("\n".join(lines) + "\n")
    result = _run(str(log))
    assert result.returncode == 1, result.stderr
    finding = next(
        line for line in result.stdout.splitlines() if line.strip().startswith("The logged loss")
    )
    assert shown in finding and unseen in finding
    # The probe's own conclusion needs what a log cannot show.
    assert "not the gradients" not in result.stdout
    assert "given to backward()" not in finding
