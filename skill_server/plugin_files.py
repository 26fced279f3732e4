"""The plugin, skill, extension and registry files, generated so that they cannot drift.

Everything here is computed from the package metadata (``pyproject.toml``), the MCP server's
own listing (``build_server()``: tools, prompts), the prompts' workflows
(``skill_server.prompts``), the real CLI parser and the knowledge base. ``python -m
gradient_doctor.skill_server.docs`` writes these files and ``--check`` fails when one differs.

What is made (paths relative to the repository):

- ``.claude-plugin/marketplace.json``: the repository as a Claude Code marketplace;
- ``plugin/.claude-plugin/plugin.json``, ``plugin/.mcp.json``: the Claude Code plugin;
- ``plugin/commands/*.md`` (Claude Code) and ``plugin/commands/*.toml`` (Gemini CLI): the
  slash commands, from the same text as the MCP prompts;
- ``plugin/skills/gradient-doctor/SKILL.md`` and ``references/*.md``: the Agent Skill, read
  by Claude Code, Codex CLI, Cursor and Gemini CLI;
- ``plugin/gemini-extension.json``: the plugin folder as a Gemini CLI extension;
- ``plugin/README.md``; ``server.json`` for the MCP Registry.

Hand-written and only checked: ``plugin/bin/*`` and ``plugin/scripts/launcher.py`` (the
launcher), ``plugin/LICENSE``, ``plugin/assets/icon.png`` and the ``plugin/package`` links.
"""

from __future__ import annotations

import json
import re
import shlex
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
PLUGIN_DIR_NAME = "plugin"
PLUGIN_NAME = "gradient-doctor"
MARKETPLACE_NAME = "gradient-doctor"
SKILL_NAME = "gradient-doctor"
#: Where the project is published: plugin.json, server.json and the install lines use it.
REPOSITORY = "https://github.com/gradient-doctor/gradient-doctor"
AUTHOR = {"name": "Gradient Doctor contributors"}
KEYWORDS = (
    "pytorch",
    "gradients",
    "nan",
    "gradient-clipping",
    "gradient-accumulation",
    "mixed-precision",
    "ddp",
    "training",
    "debugging",
    "mcp",
)
#: Hosts the first-run setup reaches (pip/uv installing the package's dependencies).
NETWORK_HOSTS = ("pypi.org", "files.pythonhosted.org")
#: The pinned Claude Code CLI the checks run (``npm view @anthropic-ai/claude-code version``).
CLAUDE_CODE_VERSION = "2.1.330"
#: The pinned Gemini CLI the extension checks run.
GEMINI_CLI_VERSION = "0.61.0"
#: The MCP Registry schema ``server.json`` follows.
SERVER_SCHEMA = "https://static.modelcontextprotocol.io/schemas/2025-12-11/server.schema.json"
#: The PyPI README marker the MCP Registry reads to verify the package's owner.
REGISTRY_NAME = "io.github." + REPOSITORY.removeprefix("https://github.com/").split("/")[0]
REGISTRY_NAME += "/" + PLUGIN_NAME


def plugin_dir(root: Path = REPO) -> Path:
    """The plugin folder inside the repository ``root``."""
    return root / PLUGIN_DIR_NAME


# --- inputs ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Project:
    """What ``pyproject.toml`` says about the distribution."""

    name: str
    version: str
    description: str
    license: str
    requires_python: str


def project(root: Path = REPO) -> Project:
    """The distribution's metadata, read from ``pyproject.toml``."""
    text = (root / "pyproject.toml").read_text(encoding="utf-8")
    if sys.version_info >= (3, 11):
        import tomllib

        data = tomllib.loads(text)["project"]
        licence = data.get("license", {})
        licence = licence.get("text", "") if isinstance(licence, dict) else str(licence)
        return Project(
            name=data["name"],
            version=data["version"],
            description=data["description"],
            license=licence,
            requires_python=data.get("requires-python", ""),
        )

    def field(name: str) -> str:  # Python 3.10: the few plain string fields we need
        match = re.search(rf'^{re.escape(name)}\s*=\s*"([^"]*)"', text, flags=re.MULTILINE)
        return match.group(1) if match else ""

    licence = re.search(r'^license\s*=\s*\{\s*text\s*=\s*"([^"]*)"', text, flags=re.MULTILINE)
    return Project(
        name=field("name"),
        version=field("version"),
        description=field("description"),
        license=licence.group(1) if licence else "",
        requires_python=field("requires-python"),
    )


