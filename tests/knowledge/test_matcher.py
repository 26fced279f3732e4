"""The free-text matcher: held-out evaluation set, number rules, code rules, scope, robustness."""

from __future__ import annotations

import json
import marshal
import math
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any, get_args

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gradient_doctor.knowledge import _code as code_module
from gradient_doctor.knowledge import _numbers as numbers_module
from gradient_doctor.knowledge import findings, load_knowledge, models
from gradient_doctor.knowledge import matcher as matcher_module
from gradient_doctor.knowledge._code import (
    fragment_source,
    prose_hits,
    segments,
    split_code,
    without_code,
)
from gradient_doctor.knowledge._numbers import Series, read_quantities, read_series
from gradient_doctor.knowledge.matcher import Match, Matcher, MatchResult, get_matcher, match
from tests.conftest import REPO, run_cli

EVAL_FILE = Path(__file__).with_name("match_eval.yaml")
EVAL_ITEMS: list[dict[str, Any]] = yaml.safe_load(EVAL_FILE.read_text("utf-8"))["items"]


def _item_id(index: int, item: dict[str, Any]) -> str:
    return f"{index:03d}-{item['group']}-{item['expect']}"


def _top_ids(result: MatchResult, n: int = 1) -> list[str]:
    return [m.id for m in result.matches[:n]]


# -- the evaluation set --------------------------------------------------------------------


def _eval_param(index: int, item: dict[str, Any]) -> Any:
    marks = []
    if item.get("known_miss"):
        marks.append(pytest.mark.xfail(reason=" ".join(item["known_miss"].split()), strict=True))
    return pytest.param(item, id=_item_id(index, item), marks=marks)


@pytest.mark.parametrize("item", [_eval_param(i, item) for i, item in enumerate(EVAL_ITEMS)])
def test_eval_item_ranks_first(item: dict[str, Any]) -> None:
    result = match(item["text"], code=item.get("code"), top_k=5)
    ranked = [(m.id, round(m.score, 2)) for m in result.matches[:3]]
    assert _top_ids(result) == [item["expect"]], f"{item['text']!r} ranked {ranked}"
    if item["expect"] == "out-of-scope":
        assert result.out_of_scope and result.pointer


def test_eval_set_covers_the_catalogue() -> None:
    """Every rationalization and symptom twice, every red flag and signal once, and extras."""
    kb = load_knowledge()
    counts = Counter(item["expect"] for item in EVAL_ITEMS)
    groups = Counter(item["group"] for item in EVAL_ITEMS)
    for entry in kb.by_kind("rationalization") + kb.by_kind("symptom"):
        assert counts[entry.id] >= 2, entry.id
    for entry in kb.by_kind("red-flag") + kb.by_kind("signal"):
        assert counts[entry.id] >= 1, entry.id
    assert groups["out-of-scope"] >= 6
    assert groups["log"] >= 5 and groups["typo"] >= 5
    assert all(item["expect"] in kb.entries for item in EVAL_ITEMS)

    # Accuracy is reported, not asserted here (each item is asserted above).
    per_group: dict[str, list[int]] = {}
    for item in EVAL_ITEMS:
        ids = _top_ids(match(item["text"], code=item.get("code")), 3)
        tally = per_group.setdefault(item["group"], [0, 0, 0])
        tally[0] += 1
        tally[1] += ids[:1] == [item["expect"]]
        tally[2] += item["expect"] in ids
    n, top1, top3 = (sum(t[i] for t in per_group.values()) for i in range(3))
    misses = sum(1 for item in EVAL_ITEMS if item.get("known_miss"))
    print(
        f"\nmatcher accuracy on {n} held-out items: top-1 {top1 / n:.1%}, top-3 {top3 / n:.1%}"
        f" ({misses} known misses)"
    )
    for group, (count, first, three) in per_group.items():
        print(f"  {group:16s} top-1 {first}/{count}  top-3 {three}/{count}")


def test_eval_texts_are_not_copied_from_the_index() -> None:
    """The evaluation set is held out: no item repeats an entry's paraphrase or phrasing."""
    kb = load_knowledge()
    indexed = {
        " ".join(text.lower().split())
        for entry in kb.entries.values()
        for text in [*getattr(entry, "paraphrases", []), *getattr(entry, "phrasings", [])]
    }
    for item in EVAL_ITEMS:
        assert " ".join(item["text"].lower().split()) not in indexed, item["text"]


# -- numbers and log lines -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected", "reason_part"),
    [
        ("grad norm 3.4e+04", "exploding-gradients", "> 1000 (critical, profile default, from CG)"),
        ("total_norm: 250.3", "exploding-gradients", "> 100 (warning, profile default"),
        ("grad_norm=0.0000002", "vanishing-gradients", "< 1e-06 (warning, profile default"),
        ("grad norm 1e-10 and the loss is stuck", "vanishing-gradients", "(critical"),
        ("grad norm 0.0", "zero-gradients", "exactly 0"),
        ("loss: nan", "loss-nan", "loss nan"),
        ("step 9 | loss=inf", "loss-nan", "loss inf"),
        ("step 12 grad_norm=inf", "inf-gradients", "gradients inf"),
        ("scale 65536 → 1", "amp-overflow-skips", "6.6e+04 → 1"),
        ("dead 63%", "dead-neurons", "63% > 50% (critical"),
        ("activations: 70% zeros", "many-zero-activations", "70% > 50%"),
        ("55% of parameters have an all-zero gradient", "zero-gradients", "55% > 50%"),
        ("fc1 grad/param ratio 3.5", "grad-param-ratio", "> 1"),
        ("after step 900 the weights of fc2 are all nan", "nan-parameters", "non-finite"),
        ("grad_norm: 4e-7 but the loss is still decreasing nicely", "small-grads-mean-broken", ""),
        ("loss scale sits at 0.25 after thousands of skips", "amp-overflow-skips", "halved it"),
        ("40 percent of the GELU units never fire on held-out data", "dead-neurons", "40% > 20%"),
        ("Just set max_norm to 0.005 and nothing will ever explode.", "clip-harder", "< 0.1"),
        ("||g||/||w|| = 4 in the stem conv", "grad-param-ratio", "> 1"),
        ("ratio of gradient norm to parameter norm: 3e-8 (embedding)", "grad-param-ratio", "<"),
    ],
)
def test_number_rules(text: str, expected: str, reason_part: str) -> None:
    result = match(text)
    assert _top_ids(result) == [expected], [(m.id, m.score) for m in result.matches]
    assert any(reason_part in reason for reason in result.matches[0].reasons)


def test_numbers_are_read_from_the_text() -> None:
    numbers = match("epoch 3 | loss: nan | grad_norm=1,523.2 | scale 65536 -> 32768").numbers
    assert math.isnan(numbers["loss"])
    assert numbers["grad_norm"] == pytest.approx(1523.2)
    assert numbers["amp_scale_from"] == 65536 and numbers["amp_scale_to"] == 32768
    assert match("47% zeros in the activations").numbers == {"zero_activation_fraction": 0.47}
    assert match("grad norm 10^-8").numbers["grad_norm"] == pytest.approx(1e-8)
    # What clip_grad_norm_ returns is the total norm (before clipping).
    assert match("clip_grad_norm_(params, 1.0) returns 3.2").numbers["grad_norm"] == 3.2
    assert match("the loss scale stays at 2^15").numbers == {"amp_scale_level": 32768.0}
    assert "amp_scale_level" not in match("loss scale is 65536 -> 2").numbers
    assert match("scale moved between 2^14 and 2^16").numbers == {"amp_scale_level": 16384.0}
    assert match("62% of weights got grad == 0").numbers == {"zero_grad_fraction": 0.62}
    # A vocabulary size is not a loss value.
    assert read_series("loss 6.9 at step 0, 6.9 at 5k (vocab 1000)") == [Series("loss", (6.9, 6.9))]
    # A number joined to a name by a hyphen names a dataset or model, not a reading; a range
    # between two numbers still reads both.
    text = "train loss 2.5 at epoch 1, 2.4 at epoch 5 with ResNet-50 on CIFAR-100"
    assert read_series(text) == [Series("loss", (2.5, 2.4))]
    (band,) = read_series("grad norm 0.4-0.7 all run")
    assert band.name == "grad_norm" and band.ranges == ((0.4, 0.7),)


def _rule_reasons(result: MatchResult, entry_id: str) -> list[str]:
    for m in result.matches:
        if m.id == entry_id:
            return [r for r in m.reasons if not r.startswith(("words:", "phrases:", "close"))]
    return []


def test_nan_loss_points_at_gradients_only_when_they_are_mentioned() -> None:
    plain = match("loss: nan at step 400", top_k=10)
    with_grads = match("loss: nan at step 400 and the gradients look broken", top_k=10)
    assert _top_ids(plain) == ["loss-nan"] and _top_ids(with_grads) == ["loss-nan"]
    assert not _rule_reasons(plain, "nan-gradients")
    assert any("gradients are mentioned" in r for r in _rule_reasons(with_grads, "nan-gradients"))
    assert "nan-gradients" in _top_ids(with_grads, 3)


def test_healthy_norm_is_not_called_exploding() -> None:
    result = match("grad_norm 5.1")
    assert "exploding-gradients" not in _top_ids(result, 3)
    assert _top_ids(result) == ["healthy"]


def test_thresholds_follow_the_profile() -> None:
    """50 is healthy-ish under the default profile (warning > 100) but critical under GS (> 10)."""
    kb = load_knowledge()
    default = Matcher(kb).match("grad norm 50")
    gs = Matcher(kb, profile="gs").match("grad norm 50")
    assert "exploding-gradients" not in _top_ids(default, 1)
    assert _top_ids(gs) == ["exploding-gradients"]
    assert any("profile gs, from GS" in r for r in gs.matches[0].reasons)


# -- code fragments ------------------------------------------------------------------------

CORRECT_AMP_LOOP = """
for x, y in loader:
    optimizer.zero_grad()
    with torch.autocast("cuda", dtype=torch.float16):
        loss = criterion(model(x), y)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
    scaler.step(optimizer)
    scaler.update()
"""

