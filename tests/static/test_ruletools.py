"""The queries that several static rules share (``probes/static/ruletools.py``)."""

from __future__ import annotations

import libcst as cst

from gradient_doctor.probes.static.model import Event, FileModel
from gradient_doctor.probes.static.names import code_of
from gradient_doctor.probes.static.ruletools import (
    accumulating_units,
    clipping,
    direct_clip_calls,
    micro_step_backwards,
    micro_step_for,
    missing_unscale,
    placements,
    shorten,
)

CONDITIONAL_ACCUMULATION = """
def clip(model):
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)

for i, batch in enumerate(loader):
    (model(batch).loss / N).backward()
    clip(model)
    torch.nn.utils.clip_grad_norm_(model.parameters(), math.inf)
    if (i + 1) % N == 0:
        optimizer.step()
        optimizer.zero_grad()
"""


def _model(source: str) -> FileModel:
    return FileModel(cst.parse_module(source))


def _texts(events: list[Event]) -> list[str]:
    return [code_of(event.call) for event in events]


def test_accumulating_units_yield_the_gated_steps_only_for_accumulation() -> None:
    (found,) = accumulating_units(_model(CONDITIONAL_ACCUMULATION))
    assert found.accumulation is found.unit.accumulation
    assert found.accumulation.divisor_text == "N"
    assert _texts(found.steps) == ["optimizer.step()"]

    plain = "for x, y in loader:\n    loss_fn(model(x), y).backward()\n    optimizer.step()\n"
    assert _model(plain).units and not list(accumulating_units(_model(plain)))


def test_accumulating_units_skip_deepspeed_engines_only_when_asked() -> None:
    model = _model(
        "import deepspeed\n"
        "engine, _, _, _ = deepspeed.initialize(model=net, config=cfg)\n"
        "for i, batch in enumerate(loader):\n"
        "    engine.backward(engine(batch))\n"
        "    if (i + 1) % N == 0:\n"
        "        engine.step()\n"
    )
    (found,) = accumulating_units(model)
    assert [step.framework for step in found.steps] == ["deepspeed"]
    assert list(accumulating_units(model, skip_deepspeed=True)) == []


def test_placements_see_a_helper_call_as_the_statement_to_move() -> None:
    model = _model(CONDITIONAL_ACCUMULATION)
    (found,) = accumulating_units(model)
    inlined, measuring = found.unit.of_kind("clip")
    clip_at, step_at = placements(inlined, found.steps[0])
    assert code_of(clip_at.node) == "clip(model)"
    assert clip_at.via_helper and not clip_at.standalone
    assert code_of(step_at.stmt).strip() == "optimizer.step()"
    assert not step_at.via_helper and step_at.standalone

    direct_at, _ = placements(measuring, found.steps[0])
    assert direct_at.node is measuring.call and direct_at.standalone


def test_a_statement_sharing_its_line_is_not_standalone() -> None:
    model = _model(
        "for x in loader:\n    model(x).backward(); optimizer.step()\n    optimizer.zero_grad()\n"
    )
    (unit,) = model.units
    step_at, backward_at = placements(unit.steps[0], unit.backwards[0])
    assert not step_at.via_helper and not backward_at.via_helper
    assert not step_at.standalone and not backward_at.standalone


def test_clipping_leaves_out_clips_that_only_measure() -> None:
    (found,) = accumulating_units(_model(CONDITIONAL_ACCUMULATION))
    assert len(found.unit.of_kind("clip")) == 2
    assert [code_of(placements(c, found.steps[0])[0].node) for c in clipping(found.unit)] == [
        "clip(model)"
    ]


def test_direct_clip_calls_report_each_written_call_once_by_kind() -> None:
    model = _model(
        CONDITIONAL_ACCUMULATION + "clip(model)\ntorch.nn.utils.clip_grad_value_(params, 0.5)\n"
    )
    norms = sorted(code_of(call) for _, call in direct_clip_calls(model, "norm"))
    assert norms == [
        "torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)",
        "torch.nn.utils.clip_grad_norm_(model.parameters(), math.inf)",
    ]
    values = list(direct_clip_calls(model, "value"))
    assert [code_of(call) for _, call in values] == ["torch.nn.utils.clip_grad_value_(params, 0.5)"]
    assert all(event.call is call and event.clip_kind == "value" for event, call in values)


def test_micro_step_for_is_the_for_statement_of_the_micro_step() -> None:
    (found,) = accumulating_units(_model(CONDITIONAL_ACCUMULATION))
    loop = micro_step_for(found.unit)
    assert loop is not None and code_of(loop.iter) == "enumerate(loader)"

    while_loop = _model(
        "while i < n:\n"
        "    (model(next(data)) / N).backward()\n"
        "    if (i + 1) % N == 0:\n"
        "        optimizer.step()\n"
        "    i += 1\n"
    )
    (unit,) = while_loop.units
    assert unit.micro is not None and micro_step_for(unit) is None


def test_missing_unscale_only_for_scaled_gradients_not_yet_unscaled() -> None:
    scaled = (
        "scaler = torch.amp.GradScaler('cuda')\n"
        "for x in loader:\n"
        "    scaler.scale(model(x)).backward()\n"
        "{unscale}"
        "    scaler.step(opt)\n"
        "    scaler.update()\n"
    )
    (unit,) = _model(scaled.format(unscale="")).units
    assert missing_unscale(unit, unit.steps[0]) == "scaler.unscale_(opt)"

    (unit,) = _model(scaled.format(unscale="    scaler.unscale_(opt)\n")).units
    assert missing_unscale(unit, unit.steps[0]) is None

    (unit,) = _model("for x in loader:\n    model(x).backward()\n    opt.step()\n").units
    assert missing_unscale(unit, unit.steps[0]) is None


def test_shorten_puts_source_on_one_line_within_sixty_characters() -> None:
    assert shorten("loss  =\n    a /\n  b") == "loss = a / b"
    exact = "x" * 60
    assert shorten(exact) == exact
    long = shorten("y" * 61)
    assert len(long) == 60 and long.endswith("...") and long.startswith("y" * 57)


def test_shorten_cuts_between_tokens_never_inside_a_name() -> None:
    clip = "torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip_value_for_x)"
    assert shorten(clip) == "torch.nn.utils.clip_grad_norm_(model.parameters(), ..."
    assert "args.c" not in shorten(clip)


def test_micro_step_backwards_are_the_plain_ones_of_every_micro_batch() -> None:
    model = _model(
        "from accelerate import Accelerator\n"
        "accelerator = Accelerator()\n"
        "for i, batch in enumerate(loader):\n"
        "    accelerator.backward(model(batch) / N)\n"
        "    (model(batch) / N).backward()\n"
        "    if (i + 1) % N == 0:\n"
        "        extra_loss(model).backward()\n"
        "        optimizer.step()\n"
    )
    (unit,) = model.units
    assert len(unit.backwards) == 3
    assert _texts(micro_step_backwards(unit)) == ["(model(batch) / N).backward()"]