@cache
def server_listing() -> dict[str, Any]:
    """The tools and prompts ``build_server()`` registers (names, descriptions, schemas)."""
    import anyio

    from gradient_doctor.skill_server.docs import _listing

    listing = anyio.run(_listing)
    return {
        "tools": [
            {
                "name": t.name,
                "description": t.description or "",
                "properties": sorted((t.input_schema or {}).get("properties", {})),
            }
            for t in listing["tools"]
        ],
        "prompts": [
            {"name": p.name, "description": p.description or ""} for p in listing["prompts"]
        ],
    }


def tool_names() -> list[str]:
    return [t["name"] for t in server_listing()["tools"]]


def claude_tool_name(tool: str, server: str | None = None) -> str:
    """The name Claude Code gives a plugin MCP server's tool.

    Claude Code names a plugin's server ``plugin:<plugin>:<server>`` and its tools
    ``mcp__<that name with every character outside [A-Za-z0-9_-] turned into _>__<tool>``,
    e.g. ``mcp__plugin_gradient-doctor_gradient-doctor__diagnose``.
    """
    from gradient_doctor.skill_server.server import SERVER_NAME

    key = f"plugin:{PLUGIN_NAME}:{server or SERVER_NAME}"
    return f"mcp__{re.sub(r'[^A-Za-z0-9_-]', '_', key)}__{tool}"


# --- the CLI fallback ------------------------------------------------------------------------

#: For each MCP tool, the CLI command line that does the same (placeholders in capitals).
CLI_FOR_TOOL: dict[str, str] = {
    "diagnose": 'gradient-doctor check SCRIPT --description "WHAT GOES WRONG"',
    "lint_script": "gradient-doctor lint SCRIPT --format markdown",
    "probe_script": "gradient-doctor probe SCRIPT --steps 30",
    "match_symptoms": 'gradient-doctor match "WHAT GOES WRONG"',
    "explain": "gradient-doctor explain ID",
    "diagnose_logs": "gradient-doctor logs PATH",
    "get_fix": "gradient-doctor explain SNIPPET_ID --name model=MODEL",
}
#: Tools with no CLI command of their own, and where the CLI gives the same thing.
CLI_INSTEAD: dict[str, str] = {}


def cli_has_option(command: str, option: str) -> bool:
    """Whether ``gradient-doctor COMMAND`` accepts ``option`` (read from the real parser)."""
    import argparse

    from gradient_doctor.skill_server.cli import build_parser

    for action in build_parser()._actions:
        if isinstance(action, argparse._SubParsersAction) and command in action.choices:
            return option in action.choices[command]._option_string_actions
    return False


def cli_line_parses(line: str) -> bool:
    """Whether a ``gradient-doctor ...`` line is accepted by the real CLI parser."""
    from gradient_doctor.skill_server.cli import build_parser

    words = shlex.split(line)
    if not words or words[0] != "gradient-doctor":
        return False
    try:
        build_parser().parse_args(words[1:])
    except SystemExit:
        return False
    return True


@dataclass(frozen=True)
class Verify:
    """How to prove a fix, as far as this build of the server and CLI can."""

    mcp: str
    cli: str | None


def verify_step() -> Verify:
    """The verify step, written from what the server and CLI offer now.

    ``diagnose(verify=true)``, a ``verify_fix`` tool and ``check --verify`` are named only when
    they exist; otherwise the step is re-running ``diagnose`` on the patched script, which is
    always possible.
    """
    tools = {t["name"]: t for t in server_listing()["tools"]}
    cli = "gradient-doctor check SCRIPT --verify" if cli_has_option("check", "--verify") else None
    if "verify" in tools.get("diagnose", {}).get("properties", []):
        return Verify(
            "call `diagnose` with verify=true: it applies the combined patch to a scratch copy "
            "(never the user's file), runs it under the probe with the same settings and says "
            "whether the problem is fixed, improved, unchanged, worse or broken",
            cli,
        )
    if "verify_fix" in tools:
        return Verify(
            "call `verify_fix`: it applies the patch to a scratch copy (never the user's file), "
            "runs it under the probe and compares before and after",
            cli,
        )
    return Verify(
        "after the user applies the patch, call `diagnose` on the script again and compare the "
        "new report with the first: the issues should be gone and the norms in range",
        cli,
    )


