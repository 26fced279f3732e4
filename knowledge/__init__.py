"""What Gradient Doctor knows: typed catalogue entries, thresholds, guides and the NaN tree.

``load_knowledge()`` returns the validated, cached :class:`KnowledgeBase`; the free-text
matcher lives in ``knowledge.matcher``.
"""

from __future__ import annotations

from gradient_doctor.knowledge.loader import (
    KnowledgeBase,
    KnowledgeError,
    build_knowledge,
    load_knowledge,
)
from gradient_doctor.knowledge.models import (
    SNIPPET_IDS,
    Entry,
    Guide,
    NanTree,
    Rationalization,
    RedFlag,
    SeedCorrection,
    Signal,
    Symptom,
    ThresholdProfile,
    ThresholdSet,
)

__all__ = [
    "SNIPPET_IDS",
    "Entry",
    "Guide",
    "KnowledgeBase",
    "KnowledgeError",
    "NanTree",
    "Rationalization",
    "RedFlag",
    "SeedCorrection",
    "Signal",
    "Symptom",
    "ThresholdProfile",
    "ThresholdSet",
    "build_knowledge",
    "load_knowledge",
]
