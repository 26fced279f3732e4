"""``gradient-doctor check --verify`` through the real command line (slow: real runs)."""

from __future__ import annotations

import json
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from subprocess import CompletedProcess
from typing import Any

import pytest
import torch
from verify_helpers import (
    BROKEN_PATCH_CLI,
    EXAMPLES,
    REPO,
    RUNTIME_FIXTURES,
    STEPS,
    VERIFY_FIXTURES,
    folder_state,
    run_gd,
    verification_of,
)

from gradient_doctor.probes.static import lint_source

pytestmark = pytest.mark.slow

#: Fixtures that put their model on a CUDA device (tests/runtime/test_cuda_path.py).
NEEDS_CUDA = frozenset({"cuda_amp_transformer.py"})


def patchable_fixtures() -> list[Path]:
    """Every runtime fixture the analyser offers a patch for (decided by the analyser itself,
    so a rule that starts patching another fixture brings it into this test)."""
    found = []
    for path in sorted(RUNTIME_FIXTURES.glob("*.py")):
        if path.name.startswith("_"):
            continue
        if path.name in NEEDS_CUDA and not torch.cuda.is_available():
            continue  # the script itself fails without a GPU: nothing to compare
        if lint_source(path.read_text(encoding="utf-8"), path.name).combined_diff:
            found.append(path)
    return found


@pytest.fixture(scope="module")
def fixture_runs() -> dict[str, Any]:
    """``check --verify`` on every patchable fixture, two at a time, and the fixture folder's
    files before and after."""
    scripts = patchable_fixtures()
    before = folder_state(RUNTIME_FIXTURES)

    def one(path: Path) -> CompletedProcess[str]:
        return run_gd("check", str(path), "--verify", "--steps", STEPS, "--format", "json")

    with ThreadPoolExecutor(max_workers=2) as pool:
        results = dict(zip([p.name for p in scripts], pool.map(one, scripts), strict=True))
    return {"results": results, "before": before, "after": folder_state(RUNTIME_FIXTURES)}


def test_the_fixtures_with_a_patch_are_the_known_ones(fixture_runs: dict[str, Any]) -> None:
    # The bugs the analyser patches today; more may join (then they must be fixed too).
    assert {
        "clip_after_step.py",
        "accum_unscaled_loss.py",
        "amp_clip_without_unscale.py",
        "accum_missing_zero.py",
        "ddp_single_accum.py",
    } <= set(fixture_runs["results"])


def test_every_patchable_fixture_is_fixed(fixture_runs: dict[str, Any]) -> None:
    statuses = {}
    for name, result in fixture_runs["results"].items():
        verification = verification_of(result)
        statuses[name] = (verification["status"], verification["verdict"])
        assert verification["patch"], name
        assert verification["targets"], name
        assert not set(verification["targets"]) & set(verification["remaining"]), name
        assert verification["before"]["seeding"]["seed"] == 0, name
        assert verification["deterministic"] is True, (name, verification["notes"])
    assert all(status == "fixed" for status, _ in statuses.values()), json.dumps(statuses, indent=1)


def test_the_users_files_are_left_byte_identical(fixture_runs: dict[str, Any]) -> None:
    # No byte changed and nothing was placed next to them (the copy lives in a temp folder).
    assert fixture_runs["after"] == fixture_runs["before"]


def test_the_example_report_shows_the_verification(tmp_path: Path) -> None:
    script = EXAMPLES / "buggy_train.py"
    before = script.read_bytes()
    plots = tmp_path / "plots"
    result = run_gd("check", str(script), "--verify", "--steps", STEPS, "--plots", str(plots))
    assert result.returncode == 1, result.stderr  # the original still has its bugs
    report = result.stdout
    assert "### Verification" in report
    verdict = next(line for line in report.splitlines() if line.startswith("✅ **fixed**"))
    assert "`accum-unscaled-loss`" in verdict and "`clip-after-step`" in verdict
    assert "| | Before | After (patched copy) |" in report
    assert "Verified: a patched copy was run and the result is **fixed**" in report
    assert report.index("### Verification") < report.index("### Code to Add")
    assert (plots / "verification.png").read_bytes().startswith(b"\x89PNG")
    assert "verification.png" in result.stderr
    assert script.read_bytes() == before