def cli_section(command: str) -> str:
    """The "without the MCP tools" section of a slash command."""
    lines = {
        "check-gradients": [
            CLI_FOR_TOOL["diagnose"],
            "gradient-doctor check SCRIPT --verify",
            CLI_FOR_TOOL["lint_script"],
        ],
        "triage": [CLI_FOR_TOOL["match_symptoms"], CLI_FOR_TOOL["explain"]],
        "review-training-loop": [CLI_FOR_TOOL["lint_script"], CLI_FOR_TOOL["probe_script"]],
    }[command]
    shown = "\n".join(f"    {line}" for line in lines)
    return (
        "## Without the MCP tools\n\n"
        "If the gradient-doctor tools are not available in this session, run the same checks "
        "with the command line (the plugin puts `gradient-doctor` on PATH and sets it up on "
        "first use; add `--format json` for machine-readable output"
        + ("; the script's own arguments go last, after `--`" if command != "triage" else "")
        + "):\n\n"
        f"{shown}\n\n"
        "Pasted code that is not in a file: write it to a temporary `.py` file first; the "
        "user's own files are never modified.\n"
    )


# --- small renderers ---------------------------------------------------------------------------


def _json(data: Any) -> str:
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


def _yaml_scalar(value: str) -> str:
    """A YAML double-quoted scalar (JSON strings are valid YAML)."""
    return json.dumps(value, ensure_ascii=False)


def _front_matter(fields: dict[str, str | list[str]]) -> str:
    lines = ["---"]
    for key, value in fields.items():
        if isinstance(value, list):
            lines.append(f"{key}: [{', '.join(_yaml_scalar(v) for v in value)}]")
        else:
            lines.append(f"{key}: {_yaml_scalar(value)}")
    lines.append("---")
    return "\n".join(lines) + "\n"


def _first_sentence(text: str) -> str:
    flat = " ".join(text.split())
    match = re.match(r"(.+?\.)(\s|$)", flat)
    return match.group(1) if match else flat


# --- the files -------------------------------------------------------------------------------


def plugin_description() -> str:
    return (
        "Diagnose and fix gradient problems in PyTorch training (NaN loss, exploding or "
        "vanishing gradients, clipping, accumulation, AMP and DDP mistakes): /check-gradients, "
        "/triage, /review-training-loop, an Agent Skill and an MCP server."
    )


def marketplace_json(meta: Project) -> str:
    entry = {
        "name": PLUGIN_NAME,
        "source": f"./{PLUGIN_DIR_NAME}",
        "description": plugin_description(),
        "version": meta.version,
        "author": AUTHOR,
        "homepage": REPOSITORY,
        "repository": REPOSITORY,
        "license": meta.license,
        "keywords": list(KEYWORDS),
        "category": "development",
    }
    return _json(
        {
            "name": MARKETPLACE_NAME,
            "owner": AUTHOR,
            "metadata": {
                "description": "Gradient Doctor: gradient diagnosis for PyTorch training, as a "
                "Claude Code plugin.",
                "version": meta.version,
            },
            "plugins": [entry],
        }
    )


def plugin_json(meta: Project) -> str:
    return _json(
        {
            "name": PLUGIN_NAME,
            "version": meta.version,
            "description": plugin_description(),
            "author": AUTHOR,
            "homepage": REPOSITORY,
            "repository": REPOSITORY,
            "license": meta.license,
            "keywords": list(KEYWORDS),
            "icon": f"./{ICON}",
            "network": {"hosts": list(NETWORK_HOSTS)},
        }
    )


def mcp_json() -> str:
    """Claude Code starts the server through the launcher, rooted at the user's project."""
    from gradient_doctor.skill_server.server import SERVER_NAME

    return _json(
        {
            "mcpServers": {
                SERVER_NAME: {
                    "command": "sh",
                    "args": [
                        "${CLAUDE_PLUGIN_ROOT}/bin/gradient-doctor-mcp",
                        "--project",
                        "${CLAUDE_PROJECT_DIR}",
                    ],
                }
            }
        }
    )


