"""The plugin's files are generated from the server, the prompts and the knowledge base, and
say only what is true of them."""

from __future__ import annotations

import json
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
import yaml
from plugin_helpers import PLUGIN, REPO

from gradient_doctor.knowledge import load_knowledge
from gradient_doctor.skill_server import docs, plugin_files, prompts
from gradient_doctor.skill_server.server import SERVER_NAME, build_server

SKILL = PLUGIN / "skills" / plugin_files.SKILL_NAME


def _front_matter(path: Path) -> tuple[dict[str, object], str]:
    text = path.read_text(encoding="utf-8")
    match = re.match(r"---\n(.*?)\n---\n(.*)", text, flags=re.DOTALL)
    assert match, f"{path} has no front matter"
    return yaml.safe_load(match.group(1)), match.group(2)


def test_generated_files_are_current() -> None:
    stale = plugin_files.stale_files()
    assert not stale, f"stale: {stale}; run python -m gradient_doctor.skill_server.docs"
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert "<!-- plugin-install:start -->" in readme
    assert docs.updated_readme(readme, docs.readme_bodies(readme)) == readme
    assert plugin_files.check_claims() == []


def test_check_flags_an_edited_command_and_a_leftover_file(tmp_path: Path) -> None:
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    plugin_files.write_files(tmp_path)
    assert plugin_files.stale_files(tmp_path) == []
    command = tmp_path / "plugin" / "commands" / "check-gradients.md"
    command.write_text(command.read_text() + "\nJust lower the learning rate.\n")
    (tmp_path / "plugin" / "commands" / "old-command.md").write_text("---\n---\n")
    stale = plugin_files.stale_files(tmp_path)
    assert "plugin/commands/check-gradients.md" in stale
    assert any(s.startswith("plugin/commands/old-command.md") for s in stale)
    readme = tmp_path / "README.md"
    shutil.copy(REPO / "README.md", readme)
    check = [sys.executable, "-m", "gradient_doctor.skill_server.docs", "--readme", str(readme)]
    assert subprocess.run([*check, "--root", str(tmp_path), "--check"]).returncode == 1
    assert subprocess.run([*check, "--root", str(tmp_path)]).returncode == 0
    assert subprocess.run([*check, "--root", str(tmp_path), "--check"]).returncode == 0
    assert not (tmp_path / "plugin" / "commands" / "old-command.md").exists()


def test_manifests_carry_the_package_metadata() -> None:
    meta = plugin_files.project()
    manifest = json.loads((PLUGIN / ".claude-plugin" / "plugin.json").read_text())
    assert manifest["name"] == plugin_files.PLUGIN_NAME
    assert manifest["version"] == meta.version
    assert manifest["license"] == meta.license == "Apache-2.0"
    for key in ("description", "author", "repository", "keywords"):
        assert manifest[key], key
    marketplace = json.loads((REPO / ".claude-plugin" / "marketplace.json").read_text())
    (entry,) = marketplace["plugins"]
    assert entry["source"] == "./plugin" and entry["version"] == meta.version
    gemini = json.loads((PLUGIN / "gemini-extension.json").read_text())
    assert gemini["name"] == manifest["name"] and gemini["version"] == meta.version
    licence = (PLUGIN / "LICENSE").read_text()
    assert "Apache License" in licence and "Version 2.0, January 2004" in licence
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in licence


def test_icon_is_a_square_png_the_plugin_directory_accepts() -> None:
    data = (PLUGIN / plugin_files.ICON).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    assert width == height and 512 <= width <= 2048
    assert len(data) < 2 * 1024 * 1024


def test_package_links_point_at_the_source_folders() -> None:
    for part in ("pyproject.toml", "setup.py", "README.md", *plugin_files_parts()):
        link = PLUGIN / "package" / part
        assert link.is_symlink(), f"{link} should link to the repository's {part}"
        assert link.resolve() == (REPO / part).resolve()


def plugin_files_parts() -> tuple[str, ...]:
    return ("knowledge", "probes", "templates", "skill_server")


def test_mcp_json_starts_the_launcher_rooted_at_the_project() -> None:
    config = json.loads((PLUGIN / ".mcp.json").read_text())["mcpServers"]
    assert list(config) == [SERVER_NAME]
    server = config[SERVER_NAME]
    assert server["command"] == "sh"
    assert server["args"] == [
        "${CLAUDE_PLUGIN_ROOT}/bin/gradient-doctor-mcp",
        "--project",
        "${CLAUDE_PROJECT_DIR}",
    ]
    for shim in ("gradient-doctor", "gradient-doctor-mcp"):
        path = PLUGIN / "bin" / shim
        assert path.stat().st_mode & 0o111, f"{shim} must be executable"


