"""What Gradient Doctor knows: typed catalogue entries, thresholds, guides and the NaN tree.

``load_knowledge()`` returns the validated, cached :class:`KnowledgeBase`; the free-text
matcher lives in ``knowledge.matcher``.

The names below are imported on first use (PEP 562), not with the package: importing
``gradient_doctor.knowledge.findings`` or the matcher's cached index must not pay for building
every pydantic model of the knowledge base, which costs a CLI start-up tens of milliseconds.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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

_FROM_LOADER = ("KnowledgeBase", "KnowledgeError", "build_knowledge", "load_knowledge")
_FROM_MODELS = (
    "SNIPPET_IDS",
    "Entry",
    "Guide",
    "NanTree",
    "Rationalization",
    "RedFlag",
    "SeedCorrection",
    "Signal",
    "Symptom",
    "ThresholdProfile",
    "ThresholdSet",
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


def __getattr__(name: str) -> Any:
    if name in _FROM_LOADER:
        module = importlib.import_module("gradient_doctor.knowledge.loader")
    elif name in _FROM_MODELS:
        module = importlib.import_module("gradient_doctor.knowledge.models")
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(module, name)
    globals()[name] = value
    return value