def gemini_extension_json(meta: Project) -> str:
    from gradient_doctor.skill_server.server import SERVER_NAME

    return _json(
        {
            "name": PLUGIN_NAME,
            "version": meta.version,
            "description": plugin_description(),
            "mcpServers": {
                SERVER_NAME: {
                    "command": "sh",
                    "args": [
                        "${extensionPath}${/}bin${/}gradient-doctor-mcp",
                        "--project",
                        "${workspacePath}",
                    ],
                }
            },
        }
    )


def commands() -> list[Any]:
    from gradient_doctor.skill_server import prompts

    return prompts.slash_commands({name: cli_section(name) for name in prompts.DESCRIPTIONS})


def claude_command(command: Any) -> str:
    """A Claude Code command file: front matter, then the workflow with ``$ARGUMENTS``.

    ``allowed-tools`` names exactly the server's tools that the workflow mentions, in Claude
    Code's spelling, plus the CLI fallback and the file tools to find and read the script.
    """
    body = command.render("$ARGUMENTS")
    allowed = [claude_tool_name(tool) for tool in tool_names() if f"`{tool}`" in body]
    allowed += ["Bash(gradient-doctor:*)", "Read", "Grep", "Glob"]
    return (
        _front_matter(
            {
                "description": command.description,
                "argument-hint": command.argument_hint,
                "allowed-tools": allowed,
            }
        )
        + "\n"
        + body
    )


def gemini_command(command: Any) -> str:
    """A Gemini CLI command file (TOML): the same workflow with ``{{args}}``."""
    body = command.render("{{args}}")
    if "'''" in body:
        raise ValueError(f"{command.name}: the prompt holds ''' and cannot be a TOML literal")
    return f"description = {_yaml_scalar(command.description)}\nprompt = '''\n{body}'''\n"


def skill_description() -> str:
    return (
        "Diagnoses and fixes gradient problems in PyTorch training. Use when the loss becomes "
        "NaN or Inf, training is unstable (loss spikes, divergence, a loss that stops "
        "falling), gradients explode or vanish, or when writing or reviewing training-loop "
        "code that does gradient clipping, gradient accumulation, mixed precision (AMP, "
        "GradScaler) or DDP. Reads the script for red flags, runs it for a few steps under a "
        "gradient probe, and gives fixes written with the user's own variable names."
    )


REFERENCES = {
    "catalog.md": "every identifier, by kind",
    "red-flags.md": "training-loop mistakes: what, why, how it shows up, how to confirm, the fix",
    "runtime-signals.md": "what the probe measures and when a number is a problem",
    "rationalizations.md": "tempting claims and what to say instead",
    "symptoms.md": "what users report, the likely causes and the first checks",
    "thresholds.md": "the numbers behind every verdict, per profile",
    "nan-tree.md": "the NaN decision tree",
    "guides.md": "topic guides: clipping, accumulation, AMP, DDP, NaN and more",
}


def reference_pages() -> dict[str, str]:
    """The skill's reference pages, rendered by the same views as the MCP resources."""
    from gradient_doctor.knowledge import load_knowledge
    from gradient_doctor.skill_server import views

    kb = load_knowledge()
    note = (
        "<!-- Generated from the knowledge base by `python -m "
        "gradient_doctor.skill_server.docs`; do not edit. -->\n\n"
    )

    def entries(kind: Any, title: str, intro: str = "") -> str:
        pages = [views.entry_markdown(e).strip() for e in kb.by_kind(kind)]
        return f"{note}# {title}\n\n{intro}" + "\n\n---\n\n".join(pages) + "\n"

    guides = [views.guide_markdown(g).strip() for g in kb.guides.values()]
    return {
        "catalog.md": note + views.catalog_markdown(kb).strip() + "\n",
        "red-flags.md": entries(
            "red-flag", "Red flags", views.red_flag_checklist_markdown(kb).strip() + "\n\n---\n\n"
        ),
        "runtime-signals.md": entries("signal", "Runtime signals"),
        "rationalizations.md": note + views.rationalization_table_markdown(kb).strip() + "\n",
        "symptoms.md": entries("symptom", "Symptoms"),
        "thresholds.md": note + views.thresholds_markdown(kb.thresholds).strip() + "\n",
        "nan-tree.md": note + views.nan_tree_markdown(kb.nan_tree).strip() + "\n",
        "guides.md": note + "# Topic guides\n\n" + "\n\n---\n\n".join(guides) + "\n",
    }


