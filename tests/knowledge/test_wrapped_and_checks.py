"""Readers added in the matcher11 round: wrapped prose, calibrating scalers, noisy losses,
explicit NaN checks, per-layer rows and checkpoint errors (each also covered by eval items)."""

from __future__ import annotations

from gradient_doctor.knowledge._errors import read_errors
from gradient_doctor.knowledge._numbers import aligned_columns, read_quantities
from gradient_doctor.knowledge._text import unwrap_prose, wrapped_breaks
from gradient_doctor.knowledge.matcher_frames import (
    checked_stage,
    noisy_loss_improving,
    scaler_settles,
)

WRAPPED = (
    "ported from flax; in JAX the norm looked fine, but in torch the total grad norm is\n"
    "3e-9 from the first step on and the loss is stuck at 2.3026 after five epochs\n"
)


def test_a_wrapped_line_break_joins_a_name_and_its_value() -> None:
    assert wrapped_breaks(WRAPPED) == [WRAPPED.index("\n")]
    assert [q.value for q in read_quantities(WRAPPED) if q.name == "grad_norm"] == [3e-9]


def test_log_rows_tables_and_code_keep_their_line_breaks() -> None:
    log = "training went fine until the very end of the run and then this showed up in the log\n"
    log += "step 11840 loss 2.3117 gn 3.41\nstep 11850 loss 2.2984 gn 3.02\n"
    assert wrapped_breaks(log) == []
    code = "for step, batch in enumerate(loader):  # the loop I use for every single run\n"
    code += "    loss = model(batch).loss\n"
    assert unwrap_prose(code) == code


def test_a_scaler_that_backs_off_early_and_then_holds_is_healthy() -> None:
    calm = (
        "GradScaler went 65536 -> 4096 in the first dozen steps, then it climbed back to "
        "65536 and stays there; the loss keeps going down like the fp32 run."
    )
    hit = scaler_settles(calm)
    assert hit is not None and hit.entry_id == "healthy"
    assert scaler_settles(calm + " Then at step 9k the loss went nan.") is None


def test_a_noisy_step_loss_with_a_falling_average_is_healthy() -> None:
    text = "per-step loss is noisy, 0.3 then 1.1, but the 200-step running average goes down."
    found = noisy_loss_improving(text)
    assert found is not None and found[0].entry_id == "healthy"
    assert "loss-spikes" in found[1]
    assert noisy_loss_improving("the per-step loss is noisy and it keeps climbing") is None


def test_an_explicit_check_locates_the_first_non_finite_stage() -> None:
    inf = checked_stage("fp32. torch.isinf(model.emb.weight.grad).any() returns True, loss 5.4")
    assert inf is not None and inf.entry_id == "inf-gradients"
    inputs = checked_stage("at that step torch.isfinite(batch['x']).all() is False")
    assert inputs is not None and inputs.entry_id == "nonfinite-inputs"
    params = checked_stage(
        ">>> [n for n, p in model.named_parameters() if not torch.isfinite(p).all()]\n"
        "['head.weight', 'head.bias']"
    )
    assert params is not None and params.entry_id == "nan-parameters"
    assert checked_stage("torch.isfinite(batch['x']).all() is True") is None


def test_rows_naming_a_layer_then_grad_then_a_value_are_per_layer_norms() -> None:
    rows = (
        "the classifier is stuck at 0.693 from the first epoch on, grads per parameter:\n"
        "  l0.weight  grad 2e-11\n  l5.weight  grad 6e-8\n  out.weight grad 4e-3\n"
    )
    assert aligned_columns(rows) == {"layer_norms": [2e-11, 6e-8, 4e-3]}


def test_a_checkpoint_that_does_not_fit_the_model_is_its_own_error() -> None:
    reading = read_errors(
        "Error(s) in loading state_dict for Net:\n  size mismatch for fc.weight: copying a param "
        "with shape torch.Size([10, 512]) from\n  checkpoint, the shape in current model is "
        "torch.Size([5, 512]).\nwhat now?"
    )
    assert reading is not None and reading.kind.name == "checkpoint"
    assert "checkpoint" not in reading.rest.lower()