CORRECT_ACCUMULATION = """
for i, (x, y) in enumerate(loader):
    loss = criterion(model(x), y) / accum_steps
    loss.backward()
    if (i + 1) % accum_steps == 0 or i + 1 == len(loader):
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
"""


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        (
            "optimizer.step()\ntorch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)",
            "clip-after-step",
        ),
        ("loss.backward()\noptimizer.step()\nclip_grad_norm_(…)\n", "clip-after-step"),
        (
            "scaler.scale(loss).backward()\nclip_grad_norm_(model.parameters(), 1.0)\n"
            "scaler.step(optimizer)\nscaler.update()",
            "amp-clip-without-unscale",
        ),
        (
            "scaler.scale(loss).backward()\noptimizer.step()\nscaler.update()",
            "amp-step-bypasses-scaler",
        ),
        (
            "loss.backward()\ntorch.nn.utils.clip_grad_value_(model.parameters(), 0.5)\n"
            "optimizer.step()",
            "value-clipping",
        ),
        (
            "loss.backward()\nclip_grad_norm_(model.parameters(), max_norm=0.01)\noptimizer.step()",
            "clip-too-aggressive",
        ),
        # No indentation at all, and elided lines: the order still tells.
        (
            "for i, b in enumerate(loader):\nloss = model(b)\nloss.backward()\n...\n"
            "if (i + 1) % accum == 0:\noptimizer.step()\noptimizer.zero_grad()",
            "accum-unscaled-loss",
        ),
        (
            "for i, b in enumerate(loader):\n    optimizer.zero_grad()\n"
            "    (model(b) / 4).backward()\n    if (i + 1) % 4 == 0:\n        optimizer.step()",
            "accum-zero-grad-every-microstep",
        ),
        (
            "for i, b in enumerate(loader):\n    (model(b) / n).backward()\n"
            "    if (i + 1) % n == 0:\n        optimizer.step()",
            "accum-missing-zero-grad",
        ),
        (
            "scaler.scale(loss).backward()\nscaler.unscale_(optimizer)\n"
            "clip_grad_norm_(params, 1.0)\nscaler.unscale_(optimizer)\nscaler.step(optimizer)",
            "amp-double-unscale",
        ),
        (
            "loss.backward()\noptimizer.step()\noptimizer.zero_grad()\n"
            "grad_norm = total_norm(model)\nlog(grad_norm)",
            "monitor-after-zero-grad",
        ),
    ],
)
def test_code_rules(code: str, expected: str) -> None:
    result = match("what is wrong here?", code=code)
    assert result.code_detected
    assert _top_ids(result) == [expected], [(m.id, m.reasons[:1]) for m in result.matches]
    assert result.matches[0].reasons[0].startswith("code:")


def test_code_pasted_inside_the_text_is_found() -> None:
    text = (
        "Training is unstable, here is my loop:\n```python\nloss.backward()\noptimizer.step()\n"
        "torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n```\n"
    )
    result = match(text)
    assert result.code_detected
    assert _top_ids(result) == ["clip-after-step"]


@pytest.mark.parametrize("code", [CORRECT_AMP_LOOP, CORRECT_ACCUMULATION])
def test_correct_loops_raise_no_code_red_flag(code: str) -> None:
    result = match("is this loop right?", code=code, top_k=10)
    flagged = {m.id for m in result.matches if any(r.startswith("code:") for r in m.reasons)}
    assert not flagged & {
        "clip-after-step",
        "clip-before-backward",
        "amp-clip-without-unscale",
        "amp-step-bypasses-scaler",
        "accum-unscaled-loss",
        "accum-missing-zero-grad",
        "accum-zero-grad-every-microstep",
        "accum-clip-every-microstep",
        "accum-scheduler-per-microbatch",
        "monitor-after-zero-grad",
    }, flagged


# -- fragments through the static analyser -----------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # statements joined by ';' with an inline block body (Python's reading: both in the if)
        ("my loop: `loss.backward(); if (i+1) % n == 0: opt.step(); opt.zero_grad()`", None),
        # a loop body without its loop, with the update gated
        (
            "```\nloss = model(b) / 4\nloss.backward()\nopt.zero_grad()\n"
            "if step % 4 == 0:\n    opt.step()\n```",
            "accum-zero-grad-every-microstep",
        ),
        # pseudo-code with '...' and one line pasted at the wrong indentation
        (
            "```\nfor x, y in dl:\n    ...\n    scaler.scale(loss).backward()\n"
            "  clip_grad_norm_(model.parameters(), 1.0)\n    scaler.step(opt)\n"
            "    scaler.update()\n```",
            "amp-clip-without-unscale",
        ),
        # inline backticks, in order, around prose
        (
            "`scaler.scale(loss).backward()` then `optimizer.step()` then `scaler.update()`",
            "amp-step-bypasses-scaler",
        ),
        # a Markdown block indented by four spaces
        (
            "is this right?\n\n    for i, b in enumerate(dl):\n        (model(b) / 8).backward()\n"
            "        if i % 8 == 0:\n            opt.step()\n",
            "accum-missing-zero-grad",
        ),
        # statements in a prose line, with a remark after the code
        (
            "I log it like this: opt.step(); opt.zero_grad(); gn = total_norm(model) -- always 0",
            "monitor-after-zero-grad",
        ),
    ],
    ids=["semicolons", "loop-body", "ellipsis-indent", "inline", "indented-block", "prose-line"],
)
def test_code_fragments_are_repaired_and_analysed(text: str, expected: str | None) -> None:
    result = match(text)
    assert result.code_detected
    assert _top_ids(result) == [expected or "accum-unscaled-loss"], [
        (m.id, m.reasons[:1]) for m in result.matches
    ]
    assert result.matches[0].reasons[0].startswith("code:")


def test_fragment_source_rebuilds_blocks() -> None:
    source = fragment_source("for i, b in enumerate(dl): loss = f(b); if i % 4 == 0: opt.step()")
    assert source == (
        "for i, b in enumerate(dl):\n    loss = f(b)\n    if i % 4 == 0:\n        opt.step()\n"
    )
    flat = fragment_source("for b in dl:\nloss.backward()\nif i % 2 == 0:\nopt.step()\nelse:\npass")
    assert flat is not None and "\n        opt.step()\n    else:\n        pass" in flat
    assert fragment_source("this is just a sentence, not code at all") is None
    assert fragment_source("opt.step()  <- the optimizer\nwhy does it fail") == "opt.step()\n"


def test_sentence_rule_triggers_never_hide_a_match(monkeypatch: pytest.MonkeyPatch) -> None:
    """A rule skipped for lack of its trigger words would not have matched anyway."""
    texts = [item["text"] for item in EVAL_ITEMS]
    gated = [prose_hits(split_code(t).prose) for t in texts]
    monkeypatch.setattr(code_module, "_PROSE_TRIGGERS", {})
    ungated = [prose_hits(split_code(t).prose) for t in texts]
    assert gated == ungated
    # The same for the number patterns ("" is in every text: nothing is skipped).
    gated_numbers = [read_quantities(t) for t in texts]
    for value in vars(numbers_module).values():
        if isinstance(value, numbers_module._Lazy):
            monkeypatch.setattr(value, "triggers", ("",))
    assert [read_quantities(t) for t in texts] == gated_numbers


def test_static_analyser_findings_are_cited() -> None:
    result = match("why?", code="loss.backward()\noptimizer.step()\nclip_grad_norm_(p, 1.0)")
    assert any("static analyser" in r for r in result.matches[0].reasons)


# -- numbers written as series ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected", "reason_part"),
    [
        ("train loss 0.9 at step 1k, 4 at 10k, 25 at 30k", "loss-diverging", "its best value"),
        ("grad norm: 0.5, 1.4, 3.9, 11, 38", "grad-norm-rising", "rises"),
        ("grad norm 1.2 -> 0.3 -> 0.05 -> 0.004 -> 0.0002", "grad-norm-decaying", "decays"),
        ("norms: 1.0 1.1 0.9 1.2 95 1.0 1.1", "grad-norm-spikes", "spike factor"),
        ("loss 0.45, 0.44, 3.9, 0.45, 0.43", "loss-spikes", "comes back"),
        ("loss 2.31, 2.30, 2.31, 2.30", "loss-stuck", "flat"),
        ("val loss 0.71, 0.70, 0.71, 0.70 after dropping from 2.3", "plateau", "stays flat"),
        ("grad norm is ~800 at first and then settles around 1-2. normal?", "healthy", "settles"),
        (
            "gradient norm per layer: emb 0.001, block1 0.02, head 0.5",
            "layer-norm-spread",
            "per-layer norms differ",
        ),
        ("loss 4.2, then 1.8 by step 2k, and it has sat at 1.8 since", "plateau", "one level"),
        # Issue 15 (fresh20/21 families), own examples: an excursion of several readings that
        # returns to the usual level is spikes, not a trend.
        (
            "total norm hovers near 0.3-0.5, then 60 and 85 at two steps, then 0.4 again",
            "grad-norm-spikes",
            "then back to it",
        ),
        # Every reading far past the exploding threshold, no trend: exploding by size.
        ("grad norm per step: 5.5e3, 3.1e3, 7.7e3, 4.0e3", "exploding-gradients", "critical"),
        # A rise that ends far past the threshold: the size ranks above the trend.
        (
            "grad norm at step 0 2.1, step 20 640, step 40 8,800, step 60 31,000",
            "exploding-gradients",
            "critical",
        ),
        # A nanoGPT-style log whose loss jumps for one reading and comes back.
        (
            "iter 300: loss 4.10\niter 310: loss 4.05\niter 320: loss 8.30\niter 330: loss 4.20",
            "loss-spikes",
            "comes back",
        ),
        # After its best the loss climbs at every reading, past twice its best.
        ("loss 9.8, 6.1, 5.5, 6.9, 8.4, 12.3", "loss-diverging", "climbs at every reading"),
        # Two layers named by their module type, not the word "layer".
        (
            "norm of the first Conv is 2e-9 and of the last Conv 6e-3",
            "vanishing-gradients",
            "early layer is the small one",
        ),
    ],
)
def test_series_rules(text: str, expected: str, reason_part: str) -> None:
    result = match(text)
    assert _top_ids(result) == [expected], [(m.id, m.reasons[:1]) for m in result.matches]
    assert any(reason_part in r for r in result.matches[0].reasons), result.matches[0].reasons


def test_series_are_reported() -> None:
    result = match("grad norm log: step 0 0.8, step 1000 2.5, step 2000 9, step 3000 40")
    assert result.series == {"grad_norm": [0.8, 2.5, 9.0, 40.0]}