def skill_md() -> str:
    """The Agent Skill: when to use it, the workflow, what not to say, the CLI fallback."""
    from gradient_doctor.knowledge import load_knowledge
    from gradient_doctor.knowledge.models import Rationalization, Symptom
    from gradient_doctor.skill_server import prompts

    kb = load_knowledge()
    all_symptoms = [e for e in kb.by_kind("symptom") if isinstance(e, Symptom)]
    symptoms = [e for e in all_symptoms if not e.pointer]
    out_of_scope = [e for e in all_symptoms if e.pointer]
    verify = verify_step()
    tools = server_listing()["tools"]

    lines = [
        _front_matter({"name": SKILL_NAME, "description": skill_description()}),
        "# Gradient Doctor",
        "",
        "Gradient Doctor turns gradient-management guidance into tools: it reads a PyTorch "
        "training script for red flags (with exact lines and patches), runs it for a few "
        "optimizer steps under gradient hooks to measure what the gradients really do, and "
        "returns one report with the fix code. The user's files are never modified.",
        "",
        "## When to use it",
        "",
        *[f"- {e.title}" for e in symptoms],
        "- Writing or reviewing a training loop that clips gradients, accumulates them, uses "
        "AMP / `GradScaler`, or trains with DDP.",
        "- The user makes one of the claims under *What not to say*.",
        "",
        *[
            f"Not for a {e.title.lower()}. {' '.join((e.pointer or '').split())}"
            for e in out_of_scope
        ],
        "",
        "## Workflow",
        "",
        "1. **Diagnose.** Call `diagnose` with the script's path and the user's words as "
        "`description`. It merges the static read, a short probed run and the described "
        "symptom into a Gradient Health Report. Without a script, call `match_symptoms` with "
        "the user's words first, then ask for the script: a symptom alone does not prove a "
        "cause.",
        "2. **Fix.** For each critical issue not covered by the report's patch, call `get_fix` "
        "with the snippet or catalogue id and the user's variable names (model, optimizer, "
        "loss, scaler, accumulation steps) read from the script.",
        "3. **Explain.** When the user asks why, call `explain` with the id; quote its sources.",
        f"4. **Verify.** {verify.mcp[0].upper() + verify.mcp[1:]}.",
        "",
        prompts.presentation(),
        "",
        "The tools the server offers:",
        "",
        "| tool | what it does | without MCP |",
        "|---|---|---|",
    ]
    for tool in tools:
        cli = CLI_FOR_TOOL.get(tool["name"])
        instead = f"`{cli}`" if cli else CLI_INSTEAD.get(tool["name"], "(MCP only)")
        lines.append(f"| `{tool['name']}` | {_first_sentence(tool['description'])} | {instead} |")
    lines += [
        "",
        "In Claude Code and Gemini CLI the same workflows are slash commands: "
        "`/check-gradients [script.py] [symptoms...]`, `/triage <symptoms>` and "
        "`/review-training-loop [file.py | code]`.",
        "",
        "## What not to say",
        "",
        "Do not replace a measured diagnosis with generic advice. These claims come up most:",
        "",
        prompts.do_not_say(
            "Every claim with its answer: [references/rationalizations.md]"
            "(references/rationalizations.md)."
        ),
        "",
        "Also refuse these; each has its answer in the reference:",
        "",
    ]
    guarded = set(prompts.GUARDED_CLAIMS)
    others = sorted(
        (
            e
            for e in kb.by_kind("rationalization")
            if isinstance(e, Rationalization) and e.id not in guarded
        ),
        key=lambda e: e.number,
    )
    lines += [f'- "{e.claim}" (`{e.id}`)' for e in others]
    cli_lines = [CLI_FOR_TOOL[name] for name in CLI_FOR_TOOL]
    if verify.cli:
        cli_lines.append(verify.cli)
    lines += [
        "",
        "## Without MCP: the command line",
        "",
        "Where the host has no MCP server configured, run the CLI from a shell. Claude Code's "
        "plugin puts `gradient-doctor` on PATH (set up on first use); elsewhere install it "
        "(`pipx install gradient-doctor` or `uv tool install gradient-doctor`, or from a "
        "clone: `pipx install ./gradient-doctor`) or run the clone's "
        "`plugin/bin/gradient-doctor`.",
        "",
        "```bash",
        *cli_lines,
        "gradient-doctor catalog                  # every id",
        "```",
        "",
        "Exit codes for `lint`, `probe` and `check`: 0 nothing at or above `--fail-on` "
        "(default critical), 1 findings at or above it, 2 a usage or input error. The probe "
        "runs the script in the project's own interpreter (its `.venv`, `venv`, "
        "`VIRTUAL_ENV` or `CONDA_PREFIX`), so torch comes from the project.",
        "",
        "## Reference",
        "",
        "Generated from the knowledge base (the same text as the server's resources and "
        "`gradient-doctor explain`):",
        "",
        *[f"- [references/{name}](references/{name}): {what}" for name, what in REFERENCES.items()],
        "",
    ]
    return "\n".join(lines)


