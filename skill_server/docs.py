"""Generate the README's sections and the plugin's files from the server itself.

``python -m gradient_doctor.skill_server.docs`` rewrites the text between
``<!-- SECTION:start -->`` and ``<!-- SECTION:end -->`` in README.md for each generated section
(``mcp-setup``, ``mcp-reference``, ``cli-reference``, ``catalogue``, ``plugin-install``), and
writes the plugin, skill, extension and registry files (``skill_server.plugin_files``);
``--check`` only reports (exit 1) what is out of date. The reference lists what
``build_server()`` registers, so it cannot drift from the code.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

import anyio

README = Path(__file__).resolve().parent.parent / "README.md"
SECTIONS = ("mcp-setup", "mcp-reference", "cli-reference", "catalogue")

SETUP = """\
The server speaks MCP over stdio (the default) or streamable HTTP. It reads files only under
its allowed roots (default: the directory it starts in; `--root DIR` adds more), never writes
your files, and never imports torch itself: scripts run in a child process.

**Claude Code**

```bash
claude mcp add gradient-doctor -- gradient-doctor serve
# or, from a clone (absolute paths), letting it read another project:
claude mcp add gradient-doctor -- /repo/.venv/bin/gradient-doctor serve --root /project
```

**Cursor** (`.cursor/mcp.json`) and other clients with an `mcpServers` file:

```json
{
  "mcpServers": {
    "gradient-doctor": {"command": "gradient-doctor", "args": ["serve"]}
  }
}
```

**VS Code** (`.vscode/mcp.json`):

```json
{
  "servers": {
    "gradient-doctor": {"type": "stdio", "command": "gradient-doctor", "args": ["serve"]}
  }
}
```

**Generic stdio**: run `gradient-doctor serve` with the client on its stdin/stdout.

**Streamable HTTP**: `gradient-doctor serve --http [--host 127.0.0.1] [--port 8765]`; the
endpoint is `http://127.0.0.1:8765/mcp`. On loopback the SDK refuses requests whose `Host` or
`Origin` header is not local (DNS-rebinding protection). Binding any other address needs
`--allow-remote` and a bearer token of at least 16 characters, from `--token-file FILE` or the
`GRADIENT_DOCTOR_TOKEN` environment variable; clients send `Authorization: Bearer <token>`.
`--allowed-host NAME` also turns on the Host/Origin check for a remote bind.