@pytest.mark.parametrize(
    "text",
    [
        "logged the loss just before calling backward() and on step 4410 it is already nan",
        "we check the loss prior to backward, and at the failing iteration it is already inf",
    ],
)
def test_loss_already_nonfinite_before_backward(text: str) -> None:
    assert _top_ids(match(text)) == ["nan-loss-before-backward"]


def test_thousands_separators_make_one_value() -> None:
    result = match("grad norm: step 10 1,250, step 20 3,400, step 30 12,000.")
    assert result.series == {"grad_norm": [1250.0, 3400.0, 12000.0]}


def test_values_per_bin_of_steps_are_a_series() -> None:
    text = "loss, mean per 1k steps:\n0-1k 4.1 | 1k-2k 3.2 | 2k-3k 2.9 | 3k-4k 2.7\n"
    assert read_series(text) == [Series("loss", (4.1, 3.2, 2.9, 2.7))]
    # Cells that are not a bin and a value are not read.
    assert read_series("loss:\na | b | c | d") == []


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "step  loss  grad_norm\n10  2.0  1.5e3\n20  2.1  2.6e3\n30  2.1  4.1e3\n40  2.3  7e3",
            "exploding-gradients",
        ),
        (
            "grad norm per layer (loss stuck at 4.6 since step ~80):\n  a.w  1e-11\n  b.w  1e-8\n"
            "  c.w  1e-5\n  d.w  1e-2\n",
            "vanishing-gradients",
        ),
        (
            "Over an epoch, 60% of the ReLU units in layer 4 output exactly 0 for every input.",
            "dead-neurons",
        ),
    ],
)
def test_tables_and_counts_reach_their_entry(text: str, expected: str) -> None:
    assert _top_ids(match(text)) == [expected]


@pytest.mark.parametrize(
    "text",
    [
        "I log (w_after - w_before).norm() / w_before.norm(): the embedding sits at 0.4",
        "||theta_new - theta_old|| / ||theta_old|| per step is 0.25 on the head",
        "|delta w| / |w| reads 0.3 on every step for ln_f",
        "update/param norm ratio with lr 1e-4: around 1e-8 in all layers",
        "Each step I compute (p - p_prev).norm() / p_prev.norm(). For the stem it is 0.5.",
    ],
)
def test_update_formulas_in_any_notation_are_read(text: str) -> None:
    values = [q.value for q in read_quantities(text) if q.name == "update_ratio"]
    assert values and all(v != 1e-4 for v in values), values
    assert _top_ids(match(text)) == ["update-param-ratio"]


def test_an_update_formula_reads_no_other_ratio() -> None:
    text = "|dw|/|w| is 1e-3 everywhere; |g|/|w| is 0.4 on the head"
    assert [q.value for q in read_quantities(text) if q.name == "update_ratio"] == [1e-3]


def test_whitespace_aligned_rows_are_read_as_series() -> None:
    """Notebook and logger output aligned with spaces: a header over numbers, a value per
    named layer under a line naming the norm, a step and a value under a line naming it."""
    header = "iter   loss   grad_norm\n10     4.0    2.0\n20     3.1    9.0\n30     2.9    80.0"
    assert read_series(header) == [
        Series("loss", (4.0, 3.1, 2.9)),
        Series("grad_norm", (2.0, 9.0, 80.0)),
    ]
    layers = "grad norm of every layer:\n  enc.0.w   1e-9\n  enc.1.w   1e-6\n  dec.w     1e-3\n"
    assert read_series(layers) == [Series("layer_norms", (1e-9, 1e-6, 1e-3))]
    steps = "loss printed:\nstep 0    3.5\nstep 100  3.1\n...\nstep 900  9.8\n"
    assert read_series(steps) == [Series("loss", (3.5, 3.1, 9.8))]
    scale = "it 0 loss 2.0 scale 1024\nit 1 loss 2.0 scale 512\nit 2 loss 2.0 scale 256"
    assert Series("amp_scale", (1024.0, 512.0, 256.0)) in read_series(scale)
    # Rows under a line naming nothing, or labels that repeat, are not read.
    assert read_series("results:\nfoo 1.0\nbar 2.0\nbaz 3.0") == []
    assert read_series("grad norm:\nrun 1.0\nrun 2.0\nrun 3.0") == []
    # "10 classes" is a count even where "classes" ends the loss's stretch of text.
    assert read_series("loss stays at 2.30 (10 classes)") == []


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "loss flat at chance. grad norm per layer:\nl0  1e-10\nl1  1e-8\nl2  1e-6\nl3  1e-3",
            "vanishing-gradients",
        ),
        ("grad norm per layer:\na  0.3\nb  0.4\nc  25.0\nd  0.35", "layer-norm-spread"),
        (
            "fp16 run:\nstep 0 scale 65536\nstep 1 scale 16384\nstep 2 scale 2048",
            "amp-overflow-skips",
        ),
    ],
)
def test_aligned_listings_reach_their_entry(text: str, expected: str) -> None:
    assert _top_ids(match(text)) == [expected]


def test_series_leave_steps_and_counts_out() -> None:
    text = "grad norm: step 0 0.8, step 1000 2.5, step 2000 9 on 8 GPUs, 30% of the time"
    assert read_series(text) == [Series("grad_norm", (0.8, 2.5, 9.0))]
    assert read_series("grad norm between 0.3 and 1.2") == [
        Series("grad_norm", (pytest.approx(0.6),), ((0.3, 1.2),))
    ]
    assert read_series("train loss 2.1 at 5k, 1.9 at 10k; lr 3e-4, batch 64") == [
        Series("loss", (2.1, 1.9))
    ]
    # A pasted table: each column whose header names a quantity is a series.
    table = "| epoch | train loss | gnorm |\n|:-:|:-:|:-:|\n| 1 | 2.0 | 1.5 |\n| 2 | 1.6 | 1.2 |\n"
    assert read_series(table) == [Series("loss", (2.0, 1.6)), Series("grad_norm", (1.5, 1.2))]
    csv = "step,loss,grad_norm\n10,4.0,2.0\n20,3.1,1.8\n30,2.9,1.7"
    assert [s.name for s in read_series(csv)] == ["loss", "grad_norm"]
    assert read_series("loss 2.1, 1.9, 1.8") == [Series("loss", (2.1, 1.9, 1.8))]
    # Norms listed layer by layer are a spread, not a trend over time.
    assert read_series("layer-wise grad norms: embed 0.001, attn 0.02, head 0.5") == [
        Series("layer_norms", (0.001, 0.02, 0.5))
    ]
    # A call on a parenthesised expression is code: "(loss / 4).backward()".
    assert "(loss / 4).backward()" in split_code("(loss / 4).backward()\nopt.step()").code
    # Code is not a series: ``log(p, -1)`` holds no loss values.
    assert read_series(without_code("loss = -(y * torch.log(p, -1)).mean()")) == []


# -- healthy, and the reason ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected", "reason_part"),
    [
        (
            "grad norm stays between 0.3 and 1.2 and the loss is dropping, is that normal?",
            "healthy",
            "whether this is normal",
        ),
        (
            "{'loss': 1.23, 'grad_norm': 0.9} ... {'loss': 0.98, 'grad_norm': 0.7} fine?",
            "healthy",
            "training improves",
        ),
        (
            "grad norm is around 2e-3 but val accuracy keeps going up, are my gradients vanishing?",
            "small-grads-mean-broken",
            "still improves",
        ),
        (
            "layer-wise grad norms sit between 0.2 and 0.9 and the loss is dropping, any issue?",
            "healthy",
            "layers are balanced",
        ),
        (
            "the GradScaler scale holds at 32768 and the loss is decreasing, fine?",
            "healthy",
            "loss scale holds",
        ),
        (
            "clip_grad_norm_ returns 0.3-0.6 against max_norm 1.0 while the loss decreases",
            "healthy",
            "inside the healthy range",
        ),
        (
            "eval loss follows the train loss closely and the grad norm is about 1",
            "healthy",
            "training improves",
        ),
        # A ratio inside its normal band says the ratio signal is absent.
        (
            "gradient-to-weight ratio sits near 1e-2 in each block and the loss keeps falling",
            "healthy",
            "grad/param ratio 0.01 is inside",
        ),
        (
            "update ratio (||dw||/||w||) about 2e-3 across layers, is this ok?",
            "healthy",
            "of its usual",
        ),
    ],
)
def test_healthy_situations_say_why(text: str, expected: str, reason_part: str) -> None:
    result = match(text)
    assert _top_ids(result) == [expected], [(m.id, m.reasons[:1]) for m in result.matches]
    assert any(reason_part in r for r in result.matches[0].reasons), result.matches[0].reasons


def test_healthy_numbers_next_to_a_problem_stay_weak() -> None:
    result = match("grad norm 0.8 every step but loss: nan at step 400, is that normal?")
    assert _top_ids(result) == ["loss-nan"]


# -- named causes ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "cause", "effect"),
    [
        (
            "The first layers get ~1e-9 gradients. It's a 50-layer tanh MLP.",
            "saturating-deep-net",
            "vanishing-gradients",
        ),
        (
            "Loss went to inf; the culprit is torch.exp(logits) in my loss with no clamp.",
            "unstable-loss-op",
            "loss-nan",
        ),
        (
            "Loss became NaN; traced it to torch.log of a zero probability in the focal loss.",
            "unstable-loss-op",
            "loss-nan",
        ),
        # A signal defined as the origin (the data) ranks above the NaN it explains.
        (
            "the culprit: a few csv rows contain inf in the 'age' field, so the loss hits NaN",
            "nonfinite-inputs",
            "loss-nan",
        ),
    ],
)
def test_a_named_cause_ranks_above_what_it_causes(text: str, cause: str, effect: str) -> None:
    result = match(text, top_k=5)
    ids = _top_ids(result, 5)
    assert ids[0] == cause and effect in ids, ids