def _listing() -> tuple[set[str], dict[str, str]]:
    async def read() -> tuple[set[str], dict[str, str]]:
        server = build_server()
        tools = {t.name for t in await server.list_tools()}
        prompt_list = {p.name: p.description or "" for p in await server.list_prompts()}
        return tools, prompt_list

    return anyio.run(read)


def test_commands_mirror_the_mcp_prompts_and_name_real_tools() -> None:
    tools, server_prompts = _listing()
    commands = sorted(p.stem for p in (PLUGIN / "commands").glob("*.md"))
    assert (
        commands == sorted(server_prompts) == ["check-gradients", "review-training-loop", "triage"]
    )
    pattern = re.compile(r"^mcp__plugin_gradient-doctor_gradient-doctor__([a-z_]+)$")
    for name in commands:
        front, body = _front_matter(PLUGIN / "commands" / f"{name}.md")
        assert front["description"] == server_prompts[name]
        assert front["argument-hint"]
        allowed = front["allowed-tools"]
        assert isinstance(allowed, list)
        mcp_tools = [t for t in allowed if t.startswith("mcp__")]
        assert mcp_tools, name
        allowed_names = set()
        for tool in mcp_tools:
            match = pattern.match(tool)
            assert match and match.group(1) in tools, f"{name}: {tool} is not a server tool"
            allowed_names.add(match.group(1))
        mentioned = {tool for tool in tools if f"`{tool}`" in body}
        assert allowed_names == mentioned, f"{name}: allowed {allowed_names}, calls {mentioned}"
        assert "Bash(gradient-doctor:*)" in allowed
        assert "$ARGUMENTS" in body and "## Without the MCP tools" in body
        for claim in prompts.GUARDED_CLAIMS:
            entry = load_knowledge().entries[claim]
            assert entry.claim in body, f"{name} does not refuse {claim!r}"


def test_command_steps_are_the_mcp_prompt_steps() -> None:
    _, body = _front_matter(PLUGIN / "commands" / "check-gradients.md")
    mcp_text = prompts.check_gradients_text("train.py", "loss spikes")
    shared = [line for line in mcp_text.splitlines() if line.startswith(("2. ", "3. ", "4. "))]
    assert len(shared) == 3
    for line in shared:
        assert line in body
    toml = (PLUGIN / "commands" / "check-gradients.toml").read_text()
    import tomllib

    gemini = tomllib.loads(toml)
    assert gemini["description"] == prompts.DESCRIPTIONS["check-gradients"]
    assert gemini["prompt"].strip() == body.replace("$ARGUMENTS", "{{args}}").strip()


def test_gemini_commands_parse_and_take_the_arguments() -> None:
    import tomllib

    for path in sorted((PLUGIN / "commands").glob("*.toml")):
        data = tomllib.loads(path.read_text(encoding="utf-8"))
        assert set(data) == {"description", "prompt"}
        assert "{{args}}" in data["prompt"] and "$ARGUMENTS" not in data["prompt"]
        assert "!{" not in data["prompt"] and "@{" not in data["prompt"]  # no shell/file injection


def test_skill_says_when_to_use_it_the_workflow_and_what_not_to_say() -> None:
    front, body = _front_matter(SKILL / "SKILL.md")
    assert front["name"] == SKILL.name == plugin_files.SKILL_NAME
    description = str(front["description"])
    assert len(description) <= 1024
    for term in ("NaN", "clipping", "accumulation", "AMP", "DDP", "unstable"):
        assert term in description, term
    positions = [body.index(f"**{step}.**") for step in ("Diagnose", "Fix", "Explain", "Verify")]
    assert positions == sorted(positions)
    kb = load_knowledge()
    for entry in kb.by_kind("rationalization"):
        assert entry.claim in body, f"the skill does not refuse {entry.id}"
    for entry in kb.by_kind("symptom"):
        assert entry.title in body or entry.title.lower() in body
    assert "## Without MCP: the command line" in body
    for line in plugin_files.CLI_FOR_TOOL.values():
        assert line in body
    tools, _ = _listing()
    for tool in tools:
        assert f"| `{tool}` |" in body, f"the skill's tool table misses {tool}"


