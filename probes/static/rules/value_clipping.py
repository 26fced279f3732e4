"""value-clipping: ``clip_grad_value_`` where norm clipping would keep the direction."""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

import libcst as cst

from gradient_doctor.probes.static.base import Invalid, RawFinding, Rule
from gradient_doctor.probes.static.model import FileModel
from gradient_doctor.probes.static.names import code_of, dotted_name
from gradient_doctor.probes.static.patches import Patch
from gradient_doctor.probes.static.ruletools import direct_clip_calls, torch_name


class ValueClipping(Rule):
    id = "value-clipping"
    severity = "info"
    message = (
        "`{call}` on line {clip_line} clips each gradient element to ±{limit}, which changes the "
        "gradient's direction; `clip_grad_norm_` rescales it as a whole"
    )
    what = "Finds element-wise gradient clipping (`clip_grad_value_`)."
    why = (
        "Value clipping caps every element independently, so large components are cut while "
        "small ones are kept: the update no longer points along the gradient. Norm clipping "
        "scales the whole gradient vector down and keeps its direction; it is the standard "
        "choice for Transformers and RNNs."
    )
    example = "torch.nn.utils.clip_grad_value_(model.parameters(), clip_value=0.5)\n"
    use_instead = "torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)\n"
    fix_safety = (
        "Unsafe: norm clipping with max_norm=1.0 is a different transformation, not a "
        "translation of your clip value; tune max_norm from measured gradient norms."
    )
    snippet_id = "value-to-norm-clipping"
    valid: ClassVar[list[str]] = [
        """
import torch
torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
""",
        """
import torch
clip_value = 0.5
grads = [p.grad.clamp(-clip_value, clip_value) for p in params]
""",
        """
from utils import commons
norm = commons.clip_grad_value_(model.parameters(), None)
""",
    ]
    invalid: ClassVar[list[Invalid]] = [
        Invalid(
            """
import torch
for x, y in loader:
    loss_fn(model(x), y).backward()
    torch.nn.utils.clip_grad_value_(model.parameters(), clip_value=0.5)
    optimizer.step()
""",
            5,
        ),
        Invalid(
            """
import torch
from torch.nn.utils import clip_grad_value_
clip_grad_value_(model.parameters(), 1.0)
""",
            4,
        ),
    ]

    def check(self, model: FileModel) -> Iterator[RawFinding]:
        for event, call in direct_clip_calls(model, "value"):
            if event.measures_only:
                continue  # `clip_grad_value_(params, None)` in a project helper only measures
            limit = code_of(event.limit) if event.limit is not None else "clip_value"
            yield RawFinding(
                node=call,
                message=self.message,
                evidence={
                    "call": code_of(call.func),
                    "clip_line": call,
                    "limit": limit,
                },
                patch=self._patch(model, call),
                fix_safe=False,
                fix_description="Replace value clipping with norm clipping (max_norm=1.0).",
            )

    def _patch(self, model: FileModel, call: cst.Call) -> Patch | None:
        if not call.args or call.args[0].keyword is not None or call.args[0].star:
            return None
        func = call.func
        if isinstance(func, cst.Attribute) and dotted_name(func) is not None:
            new_func: cst.BaseExpression = func.with_changes(attr=cst.Name("clip_grad_norm_"))
        else:
            torch = torch_name(model)
            if torch is None:
                return None
            new_func = cst.parse_expression(f"{torch}.nn.utils.clip_grad_norm_")
        params = call.args[0].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        new_call = call.with_changes(
            func=new_func,
            args=[
                params.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))),
                cst.Arg(
                    keyword=cst.Name("max_norm"),
                    value=cst.Float("1.0"),
                    equal=cst.AssignEqual(
                        whitespace_before=cst.SimpleWhitespace(""),
                        whitespace_after=cst.SimpleWhitespace(""),
                    ),
                ),
            ],
        )
        return Patch().replace_node(call, new_call)