def test_an_id_without_its_order_word_is_not_named() -> None:
    # "clip ... step" without "after" does not name clip-after-step, so the norm reading wins.
    result = match("clip_grad_norm_ returns 400 every step", top_k=3)
    assert _top_ids(result) == ["exploding-gradients"], result.matches
    assert _top_ids(match("I clip after the optimizer step")) == ["clip-after-step"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # Counts that do not divide: the last micro-batches of the epoch are never applied.
        (
            "500 batches per epoch, optimizer update every 16: is the tail lost?",
            "accum-leftover-batches",
        ),
        (
            "Relying on clipping shows the model is broken, fix the init instead.",
            "clipping-is-a-hack",
        ),
        (
            "Activation checkpointing breaks gradient clipping, you can't use both.",
            "checkpointing-breaks-clipping",
        ),
        # Nothing about gradients or norms: the loss spike, not a grad-norm spike.
        ("the training loss leaps up and comes back down every few thousand steps", "loss-spikes"),
        ("we clamp all gradient values to [-1, 1] before stepping", "value-clipping"),
        (
            "max_norm is 20, the norm never goes above 4, and the run still blows up",
            "clip-never-active",
        ),
        (
            "clip_grad_norm_(params, ...) is there, still NaNs after 3k steps",
            "clipping-did-not-fix-nan",
        ),
        ("Maybe swap to Adagrad, the optimizer may be the culprit.", "switch-optimizer"),
        ("we clip after backward but unscale_ is not called anywhere", "amp-clip-without-unscale"),
        ("loss stays at 1.2 for 30 epochs now, after a quick early decrease", "plateau"),
        ("loss 2.3 at the start and still 2.3 at step 9000", "loss-stuck"),
        (
            "only the backward goes inside model.no_sync(), the forward runs outside it",
            "ddp-no-sync-misplaced",
        ),
    ],
)
def test_claims_and_counts_in_words(text: str, expected: str) -> None:
    result = match(text, top_k=3)
    assert _top_ids(result) == [expected], [(m.id, m.score) for m in result.matches]


def test_a_paper_silent_about_clipping_is_not_a_paper_that_did_not_clip() -> None:
    silent = match("The appendix lists no clipping setting, so our rerun won't clip.", top_k=3)
    assert _top_ids(silent) == ["paper-does-not-mention-clipping"], silent.matches
    assert any("says nothing about clipping" in r for r in silent.matches[0].reasons)


def test_the_clipping_question_needs_the_word_clip() -> None:
    result = match("norm near 30 early on, then about 1 for the rest; loss falls nicely", top_k=5)
    assert "is-clipping-needed" not in _top_ids(result, 5)
    assert _top_ids(result) == ["healthy"]


# -- scope -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "What learning rate should I start from for ResNet-50 on ImageNet?",
        "How do I split my dataset into train and validation sets?",
        "Which LR scheduler works best with AdamW for a ViT?",
        "What learning rate should I use for a residual network?",
    ],
)
def test_out_of_scope_questions(text: str) -> None:
    result = match(text)
    assert result.out_of_scope
    assert _top_ids(result) == ["out-of-scope"]
    assert result.pointer and "learning" in result.pointer.lower()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("I lowered the LR and still get NaN", "lower-lr-for-nan"),
        ("Which learning-rate warmup avoids the loss spikes I keep seeing?", "loss-spikes"),
        ("My learning rate schedule has warmup but the gradient norm explodes at step 800", None),
        # Said to be fine in one clause, a problem in the next: the problem keeps it ours.
        ("Grads look fine, but the loss spikes whenever the cosine schedule restarts", None),
        # A loss that climbs is a training problem, whatever the text blames for it.
        ("We doubled the learning rate and removed warmup; now the loss climbs after 1k", None),
    ],
)
def test_gradient_words_keep_a_question_in_scope(text: str, expected: str | None) -> None:
    result = match(text)
    assert not result.out_of_scope and result.pointer is None
    assert "out-of-scope" not in _top_ids(result, 5)
    if expected:
        assert _top_ids(result) == [expected]


# -- result shape and robustness -------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "How do I restore the optimizer state when I resume from my checkpoint after a crash?",
        "The DataLoader hangs at epoch 3 with num_workers=4; everything just sits stuck there.",
        "GPU utilization is 40% and the input pipeline seems to be the bottleneck, how to fix?",
        "With 1% positives, should I use class weights or oversample with a sampler?",
        "My LR range test: flat until 1e-4, then the loss explodes past 1e-2. Which LR do I use?",
        # Quantities said to be fine, and a factor of ten, name no gradient problem.
        "Loss and grads look normal. Cosine or step decay, and how long a warmup for 40 epochs?",
        "Should OneCycleLR's max_lr sit an order of magnitude below where the loss rises?",
        "Error(s) in loading state_dict: Unexpected key(s) 'module.fc.weight' (saved under DDP)",
    ],
)
def test_plumbing_questions_are_out_of_scope_with_a_pointer(text: str) -> None:
    result = match(text)
    assert result.out_of_scope and result.pointer
    assert _top_ids(result) == ["out-of-scope"]


def test_a_stuck_loss_next_to_a_loader_question_stays_in_scope() -> None:
    result = match("My loss is stuck at 2.3 and data loading is also slow with num_workers=2")
    assert not result.out_of_scope


@pytest.mark.parametrize(
    ("text", "cause"),
    [
        (
            "I think the data is to blame: loss went nan, so I ran torch.isnan(batch['img']).any()"
            " and it printed True for that batch.",
            "nonfinite-inputs",
        ),
        (
            "After the blow-up I loaded the saved weights: the decoder's weight tensors hold inf.",
            "nan-parameters",
        ),
        (
            "We accumulate 4 micro-batches, and lr_scheduler.step() runs right after each"
            " backward(); the LR hits its floor at a quarter of the run.",
            "accum-scheduler-per-microbatch",
        ),
    ],
)
def test_a_measured_cause_outranks_its_symptom_and_the_belief(text: str, cause: str) -> None:
    assert _top_ids(match(text)) == [cause]


def test_the_scheduler_beside_backward_needs_accumulation() -> None:
    text = "scheduler.step() is called right after every loss.backward() in my loop."
    assert "accum-scheduler-per-microbatch" not in {h.entry_id for h in prose_hits(text)}


def test_a_run_compared_with_another_is_not_a_layer_ratio() -> None:
    names = [q.name for q in read_quantities("grad norm is 16x lower than the old run")]
    assert "layer_ratio" not in names
    names = [q.name for q in read_quantities("first layer's norm is 500x smaller than the last")]
    assert "layer_ratio" in names


@pytest.mark.parametrize(
    "text",
    [
        "I print clip_grad_norm_(net.parameters(), 1e9) each epoch: it stays between 0.6 and 1.9."
        " Train loss and val loss both keep going down. Is there anything to fix here?",
        "The grad norm wobbles between 0.8 and 2.5 step to step, no NaN, and accuracy keeps"
        " improving on train and val. Does anything here need fixing?",
        "grad norm moves between 1 and 3 every step; eval accuracy is tracking the reference run"
        " within 0.2 points. Anything here to fix?",
    ],
)
def test_a_healthy_run_told_in_shared_clauses_is_healthy(text: str) -> None:
    assert _top_ids(match(text)) == ["healthy"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "Over the test set, 40% of the hidden units had an output that was never above zero.",
            "dead-neurons",
        ),
        (
            "Do I need clipping for my DenseNet (batch norm, skip connections, SGD)? It trains ok.",
            "is-clipping-needed",
        ),
        (
            "Is it worth including clip_grad_norm_ in a small MLP? It trains fine.",
            "is-clipping-needed",
        ),
        ("Loss still jumps; next I'm going to set max_norm=0.005. Any downside?", "clip-harder"),
    ],
)
def test_near_ties_go_to_what_the_text_says(text: str, expected: str) -> None:
    assert _top_ids(match(text)) == [expected]


def test_a_max_norm_already_set_is_not_the_plan_to_clip_harder() -> None:
    hits = {h.entry_id for h in prose_hits("I set max_norm=0.01 and now training crawls.")}
    assert "clip-harder" not in hits


def test_a_helper_defined_above_the_loop_is_not_ordered_against_it() -> None:
    code = (
        "def clip_all(m, opt, scaler):\n"
        "    scaler.unscale_(opt)\n"
        "    torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)\n"
        "\n"
        "for x, y in loader:\n"
        "    opt.zero_grad()\n"
        "    scaler.scale(loss_fn(m(x), y)).backward()\n"
        "    clip_all(m, opt, scaler)\n"
        "    scaler.step(opt)\n"
        "    scaler.update()\n"
    )
    assert "clip-before-backward" not in {h.entry_id for h in code_module.analyse(code)}


def test_a_finding_in_code_handed_over_for_review_comes_first() -> None:
    code = (
        "class Tagger:\n"
        "    def train_step(self, x, y):\n"
        "        self.opt.zero_grad()\n"
        "        out = self.gru(x)\n"
        "        loss = F.cross_entropy(out, y)\n"
        "        loss.backward()\n"
        "        self.opt.step()\n"
    )
    text = "Please review our GRU tagger's step before the long run. Would you change anything?"
    assert _top_ids(match(text, code=code)) == ["no-clip-sequence-model"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "Incident notes: loss hit nan at 80k. Conclusion: the shards must contain bad values,"
            " so we scan them all before anything else.",
            "nan-means-bad-data",
        ),
        (
            "Grad norm reached 5e4 then nan. Replace AdamW with plain SGD since AdamW is known to"
            " diverge on this model.",
            "switch-optimizer",
        ),
        (
            "The reference config trains with batch size 256 but my 16GB card goes out of memory"
            " above 32. How do I get there without buying GPUs?",
            "oom-wants-larger-batch",
        ),
    ],
)
def test_plans_and_conclusions_written_as_notes(text: str, expected: str) -> None:
    assert _top_ids(match(text)) == [expected]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "clip at max_grad_norm=50. the grad norm sits at 5-20 and never once crossed 50 in"
            " 40k steps, while the loss keeps jumping from 2.0 to 6.1 every few thousand steps",
            "clip-never-active",
        ),
        (
            "first nan at step 9000; I dumped that batch and `batch['x'].isnan().sum()` = 12."
            " every other batch I looked at is clean",
            "nonfinite-inputs",
        ),
        (
            "total gradient norm is already 400-900 at step 1 and reaches ~3,000 on some steps;"
            " the loss is still finite",
            "exploding-gradients",
        ),
    ],
)
def test_a_measured_cause_beats_the_symptom_it_explains(text: str, expected: str) -> None:
    assert _top_ids(match(text)) == [expected]