def server_json(meta: Project) -> str:
    """The MCP Registry entry: the PyPI package, run with ``uvx gradient-doctor serve``."""
    description = "Diagnose and fix gradient failures (NaN, exploding, vanishing) in PyTorch."
    return _json(
        {
            "$schema": SERVER_SCHEMA,
            "name": REGISTRY_NAME,
            "title": "Gradient Doctor",
            "description": description,
            "version": meta.version,
            "repository": {"url": REPOSITORY, "source": "github"},
            "websiteUrl": REPOSITORY,
            "packages": [
                {
                    "registryType": "pypi",
                    "registryBaseUrl": "https://pypi.org",
                    "identifier": meta.name,
                    "version": meta.version,
                    "runtimeHint": "uvx",
                    "transport": {"type": "stdio"},
                    "packageArguments": [{"type": "positional", "value": "serve"}],
                }
            ],
        }
    )


# --- install steps per host (README section and plugin README) ---------------------------------


def install_markdown(plugin_path: str = "gradient-doctor/plugin") -> str:
    """How to install the plugin, the skill and the server in each host."""
    from gradient_doctor.skill_server.server import SERVER_NAME

    owner_repo = REPOSITORY.removeprefix("https://github.com/")
    skill = f"{plugin_path}/skills/{SKILL_NAME}"
    mcp = f"{plugin_path}/bin/gradient-doctor-mcp"
    cursor_config = _json(
        {
            "mcpServers": {
                SERVER_NAME: {
                    "command": "sh",
                    "args": [f"/abs/path/to/{mcp}", "--project", "${workspaceFolder}"],
                }
            }
        }
    ).rstrip()
    return f"""\
The repository is a Claude Code plugin marketplace; its `{PLUGIN_DIR_NAME}/` folder holds one plugin
that is also a Gemini CLI extension, and an Agent Skill that Codex CLI and Cursor read. Each host
gets the slash commands or the skill plus the MCP server, started by the plugin's launcher:
it uses a `gradient-doctor` that is already installed (PATH, or the clone's `.venv`), or on
first use makes its own virtual environment (in the plugin's data folder, or
`~/.cache/gradient-doctor`) from the package source that ships inside the plugin, with `uv`
when present, else `venv` + pip. It needs Python ≥ 3.10 (or `uv`) and says so in one line when
there is none; torch is not needed by the server (the probe runs in your project's interpreter).

**Claude Code** (plugin: `/check-gradients`, `/triage`, `/review-training-loop`, the skill,
the MCP server)

```text
/plugin marketplace add {owner_repo}
/plugin install {PLUGIN_NAME}@{MARKETPLACE_NAME}
```

From a terminal: `claude plugin marketplace add {owner_repo}` then `claude plugin install
{PLUGIN_NAME}@{MARKETPLACE_NAME}`; from a clone, `claude plugin marketplace add ./gradient-doctor`
(the same commands), or try it without installing: `claude --plugin-dir ./{plugin_path}`.
Then, in any project: `/check-gradients train.py loss goes NaN after 2k steps` (also
`/{PLUGIN_NAME}:check-gradients`). The server is rooted at the project
(`${{CLAUDE_PROJECT_DIR}}`) and its tools are `{claude_tool_name("diagnose")}` and so on.
The first start installs the environment once per version (measured here: about 4 s with
`uv`, 30-50 s with pip); when that outlasts Claude Code's 30 s MCP start-up limit, the server
answers at once with no tools and adds them when the install finishes.

**Codex CLI** (skill + MCP server)

```bash
git clone {REPOSITORY}.git
mkdir -p ~/.agents/skills && cp -R {skill} ~/.agents/skills/   # or <project>/.agents/skills/
codex mcp add {SERVER_NAME} -- sh "$PWD/{mcp}"
```

The server is rooted at the folder Codex starts it in; add `--project DIR` after the
path to root it elsewhere.

**Cursor** (skill + MCP server)

```bash
git clone {REPOSITORY}.git
mkdir -p .cursor/skills && cp -R {skill} .cursor/skills/       # or ~/.cursor/skills/
```

and in `.cursor/mcp.json` (absolute path to the clone):

```json
{cursor_config}
```

**Gemini CLI** (extension: the same commands, the skill, the MCP server)

```bash
git clone {REPOSITORY}.git
gemini extensions install ./{plugin_path}     # or: gemini extensions link ./{plugin_path}
```

Gemini copies the folder but keeps `package/` as links into the clone, so keep the clone
(or `link` it).

**Any other MCP client**: run `gradient-doctor serve` (installed with pipx or `uv tool`), or
`sh {mcp}` from a clone; see *Using it from a coding assistant (MCP)*. The MCP Registry entry
is `server.json` (`{REGISTRY_NAME}`, PyPI package `gradient-doctor`, run as
`uvx gradient-doctor serve`).
<!-- mcp-name: {REGISTRY_NAME} -->
"""