def test_json_follows_the_contract() -> None:
    result = run_gd(
        "check", "examples/buggy_train.py", "--verify", "--steps", STEPS, "--format", "json"
    )
    verification = verification_of(result)
    assert {"status", "patch", "resolved", "remaining", "new", "before", "after"} <= set(
        verification
    )
    assert verification["status"] == "fixed"
    data = json.loads(result.stdout)
    assert verification["patch"] == data["combined_diff"]
    assert {"accum-unscaled-loss", "clip-after-step"} <= set(verification["resolved"])
    before, after = verification["before"], verification["after"]
    assert before["status"] == after["status"] == "stopped"
    assert len(before["loss"]) == len(after["loss"]) == int(STEPS)
    assert len(before["total_norm"]) == int(STEPS)
    # The script seeds itself with a constant: recorded, and both runs still start alike.
    calls = before["seeding"]["reseeds"]
    assert calls and calls[0]["function"] == "torch.manual_seed" and calls[0]["seed"] == "0"
    assert verification["deterministic"] is True
    # The diagnosis' own probe run is the original's run (no third run).
    assert data["probe_steps"] == before["steps"]


def test_a_healthy_script_has_no_patch() -> None:
    result = run_gd(
        "check", "examples/healthy_train.py", "--verify", "--steps", STEPS, "--format", "json"
    )
    verification = verification_of(result)
    assert verification["status"] == "no-patch"
    assert verification["after"] is None and verification["patch"] is None
    assert verification["before"]["status"] in ("ok", "stopped")


@pytest.mark.parametrize("kind", ["runtime", "syntax", "stale"])
def test_an_injected_broken_patch_is_broken_and_unsafe(kind: str, tmp_path: Path) -> None:
    script = tmp_path / "buggy_train.py"
    shutil.copy(EXAMPLES / "buggy_train.py", script)
    before = folder_state(tmp_path)
    common = ["check", str(script), "--verify", "--steps", STEPS]
    wrapper = [str(BROKEN_PATCH_CLI), kind]
    as_json = run_gd(*common, "--format", "json", wrapper=wrapper)
    verification = verification_of(as_json)
    assert verification["status"] == "broken", verification["verdict"]
    assert verification["unsafe"] is True
    assert "Do not apply this patch" in verification["verdict"]
    if kind == "runtime":
        # The traceback tail shows the patched line, under the script's own name.
        tail = verification["after"]["traceback_tail"]
        assert f'File "{script}", line' in tail and "optimizer.step_now()" in tail
        assert "AttributeError" in tail
        markdown = run_gd(*common, wrapper=wrapper)
        assert markdown.returncode == 1
        assert "❌ **broken**" in markdown.stdout
        assert "The patched copy stopped with:" in markdown.stdout
        # The report's patch section marks the patch unsafe.
        code_to_add = markdown.stdout.split("### Code to Add", 1)[1]
        assert code_to_add.lstrip().startswith("⚠️ **Unsafe patch: do not apply it as it is.**")
    assert folder_state(tmp_path) == before
    if kind == "syntax":
        assert "does not parse" in verification["verdict"]
        assert verification["after"]["status"] is None
    if kind == "stale":
        assert "does not match" in verification["verdict"]


def _project(tmp_path: Path) -> Path:
    project = tmp_path / "project"
    shutil.copytree(VERIFY_FIXTURES / "project", project)
    return project


def test_the_copy_imports_its_neighbours_and_reads_its_data_like_the_original(
    tmp_path: Path,
) -> None:
    project = _project(tmp_path)
    before = folder_state(project)
    result = run_gd(
        "check",
        str(project / "train.py"),
        "--verify",
        "--steps",
        STEPS,
        "--format",
        "json",
        "--",
        "--lr",
        "0.05",
        cwd=tmp_path,
    )
    verification = verification_of(result)
    # The script asserts argv[0] == __file__, imports helpers.py, reads data/ via __file__ and
    # settings.txt from its working folder: a copy run anywhere else would be "broken".
    assert verification["after"]["status"] == "stopped", verification["after"]["traceback_tail"]
    assert verification["status"] == "fixed", verification["verdict"]
    assert folder_state(project) == before


