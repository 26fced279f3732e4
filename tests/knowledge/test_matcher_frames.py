"""Quantity/trend frames and NaN-stage location (knowledge/matcher_frames.py).

Texts here are written for these tests, in phrasings unlike the evaluation set's.
"""

from __future__ import annotations

import pytest

from gradient_doctor.knowledge.matcher import match
from gradient_doctor.knowledge.matcher_frames import (
    cleared_stages,
    frame_evidence,
    frame_hits,
    layer_profile_hits,
    located_nan,
    read_frames,
)


@pytest.mark.parametrize(
    ("text", "quantity", "trend"),
    [
        ("The gnorm graph went vertical around noon.", "grad_norm", "vertical"),
        ("After 5k steps the loss plot goes blank.", "loss", "blank"),
        ("loss scale keeps halving and halving again and again", "loss_scale", "staircase_down"),
        ("the gradient magnitude creeps up steadily all week", "grad_norm", "ramp_up"),
        ("training loss: a saw-tooth pattern every epoch", "loss", "sawtooth"),
        ("grad norm curve: dead flat at 0 since the start", "grad_norm", "zero"),
    ],
)
def test_a_trend_belongs_to_the_quantity_named_before_it(
    text: str, quantity: str, trend: str
) -> None:
    frames = read_frames(text)
    assert [(f.quantity, f.trend) for f in frames] == [(quantity, trend)]


def test_a_sentence_without_a_quantity_continues_the_previous_subject() -> None:
    frames = read_frames("Look at the scaler widget. It keeps stepping down every hour.")
    assert [(f.quantity, f.trend) for f in frames] == [("loss_scale", "staircase_down")]


def test_a_held_out_loss_is_not_the_training_loss() -> None:
    assert read_frames("the validation loss goes blank after the eval crashed") == []


def test_the_earliest_frame_is_the_surest() -> None:
    hits = frame_hits("the grad plot shot straight up; minutes later the loss curve went blank")
    assert [h.entry_id for h in hits] == ["exploding-gradients", "loss-nan"]
    assert hits[0].strength > hits[1].strength


def test_a_rare_backoff_with_a_falling_loss_is_healthy() -> None:
    evidence = frame_evidence(
        "scaler value dips to 16384 now and then and recovers; loss keeps dropping"
    )
    assert [h.entry_id for h in evidence.hits] == ["healthy"]
    assert "amp-overflow-skips" in evidence.ruled_out


def test_trend_words_given_to_the_norm_do_not_count_for_loss_entries() -> None:
    evidence = frame_evidence("our grad norm plot is a needle farm: single spikes, straight back")
    assert "plateau" in evidence.discounted() and "loss-spikes" in evidence.discounted()
    assert "grad-norm-spikes" not in evidence.discounted()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "Loss printed just before backward: 1.93, perfectly normal. Right after backward a "
            "scan finds nan in the lm_head .grad first.",
            "nan-gradients",
        ),
        (
            "Parameters are all finite at step 300; at step 301 the loss is nan before backward "
            "is even called.",
            "nan-loss-before-backward",
        ),
        (
            "Loaded the EMA weights: 3 tensors are inf in the state_dict, and the logits are nan.",
            "nan-parameters",
        ),
    ],
)
def test_the_first_non_finite_stage_is_located(text: str, expected: str) -> None:
    hit = located_nan(text)
    assert hit is not None and hit.entry_id == expected


@pytest.mark.parametrize(
    "text",
    [
        "my loss is nan after 3k steps",  # nothing checked and found finite: the symptom
        "the grads are nan and the loss is nan",  # no stage cleared before the first bad one
        "inputs are nan, weights are fine",  # bad data is the words' and checks' job
    ],
)
def test_no_stage_is_located_without_a_finite_stage_before_it(text: str) -> None:
    assert located_nan(text) is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # A check's verdict after its name, and the last state said of a stage.
        (
            "1. inputs finite ..... ok\n2. weights finite ..... FAIL (head.weight 40 NaN)\n"
            "3. loss ..... nan",
            "nan-parameters",
        ),
        (
            "step 10: params finite: True\nstep 11: params finite: False, loss nan",
            "nan-parameters",
        ),
        # The loss non-finite where it is printed before backward, with no stage before it.
        ("loss (printed before .backward()): nan at iter 900", "nan-loss-before-backward"),
        # An inf told with its NaN denied, and a finite loss number of that same step.
        ("grad norm printed inf, not nan, and the loss for that step was 2.02", "inf-gradients"),
        # A table of gradient values under a heading that says so names parameters per row.
        (
            "per-param grad norms (loss 3.2, finite):\n  enc.0.attn.weight   inf\n"
            "  enc.0.mlp.weight    0.21",
            "inf-gradients",
        ),
        # One layer's grad against "every other" layer's: the stage is not finite.
        (
            "the loss looks fine; the out_proj grad has nan, every other grad looks normal",
            "nan-gradients",
        ),
        # A check on the inputs that came back non-finite.
        (
            "weights finite; torch.isfinite(batch['x']).all(): False, loss nan",
            "nonfinite-inputs",
        ),
    ],
)
def test_checks_told_in_logs_locate_the_stage(text: str, expected: str) -> None:
    hit = located_nan(text)
    assert hit is not None and hit.entry_id == expected