def plugin_readme(meta: Project) -> str:
    """The README at the plugin folder's root."""
    command_rows = "\n".join(
        f"| `/{c.name} {c.argument_hint}` | {c.description} |" for c in commands()
    )
    return f"""\
<!-- Generated by `python -m gradient_doctor.skill_server.docs`; do not edit. -->
# Gradient Doctor plugin

Gradient Doctor {meta.version} diagnoses gradient problems in PyTorch training: NaN or Inf loss,
exploding or vanishing gradients, dead units, and the training-loop mistakes behind most of
them (clipping after `optimizer.step()`, accumulating without dividing the loss, clipping
scaled AMP gradients, DDP accumulation without `no_sync`). It reads your training script for
red flags, runs it for a few optimizer steps under gradient hooks, and answers with one report,
the patch and fix code written with your variable names. Your files are never modified.

## What you get

| command | what it does |
|---|---|
{command_rows}

- the Agent Skill `skills/{SKILL_NAME}/SKILL.md`: when to use the tools, the workflow
  (diagnose, fix, explain, verify), the claims not to make, the command-line fallback, and
  reference pages generated from the knowledge base;
- the MCP server `{PLUGIN_NAME}` (tools `diagnose`, `lint_script`, `probe_script`,
  `match_symptoms`, `get_fix`, `explain`, `diagnose_logs`), rooted at your project;
- the `gradient-doctor` command on the shell's PATH inside Claude Code.

## Install

{install_markdown("gradient-doctor/plugin")}
## How it starts

`.mcp.json` runs `sh bin/gradient-doctor-mcp --project ${{CLAUDE_PROJECT_DIR}}`. The shim finds
Python 3.10 or newer (`python3`, `python`, else `uv run`), or prints one line saying it is
missing, and hands over to `scripts/launcher.py`. The launcher uses, in order:
`GRADIENT_DOCTOR_EXECUTABLE`; the repository's `.venv` when this folder sits in a clone;
`gradient-doctor` on PATH when its version is {meta.version}; an environment it made before;
otherwise it installs one from `package/` (the package source, which Claude Code copies into
the plugin's cache as real files) into `${{CLAUDE_PLUGIN_DATA}}/envs/` (or
`~/.cache/gradient-doctor/envs/`), logging to `setup.log` there. The probe runs your script in
your project's interpreter, so torch comes from your project.

## License

Apache-2.0 (see `LICENSE`).
"""


# --- all of it -------------------------------------------------------------------------------


