"""Markdown views of the knowledge base, shared by the CLI and the MCP server resources.

Each view renders one template from ``templates/knowledge/``; this module only prepares plain
data for them (rows, formatted numbers), so the wording lives in the templates.
"""

from __future__ import annotations

from typing import Any

from gradient_doctor.knowledge.loader import KnowledgeBase
from gradient_doctor.knowledge.models import (
    Entry,
    EntryKind,
    Guide,
    NanTree,
    SeedCorrection,
    SourceRef,
    ThresholdProfile,
    ThresholdSet,
)
from gradient_doctor.templates import render

_SEVERITY_ORDER = ("critical", "warning", "info")
_KIND_ORDER: tuple[EntryKind, ...] = ("red-flag", "signal", "rationalization", "symptom")
_KIND_TITLES = {
    "red-flag": "Red flags and code rules",
    "signal": "Runtime signals",
    "rationalization": "Rationalizations",
    "symptom": "Symptoms",
}
_WHERE_WORDS = {"S": "static analysis", "R": "runtime probe", "T": "free-text symptom"}

#: Threshold keys in the order they are shown, with a short label.
_THRESHOLD_ROWS: tuple[tuple[str, str], ...] = (
    ("exploding_warning", "Exploding: warning above (total norm)"),
    ("exploding_critical", "Exploding: critical above (total norm)"),
    ("vanishing_warning", "Vanishing: warning below (total norm)"),
    ("vanishing_critical", "Vanishing: critical below (total norm)"),
    ("early_late_ratio", "Vanishing: late / early layer norm above"),
    ("layer_spread_warning", "Layer spread (max/min): warning above"),
    ("layer_spread_critical", "Layer spread (max/min): critical above"),
    ("zero_grad_fraction_warning", "Zero-gradient tensors: warning above"),
    ("zero_grad_fraction_critical", "Zero-gradient tensors: critical above"),
    ("dead_fraction_warning", "Dead units: warning above"),
    ("dead_fraction_critical", "Dead units: critical above"),
    ("grad_param_ratio_high", "‖g‖/‖w‖ too large above"),
    ("grad_param_ratio_low", "‖g‖/‖w‖ too small below"),
    ("spike_factor", "Spike: norm / running median above"),
    ("clip_active_fraction", "Clipping too aggressive: share of steps clipped above"),
    ("amp_skip_fraction", "AMP overflow: share of skipped steps above"),
)


def format_number(value: float) -> str:
    """A compact, exact-looking rendering of a threshold (100, 0.5, 1e-06)."""
    if value == int(value) and abs(value) < 1e6:
        return str(int(value))
    return f"{value:g}"


def short_source(source: SourceRef) -> str:
    """``GM, Pitfall 2`` — the seed short name and section, without the file name."""
    return f"{source.seed}, {source.section}"


def entry_source(entry: Entry) -> str:
    """The entry's sources as one short line (``GM red flags; GM pitfall 2``)."""
    return "; ".join(short_source(s) for s in entry.sources)


def entry_markdown(entry: Entry, thresholds: ThresholdSet | None = None) -> str:
    """One entry as a Markdown page: what, why, how it shows, how to confirm, the fix.

    A signal's threshold keys are shown with their value in the default profile of
    ``thresholds`` (the packaged knowledge base's when None).
    """
    where = [_WHERE_WORDS[w] for w in getattr(entry, "where", [])]
    limits: list[dict[str, str]] = []
    keys = getattr(entry, "thresholds", [])
    if keys:
        if thresholds is None:
            from gradient_doctor.knowledge.loader import load_knowledge

            thresholds = load_knowledge().thresholds
        profile = thresholds.profile()
        for key in keys:
            tv = getattr(profile, key)
            limits.append({"key": key, "value": format_number(tv.value), "seed": tv.source.seed})
    profile_name = thresholds.default_profile if thresholds else ""
    return render(
        "knowledge/entry.md.j2", entry=entry, where=where, limits=limits, profile=profile_name
    )