def test_an_lr_range_test_is_out_of_scope_even_with_its_loss_numbers() -> None:
    text = "LR range test: loss falls from 1e-5 on and blows up past 1e-1. Which max_lr do I take?"
    result = match(text, code="for x, y in dl:\n    loss = f(m(x), y)\n    loss.backward()\n")
    assert result.out_of_scope and _top_ids(result) == ["out-of-scope"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "Their loss goes NaN in epoch 2. I'm going to suggest they halve the learning rate and"
            " rerun, that normally does it.",
            "lower-lr-for-nan",
        ),
        (
            "Loss spikes keep coming with max_norm=0.5, so the team wants to set it to 0.005."
            " Should I agree?",
            "clip-harder",
        ),
        (
            "bf16 off, fp16 + GradScaler: the scale dropped 65536 -> 32768 in the first 20 steps"
            " and has held there for 30k steps. grad norm 0.4-0.9, loss curve smooth.",
            "healthy",
        ),
    ],
)
def test_plans_and_calibration_read_as_told(text: str, expected: str) -> None:
    assert _top_ids(match(text)) == [expected]


def test_result_shape() -> None:
    kb = load_knowledge()
    result = match("clipping after optimizer.step() with fp16 and grad accumulation", top_k=7)
    assert 1 <= len(result.matches) <= 7
    scores = [m.score for m in result.matches]
    assert scores == sorted(scores, reverse=True)
    for m in result.matches:
        entry = kb.entries[m.id]
        assert m.kind == entry.kind and m.title == entry.title
        assert m.severity == getattr(entry, "severity", None)
        assert m.reasons
    assert len(match("exploding gradients", top_k=1).matches) == 1


def test_typos_are_repaired_and_reported() -> None:
    result = match("graident acumulation withuot dividng the loss")
    assert _top_ids(result) == ["accum-unscaled-loss"]
    assert any("typo:" in r and "'dividng' as 'dividing'" in r for r in result.matches[0].reasons)


def test_json_serialises_non_finite_numbers() -> None:
    data = json.loads(match("loss: nan, grad norm inf").model_dump_json())
    assert data["numbers"] == {"loss": "NaN", "grad_norm": "Infinity"}
    assert json.loads(match("grad norm -inf").model_dump_json(indent=2))["numbers"] == {
        "grad_norm": "-Infinity"
    }
    result = match("grad norm: 0.5, 1.4, 3.9, 11, 38")
    pretty = result.model_dump_json(indent=2)
    assert "0.5 → 1.4" in pretty  # written as UTF-8, not escaped
    assert json.loads(pretty)["series"] == {"grad_norm": [0.5, 1.4, 3.9, 11.0, 38.0]}
    dumped = result.model_dump(mode="json")
    assert set(dumped) == {
        "matches",
        "out_of_scope",
        "pointer",
        "numbers",
        "series",
        "code_detected",
    }
    assert [m["id"] for m in dumped["matches"]] == _top_ids(result, 5)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "   \n\t ",
        "?!?!",
        "\x00\x01\x02 binary \xff\xfe",
        "梯度爆炸 🔥 λ→∞",
        "loss " * 4000,
        "grad norm is " * 2000,
        "1,000,000,000" * 2000,
        "`" * 30000,
        "if i % 4 == 0:\n    optimizer.step()\n" * 500,
    ],
    ids=[
        "empty",
        "blank",
        "symbols",
        "binary",
        "unicode",
        "loss-x4000",
        "norm-x2000",
        "digits",
        "backticks",
        "code-x500",
    ],
)
def test_odd_input_never_raises(text: str) -> None:
    result = match(text, code=text or None)
    assert isinstance(result, MatchResult)
    if not text.strip():
        assert result.matches == []


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=st.text(max_size=400), code=st.one_of(st.none(), st.text(max_size=300)))
def test_match_never_raises_on_arbitrary_text(text: str, code: str | None) -> None:
    result = match(text, code=code, top_k=3)
    assert len(result.matches) <= 3
    assert all(m.score > 0 for m in result.matches)


_LOG_WORDS = [
    "loss",
    "grad norm",
    "grad_norm",
    "step",
    "steps",
    "at steps",
    "lr",
    "scale",
    "every",
    "epoch",
    "went",
    "to",
    "and",
    ",",
    ":",
    "=",
    "|",
    "(",
    ")",
    "->",
    "at",
    "norm of",
    "layer1.weight",
]
_LOG_NUMBERS = [
    "7,840",
    "1,200",
    "12,000.5",
    "3e-4",
    "1E+03",
    "2k",
    "1.5M",
    "nan",
    "-inf",
    "inf",
    "10^-3",
    "2x10^5",
    "0.0",
    "42",
    "-0.7",
    "1,2",
    "100%",
    "3.",
    ".5",
]


@given(
    words=st.lists(
        st.one_of(st.sampled_from(_LOG_WORDS), st.sampled_from(_LOG_NUMBERS)), max_size=40
    )
)
@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
def test_match_never_raises_on_log_shaped_text(words: list[str]) -> None:
    # Arbitrary unicode rarely forms a number series; log-shaped text with thousands separators,
    # suffixes and exponents exercises the series reader's marker and list logic.
    result = match(" ".join(words), top_k=3)
    assert len(result.matches) <= 3


def test_a_step_list_with_thousands_separators_is_read_without_error() -> None:
    result = match("grad norm at steps 1,200, 7,840 and 12,000 went 0.9, 4.1, 55", top_k=3)
    assert len(result.matches) <= 3


def test_matcher_is_built_once() -> None:
    assert get_matcher() is get_matcher()


def test_a_snapshot_matches_like_the_index_it_was_taken_from() -> None:
    built = Matcher(load_knowledge())
    restored = Matcher.from_snapshot(marshal.loads(marshal.dumps(built.snapshot())))
    for item in EVAL_ITEMS[::7]:
        assert restored.match(item["text"], code=item.get("code")) == built.match(
            item["text"], code=item.get("code")
        )


def test_entry_kinds_agree_with_the_models() -> None:
    assert get_args(matcher_module.EntryKind) == get_args(models.EntryKind)
    assert get_args(matcher_module.Severity) == get_args(findings.Severity)


def test_match_docs_state_the_score_constants() -> None:
    doc = " ".join((Match.__doc__ or "").split())
    assert f"up to {matcher_module._SENTENCE_BONUS:g} for the closest" in doc
    assert f"{matcher_module._NAMED_BONUS:g} when the text names" in doc
    assert f"plus {matcher_module._EVIDENCE_WEIGHT:g} times the confidence" in doc
    low = min(matcher_module._RATIONALIZATION_REPORT_PRIOR, matcher_module._SYMPTOM_CLAIM_PRIOR)
    assert f"between {low:g} and {matcher_module._RATIONALIZATION_PRIOR:g}" in doc


@pytest.mark.slow
def test_snapshot_is_written_once_then_reused(tmp_path: Path) -> None:
    probe = (
        "import gradient_doctor.knowledge.matcher as m\n"
        "print(m.get_matcher()._kb is None, m.snapshot_path())\n"
    )

    def run(cache: str) -> list[str]:
        env = {**os.environ, "GRADIENT_DOCTOR_CACHE_DIR": cache}
        done = subprocess.run(
            [sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.split()

    stale = tmp_path / "matcher-from-an-older-release.marshal"
    stale.write_bytes(b"old")
    os.utime(stale, (1_000_000_000, 1_000_000_000))
    first = run(str(tmp_path))
    assert first[0] == "False" and Path(first[1]).is_file()
    assert not stale.exists()  # another version's snapshot, untouched for a week, is removed
    assert run(str(tmp_path))[0] == "True"  # served from the snapshot: no YAML, no models
    Path(first[1]).write_bytes(b"not a snapshot")
    assert run(str(tmp_path))[0] == "False"  # a broken snapshot is rebuilt, not an error
    assert run("")[:2] == ["False", "None"]  # caching off


@pytest.mark.slow
def test_cli_match_imports_only_its_own_command(tmp_path: Path) -> None:
    probe = (
        "import sys\n"
        "from gradient_doctor.skill_server.cli import main\n"
        "main(['match', 'loss is nan'])\n"
        "others = [m for m in sys.modules if m.startswith('gradient_doctor.skill_server.commands.')"
        " and not m.endswith('.match')]\n"
        "assert not others, others\n"
        "assert 'mcp' not in sys.modules and 'anyio' not in sys.modules\n"
        # Served from the index snapshot, the answer is plain data: no pydantic model is built
        # (importing pydantic was a third of the command's start-up).
        "assert 'pydantic' not in sys.modules, 'pydantic imported'\n"
        "main(['match', '--format', 'json', 'grad norm inf'])\n"
        "assert 'pydantic' not in sys.modules, 'pydantic imported'\n"
    )
    warm = "from gradient_doctor.knowledge.matcher import get_matcher\nget_matcher()\n"
    env = {**os.environ, "GRADIENT_DOCTOR_CACHE_DIR": str(tmp_path)}
    for code in (warm, probe):  # the first run writes the snapshot the probe is served from
        done = subprocess.run(
            [sys.executable, "-c", code],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr


@pytest.mark.slow
def test_matching_does_not_import_torch() -> None:
    """Text alone never loads the static analyser (libcst); pasted code does, torch never."""
    probe = (
        "import sys\n"
        "from gradient_doctor.knowledge.matcher import match\n"
        "match('loss: nan after clip_grad_norm_ with GradScaler')\n"
        "assert not any(m.startswith('gradient_doctor.probes') for m in sys.modules)\n"
        "match('why?', code='loss.backward()\\noptimizer.step()\\nclip_grad_norm_(p, 1.0)')\n"
        "assert 'gradient_doctor.probes.static' in sys.modules\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr


# -- the CLI -----------------------------------------------------------------------------------


@pytest.mark.slow
def test_cli_json_contract() -> None:
    done = run_cli("match", "my loss goes to NaN after 2k steps", "--format", "json", "--top", "3")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert set(data) >= {"matches", "out_of_scope", "pointer", "numbers"}
    assert 1 <= len(data["matches"]) <= 3
    first = data["matches"][0]
    assert first["id"] == "loss-nan"
    assert {"id", "kind", "score", "title", "severity", "reasons"} <= set(first)
    assert data["out_of_scope"] is False


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # A run told to go well and then to fall apart, no loss named (fresh43's family).
        (
            "The VAE trained smoothly for a week, but then on Sunday it fell apart for good.",
            "diverges-after-stable-start",
        ),
        # Skip connections are residual connections: a belief about them is in scope (fresh42).
        (
            "A reviewer says shortcut connections are a hack from vision and our 80-layer "
            "model should learn without them.",
            "residuals-are-a-trick",
        ),
    ],
)
def test_new_authors_words(text: str, expected: str) -> None:
    result = match(text)
    assert not result.out_of_scope
    assert _top_ids(result) == [expected], [(m.id, m.score) for m in result.matches]


@pytest.mark.parametrize(
    ("text", "first", "ruled_out"),
    [
        # A bare norm far above the exploding level reads as explosion, and the entries of
        # small gradients it shares words with stay out of the list (ux review).
        (
            "grad norm 3.4e+04",
            "exploding-gradients",
            {"grad-norm-decaying", "zero-gradients", "vanishing-gradients"},
        ),
        # And a norm far below the vanishing level the other way round.
        (
            "grad_norm=0.0000002",
            "vanishing-gradients",
            {"exploding-gradients", "grad-norm-rising", "inf-gradients"},
        ),
    ],
)
def test_cli_a_bare_norm_reads_by_its_size(text: str, first: str, ruled_out: set[str]) -> None:
    done = run_cli("match", text, "--format", "json")
    assert done.returncode == 0, done.stderr
    ids = [m["id"] for m in json.loads(done.stdout)["matches"]]
    assert ids[0] == first, ids
    assert not ruled_out & set(ids), ids


@pytest.mark.slow
def test_cli_markdown_and_code_file(tmp_path: Path) -> None:
    loop = tmp_path / "loop.py"
    loop.write_text(
        "scaler.scale(loss).backward()\n"
        "torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n"
        "scaler.step(optimizer)\nscaler.update()\n",
        encoding="utf-8",
    )
    before = loop.read_bytes()
    done = run_cli("match", "clipping seems to do nothing with AMP", "--code", str(loop))
    assert done.returncode == 0, done.stderr
    assert "`amp-clip-without-unscale`" in done.stdout.splitlines()[0]
    assert "fix:" in done.stdout and "why:" in done.stdout
    assert loop.read_bytes() == before


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("match", "   "), "TEXT is empty"),
        (("match", "x", "--code", "/definitely/not/here.py"), "no such file"),
        (("match", "x", "--top", "0"), "--top must be between"),
    ],
)
def test_cli_usage_errors(args: tuple[str, ...], needle: str) -> None:
    done = run_cli(*args)
    assert done.returncode == 2
    assert needle in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert "Traceback" not in done.stderr


