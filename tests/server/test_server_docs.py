"""The README's MCP sections are generated from the server and must match it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from server_helpers import REPO

from gradient_doctor.skill_server import docs


def test_readme_mcp_sections_match_the_server() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert docs.updated_readme(readme, docs.sections()) == readme, (
        "README is out of date: run `python -m skill_server.docs`"
    )


def test_reference_lists_every_tool_prompt_and_resource() -> None:
    reference = docs.reference_markdown()
    for name in ("match_symptoms", "lint_script", "probe_script", "diagnose", "get_fix", "explain"):
        assert f"`{name}`" in reference
    for prompt in ("/check-gradients", "/triage", "/review-training-loop"):
        assert prompt in reference
    assert "gradient-doctor://entry/{id}" in reference


def test_docs_check_flags_a_stale_readme(tmp_path: Path) -> None:
    stale = tmp_path / "README.md"
    stale.write_text(
        "x\n<!-- mcp-setup:start -->\nold\n<!-- mcp-setup:end -->\n"
        "<!-- mcp-reference:start -->\n<!-- mcp-reference:end -->\n"
        "<!-- cli-reference:start -->\n<!-- cli-reference:end -->\n"
        "<!-- catalogue:start -->\n<!-- catalogue:end -->\n"
    )
    check = [sys.executable, "-m", "gradient_doctor.skill_server.docs", "--readme", str(stale)]
    assert subprocess.run([*check, "--check"], cwd=REPO).returncode == 1
    assert subprocess.run(check, cwd=REPO).returncode == 0
    assert subprocess.run([*check, "--check"], cwd=REPO).returncode == 0
    assert "claude mcp add" in stale.read_text()


def test_cli_and_catalogue_sections_cover_every_command_and_entry() -> None:
    from gradient_doctor.knowledge import load_knowledge

    cli = docs.cli_markdown()
    for command in ("catalog", "check", "explain", "lint", "match", "probe", "serve"):
        assert f"`gradient-doctor {command}`" in cli
    catalogue = docs.catalogue_markdown()
    for entry_id in load_knowledge().entries:
        assert f"`{entry_id}`" in catalogue