@pytest.mark.parametrize(
    "text",
    [
        "0 NaN/Inf, total grad norm 0.4-2.7, loss 2.31 -> 1.02",
        "nan 0 | inf 0 | loss 0.93",
        "no NaN or Inf anywhere, loss 2.8 -> 1.1",
        # A backward function's "0th output" is a gradient, not the model's output.
        "loss 1.30 just before backward; Function 'MulBackward0' returned nan values in its 0th"
        " output",
    ],
)
def test_zero_counts_and_anomaly_outputs_locate_nothing_wrong(text: str) -> None:
    hit = located_nan(text)
    assert hit is None or hit.entry_id == "nan-gradients"


def test_a_stage_said_to_hold_no_nan_is_cleared() -> None:
    assert cleared_stages("no nan in any parameter, yet the loss is nan") == frozenset(
        {"nan-parameters"}
    )
    assert cleared_stages("the loss is nan") == frozenset()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "the grad norm graph looks like a lawn with weeds: one point, then right back",
            "grad-norm-spikes",
        ),
        (
            "total gradient norm sits exactly 0.25 all run, never budges from 0.25",
            "clipping-slow-convergence",
        ),
        (
            "gnorm chart goes through the roof and then the loss plot stops drawing",
            "exploding-gradients",
        ),
    ],
)
def test_frames_reach_their_entry_through_match(text: str, expected: str) -> None:
    result = match(text)
    assert result.matches[0].id == expected, [(m.id, m.score) for m in result.matches[:3]]
    assert any(r.startswith("text: the ") for r in result.matches[0].reasons)


def test_a_starved_layer_profile_is_vanishing_when_training_does_not_improve() -> None:
    text = "grad norms per block: embed 2e-11, block3 4e-08, block7 1e-05, lm_head 3e-03"
    hits = layer_profile_hits(text, 1000.0, improving=False)
    assert [h.entry_id for h in hits] == ["vanishing-gradients"]
    assert "embed" in hits[0].reason and "lm_head" in hits[0].reason
    assert layer_profile_hits(text, 1e9, improving=False) == []  # the profile's threshold


def test_a_gentle_profile_answers_a_worry_about_the_first_layer() -> None:
    text = (
        "is my stem vanishing? grad norms stem 0.03, stage2 0.07, head 0.2, and accuracy keeps "
        "improving"
    )
    assert [h.entry_id for h in layer_profile_hits(text, 1000.0, improving=True)] == ["healthy"]
    assert layer_profile_hits(text, 1000.0, improving=False) == []


def test_a_profile_told_from_the_output_down_is_read_from_the_input() -> None:
    text = "grad norms: head 5e-03, block2 1e-06, block1 3e-10, loss flat"
    hits = layer_profile_hits(text, 1000.0, improving=False)
    assert [h.entry_id for h in hits] == ["vanishing-gradients"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("the gradient size chart sits in the thousands, sometimes tens of thousands", "huge"),
        ("the grads on the critic are massive on every update", "huge"),
        ("grad norm 0.7 mostly, then one step at 250 and the next step it's back to 0.7", "needle"),
        ("the grad norm line has been going up slowly like a ramp for days", "ramp_up"),
    ],
)
def test_sizes_returns_and_ramps_in_lay_words(text: str, expected: str) -> None:
    assert any(f.quantity == "grad_norm" and f.trend == expected for f in read_frames(text))


@pytest.mark.parametrize(
    "text",
    [
        "my huge model's grad norm is fine, around 1",  # the size word is the model's
        "the grad norm isn't huge, about 3",
        "histogram of the gradients: a thin needle at zero for the first conv layers",
    ],
)
def test_size_words_of_something_else_and_histogram_needles_are_no_trend(text: str) -> None:
    assert not any(f.trend in ("huge", "needle") for f in read_frames(text))


def test_every_trend_match_in_the_eval_set_holds_one_of_its_cues() -> None:
    """The cue words only skip regexes that could not match (a speed-up, never a filter)."""
    from pathlib import Path

    import yaml

    from gradient_doctor.knowledge import matcher_frames

    items = yaml.safe_load(Path(__file__).with_name("match_eval.yaml").read_text("utf-8"))
    for item in items["items"]:
        for trend, pattern in matcher_frames._TRENDS:
            for m in pattern.finditer(item["text"]):
                cues = matcher_frames._TREND_CUES[trend]
                assert any(cue in m.group(0).lower() for cue in cues), (trend, m.group(0))


@pytest.mark.parametrize(
    "text",
    [
        "the clip_fraction panel has been 0.0 for the whole run",
        'the "fraction of steps clipped" panel stays at 0 for the whole run',
    ],
)
def test_a_clipping_counter_at_zero_all_run_is_clipping_that_never_acts(text: str) -> None:
    assert any(h.entry_id == "clip-never-active" for h in frame_evidence(text).hits)
