"""Two first-look defects: a failure the text denies, and a gradient norm measured by hand.

* "it is NOT exploding, norms are flat at 0.8" denies the failure: the words under the negation
  are no evidence for the entry about it, and the re-ranker sees the denial.
* A loop that sums the parameters' gradient norms itself monitors the gradients: "no gradient
  monitoring" is no answer for it, however many of its words the text shares.
"""

from __future__ import annotations

import pytest

from gradient_doctor.knowledge import rerank
from gradient_doctor.knowledge._code import code_hits, measures_grad_norm
from gradient_doctor.knowledge.matcher import match
from gradient_doctor.knowledge.rerank import Candidate

# -- negation -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "denied"),
    [
        ("it is NOT exploding, norms are flat at 0.8", {"exploding"}),
        ("no NaN anywhere, the loss just plateaus", {"nan", "anywhere"}),
        ("the norm never blew up; it isn't vanishing either", {"blew", "vanishing"}),
    ],
)
def test_denied_words_are_read_up_to_the_clause_end(text: str, denied: set[str]) -> None:
    words, failure = rerank.denied_words(text)
    assert denied <= words
    assert failure
    assert "loss" not in words  # the comma or semicolon ends the negation's reach


@pytest.mark.parametrize(
    "text",
    [
        "the loss is not decreasing at all",  # a negated improvement is a report, not a denial
        "not only NaN but also inf in the logits",
        "the loss no longer spikes after warmup",
    ],
)
def test_no_failure_is_denied(text: str) -> None:
    assert not rerank.denied_words(text)[1]
    assert "denies" not in rerank._facts(text, code_detected=False)


@pytest.mark.parametrize(
    ("text", "negated"),
    [
        ("it is NOT exploding, norms are flat at 0.8", "exploding-gradients"),
        ("My grads are not exploding: grad norm sits at 0.8 the whole run. Normal?", None),
        ("Honestly the gradients aren't vanishing, the first layer gets 1e-2 like the last", None),
    ],
)
def test_a_denied_failure_is_not_ranked_first(text: str, negated: str | None) -> None:
    result = match(text, top_k=3)
    assert result.matches
    first = result.matches[0].id
    assert first not in {"exploding-gradients", "vanishing-gradients", "model-too-complex"}
    if negated is not None:
        assert negated not in [m.id for m in result.matches]


def test_a_failure_said_outside_the_negation_still_counts() -> None:
    # The inputs are clean, the loss is not: the NaN is reported.
    result = match("no NaN in the inputs, but the loss is NaN from step 40 on", top_k=3)
    assert result.matches[0].id in {"loss-nan", "nan-loss-before-backward", "nan-gradients"}


def test_the_denial_is_a_feature_of_the_candidates_matched_on_it() -> None:
    text = "it is NOT exploding, norms are flat at 0.8"
    candidates = [
        Candidate("exploding-gradients", "symptom", 9.0, ["words: exploding, norms"]),
        Candidate("healthy", "symptom", 8.0, ["words: flat, norms"]),
    ]
    rows = rerank.candidate_features(text, None, candidates, False)
    first = {index for index, _ in rows[0][0]}
    second = {index for index, _ in rows[1][0]}
    denied = rerank._evidence("denied-failure", "symptom", True)[0]
    assert denied in first
    assert denied not in second
    assert rerank._feature("q=denies&id=healthy") in second


# -- a gradient norm measured by hand -----------------------------------------------------------

_HAND_NORM_LOOPS = [
    # A running sum over the parameters, squared norms.
    "for images, labels in train_loader:\n"
    "    optimizer.zero_grad()\n"
    "    loss = criterion(net(images), labels)\n"
    "    loss.backward()\n"
    "    total = 0.0\n"
    "    for p in net.parameters():\n"
    "        if p.grad is not None:\n"
    "            total += p.grad.norm() ** 2\n"
    "    print('grad norm', total ** 0.5)\n"
    "    optimizer.step()\n",
    # A generator over detached gradients, logged to a tracker.
    "for batch in dl:\n"
    "    loss = model(**batch).loss\n"
    "    loss.backward()\n"
    "    gn = sum(q.grad.detach().norm() ** 2 for q in model.parameters()) ** 0.5\n"
    "    tracker.log({'gn': gn})\n"
    "    opt.step()\n"
    "    opt.zero_grad()\n",
    # Squares summed through .data.pow(2).
    "for xb, yb in loader:\n"
    "    opt.zero_grad()\n"
    "    crit(model(xb), yb).backward()\n"
    "    sq = 0.0\n"
    "    for w in model.parameters():\n"
    "        sq += w.grad.data.pow(2).sum().item()\n"
    "    history.append(sq ** 0.5)\n"
    "    opt.step()\n",
    # torch.norm of each gradient.
    "for xb, yb in loader:\n"
    "    opt.zero_grad()\n"
    "    crit(model(xb), yb).backward()\n"
    "    norms = [torch.norm(w.grad) for w in model.parameters()]\n"
    "    opt.step()\n",
]