def test_verify_step_names_only_what_exists() -> None:
    verify = plugin_files.verify_step()
    tools, _ = _listing()
    has_verify_cli = plugin_files.cli_has_option("check", "--verify")
    assert (verify.cli is not None) == has_verify_cli
    if "verify_fix" not in tools:
        assert "verify_fix" not in verify.mcp
    body = (SKILL / "SKILL.md").read_text()
    if not has_verify_cli:
        assert "--verify" not in body


def test_reference_pages_cover_every_entry() -> None:
    kb = load_knowledge()
    pages = {p.name: p.read_text(encoding="utf-8") for p in (SKILL / "references").glob("*.md")}
    assert set(pages) == set(plugin_files.REFERENCES)
    for kind, page in (
        ("red-flag", "red-flags.md"),
        ("signal", "runtime-signals.md"),
        ("rationalization", "rationalizations.md"),
        ("symptom", "symptoms.md"),
    ):
        for entry in kb.by_kind(kind):
            assert entry.id in pages[page] or entry.title in pages[page], (page, entry.id)
    for entry_id in kb.entries:
        assert f"`{entry_id}`" in pages["catalog.md"]
    for topic in kb.guides:
        assert kb.guides[topic].title in pages["guides.md"]
    skill = (SKILL / "SKILL.md").read_text()
    for name in pages:
        assert f"(references/{name})" in skill


def test_cli_fallback_lines_parse_with_the_real_cli() -> None:
    for line in plugin_files.CLI_FOR_TOOL.values():
        assert plugin_files.cli_line_parses(line), line
    assert not plugin_files.cli_line_parses("gradient-doctor check SCRIPT --no-such-flag")
    tools, _ = _listing()
    unmapped = tools - set(plugin_files.CLI_FOR_TOOL) - set(plugin_files.CLI_INSTEAD)
    assert not unmapped, f"tools without a CLI fallback line: {sorted(unmapped)}"


def test_server_json_follows_the_registry_rules() -> None:
    meta = plugin_files.project()
    data = json.loads((REPO / "server.json").read_text())
    assert data["$schema"].startswith("https://static.modelcontextprotocol.io/schemas/")
    assert re.fullmatch(r"[a-zA-Z0-9.-]+/[a-zA-Z0-9._-]+", data["name"])
    assert data["name"].startswith("io.github.")
    assert 1 <= len(data["description"]) <= 100
    assert data["version"] == meta.version
    (package,) = data["packages"]
    assert package["registryType"] == "pypi" and package["identifier"] == meta.name
    assert package["version"] == meta.version and package["version"] != "latest"
    assert package["transport"] == {"type": "stdio"}
    assert package["registryBaseUrl"] == "https://pypi.org"
    assert package["packageArguments"] == [{"type": "positional", "value": "serve"}]
    # PyPI ownership: the registry reads `mcp-name: NAME` from the package's README.
    assert f"mcp-name: {data['name']}" in (REPO / "README.md").read_text()


@pytest.mark.parametrize(
    ("tool", "expected"),
    [("diagnose", "mcp__plugin_gradient-doctor_gradient-doctor__diagnose")],
)
def test_claude_tool_names_follow_claude_codes_rule(tool: str, expected: str) -> None:
    assert plugin_files.claude_tool_name(tool) == expected
    assert (
        plugin_files.claude_tool_name("x", server="a.b c") == "mcp__plugin_gradient-doctor_a_b_c__x"
    )


def test_every_slash_commands_cli_fallback_parses_and_check_gradients_can_verify() -> None:
    for command in ("check-gradients", "triage", "review-training-loop"):
        section = plugin_files.cli_section(command)
        lines = [line.strip() for line in section.splitlines() if line.startswith("    ")]
        assert lines, command
        for line in lines:
            assert plugin_files.cli_line_parses(line), (command, line)
    fallback = plugin_files.cli_section("check-gradients")
    assert "gradient-doctor check SCRIPT --verify" in fallback
    assert "after `--`" in fallback
    # The MCP steps the assistant follows: arguments for scripts that need them, and every
    # status in which the probe measured nothing.
    steps = prompts.check_gradients_steps("train.py", "")
    assert "pass them as args" in steps
    for status in ("script-error", "timeout", "no-training-loop", "out-of-memory"):
        assert status in steps