def generated_files(root: Path = REPO) -> dict[str, str]:
    """Every generated file, by path relative to the repository ``root``."""
    meta = project(root)
    plugin = PLUGIN_DIR_NAME
    files = {
        ".claude-plugin/marketplace.json": marketplace_json(meta),
        f"{plugin}/.claude-plugin/plugin.json": plugin_json(meta),
        f"{plugin}/.mcp.json": mcp_json(),
        f"{plugin}/gemini-extension.json": gemini_extension_json(meta),
        f"{plugin}/README.md": plugin_readme(meta),
        f"{plugin}/skills/{SKILL_NAME}/SKILL.md": skill_md(),
        "server.json": server_json(meta),
    }
    for command in commands():
        files[f"{plugin}/commands/{command.name}.md"] = claude_command(command)
        files[f"{plugin}/commands/{command.name}.toml"] = gemini_command(command)
    for name, text in reference_pages().items():
        files[f"{plugin}/skills/{SKILL_NAME}/references/{name}"] = text
    return files


#: Folders whose every file is generated: a file there that is not generated is stale.
GENERATED_FOLDERS = (
    f"{PLUGIN_DIR_NAME}/commands",
    f"{PLUGIN_DIR_NAME}/skills",
)


def stale_files(root: Path = REPO) -> list[str]:
    """Generated files that are missing or differ, and leftovers in generated folders."""
    wanted = generated_files(root)
    stale = []
    for relative, text in wanted.items():
        path = root / relative
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            stale.append(relative)
    for folder in GENERATED_FOLDERS:
        for path in sorted((root / folder).rglob("*")):
            relative = path.relative_to(root).as_posix()
            if path.is_file() and relative not in wanted:
                stale.append(f"{relative} (not generated: remove it)")
    return stale


def write_files(root: Path = REPO) -> list[str]:
    """Write the generated files (and remove leftovers); the paths that changed."""
    wanted = generated_files(root)
    changed = []
    for relative, text in wanted.items():
        path = root / relative
        if path.is_file() and path.read_text(encoding="utf-8") == text:
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        changed.append(relative)
    for folder in GENERATED_FOLDERS:
        for path in sorted((root / folder).rglob("*")):
            if path.is_file() and path.relative_to(root).as_posix() not in wanted:
                path.unlink()
                changed.append(path.relative_to(root).as_posix())
    return changed


def check_claims() -> list[str]:
    """Problems in what the generated text claims: CLI lines that the real parser refuses."""
    problems = []
    lines = list(CLI_FOR_TOOL.values())
    verify = verify_step().cli
    if verify:
        lines.append(verify)
    for line in lines:
        if not cli_line_parses(line):
            problems.append(f"the CLI refuses `{line}`")
    return problems


ICON = "assets/icon.png"
ICON_PIXELS = 512


def write_icon(path: Path) -> None:
    """Draw the plugin icon: a gradient norm that spikes, held under a clip line (512 px PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch

    figure = plt.figure(figsize=(ICON_PIXELS / 100, ICON_PIXELS / 100), dpi=100)
    axes = figure.add_axes((0.0, 0.0, 1.0, 1.0))
    axes.set_xlim(0, 1)
    axes.set_ylim(0, 1)
    axes.axis("off")
    figure.patch.set_alpha(0.0)
    axes.add_patch(
        FancyBboxPatch(
            (0.04, 0.04),
            0.92,
            0.92,
            boxstyle="round,pad=0,rounding_size=0.18",
            facecolor="#13294b",
            edgecolor="none",
        )
    )
    # The measured norm: calm, a spike that would explode, cut at the clip line.
    xs = [0.14, 0.24, 0.32, 0.40, 0.47, 0.53, 0.60, 0.68, 0.76, 0.86]
    raw = [0.30, 0.34, 0.29, 0.36, 0.95, 0.31, 0.35, 0.30, 0.33, 0.31]
    clip = 0.62
    axes.plot([0.12, 0.88], [clip, clip], color="#f2a541", linewidth=7, linestyle=(0, (2, 1.4)))
    axes.plot(
        xs, [min(v, clip) for v in raw], color="#ffffff", linewidth=14, solid_joinstyle="round"
    )
    axes.plot([0.47], [clip], marker="o", markersize=24, color="#f2a541")
    # A small cross: the doctor.
    axes.plot([0.78, 0.78], [0.72, 0.88], color="#e4572e", linewidth=13, solid_capstyle="butt")
    axes.plot([0.70, 0.86], [0.80, 0.80], color="#e4572e", linewidth=13, solid_capstyle="butt")
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100, transparent=True, metadata={"Software": None})
    plt.close(figure)
