"""The CLI's reports read by a user on more than one toy file: a folder of many scripts for
``lint``, and the commands that name ids a user then looks up."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_cli

# A plain loop: only the info finding `no-grad-monitoring`.
PLAIN_LOOP = """\
import torch

model = torch.nn.Linear(2, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in data:
    opt.zero_grad()
    loss = ((model(x) - y) ** 2).mean()
    loss.backward()
    opt.step()
"""

# The same loop clipping after the step: the critical `clip-after-step`.
CLIP_AFTER_STEP = """\
import torch

net = torch.nn.Linear(2, 1)
sgd = torch.optim.SGD(net.parameters(), lr=0.1)
for x, y in data:
    sgd.zero_grad()
    loss = ((net(x) - y) ** 2).mean()
    loss.backward()
    sgd.step()
    torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
"""

PLAIN_FILES = 12


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder where info findings outnumber the one critical file, which sorts last by name."""
    root = tmp_path_factory.mktemp("project")
    for index in range(PLAIN_FILES):
        (root / f"a_plain_{index:02}.py").write_text(PLAIN_LOOP)
    (root / "z_train.py").write_text(CLIP_AFTER_STEP)
    return root


def test_markdown_on_a_folder_leads_with_the_critical_file(project: Path) -> None:
    done = run_cli("lint", ".", "--format", "markdown", cwd=project)
    assert done.returncode == 1, done.stderr
    text = done.stdout
    headline = text.splitlines()[2]
    assert headline.startswith(f"Found {PLAIN_FILES + 2} findings (1 critical, ")
    assert "--format" not in headline  # that advice is for the text output, not this report
    # The rule table: most severe first, with how many files each rule is in.
    assert "| critical | `clip-after-step` | 1 | 1 |" in text
    assert f"| info | `no-grad-monitoring` | {PLAIN_FILES + 1} | {PLAIN_FILES + 1} |" in text
    assert text.index("`clip-after-step` | 1") < text.index("`no-grad-monitoring` |")
    # The critical file comes first, in full; the info-only files last, one line each.
    critical_file = text.index("## `z_train.py`")
    info_section = text.index("## Files with only info findings")
    assert critical_file < info_section
    assert text.index("### CRITICAL `clip-after-step` at line 10") < info_section
    info_lines = [line for line in text[info_section:].splitlines() if line.startswith("- ")]
    assert len(info_lines) == PLAIN_FILES
    assert info_lines[0].startswith(
        "- INFO `no-grad-monitoring` at `a_plain_00.py` line 8, column 5: "
    )
    assert "Evidence:" not in text[info_section:]


def test_min_severity_leaves_info_out_of_every_format(project: Path) -> None:
    full = run_cli("lint", ".", cwd=project)
    assert f"{PLAIN_FILES + 1} of {PLAIN_FILES + 2} findings are info" in full.stderr
    assert "--min-severity warning" in full.stderr

    quiet = run_cli("lint", ".", "--min-severity", "warning", cwd=project)
    assert quiet.returncode == 1
    assert "no-grad-monitoring" not in quiet.stdout
    assert quiet.stdout.startswith("z_train.py:10:5: clip-after-step [critical] ")
    assert "note:" not in quiet.stderr

    as_json = run_cli("lint", ".", "--min-severity", "critical", "--format", "json", cwd=project)
    ids = {f["id"] for file in json.loads(as_json.stdout)["files"] for f in file["findings"]}
    assert ids == {"clip-after-step"}

    # --fail-on judges what is reported: info findings left out cannot fail the run.
    plain_only = run_cli(
        "lint", "a_plain_00.py", "--min-severity", "warning", "--fail-on", "info", cwd=project
    )
    assert plain_only.returncode == 0, plain_only.stdout
    assert plain_only.stdout.startswith("No findings")
    assert run_cli("lint", "a_plain_00.py", "--fail-on", "info", cwd=project).returncode == 1


def test_check_does_not_call_a_crashed_probe_a_clean_bill(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        'import torch\n\nmodel = torch.nn.Linear(2, 1)\nraise SystemExit("no data at ./data")\n'
    )
    done = run_cli("check", str(script), "--steps", "2", cwd=tmp_path)
    report = done.stdout
    assert "runtime probe ✗ script-error, no optimizer step measured" in report, report
    assert "✓ script-error" not in report
    assert "not a clean bill of health" in report
    assert "the gradients were not measured" in report
    # nor tells the user there is nothing to fix
    assert "Nothing to fix" not in report
    assert "ended with `script-error`" in report

    # A run that stops part-way measured some steps, and says so.
    crash = Path(__file__).parent / "fixtures" / "crash_train.py"
    partial = run_cli("check", str(crash), "--steps", "5", cwd=tmp_path).stdout
    assert "runtime probe ✗ script-error, 2 optimizer steps measured" in partial, partial


def test_the_snippet_ids_that_reports_name_can_be_looked_up() -> None:
    # `match` and `explain` name fix snippets by id: the catalogue lists them and `explain`
    # prints their code, with the user's names.
    catalog = run_cli("catalog").stdout
    assert "## Fix snippets" in catalog
    assert "| `accumulation` | Gradient accumulation" in catalog
    entry = run_cli("explain", "accum-unscaled-loss").stdout
    assert "Fix snippets: `accumulation`" in entry and "gradient-doctor explain SNIPPET" in entry

    done = run_cli(
        "explain", "accumulation", "--name", "model=net", "--name", "accumulation_steps=K"
    )
    assert done.returncode == 0, done.stderr
    assert "`accumulation` · fix snippet" in done.stdout
    assert "loss = criterion(net(inputs), targets)" in done.stdout
    assert "(loss / K).backward()" in done.stdout

    as_json = json.loads(run_cli("explain", "clip-norm", "--format", "json").stdout)
    assert as_json["snippet_id"] == "clip-norm" and "clip_grad_norm_" in as_json["code"]

    for args, reason in [
        (("clip-norm", "--name", "modle=net"), "unknown parameter(s) modle"),
        (("clip-norm", "--name", "model"), "write KEY=VALUE"),
        (("clip-norm", "--name", "model=os.system(1)"), "is not a Python identifier"),
        (("clip-after-step", "--name", "model=net"), "'clip-after-step' is not a fix snippet"),
        (("nan-check-ordr",), "closest: nan-check-order"),
    ]:
        bad = run_cli("explain", *args)
        assert bad.returncode == 2 and bad.stdout == "", args
        assert len(bad.stderr.splitlines()) == 1 and reason in bad.stderr, bad.stderr


def test_probe_keeps_the_reason_a_script_exited_with(tmp_path: Path) -> None:
    """argparse exits with code 2 and prints why on stderr: the report must carry that line."""
    script = tmp_path / "train.py"
    script.write_text(
        "import argparse\n\nimport torch\n\n"
        "parser = argparse.ArgumentParser()\n"
        'parser.add_argument("--data", required=True)\n'
        "args = parser.parse_args()\n"
        "model = torch.nn.Linear(2, 1)\n"
    )
    done = run_cli("probe", str(script), "--steps", "2", "--format", "json", cwd=tmp_path)
    result = json.loads(done.stdout)
    assert result["status"] == "script-error", result
    assert "the following arguments are required: --data" in result["message"], result
    assert "--data" in (result["traceback_tail"] or "")
