"""accum-leftover-batches: the micro-batches after the last full window are never applied."""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

import libcst as cst

from gradient_doctor.probes.static.base import Invalid, RawFinding, Rule
from gradient_doctor.probes.static.model import STEP_KINDS, FileModel, modulo_divisor
from gradient_doctor.probes.static.names import code_of
from gradient_doctor.probes.static.ruletools import micro_step_for


class AccumLeftoverBatches(Rule):
    id = "accum-leftover-batches"
    severity = "info"
    message = (
        "the update condition `{condition}` on line {condition_line} never fires for the last "
        "`len({loader}) % {divisor}` micro-batches of an epoch: their gradients are never applied"
    )
    what = (
        "Finds accumulation gated by `(i + 1) % N == 0` over a data loader with no step for "
        "the last, partial window of the epoch."
    )
    why = (
        "When the number of batches is not a multiple of N, the final micro-batches add their "
        "gradients but no step follows; they leak into the first update of the next epoch (or "
        "are lost). Step on the last batch too, and divide that partial window by the number "
        "of micro-batches it really holds, not by N."
    )
    example = (
        "for i, batch in enumerate(loader):\n"
        "    (model(batch).loss / N).backward()\n"
        "    if (i + 1) % N == 0:\n"
        "        optimizer.step()\n"
        "        optimizer.zero_grad()\n"
    )
    use_instead = (
        "for i, batch in enumerate(loader):\n"
        "    (model(batch).loss / N).backward()\n"
        "    if (i + 1) % N == 0 or i + 1 == len(loader):\n"
        "        optimizer.step()\n"
        "        optimizer.zero_grad()\n"
    )
    fix_safety = (
        "No automatic fix: the last window also needs its own divisor (the number of "
        "micro-batches it holds); see the accumulation-leftover snippet."
    )
    snippet_id = "accumulation-leftover"
    valid: ClassVar[list[str]] = [
        """
for i, batch in enumerate(loader):
    (model(batch).loss / N).backward()
    if (i + 1) % N == 0 or (i + 1) == len(loader):
        optimizer.step()
        optimizer.zero_grad()
""",
        """
for it in range(max_iters):
    for micro in range(N):
        (model(next(data)) / N).backward()
    optimizer.step()
    optimizer.zero_grad()
""",
        """
for i, batch in enumerate(loader):
    (model(batch).loss / N).backward()
    if (i + 1) % N == 0:
        optimizer.step()
        optimizer.zero_grad()
optimizer.step()
optimizer.zero_grad()
""",
    ]
    invalid: ClassVar[list[Invalid]] = [
        Invalid(
            """
for i, batch in enumerate(loader):
    (model(batch).loss / N).backward()
    if (i + 1) % N == 0:
        optimizer.step()
        optimizer.zero_grad()
""",
            4,
        ),
        Invalid(
            """
def train(model, train_loader, optimizer, accum):
    for epoch in range(10):
        for step, batch in enumerate(train_loader):
            loss = model(**batch).loss / accum
            loss.backward()
            if step % accum == accum - 1:
                optimizer.step()
                optimizer.zero_grad()
""",
            7,
        ),
        # One sample counter per optimizer, walked with zip() and reset by index when that
        # optimizer steps; counted afresh each epoch (learned from static6 torchseq).
        Invalid(
            """
def train_epoch(model, optimizers, loader, target):
    seen = [0 for _ in optimizers]
    for index, batch in enumerate(loader):
        (model(batch).sum() / target).backward()
        seen = [count + len(batch) for count in seen]
        for slot, (opt, count) in enumerate(zip(optimizers, seen)):
            if count >= target:
                opt.step()
                opt.zero_grad()
                seen[slot] = 0
""",
            8,
        ),
    ]

    def check(self, model: FileModel) -> Iterator[RawFinding]:
        for unit in model.units:
            acc = unit.accumulation
            if acc is None or acc.style != "conditional" or acc.handles_last_batch:
                continue
            if acc.condition is None or acc.gate is None or acc.gate.branch != 0:
                continue
            if acc.counter is None and modulo_divisor(acc.condition) is None:
                # `if apply_gradient:` on a flag the caller computes: whether the caller
                # also steps on the last batch is not visible here.
                continue
            loop = micro_step_for(unit)
            if loop is None or not isinstance(loop.iter, cst.Call):
                continue
            func = loop.iter.func
            if not (isinstance(func, cst.Name) and func.value == "enumerate"):
                continue
            if not loop.iter.args:
                continue
            loader = _unwrapped(loop.iter.args[0].value)
            if isinstance(loader, cst.Call) and code_of(loader.func) == "range":
                continue
            events = model.expanded(unit.root)
            micro_node = loop
            flushed = any(
                e.kind in STEP_KINDS
                and not any(f.node is micro_node for f in e.frames)
                and e.order > max((x.order for x in events if x.inside(unit.micro)), default=0)
                for e in events
            )
            if flushed:
                continue
            yield RawFinding(
                node=acc.condition,
                message=self.message,
                evidence={
                    "condition": code_of(acc.condition),
                    "condition_line": acc.condition,
                    "loader": code_of(loader),
                    "divisor": acc.divisor_text,
                },
            )


PROGRESS_WRAPPERS = frozenset({"tqdm", "tqdm.tqdm", "tqdm.auto.tqdm", "iter"})


def _unwrapped(loader: cst.BaseExpression) -> cst.BaseExpression:
    """The data a progress bar wraps: ``tqdm(loader, desc=...)`` has as many batches as
    ``loader``, and the message names ``len(loader)`` (learned from static11 TinyBERT)."""
    while (
        isinstance(loader, cst.Call)
        and code_of(loader.func) in PROGRESS_WRAPPERS
        and loader.args
        and loader.args[0].keyword is None
        and not loader.args[0].star
    ):
        loader = loader.args[0].value
    return loader