def test_cwd_applies_to_both_runs(tmp_path: Path) -> None:
    project = _project(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (project / "settings.txt").rename(elsewhere / "settings.txt")
    common = ["check", str(project / "train.py"), "--verify", "--steps", STEPS]
    moved = run_gd(*common, "--cwd", str(elsewhere), "--format", "json", "--", "--lr", "0.05")
    assert verification_of(moved)["status"] == "fixed"
    # Without --cwd the script's own folder has no settings.txt: both runs fail alike.
    missing = verification_of(run_gd(*common, "--format", "json", "--", "--lr", "0.05"))
    assert missing["before"]["status"] == missing["after"]["status"] == "script-error"
    assert missing["status"] == "unchanged"
    assert "FileNotFoundError" in missing["after"]["message"]


def test_a_clock_seeded_script_is_reported_as_not_deterministic() -> None:
    result = run_gd(
        "check",
        str(VERIFY_FIXTURES / "clock_seeded.py"),
        "--verify",
        "--steps",
        STEPS,
        "--format",
        "json",
    )
    verification = verification_of(result)
    assert verification["deterministic"] is False
    assert "not deterministic" in verification["verdict"]
    assert verification["status"] == "fixed"
    call = verification["before"]["seeding"]["reseeds"][0]
    assert call["function"] == "torch.manual_seed" and call["where"].endswith("clock_seeded.py:9")


@pytest.mark.parametrize("flag", [[], ["--use-optimizer"]])
def test_a_patch_must_keep_the_clip_on_the_path_that_runs(flag: list[str]) -> None:
    # The analyser withholds the patch that would move the clip into one branch only; injected
    # anyway (as an older analyser offered it), the verdict follows what ran: the clip still
    # running before the update is fixed; no clip left at all is worse and unsafe.
    script = VERIFY_FIXTURES / "branch_update.py"
    before_bytes = script.read_bytes()
    lint = json.loads(run_gd("lint", str(script), "--format", "json").stdout)
    (clip,) = [f for f in lint["files"][0]["findings"] if f["id"] == "clip-after-step"]
    assert clip["fix"] is None and "one path only" in clip["evidence"]["fix_withheld"]
    common = ["check", str(script), "--verify", "--steps", STEPS]
    wrapper = [str(BROKEN_PATCH_CLI), "one-branch"]
    result = run_gd(*common, "--format", "json", "--", *flag, wrapper=wrapper)
    verification = verification_of(result)
    assert verification["targets"] == ["clip-after-step"], verification["verdict"]
    assert verification["before"]["operations"]["clip"] >= int(STEPS) - 1
    if verification["after"]["operations"].get("clip"):
        assert verification["status"] == "fixed", verification["verdict"]
        assert not verification["unsafe"]
    else:
        assert verification["status"] == "worse", verification["verdict"]
        assert verification["unsafe"] is True
        assert "never runs gradient clipping" in verification["verdict"]
        markdown = run_gd(*common, "--", *flag, wrapper=wrapper)
        assert markdown.returncode == 1
        code_to_add = markdown.stdout.split("### Code to Add", 1)[1]
        assert code_to_add.lstrip().startswith("⚠️ **Unsafe patch: do not apply it as it is.**")
    assert script.read_bytes() == before_bytes


def test_verify_ids_chooses_the_patches() -> None:
    result = run_gd(
        "check",
        "examples/buggy_train.py",
        "--verify-ids",
        "clip-after-step",
        "--steps",
        STEPS,
        "--format",
        "json",
    )
    verification = verification_of(result)
    assert verification["targets"] == ["clip-after-step"]
    assert "(loss / ACCUM_STEPS)" not in verification["patch"]
    assert "clip-after-step" in verification["resolved"]
    assert "accum-unscaled-loss" in verification["remaining"]
    assert verification["status"] == "fixed"
    assert "`accum-unscaled-loss`" in verification["verdict"]  # named as still there


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        (["--verify-ids", "value-clipping"], "no patch for value-clipping"),
        (["--verify", "--no-probe"], "--no-probe"),
        (["--verify-ids", " , "], "at least one finding id"),
    ],
)
def test_verify_usage_errors_are_one_line(extra: list[str], fragment: str) -> None:
    result = run_gd("check", "examples/buggy_train.py", *extra, "--steps", "2")
    assert result.returncode == 2
    assert fragment in result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_the_readme_main_job_shows_the_verification() -> None:
    # README: `bash scripts/demo.sh` is the main job; it sets up .venv if needed (already there
    # when the tests run from it) and checks the bundled example with --verify.
    if not (REPO / ".venv" / "bin" / "gradient-doctor").exists():
        pytest.skip("needs the repository's .venv (scripts/bootstrap.sh)")
    result = subprocess.run(
        ["bash", "scripts/demo.sh", "--steps", STEPS],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "### Verification" in result.stdout
    assert "✅ **fixed**" in result.stdout
