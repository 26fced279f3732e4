"""``gradient-doctor explain``: show one knowledge entry (or guide) in full."""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from collections.abc import Callable

from gradient_doctor.knowledge.loader import KnowledgeBase
from gradient_doctor.skill_server.cli import EXIT_OK, UsageError
from gradient_doctor.skill_server.commands.catalog import knowledge_or_usage_error

NAME = "explain"
HELP = (
    "Explain one catalogue id (e.g. clip-after-step), a guide topic (e.g. amp), or one of the "
    "pages thresholds, nan-tree, rationalizations, red-flags, corrections; a fix snippet id "
    "(e.g. clip-norm) prints its code, written with your names (--name model=net)."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the options of ``gradient-doctor explain``."""
    parser.add_argument(
        "id", metavar="ID", help="catalogue id, guide topic, page name or fix snippet id"
    )
    parser.add_argument(
        "--name",
        dest="names",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="for a fix snippet: one of your names, e.g. --name model=net --name "
        "accumulation_steps=ACCUM (repeat it; unknown keys are refused, naming the accepted ones)",
    )
    parser.add_argument(
        "--format",
        choices=("markdown", "json"),
        default="markdown",
        help="output format (default: markdown)",
    )


def _pages(kb: KnowledgeBase) -> dict[str, tuple[Callable[[], str], Callable[[], object]]]:
    from gradient_doctor.skill_server import views

    return {
        "thresholds": (
            lambda: views.thresholds_markdown(kb.thresholds),
            lambda: kb.thresholds.model_dump(mode="json"),
        ),
        "nan-tree": (
            lambda: views.nan_tree_markdown(kb.nan_tree),
            lambda: kb.nan_tree.model_dump(mode="json"),
        ),
        "rationalizations": (
            lambda: views.rationalization_table_markdown(kb),
            lambda: [e.model_dump(mode="json") for e in kb.by_kind("rationalization")],
        ),
        "red-flags": (
            lambda: views.red_flag_checklist_markdown(kb),
            lambda: [e.model_dump(mode="json") for e in kb.by_kind("red-flag")],
        ),
        "corrections": (
            lambda: views.corrections_markdown(kb.corrections),
            lambda: [c.model_dump(mode="json") for c in kb.corrections],
        ),
    }


def run(args: argparse.Namespace) -> int:
    """Print the entry, guide or page called ``args.id``."""
    from gradient_doctor.skill_server import views

    kb = knowledge_or_usage_error()
    wanted = args.id.strip()
    as_json = args.format == "json"
    snippet_ids = _snippet_ids()
    is_snippet = (
        wanted in snippet_ids and wanted not in kb.entries and wanted not in kb.guides
    ) or (bool(args.names) and wanted in snippet_ids)
    if args.names and not is_snippet:
        raise UsageError(f"--name is for fix snippets; {wanted!r} is not a fix snippet id")
    if is_snippet:
        text = _snippet_text(wanted, _parse_names(args.names), as_json)
    elif wanted in kb.entries:
        entry = kb.entries[wanted]
        text = (
            json.dumps(entry.model_dump(mode="json"), indent=2, ensure_ascii=False) + "\n"
            if as_json
            else views.entry_markdown(entry)
        )
    elif wanted in kb.guides:
        guide = kb.guides[wanted]
        text = (
            json.dumps(guide.model_dump(mode="json"), indent=2, ensure_ascii=False) + "\n"
            if as_json
            else views.guide_markdown(guide)
        )
    elif wanted in (pages := _pages(kb)):
        markdown, data = pages[wanted]
        text = json.dumps(data(), indent=2, ensure_ascii=False) + "\n" if as_json else markdown()
    else:
        near = kb.closest(wanted) + difflib.get_close_matches(wanted, snippet_ids, n=2)
        hint = f"; closest: {', '.join(near)}" if near else ""
        raise UsageError(f"unknown id {wanted!r}{hint} (see 'gradient-doctor catalog')")
    sys.stdout.write(text)
    return EXIT_OK


def _snippet_ids() -> list[str]:
    from gradient_doctor.templates.snippets import list_snippets

    return [spec.id for spec in list_snippets()]


def _parse_names(raw: list[str]) -> dict[str, str]:
    """``["model=net", "max_norm=0.5"]`` as a mapping; :class:`UsageError` for a malformed one."""
    names: dict[str, str] = {}
    for item in raw:
        key, sep, value = item.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise UsageError(f"--name {item!r}: write KEY=VALUE, e.g. --name model=net")
        names[key.strip()] = value.strip()
    return names


def _snippet_text(snippet_id: str, names: dict[str, str], as_json: bool) -> str:
    """The snippet rendered with ``names``: Markdown for a person, or a JSON object."""
    from gradient_doctor.templates.snippets import get_snippet, render_snippet

    spec = get_snippet(snippet_id)
    try:
        code = render_snippet(snippet_id, names)
    except (KeyError, ValueError) as exc:
        raise UsageError(str(exc).strip("'\"")) from None
    if as_json:
        document = {
            "snippet_id": spec.id,
            "title": spec.title,
            "description": spec.description,
            "related": spec.related,
            "names": names,
            "code": code,
        }
        return json.dumps(document, indent=2, ensure_ascii=False) + "\n"
    related = ", ".join(f"`{r}`" for r in spec.related)
    takes = ", ".join(
        f"`{key}` (now `{names.get(key, parameter.default)}`)"
        for key, parameter in spec.parameters.items()
    )
    lines = [
        f"# {spec.title}",
        "",
        f"`{spec.id}` · fix snippet" + (f" · for {related}" if related else ""),
        "",
        spec.description.strip(),
        "",
        "```python",
        code.rstrip(),
        "```",
    ]
    if takes:
        lines += [
            "",
            f"Names it takes: {takes}. Pass yours with `--name KEY=VALUE` "
            "(e.g. `--name model=net`).",
        ]
    return "\n".join(lines) + "\n"
