"""``gradient-doctor explain``: show one knowledge entry (or guide) in full."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable

from gradient_doctor.knowledge.loader import KnowledgeBase
from gradient_doctor.skill_server.cli import EXIT_OK, UsageError
from gradient_doctor.skill_server.commands.catalog import knowledge_or_usage_error

NAME = "explain"
HELP = (
    "Explain one catalogue id (e.g. clip-after-step), a guide topic (e.g. amp), or one of the "
    "pages thresholds, nan-tree, rationalizations, red-flags, corrections."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the options of ``gradient-doctor explain``."""
    parser.add_argument("id", metavar="ID", help="catalogue id, guide topic or page name")
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
    if wanted in kb.entries:
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
        near = kb.closest(wanted)
        hint = f"; closest: {', '.join(near)}" if near else ""
        raise UsageError(f"unknown id {wanted!r}{hint} (see 'gradient-doctor catalog')")
    sys.stdout.write(text)
    return EXIT_OK