@pytest.mark.slow
def test_cli_rejects_a_binary_code_file(tmp_path: Path) -> None:
    blob = tmp_path / "model.bin"
    blob.write_bytes(b"\x00\x01\x02PK\x03\x04" * 100)
    done = run_cli("match", "why nan", "--code", str(blob))
    assert done.returncode == 2 and "binary" in done.stderr


# -- agreement with the static analyser's fixture corpus ----------------------------------------

STATIC_FIXTURES = REPO / "tests" / "fixtures" / "static"


@pytest.mark.skipif(not STATIC_FIXTURES.is_dir(), reason="static fixture corpus not present")
def test_code_rules_agree_with_the_static_fixture_corpus() -> None:
    """Whole scripts are the analyser's job, but pasted whole they should still match.

    The light rules must put a buggy script's mistake in the top 3 for nearly every script of
    the static analyser's corpus, and raise no warning/critical code rule on its golden ones.
    """
    question = "what is wrong with this training script?"
    buggy = sorted((STATIC_FIXTURES / "buggy").glob("*.py"))
    found = 0
    for script in buggy:
        expected = json.loads(script.with_suffix(".expected.json").read_text("utf-8"))
        ids = {e["id"] for e in expected["expected"]}
        result = match(question, code=script.read_text("utf-8"), top_k=3)
        found += bool(ids & set(_top_ids(result, 3)))
    false_alarms = []
    for script in sorted((STATIC_FIXTURES / "golden").glob("*.py")):
        result = match(question, code=script.read_text("utf-8"), top_k=10)
        false_alarms += [
            (script.name, m.id)
            for m in result.matches
            if m.severity in ("critical", "warning")
            and any(r.startswith("code:") for r in m.reasons)
        ]
    print(f"\nstatic corpus: {found}/{len(buggy)} buggy scripts matched in the top 3")
    assert found >= 0.9 * len(buggy)
    assert len(false_alarms) <= 1, false_alarms


# -- intent and trend families (issue 15, fresh19's misses; examples written for this test) --


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # What the user's own loop does: the red flag, not its near neighbours.
        ("we feed every micro-batch loss to backward unchanged, accum is 6", "accum-unscaled-loss"),
        (
            "zero_grad() sits at the top of the loop body while step() happens once every "
            "3 batches",
            "accum-zero-grad-every-microstep",
        ),
        (
            "after accumulating I go through the params, divide every p.grad by 8, then step",
            "accum-manual-grad-scaling",
        ),
        (
            "we do g.grad /= accum for each parameter after the last micro-batch",
            "accum-manual-grad-scaling",
        ),
        # Where the NaN is: gradients with a finite loss; the inputs checked directly.
        (
            "a NaN appears in the gradient of the decoder bias although the loss is still finite",
            "nan-gradients",
        ),
        ("torch.isinf(inputs).any() returns True for one batch in epoch 3", "nonfinite-inputs"),
        # Units that never fire are dead neurons; most zero values are the symptom.
        ("a third of the hidden units never fire for any example", "dead-neurons"),
        ("over 60% of the values after the relu are zero", "many-zero-activations"),
        # A claim that names the learning rate as the NaN's cause, with no data in it.
        ("That NaN comes from the learning rate, halve it and rerun.", "lower-lr-for-nan"),
        # A sentence starting with a keyword is not a Python header.
        (
            "for the classifier head the gradient norm is 30 times the weight norm",
            "grad-param-ratio",
        ),
    ],
)
def test_intent_families(text: str, expected: str) -> None:
    assert _top_ids(match(text)) == [expected], [(m.id, m.score) for m in match(text).matches[:3]]


@pytest.mark.parametrize(
    ("text", "expected", "reason_part"),
    [
        (
            "grad norm 0.3 at step 500, 0.6 at 2k, 1.1 at 6k, 2.0 at 12k",
            "grad-norm-rising",
            "steady climb",
        ),
        (
            "the input layer's grad norm is 2e-10 and the output layer's is 3e-3",
            "vanishing-gradients",
            "early layer is the small one",
        ),
        ("eval loss went from 0.35 at epoch 3 to 0.8 at epoch 12", "overfitting", "goes up"),
        (
            "with micro-batches of 8 the loss goes 2.4, 1.9, 1.7 and then back up to 2.8",
            "loss-down-then-up-with-accumulation",
            "climbs back",
        ),
        (
            "loss rose from 1.3 to 6.2 in the first 200 steps; warmup is 0",
            "loss-diverging",
            "ends at",
        ),
        (
            "the update-to-weight ratio ||dw||/||w|| is around 0.03",
            "update-param-ratio",
            "more than 10",
        ),
    ],
)
def test_trend_families(text: str, expected: str, reason_part: str) -> None:
    result = match(text)
    assert _top_ids(result) == [expected], [(m.id, m.score) for m in result.matches[:3]]
    assert any(reason_part in r for r in result.matches[0].reasons), result.matches[0].reasons


def test_a_falling_loss_log_is_not_stuck() -> None:
    text = (
        "{'loss': 3.1, 'grad_norm': 0.6, 'epoch': 1.0} ... "
        "{'loss': 2.4, 'grad_norm': 0.5, 'epoch': 2.0}"
    )
    assert _top_ids(match(text)) == ["healthy"]


def test_code_split_reads_keyword_sentences_as_prose() -> None:
    assert split_code("with accum=4 my loss is divided twice and the norm looks tiny").code == ""
    assert split_code("for batch in loader").code == "for batch in loader"
    assert split_code("if step % 4 == 0:").code == "if step % 4 == 0:"


# -- pasted code against the words around it (matcher5 round) ------------------------------

_CLIP_AFTER_STEP_METHOD = """
def fit_batch(self, inputs, labels):
    self.optim.zero_grad()
    out = self.network(inputs)
    self.lossf(out, labels).backward()
    self.optim.step()
    clip_grad_norm_(self.network.parameters(), 5.0)
"""
_CLEAN_FP16_STEP = """
optim.zero_grad(set_to_none=True)
with torch.autocast("cuda", dtype=torch.float16):
    out = network(inputs)
    loss = lossf(out, labels)
grad_scaler.scale(loss).backward()
grad_scaler.unscale_(optim)
clip_grad_norm_(network.parameters(), 0.8)
grad_scaler.step(optim)
grad_scaler.update()
"""


@pytest.mark.parametrize(
    "text",
    [
        "global norm values 1.1, 0.9, 85, 1.0, 0.8: huge spikes although we clip",
        "grad norm climbs 2, 40, 900, 2e4 over the first steps and then loss is nan, clip is on",
    ],
)
def test_a_serious_code_mistake_outranks_the_symptom_told(text: str) -> None:
    result = match(text, code=_CLIP_AFTER_STEP_METHOD)
    assert _top_ids(result) == ["clip-after-step"], [(m.id, m.score) for m in result.matches[:3]]


@pytest.mark.parametrize(
    "text",
    [
        "can someone review my fp16 step before the big run?",
        "is the order in this mixed precision step correct?",
        "not sure if I placed unscale_ in the right spot, please sanity check",
    ],
)
def test_a_clean_step_handed_over_for_a_check_is_healthy(text: str) -> None:
    result = match(text, code=_CLEAN_FP16_STEP)
    assert _top_ids(result) == ["healthy"], [(m.id, m.score) for m in result.matches[:3]]
    assert "finds no mistake" in result.matches[0].reasons[0]


@pytest.mark.parametrize(
    "text",
    [
        "please check this fp16 step, the loss goes nan after 3k steps",
        "review this: grad norm is huge and the scale keeps dropping",
    ],
)
def test_a_clean_step_next_to_a_failure_is_not_called_healthy(text: str) -> None:
    assert _top_ids(match(text, code=_CLEAN_FP16_STEP)) != ["healthy"]


