"""``gradient-doctor probe`` through the real command line (slow: each call runs a script)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import run_cli

from .conftest import fixture

pytestmark = pytest.mark.slow


def test_healthy_markdown_exit_0() -> None:
    done = run_cli("probe", str(fixture("healthy_mlp")), "--steps", "8")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert out.startswith("## Gradient probe:")
    assert "`stopped`" in out
    assert "`healthy`" in out
    assert "❌" not in out and "⚠️" not in out
    assert "| Threshold profile | default |" in out


def test_exploding_json_exit_1_and_contract() -> None:
    done = run_cli("probe", str(fixture("exploding")), "--steps", "6", "--format", "json")
    assert done.returncode == 1, done.stderr
    data = json.loads(done.stdout)
    assert data["status"] == "stopped" and data["steps"] == 6
    first = data["findings"][0]
    assert first["id"] == "exploding-gradients" and first["severity"] == "critical"
    assert first["evidence"]["profile"] == data["profile"] == "default"
    assert len(data["total_norm"]) == 6 and len(data["records"]) == 6
    assert {s["layer"] for s in data["layer_norms"]} == {str(i) for i in range(8)}


def test_exploding_markdown_names_the_fix() -> None:
    done = run_cli("probe", str(fixture("exploding")), "--steps", "4", "--fail-on", "never")
    assert done.returncode == 0
    assert "`exploding-gradients`" in done.stdout
    assert "clip_grad_norm_" in done.stdout  # the fix snippet's code


def test_profile_option_and_unknown_profile() -> None:
    done = run_cli(
        "probe",
        str(fixture("healthy_mlp")),
        "--steps",
        "3",
        "--profile",
        "gs",
        "--format",
        "json",
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["profile"] == "gs"
    bad = run_cli("probe", str(fixture("healthy_mlp")), "--profile", "nope")
    assert bad.returncode == 2
    assert "unknown threshold profile" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1


def test_script_args_after_double_dash() -> None:
    done = run_cli(
        "probe",
        str(fixture("args_and_cwd")),
        "--steps",
        "3",
        "--format",
        "json",
        "--",
        "--lr",
        "0.05",
    )
    assert done.returncode == 0, done.stdout[-2000:]
    data = json.loads(done.stdout)
    assert data["status"] == "ok" and data["args"] == ["--lr", "0.05"]


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["does_not_exist.py"], "no such script"),
        (["--steps", "0", "SCRIPT"], "steps must be at least 1"),
        (["--timeout", "-1", "SCRIPT"], "timeout must be a positive"),
        (["BINARY"], "binary file"),
        (["--device", "cuda", "SCRIPT"], "CUDA"),
    ],
)
def test_input_errors_exit_2_with_one_line(tmp_path: Path, args: list[str], fragment: str) -> None:
    binary = tmp_path / "model.pt"
    binary.write_bytes(b"\x00\x01\x02" * 100)
    replaced = [
        str(fixture("healthy_mlp")) if a == "SCRIPT" else str(binary) if a == "BINARY" else a
        for a in args
    ]
    done = run_cli("probe", *replaced)
    if fragment == "CUDA":
        import importlib.util

        if importlib.util.find_spec("torch") is not None:
            import torch

            if torch.cuda.is_available():
                pytest.skip("CUDA is available here")
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert fragment in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert done.stdout == ""


def test_script_error_is_a_status_with_exit_1() -> None:
    done = run_cli("probe", str(fixture("syntax_error")), "--format", "json")
    assert done.returncode == 1
    data = json.loads(done.stdout)
    assert data["status"] == "script-error"
    assert "SyntaxError" in data["message"]
    markdown = run_cli("probe", str(fixture("raises_midway")))
    assert markdown.returncode == 1
    assert "`script-error`" in markdown.stdout
    assert "shape mismatch in evaluation" in markdown.stdout
    assert "Traceback" not in markdown.stderr


# -- one rule for SCRIPT, its options and its working folder ---------------------------------------

HOSTILE = Path(__file__).resolve().parent.parent / "fixtures" / "isolation"


@pytest.mark.parametrize(
    "layout",
    [
        ["SCRIPT", "--steps", "2", "--format", "json", "--", "OUT", "--flag"],
        ["--steps", "2", "SCRIPT", "--format", "json", "--", "OUT", "--flag"],
        ["--steps", "2", "--format", "json", "SCRIPT", "--", "OUT", "--flag"],
    ],
)
def test_options_before_or_after_script_and_args_after_double_dash(
    tmp_path: Path, layout: list[str]
) -> None:
    seen = tmp_path / "seen.json"
    script = str(HOSTILE / "reports_cwd.py")
    words = [script if w == "SCRIPT" else str(seen) if w == "OUT" else w for w in layout]
    done = run_cli("probe", *words, cwd=tmp_path)
    assert done.returncode in (0, 1), done.stderr
    assert json.loads(done.stdout)["steps"] == 2
    ran = json.loads(seen.read_text())
    assert ran["argv"] == [str(seen), "--flag"]
    # The default working folder is the script's own, whatever the caller's is.
    assert ran["cwd"] == str(HOSTILE)


def test_cwd_option_moves_the_working_folder(tmp_path: Path) -> None:
    seen = tmp_path / "seen.json"
    done = run_cli(
        "probe", str(HOSTILE / "reports_cwd.py"), "--steps", "2", "--cwd", str(tmp_path),
        "--", str(seen),
    )  # fmt: skip
    assert done.returncode in (0, 1), done.stderr
    assert json.loads(seen.read_text())["cwd"] == str(tmp_path)


def test_a_stray_word_before_double_dash_is_a_usage_error() -> None:
    done = run_cli("probe", str(fixture("healthy_mlp")), "extra.py", "--steps", "2")
    assert done.returncode == 2
    assert "unrecognized arguments: extra.py" in done.stderr
    assert "go after `--`" in done.stderr


def test_help_states_the_rule() -> None:
    for command in ("probe", "check"):
        text = " ".join(run_cli(command, "--help").stdout.split())
        assert "Options may come before or after SCRIPT" in text
        assert "The script runs in its own folder" in text and "--cwd" in text
        assert "--python" in text and "--max-memory" in text


def test_the_script_starts_before_the_report_stack_is_imported() -> None:
    """Start-up order (issue 11, wall time): the CLI launches the script's supervisor with the
    standard library alone, and imports pydantic, the knowledge base and the diagnosis while
    the script's interpreter starts. Its report still comes out whole (the process ends
    without the interpreter's teardown, after flushing)."""
    code = (
        "import runpy, subprocess, sys\n"
        "original = subprocess.Popen.__init__\n"
        "def marked(self, *args, **kwargs):\n"
        "    heavy = ('pydantic', 'yaml', 'jinja2', 'anyio', 'gradient_doctor.knowledge')\n"
        "    loaded = sorted(m for m in sys.modules if m.startswith(heavy))\n"
        "    sys.stderr.write(f'LOADED AT LAUNCH: {loaded}\\n')\n"
        "    original(self, *args, **kwargs)\n"
        "subprocess.Popen.__init__ = marked\n"
        "runpy.run_module('gradient_doctor.skill_server', run_name='__main__')\n"
    )
    script = str(fixture("healthy_mlp"))
    words = ["probe", script, "--steps", "3", "--format", "json"]
    done = subprocess.run(
        [sys.executable, "-c", code, *words], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "LOADED AT LAUNCH: []" in done.stderr.splitlines()[0], done.stderr[-2000:]
    data = json.loads(done.stdout)
    assert data["status"] == "stopped" and data["steps"] == 3


def test_timeout_stops_the_script_and_its_children(tmp_path: Path) -> None:
    """The CLI watches the run without an event loop: its timeout still stops the script and
    every process it started, and the report says so."""
    pid_file = tmp_path / "pids"
    done = run_cli(
        "probe",
        str(fixture("writes_pid_then_hangs")),
        "--timeout",
        "6",
        "--format",
        "json",
        "--",
        str(pid_file),
    )
    assert done.returncode == 1, done.stderr[-2000:]
    data = json.loads(done.stdout)
    assert data["status"] == "timeout", data["message"]
    for pid in (int(p) for p in pid_file.read_text().split()):
        try:
            state = Path(f"/proc/{pid}/stat").read_text().split()[2]
        except OSError:
            continue  # gone
        assert state == "Z", f"process {pid} still runs"