Other options: `--no-exec` (never run scripts; the probe tools say so), `--max-probes N`
(concurrent probes per device kind; default one per GPU and two on CPU).
"""


def _one_line(text: str | None) -> str:
    return " ".join((text or "").split())


def _first_sentence(text: str | None) -> str:
    flat = _one_line(text)
    match = re.match(r"(.+?\.)(\s|$)", flat)
    return match.group(1) if match else flat


def _annotation_text(annotations: Any) -> str:
    if annotations is None:
        return ""
    marks = []
    if annotations.read_only_hint:
        marks.append("read-only")
    else:
        marks.append("runs your script")
    if annotations.idempotent_hint:
        marks.append("idempotent")
    if annotations.open_world_hint:
        marks.append("open-world")
    return ", ".join(marks)


def _arguments(schema: dict[str, Any]) -> str:
    required = set(schema.get("required", []))
    names = []
    for name in schema.get("properties", {}):
        names.append(f"`{name}`" if name in required else f"`{name}?`")
    return ", ".join(names)


async def _listing() -> dict[str, Any]:
    from gradient_doctor.skill_server.server import build_server

    server = build_server()
    return {
        "tools": await server.list_tools(),
        "resources": await server.list_resources(),
        "templates": await server.list_resource_templates(),
        "prompts": await server.list_prompts(),
    }


def reference_markdown() -> str:
    """The tools, prompts and resources the server registers, as Markdown."""
    listing = anyio.run(_listing)
    lines = ["**Tools**", "", "| tool | arguments | what it does | hints |", "|---|---|---|---|"]
    for tool in listing["tools"]:
        lines.append(
            f"| `{tool.name}` | {_arguments(tool.input_schema)} | "
            f"{_first_sentence(tool.description)} | {_annotation_text(tool.annotations)} |"
        )
    lines += ["", "**Prompts** (slash commands)", "", "| prompt | arguments | what it does |"]
    lines.append("|---|---|---|")
    for prompt in listing["prompts"]:
        args = ", ".join(
            f"`{a.name}`" if a.required else f"`{a.name}?`" for a in (prompt.arguments or [])
        )
        lines.append(f"| `/{prompt.name}` | {args} | {_first_sentence(prompt.description)} |")
    lines += ["", "**Resources** (Markdown)", "", "| URI | what it holds |", "|---|---|"]
    for resource in listing["resources"]:
        lines.append(f"| `{resource.uri}` | {_first_sentence(resource.description)} |")
    for template in listing["templates"]:
        lines.append(f"| `{template.uri_template}` | {_first_sentence(template.description)} |")
    return "\n".join(lines) + "\n"


def cli_markdown() -> str:
    """Every ``gradient-doctor`` sub-command with its usage line, from the real parser."""
    import argparse as _argparse

    from gradient_doctor.skill_server.cli import build_parser

    parser = build_parser()
    lines = ["| command | what it does |", "|---|---|"]
    usages = []
    for action in parser._actions:
        if not isinstance(action, _argparse._SubParsersAction):
            continue
        helps = {a.dest: a.help for a in action._choices_actions}
        for name, sub in action.choices.items():
            lines.append(f"| `gradient-doctor {name}` | {_one_line(helps.get(name))} |")
            usage = " ".join(sub.format_usage().split())
            usages.append(usage.removeprefix("usage: "))
    lines += ["", "```text", *usages, "```", "", "`gradient-doctor COMMAND --help` says more."]
    lines.append(
        "Exit codes for `lint`, `probe` and `check`: 0 no finding at or above `--fail-on` "
        "(default critical), 1 findings at or above it, 2 usage or input error (one line on "
        "stderr)."
    )
    return "\n".join(lines) + "\n"


def catalogue_markdown() -> str:
    """Every catalogue identifier, by kind, from the knowledge base."""
    from gradient_doctor.knowledge import load_knowledge
    from gradient_doctor.knowledge.models import EntryKind

    kb = load_knowledge()
    titles: dict[EntryKind, str] = {
        "red-flag": "Red flags (S: static analyser, R: runtime probe, T: free text)",
        "signal": "Runtime signals",
        "rationalization": "Rationalizations (claims not to make)",
        "symptom": "Symptoms",
    }
    lines = [
        f"{len(kb.entries)} entries, each with its sources: `gradient-doctor catalog` lists them, "
        "`gradient-doctor explain ID` shows one."
    ]
    for kind, title in titles.items():
        lines += ["", f"**{title}**", ""]
        entries = kb.by_kind(kind)
        if kind == "red-flag":
            lines += ["| id | severity | where | what |", "|---|---|---|---|"]
            for e in entries:
                where = " ".join(getattr(e, "where", []))
                lines.append(f"| `{e.id}` | {e.severity_or_none} | {where} | {e.title} |")
        elif kind == "signal":
            lines += ["| id | severity | what |", "|---|---|---|"]
            for e in entries:
                levels = getattr(e, "severities", None) or [e.severity_or_none]
                ordered = [s for s in ("critical", "warning", "info") if s in levels]
                lines.append(f"| `{e.id}` | {'/'.join(ordered)} | {e.title} |")
        else:
            lines += ["| id | what |", "|---|---|"]
            for e in entries:
                lines.append(f"| `{e.id}` | {e.title} |")
    return "\n".join(lines) + "\n"


def sections() -> dict[str, str]:
    """The generated body of each README section."""
    return {
        "mcp-setup": SETUP,
        "mcp-reference": reference_markdown(),
        "cli-reference": cli_markdown(),
        "catalogue": catalogue_markdown(),
    }


def plugin_sections() -> dict[str, str]:
    """README sections about the plugin (written where the README has their markers)."""
    from gradient_doctor.skill_server.plugin_files import install_markdown

    return {"plugin-install": install_markdown()}


def readme_bodies(text: str) -> dict[str, str]:
    """The sections to write into README ``text``: all of :func:`sections`, and each plugin
    section whose markers it has."""
    bodies = sections()
    bodies.update({k: v for k, v in plugin_sections().items() if _pattern(k).search(text)})
    return bodies


def _pattern(section: str) -> re.Pattern[str]:
    return re.compile(
        rf"(<!-- {section}:start -->\n)(.*?)(<!-- {section}:end -->)", flags=re.DOTALL
    )


def updated_readme(text: str, bodies: dict[str, str]) -> str:
    """``text`` with each generated section replaced by its body."""
    for section, body in bodies.items():
        pattern = _pattern(section)
        if not pattern.search(text):
            raise ValueError(f"README has no <!-- {section}:start/end --> markers")
        match = pattern.search(text)
        assert match is not None
        text = text[: match.start(2)] + body + text[match.end(2) :]
    return text


def main(argv: list[str] | None = None) -> int:
    """Rewrite (or ``--check``) the README's generated sections and the plugin's files."""
    from gradient_doctor.skill_server import plugin_files

    parser = argparse.ArgumentParser(
        prog="python -m gradient_doctor.skill_server.docs", description=__doc__
    )
    parser.add_argument("--check", action="store_true", help="exit 1 if anything is out of date")
    parser.add_argument(
        "--readme", type=Path, default=None, help="README to update (default: the repository's)"
    )
    parser.add_argument(
        "--root",
        type=Path,
        default=None,
        help="repository whose plugin files to write (default: this one, unless --readme "
        "names another README)",
    )
    args = parser.parse_args(argv)
    readme = args.readme or README
    root = args.root or plugin_files.REPO
    with_plugin = args.readme is None or args.root is not None
    current = readme.read_text(encoding="utf-8")
    wanted = updated_readme(current, readme_bodies(current))
    hint = "run python -m gradient_doctor.skill_server.docs"
    if args.check:
        stale = [str(readme)] if wanted != current else []
        if with_plugin:
            stale += plugin_files.stale_files(root)
        problems = plugin_files.check_claims() if with_plugin else []
        for path in stale:
            print(f"{path}: generated text is stale; {hint}")
        for problem in problems:
            print(f"generated text: {problem}")
        return 1 if stale or problems else 0
    if wanted != current:
        readme.write_text(wanted, encoding="utf-8")
    if with_plugin:
        for path in plugin_files.write_files(root):
            print(f"wrote {path}")
        for problem in plugin_files.check_claims():
            print(f"generated text: {problem}")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