def test_calls_named_in_sentences_do_not_prove_what_is_missing() -> None:
    told = split_code("they call `loss.backward()` and then `optimizer.step()` in the loop")
    assert told.told
    assert not split_code("```\nloss.backward()\noptimizer.step()\n```").told
    text = (
        "`sched.step()` comes right after `loss.backward()`, outside "
        "`if (k + 1) % accum == 0:` under which `opt.step()` is called; the schedule ends early"
    )
    result = match(text, top_k=10)
    assert _top_ids(result) == ["accum-scheduler-per-microbatch"]
    weak = {m.id: m.score for m in result.matches}
    assert weak.get("accum-missing-zero-grad", 0.0) < weak["accum-scheduler-per-microbatch"] / 2


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "the loss became nan at step 2k; I'm going to recommend they move off Adam to SGD, "
            "Adam is the problem",
            "switch-optimizer",
        ),
        (
            "grad norm blew up to 3e5 at step 700, so we'll replace AdamW by SGD because "
            "adaptive optimizers are unstable",
            "switch-optimizer",
        ),
        (
            "NaN loss in epoch 4, which means the dataset has broken records, I'll clean it first",
            "nan-means-bad-data",
        ),
        (
            "We enabled activation checkpointing for memory, so we removed gradient clipping "
            "since the two conflict",
            "checkpointing-breaks-clipping",
        ),
        (
            "the reference implementation we're reproducing never clipped, so we leave clipping "
            "off despite a few spikes",
            "paper-did-not-clip",
        ),
    ],
)
def test_a_belief_after_a_report_is_the_claim_answered(text: str, expected: str) -> None:
    """What happened comes first, then what someone believes or plans: the belief decides."""
    result = match(text)
    assert _top_ids(result) == [expected], [(m.id, m.score) for m in result.matches[:3]]


@pytest.mark.parametrize(
    "text",
    [
        "my LSTM tagger is totally stable at norm ~1. do we even need gradient clipping for it?",
        "GAN discriminator trains fine with norms of 0.5-3. is clipping really necessary here?",
        "would clip_grad_norm_ be worth having on a small ViT that never spikes?",
        "loss is smooth and the grad norm sits at 2. should I bother with clipping at all?",
    ],
)
def test_whether_to_clip_is_the_clipping_question(text: str) -> None:
    result = match(text)
    assert _top_ids(result) == ["is-clipping-needed"], [(m.id, m.score) for m in result.matches]


def test_ordinary_words_are_not_typos() -> None:
    result = match("the grad norm is ~2 throughout and the loss never stalls, scalar loss")
    notes = [r for m in result.matches for r in m.reasons if r.startswith("typo:")]
    assert not notes, notes


@pytest.mark.parametrize(
    ("text", "share"),
    [
        ("it 20 | loss 1.2 | zero_grad_params 90/120", 0.75),
        ("zero_grad_frac=0.4 loss=2.2", 0.4),
        ("frac_zero_grads: 55%", 0.55),
    ],
)
def test_zero_gradient_log_keys_are_read(text: str, share: float) -> None:
    found = [q.value for q in read_quantities(text) if q.name == "zero_grad_fraction"]
    assert found == [pytest.approx(share)]


def test_a_bare_zero_gradient_count_gives_no_share() -> None:
    assert not [
        q for q in read_quantities("zero_grad_params 148") if q.name == "zero_grad_fraction"
    ]


def test_other_log_keys_end_a_series() -> None:
    fairseq = (
        "| epoch 001 | loss 9.81 | nll_loss 9.7 | ppl 832 | wps 21034 | gnorm 1.2 | lr 0.0005\n"
        "| epoch 002 | loss 8.10 | nll_loss 8.0 | ppl 256 | wps 21100 | gnorm 3.9 | lr 0.0005\n"
    )
    read = {s.name: s.values for s in read_series(fairseq)}
    assert read == {"loss": (9.81, 8.1), "perplexity": (832.0, 256.0), "grad_norm": (1.2, 3.9)}
    logged = (
        "step=1 loss=2.3 gnorm=0.5 zero_grad_frac=0.7\nstep=2 loss=2.3 gnorm=0.4 zero_grad_frac=0.7"
    )
    assert {s.name: s.values for s in read_series(logged)}["grad_norm"] == (0.5, 0.4)


def test_a_zero_gradient_log_key_names_zero_gradients() -> None:
    text = (
        "segmentation net won't train:\n"
        "ep 1 loss 0.912 grad_norm 0.004 zero_grad_params 301/340\n"
        "ep 2 loss 0.912 grad_norm 0.004 zero_grad_params 301/340\n"
    )
    assert _top_ids(match(text)) == ["zero-gradients"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "with 6 accumulation steps we add up the six losses and call backward on the total; "
            "the lr behaves like it is six times too high",
            "accum-unscaled-loss",
        ),
        (
            "accumulating over 4 micro-batches, there's no division of the loss by 4 anywhere",
            "accum-unscaled-loss",
        ),
        (
            "every iteration begins with opt.zero_grad(), yet the optimizer steps only once per "
            "8 iterations",
            "accum-zero-grad-every-microstep",
        ),
    ],
)
def test_accumulation_told_in_words(text: str, expected: str) -> None:
    result = match(text)
    assert _top_ids(result) == [expected], [(m.id, m.score) for m in result.matches[:3]]


# -- tracker exports (matcher8) ------------------------------------------------------------


def test_namespaced_csv_columns_are_read_as_their_quantity() -> None:
    text = "wandb export:\n_step,train/loss,train/grad_norm\n100,2.41,0.81\n200,2.37,3.87\n"
    series = {s.name: s.values for s in read_series(text)}
    assert series["loss"] == (2.41, 2.37)
    assert series["grad_norm"] == (0.81, 3.87)


def test_a_scalar_exports_value_column_is_the_quantity_named_above_it() -> None:
    text = (
        "export of train/grad_norm, as downloaded:\nWall time,Step,Value\n"
        "1716201101.2,100,1.07\n1716201107.9,110,1.21\n...\n1716201114.3,900,0.98\n"
    )
    assert [(s.name, s.values) for s in read_series(text)] == [("grad_norm", (1.07, 1.21, 0.98))]
    # A prose line with commas is no header: its namespaced word does not name a column.
    prose = "export of train/grad_norm, most of it fine, see:\n1.5, 2.5, 3.5\n1.6, 2.6, 3.6\n"
    assert numbers_module._table_columns(prose) == {}


@pytest.mark.parametrize(
    ("text", "name", "value"),
    [
        ("the ratio grad_norm/param_norm is only ~0.001 for all layers", "grad_param_ratio", 1e-3),
        ("gradient to weight norm ratio is around 2e-3 everywhere", "grad_param_ratio", 2e-3),
        ("4.2% of ReLU units never activate over an epoch", "dead_fraction", 0.042),
    ],
)
def test_ratio_and_dead_share_wordings(text: str, name: str, value: float) -> None:
    assert [(q.name, q.value) for q in read_quantities(text)] == [(name, value)]


@pytest.mark.parametrize(
    "text",
    [
        "A few dead units: 2% of neurons never fire over the epoch, per-layer grad norms 0.4 to "
        "1.2, validation accuracy goes up every epoch. Worth switching to GELU?",
        "With SGD the grad/param ratio is about 5e-4 in every layer, which looks small to me, "
        "but the training loss keeps going down each epoch.",
    ],
)
def test_a_worry_whose_number_is_in_band_while_training_improves_is_healthy(text: str) -> None:
    result = match(text)
    assert _top_ids(result) == ["healthy"], [(m.id, m.score) for m in result.matches[:3]]
    assert any("inside its normal band" in r for r in result.matches[0].reasons)


def test_a_large_dead_share_is_still_dead_neurons() -> None:
    text = "45% of ReLU units never activate over an epoch, though accuracy still improves a bit"
    assert _top_ids(match(text)) == ["dead-neurons"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # The stage checked clean is not where the NaN began; the one found non-finite is.
        (
            "Every weight passes torch.isfinite and the batch passes torch.isfinite too, yet the "
            "loss is already inf right after the criterion, i.e. before backward runs. Why?",
            "nan-loss-before-backward",
        ),
        (
            "NaN at a random step. torch.isnan(feats).sum() over the failing batch returns 5, "
            "the step before had loss 0.6.",
            "nonfinite-inputs",
        ),
    ],
)
def test_nan_checks_told_in_words_locate_the_stage(text: str, expected: str) -> None:
    assert _top_ids(match(text)) == [expected]


def test_i_e_does_not_end_a_sentence() -> None:
    assert segments("it is nan, i.e. before backward. Next one.") == [
        "it is nan, i.e. before backward.",
        "Next one.",
    ]


def test_a_monitor_counting_zero_nans_reports_no_nan() -> None:
    text = (
        "health check from my callback, anything off?\n"
        "iter 500: gnorm=2.2 nan=0 inf=0\niter 1000: gnorm=1.8 nan=0 inf=0\n"
        "iter 1500: gnorm=1.5 nan=0 inf=0\nthe loss keeps going down"
    )
    ranked = _top_ids(match(text), 3)
    assert ranked[0] == "healthy"
    assert "loss-nan" not in ranked


def test_a_grad_norm_told_to_sit_at_max_norm_is_always_clipped() -> None:
    text = (
        "Training crawls compared with the reference curve; the logged norm after clipping is "
        "flat at 0.3 the whole run, which is my max_norm."
    )
    assert _top_ids(match(text)) == ["clipping-slow-convergence"]


def test_a_loss_that_climbs_back_and_keeps_rising_is_diverging() -> None:
    text = (
        "Adam, lr 3e-3, clip 1.0. Loss fell from 8.1 to 5.2 by step 400, then climbed back: "
        "6.0 at step 900, 7.1 at step 1,500, and it keeps going up. Grad norms 1 to 3."
    )
    assert _top_ids(match(text)) == ["loss-diverging"]
    # The same readings said to come back down are no divergence.
    calmer = text.replace("and it keeps going up", "then back down to 5.3")
    assert _top_ids(match(calmer)) != ["loss-diverging"]


def test_a_run_failing_only_in_reduced_precision_is_amp_diverges() -> None:
    text = (
        "Same config twice. float32: converges fine, 0.9 at 20k.\n"
        "with autocast(fp16):\nstep 1000 loss 2.1\nstep 2000 loss 6.8\nstep 2500 loss nan\n"
        "nothing else differs. why?"
    )
    assert _top_ids(match(text)) == ["amp-diverges"]


def test_a_square_root_of_the_gradients_is_monitoring_not_an_unstable_loss() -> None:
    loop = (
        "for x, y in loader:\n"
        "    loss = crit(model(x), y)\n"
        "    opt.zero_grad()\n"
        "    loss.backward()\n"
        "    gn = torch.sqrt(sum(p.grad.pow(2).sum() for p in model.parameters()))\n"
        "    opt.step()\n"
    )
    assert "unstable-loss-op" not in {h.entry_id for h in code_module.code_hits(loop, "")}
    in_loss = loop.replace("crit(model(x), y)", "torch.sqrt(((model(x) - y) ** 2).mean())")
    assert "unstable-loss-op" in {h.entry_id for h in code_module.code_hits(in_loss, "")}


