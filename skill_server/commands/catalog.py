"""``gradient-doctor catalog``: list every catalogue identifier with its kind and severity."""

from __future__ import annotations

import argparse
import json
import sys

from gradient_doctor.knowledge.loader import KnowledgeBase, KnowledgeError, load_knowledge
from gradient_doctor.skill_server.cli import EXIT_OK, UsageError

NAME = "catalog"
HELP = "List every red flag, runtime signal, rationalization and symptom Gradient Doctor knows."

KINDS = ("red-flag", "signal", "rationalization", "symptom")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the options of ``gradient-doctor catalog``."""
    parser.add_argument(
        "--format",
        choices=("markdown", "json"),
        default="markdown",
        help="output format (default: markdown)",
    )
    parser.add_argument("--kind", choices=KINDS, help="only entries of this kind")


def knowledge_or_usage_error() -> KnowledgeBase:
    """The knowledge base, or a one-line :class:`UsageError` when the data is broken."""
    try:
        return load_knowledge()
    except KnowledgeError as exc:
        lines = str(exc).splitlines()
        first = lines[1].strip(" -") if len(lines) > 1 else lines[0]
        raise UsageError(f"the knowledge base is invalid: {first}") from None


def catalog_json(kb: KnowledgeBase, kind: str | None = None) -> dict[str, list[dict[str, object]]]:
    """The ``catalog --format json`` document: one record per entry, in catalogue order."""
    from gradient_doctor.skill_server.views import entry_source

    return {
        "entries": [
            {
                "id": e.id,
                "kind": e.kind,
                "severity": e.severity_or_none,
                "source": entry_source(e),
                "title": e.title,
            }
            for e in kb.entries.values()
            if kind is None or e.kind == kind
        ]
    }


def run(args: argparse.Namespace) -> int:
    """Print the catalogue."""
    kb = knowledge_or_usage_error()
    if args.format == "json":
        json.dump(catalog_json(kb, args.kind), sys.stdout, indent=2, ensure_ascii=False)
        sys.stdout.write("\n")
        return EXIT_OK
    from gradient_doctor.skill_server.views import catalog_markdown

    if args.kind:
        kb = KnowledgeBase(
            entries={i: e for i, e in kb.entries.items() if e.kind == args.kind},
            thresholds=kb.thresholds,
            nan_tree=kb.nan_tree,
            corrections=kb.corrections,
            guides=kb.guides,
        )
    sys.stdout.write(catalog_markdown(kb, snippets=not args.kind))
    return EXIT_OK