_UNMONITORED_LOOP = (
    "for batch in dl:\n"
    "    loss = model(**batch).loss\n"
    "    loss.backward()\n"
    "    opt.step()\n"
    "    opt.zero_grad()\n"
)


@pytest.mark.parametrize("code", _HAND_NORM_LOOPS)
def test_a_hand_written_norm_loop_is_monitoring(code: str) -> None:
    assert measures_grad_norm(code)
    assert "no-grad-monitoring" not in {hit.entry_id for hit in code_hits(code)}
    for text in ("here is my training loop, does it look ok?", "training loop, loss goes up"):
        result = match(text, code=code, top_k=3)
        assert "no-grad-monitoring" not in [m.id for m in result.matches]


def test_a_loop_that_measures_nothing_still_gets_the_note() -> None:
    assert not measures_grad_norm(_UNMONITORED_LOOP)
    assert "no-grad-monitoring" in {hit.entry_id for hit in code_hits(_UNMONITORED_LOOP)}


def test_the_scorer_sums_the_denial_features_the_training_reads() -> None:
    """``rerank.scores`` adds the denial features exactly as ``candidate_features`` lists them
    (the training script learns from the second, the matcher scores with the first)."""
    import importlib.util
    from pathlib import Path

    script_path = Path(__file__).resolve().parents[2] / "scripts" / "train_reranker.py"
    spec = importlib.util.spec_from_file_location("train_reranker", script_path)
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    candidates = [
        Candidate("exploding-gradients", "symptom", 9.0, ["words: exploding, norm"]),
        Candidate("healthy", "signal", 8.0, ["words: nan, norm", "text: inside the range"]),
        Candidate("loss-stuck", "symptom", 7.0, ["words: decreasing, loss"]),
    ]
    texts = [
        ("the norm is not exploding, it sits at 0.9", "healthy"),
        ("no NaN anywhere, grad norm 0.5 to 1.2", "healthy"),
        ("the loss is not decreasing at all since epoch 2", "loss-stuck"),
        ("grad norm exploding past 1e4 at step 300", "exploding-gradients"),
    ]
    rows = [
        script._row(
            {"text": t, "expect": e, "group": f"fresh{i}"}, "first-look", False, False, candidates
        )
        for i, (t, e) in enumerate(texts * 3)
    ]
    trained = script.train(script.Lists(rows), 1.0, 1.0, 1.0)
    model = trained.model(0.0)
    flat = dict(zip(trained.used.tolist(), trained.w.tolist(), strict=True))
    for text, _ in texts:
        features = rerank.candidate_features(text, None, candidates, False)
        expected = [
            sum(flat.get(i, 0.0) * v for i, v in dense) + sum(flat.get(i, 0.0) for i in crossed)
            for dense, crossed in features
        ]
        assert rerank.scores(model, text, None, candidates, False) == pytest.approx(
            expected, abs=1e-9
        )
    assert script.ranks(rows, model).count(0) == len(rows)


def test_a_denied_failure_word_is_no_word_of_the_query() -> None:
    denied = rerank.text_grams("it is NOT exploding, norms are flat at 0.8")
    assert rerank._word_hash("exploding") not in denied
    assert rerank._pair_hash(("not", "exploding")) in denied  # the negation and its word
    assert rerank._word_hash("norms") in denied
    said = rerank.text_grams("no NaN in the inputs, but the loss is NaN")
    assert rerank._word_hash("nan") in said  # said outside the negation too


def test_the_negated_cause_stays_out_of_the_re_ranked_top_three() -> None:
    text = "My gradients are not exploding, grad norm is flat around 0.8 the whole run. Normal?"
    ids = [m.id for m in match(text, top_k=3).matches]
    assert ids[0] == "healthy"
    assert "exploding-gradients" not in ids


def test_an_entry_denied_by_name_goes_below_the_others() -> None:
    """Only when the text reports no failure at all: "no NaN, but the loss is inf" does."""
    candidates = [
        Candidate("healthy", "signal", 10.0, ["words: norm, flat"]),
        Candidate("exploding-gradients", "symptom", 9.0, ["words: grad, norm"]),
        Candidate("grad-norm-decaying", "symptom", 8.0, ["words: flat, grad, norm"]),
    ]
    model = rerank.Model({rerank._feature("id=exploding-gradients"): 50.0}, {}, {})
    denied = "my grads are not exploding, the grad norm is flat at 0.8"
    assert [candidates[i].id for i in rerank.order(denied, None, candidates, False, model)] == [
        "healthy",
        "grad-norm-decaying",
        "exploding-gradients",
    ]
    reported = "not exploding yet, but the loss spikes every 2k steps"
    assert rerank.order(reported, None, candidates, False, model)[0] == 1
