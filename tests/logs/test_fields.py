"""Column and key names map onto step fields tolerantly; evaluation keys never do."""

from __future__ import annotations

import math

import pytest

from gradient_doctor.probes.logs.fields import field_for, layer_for
from gradient_doctor.probes.logs.formats.console import parse_line
from gradient_doctor.probes.logs.formats.hf_console import parse_dict
from gradient_doctor.probes.logs.formats.nanogpt import parse_iter
from gradient_doctor.probes.logs.records import map_record, number


@pytest.mark.parametrize(
    ("key", "field"),
    [
        ("loss", "loss"),
        ("train/loss", "loss"),
        ("train_loss", "loss"),
        ("train_loss_step", "loss"),
        ("grad_norm", "grad_norm"),
        ("total_norm", "grad_norm"),
        ("train/grad_norm", "grad_norm"),
        ("grad_2.0_norm_total", "grad_norm"),
        ("gnorm", "grad_norm"),
        ("lr", "lr"),
        ("learning_rate", "lr"),
        ("lr-AdamW", "lr"),
        ("scale", "scale"),
        ("loss_scale", "scale"),
        ("amp/loss_scale", "scale"),
        ("global_step", "step"),
        ("trainer/global_step", "step"),
        ("max_grad_norm", "clip_max_norm"),
    ],
)
def test_training_keys_map_to_fields(key: str, field: str) -> None:
    assert field_for(key) == field


@pytest.mark.parametrize(
    "key", ["eval_loss", "val_loss", "val/loss", "train_loss_epoch", "test_loss", "epoch", "mfu"]
)
def test_evaluation_and_unknown_keys_map_to_nothing(key: str) -> None:
    assert field_for(key) is None


def test_per_layer_keys_name_their_layer() -> None:
    assert layer_for("grad_2.0_norm/net.0.weight") == "net.0.weight"
    assert layer_for("grad_norm/encoder.layer1") == "encoder.layer1"
    assert layer_for("grad_2.0_norm/total") is None
    assert layer_for("loss") is None


def test_values_in_the_shapes_loggers_write() -> None:
    assert number("0.6793") == pytest.approx(0.6793)
    assert math.isnan(number("nan") or 0.0)
    assert number("Infinity") == math.inf
    assert number("tensor(2.5000)") == 2.5
    assert number("abc") is None
    assert map_record({"train/loss": "2.5", "step": 3.0, "epoch": 1}) == {"loss": 2.5, "step": 3}


def test_console_lines_of_common_loops() -> None:
    assert parse_line("step 10 | loss 2.31 | grad_norm 0.52 | lr 1.0e-03") == {
        "step": 10,
        "loss": 2.31,
        "grad_norm": 0.52,
        "lr": 1e-3,
    }
    assert parse_line("Epoch 1 Step 7: loss=nan, grad norm=inf")["step"] == 7  # type: ignore[index]
    assert parse_line("step 1/100 | train loss 4.3000 | norm 1.2000 | lr 6.00e-04") == {
        "step": 1,
        "loss": 4.3,
        "grad_norm": 1.2,
        "lr": 6e-4,
    }
    assert parse_line("step 250: train loss 1.91, val loss 1.99") is None  # an evaluation
    assert parse_line("Downloading shards: 100%|█████| 2/2") is None
    assert parse_line("layer_norm 0.3 step 4") is None  # no loss, no total norm


def test_hf_and_nanogpt_lines() -> None:
    bar = " 10%|█         | 2/20 [00:00<00:00, 25.12it/s]"
    record = parse_dict(bar + "{'loss': '0.6884', 'grad_norm': 'nan', 'learning_rate': 0.0085}")
    assert record == {"loss": "0.6884", "grad_norm": "nan", "learning_rate": "0.0085"}
    assert parse_iter("iter 100: loss 2.3456, time 12.34ms, mfu 12.34%") == {
        "step": 100,
        "loss": 2.3456,
    }
