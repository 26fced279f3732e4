"""clip-too-aggressive: a ``max_norm`` far below typical gradient norms."""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

import libcst as cst

from gradient_doctor.probes.static.base import Invalid, RawFinding, Rule
from gradient_doctor.probes.static.model import FileModel
from gradient_doctor.probes.static.names import code_of, number_value
from gradient_doctor.probes.static.patches import Patch
from gradient_doctor.probes.static.ruletools import direct_clip_calls

THRESHOLD = 0.1


class ClipTooAggressive(Rule):
    id = "clip-too-aggressive"
    severity = "warning"
    message = (
        "`{call}` on line {clip_line} uses max_norm={limit}: far below typical gradient norms "
        "(about 0.5-10), so nearly every step is clipped and training slows to a crawl"
    )
    what = "Finds norm clipping with a literal `max_norm` below 0.1."
    why = (
        "When `max_norm` is much smaller than the usual gradient norm, clipping fires on every "
        "step and all updates have the same tiny length: the learning rate is effectively "
        "divided by a large factor and convergence becomes very slow. Typical values are "
        "1.0 for Transformers and 0.25-5 for RNNs; measure your norms before going lower."
    )
    example = "torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.01)\n"
    use_instead = "torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)\n"
    fix_safety = (
        "Unsafe: raising max_norm to 1.0 changes training dynamics; check the measured "
        "gradient norms (clipping should trigger on a minority of steps)."
    )
    snippet_id = "max-norm-tuning"
    valid: ClassVar[list[str]] = [
        """
import torch
torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
""",
        """
import torch
torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
""",
    ]
    invalid: ClassVar[list[Invalid]] = [
        Invalid(
            """
import torch
torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.01)
""",
            3,
        ),
        Invalid(
            """
from torch.nn.utils import clip_grad_norm_ as clip
MAX_NORM = 0.001
for batch in loader:
    model(batch).backward()
    clip(model.parameters(), MAX_NORM)
    opt.step()
""",
            6,
        ),
    ]

    def check(self, model: FileModel) -> Iterator[RawFinding]:
        for event, call in direct_clip_calls(model, "norm"):
            if event.limit is None:
                continue
            limit = event.limit
            value = number_value(limit)
            if value is None and isinstance(limit, cst.Name):
                constant = model.constants.get(limit.value)
                value = number_value(constant) if constant is not None else None
            if value is None or not 0 < value < THRESHOLD:
                continue
            patch = None
            if number_value(limit) is not None:
                patch = Patch().replace_node(limit, cst.Float("1.0"))
            yield RawFinding(
                node=call,
                message=self.message,
                evidence={
                    "call": code_of(call.func),
                    "clip_line": call,
                    "limit": value,
                },
                patch=patch,
                fix_safe=False,
                fix_description="Raise max_norm to 1.0 (then tune it from measured norms).",
            )