def catalog_markdown(kb: KnowledgeBase, *, snippets: bool = True) -> str:
    """Every entry in one table per kind: id, severity, title, source; then (``snippets``)
    the fix snippets, whose ids the entries and reports name."""
    from gradient_doctor.templates.snippets import list_snippets

    sections = []
    for kind in _KIND_ORDER:
        rows = [
            {
                "id": e.id,
                "severity": e.severity_or_none or "",
                "title": e.title,
                "source": entry_source(e),
            }
            for e in kb.by_kind(kind)
        ]
        if rows:
            sections.append({"title": _KIND_TITLES[kind], "kind": kind, "rows": rows})
    fixes = [
        {"id": spec.id, "title": spec.title, "related": spec.related}
        for spec in (list_snippets() if snippets else [])
    ]
    return render(
        "knowledge/catalog.md.j2", sections=sections, total=len(kb.entries), snippets=fixes
    )


def rationalization_table_markdown(kb: KnowledgeBase) -> str:
    """The tempting claims in table order, each with what to say instead."""
    rows = sorted(kb.by_kind("rationalization"), key=lambda e: getattr(e, "number", 0))
    return render("knowledge/rationalizations.md.j2", rows=rows)


def red_flag_checklist_markdown(kb: KnowledgeBase) -> str:
    """The red flags as a checklist grouped by severity (critical first)."""
    groups = []
    for severity in _SEVERITY_ORDER:
        flags = [e for e in kb.by_kind("red-flag") if e.severity_or_none == severity]
        if flags:
            groups.append(
                {
                    "severity": severity,
                    "flags": [
                        {
                            "entry": f,
                            "where": ", ".join(_WHERE_WORDS[w] for w in getattr(f, "where", [])),
                        }
                        for f in flags
                    ],
                }
            )
    return render("knowledge/red_flag_checklist.md.j2", groups=groups)


def guide_markdown(guide: Guide) -> str:
    """A topic guide: its title, summary, body and sources."""
    return render("knowledge/guide.md.j2", guide=guide)


def _cell(profile: ThresholdProfile, key: str) -> dict[str, Any]:
    tv = getattr(profile, key)
    return {"value": format_number(tv.value), "seed": tv.source.seed, "source": tv.source}


def thresholds_markdown(thresholds: ThresholdSet) -> str:
    """Profiles side by side (each number with its seed), the sources, and the max_norm table."""
    profiles = thresholds.profiles
    rows = [
        {"key": key, "label": label, "cells": [_cell(p, key) for p in profiles]}
        for key, label in _THRESHOLD_ROWS
    ]
    max_norm = [
        {
            "architecture": a.architecture,
            "typical": ", ".join(format_number(v) for v in a.values) or "—",
            "clip": "yes" if a.clip_by_default else "only when unstable",
            "advice": a.advice,
            "source": a.source,
        }
        for a in thresholds.max_norm
    ]
    details = [
        {
            "profile": p,
            "numbers": [{"label": label, **_cell(p, key)} for key, label in _THRESHOLD_ROWS],
        }
        for p in profiles
    ]
    low, high = thresholds.healthy_range
    return render(
        "knowledge/thresholds.md.j2",
        profiles=profiles,
        default_profile=thresholds.default_profile,
        rows=rows,
        details=details,
        max_norm=max_norm,
        healthy=f"{format_number(low)} – {format_number(high)}",
    )


def nan_tree_markdown(tree: NanTree) -> str:
    """The NaN decision tree as numbered questions with yes/no links."""
    order: list[str] = []
    pending = [tree.root]
    while pending:
        node_id = pending.pop(0)
        if node_id in order:
            continue
        order.append(node_id)
        pending.extend(tree.node(node_id).next_nodes)
    order += [n.id for n in tree.nodes if n.id not in order]
    numbers = {node_id: i + 1 for i, node_id in enumerate(order)}
    nodes = [tree.node(node_id) for node_id in order]
    return render("knowledge/nan_tree.md.j2", tree=tree, nodes=nodes, numbers=numbers)


def corrections_markdown(corrections: list[SeedCorrection]) -> str:
    """The seed corrections: what the seed says, what is true, why, and the proving test."""
    return render("knowledge/corrections.md.j2", corrections=corrections)
