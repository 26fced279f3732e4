"""MCP resources: the catalogue, each entry, the guides, the thresholds and two checklists.

All are Markdown rendered by ``skill_server.views`` from the knowledge base, so a resource and
the CLI show the same text.
"""

from __future__ import annotations

from typing import Any

from mcp.server import MCPServer

MARKDOWN = "text/markdown"


def _kb() -> Any:
    from gradient_doctor.knowledge import load_knowledge

    return load_knowledge()


def _views() -> Any:
    from gradient_doctor.skill_server import views

    return views


def register(server: MCPServer, prefix: str, not_found: type[Exception]) -> None:
    """Add the resources under ``prefix`` (e.g. ``gradient-doctor://``) to ``server``."""

    @server.resource(
        f"{prefix}catalog",
        name="catalog",
        title="Catalogue of identifiers",
        description="Every red flag, runtime signal, rationalization and symptom id.",
        mime_type=MARKDOWN,
    )
    def catalog() -> str:
        return str(_views().catalog_markdown(_kb()))

    @server.resource(
        f"{prefix}entry/{{id}}",
        name="entry",
        title="Catalogue entry",
        description="One knowledge entry by id (see the catalogue for ids).",
        mime_type=MARKDOWN,
    )
    def entry(id: str) -> str:
        kb = _kb()
        if id not in kb.entries:
            near = kb.closest(id)
            hint = f" (closest: {', '.join(near)})" if near else ""
            raise not_found(f"unknown entry {id!r}{hint}")
        return str(_views().entry_markdown(kb.entries[id]))

    @server.resource(
        f"{prefix}guide/{{topic}}",
        name="guide",
        title="Topic guide",
        description="A guide on one topic: clipping, accumulation, amp, ddp, vanishing, "
        "exploding, nan, monitoring, checkpointing, per-layer-clipping, small-gradients.",
        mime_type=MARKDOWN,
    )
    def guide(topic: str) -> str:
        guides = _kb().guides
        if topic not in guides:
            raise not_found(f"unknown guide {topic!r} (topics: {', '.join(sorted(guides))})")
        return str(_views().guide_markdown(guides[topic]))

    @server.resource(
        f"{prefix}thresholds",
        name="thresholds",
        title="Threshold profiles",
        description="The numbers behind runtime verdicts, per profile, with the seed of each.",
        mime_type=MARKDOWN,
    )
    def thresholds() -> str:
        return str(_views().thresholds_markdown(_kb().thresholds))

    @server.resource(
        f"{prefix}rationalizations",
        name="rationalizations",
        title="Rationalization table",
        description="Tempting claims about gradients and what to say instead.",
        mime_type=MARKDOWN,
    )
    def rationalizations() -> str:
        return str(_views().rationalization_table_markdown(_kb()))

    @server.resource(
        f"{prefix}red-flags",
        name="red-flags",
        title="Red-flag checklist",
        description="Training-loop mistakes to check for, grouped by severity.",
        mime_type=MARKDOWN,
    )
    def red_flags() -> str:
        return str(_views().red_flag_checklist_markdown(_kb()))