def test_the_recipes_batch_size_that_runs_out_of_memory_is_wanted() -> None:
    text = (
        "bs 32 trains, bs 96 gives CUDA out of memory on my 16GB card. The authors trained with "
        "96 and I want to match them, how?"
    )
    assert _top_ids(match(text)) == ["oom-wants-larger-batch"]
    # A recipe's epoch count is no batch size.
    hits = prose_hits("The paper used 90 epochs; my batch size runs out of memory.")
    assert not any(h.reason.startswith("text: the recipe's batch size") for h in hits)


def test_a_loss_falling_at_every_reading_is_no_loss_spike() -> None:
    text = (
        "grad norm jumps now and then to about 3 from a usual 0.6, should I worry? the loss "
        "keeps going down\nstep,loss,grad_norm\n100,2.90,0.61\n200,2.84,3.10\n300,2.80,0.58\n"
        "400,2.75,0.66\n500,2.71,2.90\n"
    )
    ranked = _top_ids(match(text), 3)
    assert ranked[0] == "healthy"
    assert "loss-spikes" not in ranked[:2]


@pytest.mark.parametrize(
    ("text", "not_first"),
    [
        (
            "half my reading group says recurrent nets are inherently fragile, so I quit using "
            "them for my poetry bot. sensible?",
            "conflicting-clipping-advice",
        ),
        (
            "everyone on the forum keeps telling me attention models are just fragile by nature; "
            "should I go back to my GRU?",
            "conflicting-clipping-advice",
        ),
    ],
)
def test_a_belief_about_clipping_needs_clipping_in_the_text(text: str, not_first: str) -> None:
    assert _top_ids(match(text)) != [not_first]


_SIX_BATCH_LOOP = """for step, (x, y) in enumerate(train_dl):
    out = net(x)
    l = crit(out, y)
    l.backward()
    if (step + 1) % 6 == 0:
        optimizer.step()
        optimizer.zero_grad()
"""


@pytest.mark.parametrize(
    ("text", "code", "expected"),
    [
        (
            "only 6 samples fit on my small card so I copied a loop that steps every 6 batches, "
            "and the loss got noisier than before. loop below",
            _SIX_BATCH_LOOP,
            "accum-unscaled-loss",
        ),
        (
            "the recipe I'm trying to match uses batch 512, my 12GB card goes out of memory above "
            "64 and the 64 run ends up a few points worse. any way around it?",
            None,
            "oom-wants-larger-batch",
        ),
    ],
)
def test_what_the_writer_did_or_is_trying_is_a_report_not_a_claim(
    text: str, code: str | None, expected: str
) -> None:
    assert _top_ids(match(text, code=code)) == [expected]


def test_at_after_an_epoch_marker_keeps_counting_epochs() -> None:
    text = "validation loss 0.52 at epoch 3, 0.66 at 6, 0.91 at 9"
    assert [s.values for s in read_series(text) if s.name == "val_loss"] == [(0.52, 0.66, 0.91)]


def test_a_held_out_loss_climbing_epoch_after_epoch_is_overfitting() -> None:
    text = (
        "training loss 0.08 and still falling; validation loss 0.52 at epoch 3, 0.66 at 6, "
        "0.91 at 9. 12k tabular rows, big MLP, no weight decay."
    )
    assert _top_ids(match(text)) == ["overfitting"]


def test_units_that_never_give_a_positive_value_are_dead() -> None:
    text = (
        "logged over 3,000 batches: 41% of 1024 units in the second layer never produced a "
        "positive value. loss 0.9 and creeping down, leaky relu not tried yet"
    )
    assert _top_ids(match(text)) == ["dead-neurons"]


def test_a_call_said_to_eat_the_step_is_the_cost_belief() -> None:
    text = (
        "a colleague claims the norm clipping call eats a big slice of every step of our small "
        "GPT, so he wants it gone. is he right?"
    )
    assert _top_ids(match(text)) == ["clipping-is-expensive"]


@pytest.mark.parametrize(
    "text",
    [
        "do we really have to use gradient clipping for a tiny one-layer LSTM that trains fine?",
        "is norm clipping a thing I need to worry about for a small char-RNN, or only for huge "
        "models?",
    ],
)
def test_having_to_add_clipping_is_asking_whether_it_is_needed(text: str) -> None:
    assert _top_ids(match(text)) == ["is-clipping-needed"]


def test_optimizer_settings_are_context_not_a_learning_rate_question() -> None:
    text = "Adam(lr=1e-3, betas=(0.9, 0.99)), step 400\nparam    ||dw||/||w||\nfc1.w  2.1e-01\n"
    result = match(text)
    assert not result.out_of_scope
    assert "out-of-scope" not in _top_ids(result, 3)


def test_a_whole_script_note_does_not_keep_a_range_test_in_scope() -> None:
    code = "lr = 1e-7\nfor x, y in dl:\n    opt.zero_grad()\n    crit(m(x), y).backward()\n"
    code += "    opt.step()\n    lr *= 1.2\n"
    text = "My LR range test loop is below; the loss flattens then shoots up. Which lr do I take?"
    result = match(text, code=code)
    assert result.out_of_scope and _top_ids(result) == ["out-of-scope"]


def test_rows_of_step_labelled_values_under_a_heading_are_a_series() -> None:
    text = "grad norm, every 1k steps:\n1k: 2.4   2k: 0.7   3k: 0.2   4k: 0.05   5k: 0.011\n"
    result = match(text)
    assert _top_ids(result) == ["grad-norm-decaying"]
    assert any("2.4" in reason for reason in result.matches[0].reasons)


def test_a_nan_check_placed_before_the_forward_locates_the_inputs() -> None:
    text = (
        "I put a nan assert on the tensor just before model(x); it trips on batch 77 and the "
        "loss is nan on that batch too."
    )
    assert _top_ids(match(text)) == ["nonfinite-inputs"]


# -- Lightning's own clipping, and validation hold-out questions ----------------------------


@pytest.mark.parametrize(
    "text",
    [
        "my lightning trainer: pl.Trainer(gradient_clip_val=1.0, max_epochs=20). good default?",
        "Lightning run with gradient_clip_val: 0.5 in the yaml config; the loss spikes at 3k.",
    ],
)
def test_lightning_that_clips_for_you_is_not_the_hand_clipping_belief(text: str) -> None:
    result = match(text, top_k=5)
    assert _top_ids(result) != ["lightning-needs-manual-clipping"], result.matches[:3]


@pytest.mark.parametrize(
    "text",
    [
        # The belief itself, gradient_clip_val or not: clipping written by hand as well.
        "In Lightning I set gradient_clip_val=1.0 but I also call clip_grad_norm_ in "
        "on_after_backward to be safe, since Lightning doesn't really clip, right?",
        "Lightning doesn't clip on its own, so I need to write the clipping myself?",
    ],
)
def test_the_hand_clipping_belief_still_ranks_first(text: str) -> None:
    assert _top_ids(match(text, top_k=5)) == ["lightning-needs-manual-clipping"]


@pytest.mark.parametrize(
    "text",
    [
        "Should I hold out 10% of my images for validation or is 5% enough?",
        "How much should I hold out for validation, 10% or 20%?",
        "I put 20% of the dataset aside as a val set; is that too much for 8k samples?",
    ],
)
def test_how_much_to_hold_out_for_validation_is_a_data_question(text: str) -> None:
    result = match(text, top_k=3)
    assert result.out_of_scope and _top_ids(result) == ["out-of-scope"], result.matches


def test_held_out_loss_stays_a_training_question() -> None:
    text = "I hold out 10% for validation; the val loss climbs after epoch 3 while train loss drops"
    assert not match(text, top_k=3).out_of_scope


@pytest.mark.parametrize(
    "text",
    [
        "my logits are [16, 5] but the labels come out as [16, 1, 5] after collate, why?",
        "the model adds an extra dim somewhere between the encoder and the head; how to find it?",
        "how many GPUs would we need to train a 3B model from scratch in a week?",
    ],
)
def test_shapes_told_in_prose_and_hardware_sizing_are_out_of_scope(text: str) -> None:
    result = match(text, top_k=3)
    assert result.out_of_scope and _top_ids(result) == ["out-of-scope"], result.matches


# -- rerank4 round: families of fresh40/fresh41's misses ------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        # A held-out loss that worsens is overfitting, whatever the text says of its data set.
        "tiny image dataset, fine-tuning a vit: train loss 0.02, validation loss climbing since"
        " epoch 4",
        "click model, val log-loss best at epoch 3 and worse every epoch after, train logloss"
        " still falls",
    ],
)
def test_held_out_loss_that_worsens_is_overfitting_in_scope(text: str) -> None:
    result = match(text)
    assert not result.out_of_scope
    assert _top_ids(result) == ["overfitting"], [(m.id, m.reasons[:1]) for m in result.matches]


def test_both_losses_rising_is_no_overfitting_evidence() -> None:
    result = match("train loss and val loss both rising since epoch 3")
    assert not any(
        r.startswith("text: the held-out loss worsens") for m in result.matches for r in m.reasons
    )


def test_a_lora_rank_is_no_distributed_rank() -> None:
    result = match("which learning rate suits a lora rank 64 adapter on a 13B model?")
    assert result.out_of_scope and result.pointer
    assert "ranks-diverge" not in _top_ids(result)


def test_saturating_stack_built_in_a_loop_over_a_named_depth() -> None:
    code = (
        "def build(n_in, hidden=256, n_layers=40):\n"
        "    mods = [nn.Linear(n_in, hidden), nn.Tanh()]\n"
        "    for _ in range(n_layers - 2):\n"
        "        mods += [nn.Linear(hidden, hidden), nn.Tanh()]\n"
        "    return nn.Sequential(*mods)\n"
    )
    result = match("can you check this network before I train it?", code=code)
    assert _top_ids(result) == ["saturating-deep-net"]
    shallow = code.replace("n_layers=40", "n_layers=6")
    reasons = [r for m in match("check this net?", code=shallow).matches for r in m.reasons]
    assert not any("deep stack" in r for r in reasons), reasons
