"""Series told across sentences and in lay words, and what the matcher reads from them."""

from __future__ import annotations

import pytest

from gradient_doctor.knowledge._numbers import read_series
from gradient_doctor.knowledge.matcher import match


def _grad_norms(text: str) -> tuple[float, ...]:
    return next((s.values for s in read_series(text) if s.name == "grad_norm"), ())


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # The next sentence goes on about "it", or starts with the next value.
        (
            "The grad/total_norm tile sat near 2. Since the restart it reads 4,000 on each step.",
            (2.0, 4000.0),
        ),
        ("the grad norm worries me. About 0.5 on day one, 2 on day two, 9 today.", (0.5, 2, 9)),
        # Rows of bare numbers under a heading that ends with a colon.
        ("total grad norm, steps 100-104:\n0.8 0.9 150.2 0.85 0.9", (0.8, 0.9, 150.2, 0.85, 0.9)),
        # The norm in lay words, and an aside in brackets that names another key.
        ("i print the size of the gradient and get 1800, 4100, 2300", (1800, 4100, 2300)),
        ("total grad norm (pre-clip, no clip yet) is 1200 then 2500", (1200, 2500)),
        ("the gradient panel: 0.8 at the start, 3 at 10k steps, 14 at 20k", (0.8, 3, 14)),
    ],
)
def test_norm_values_told_across_sentences_and_in_lay_words(
    text: str, expected: tuple[float, ...]
) -> None:
    assert _grad_norms(text) == pytest.approx(expected)


@pytest.mark.parametrize(
    "text",
    [
        # A CSV row or an aligned row is a table's, not a sentence about the last quantity.
        "grad norm is fine, 0.9.\n5000,0.72\n10000,1.38",
        "grad norm 0.9.\n0        3.12\n500      2.40",
    ],
)
def test_table_rows_do_not_continue_a_sentence(text: str) -> None:
    assert 5000.0 not in _grad_norms(text) and 500.0 not in _grad_norms(text)


def test_a_norm_that_moved_past_the_exploding_level_and_stays_is_exploding() -> None:
    text = (
        "The grad norm tile used to hover around 2. Since this morning it sits between 3,000 "
        "and 9,000 on every single step; the loss still looks normal."
    )
    assert match(text).matches[0].id == "exploding-gradients"


def test_gradients_said_not_to_be_exactly_zero_are_not_zero_gradients() -> None:
    text = (
        "all gradients are tiny from the start, about 1e-9 in total and less near the input, "
        "but none of them is exactly zero; accuracy sits at chance."
    )
    assert match(text).matches[0].id == "vanishing-gradients"
