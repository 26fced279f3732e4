"""A learned re-ranker over the matcher's top candidates.

The matcher (``knowledge.matcher``) ranks entries with hand-written rules and a word index built
from the entries' own paraphrases. This module re-orders its first :data:`DEPTH` candidates with
a linear model trained on the evaluation queries (``tests/knowledge/match_eval.yaml``) by
``scripts/train_reranker.py``. The model sees, for each candidate:

* how the matcher ranked it: its rank, its score relative to the first one and to its
  neighbours;
* which evidence produced it, read from the match's reasons: shared words or phrases, the entry
  named, a close paraphrase, a code finding, a sentence rule, a number or series reading, a
  cause ranked above its effect;
* its kind, and a few facts about the query (code in it, a question, numbers) crossed with the
  kind;
* the query's words and word pairs crossed with the candidate's id and kind (feature hashing):
  what the evaluation queries' authors wrote when they meant that entry, which the entries' own
  phrasings may not contain.

Scoring is pure Python (no numpy at run time): the weights are a dict from hashed feature to
float, read from ``data/rerank.json`` on the first re-ranked match (never while switched off).
:data:`ENABLED` says whether the matcher calls it; ``$GRADIENT_DOCTOR_RERANK`` (``0``/``1``)
overrides it, for measurements.

:data:`VERSION` names the feature extractor. The training script writes it into the weights
file, and :func:`load_weights` refuses weights written for another version (a test checks the
shipped file), so a changed extractor can never be scored with stale weights.
"""

from __future__ import annotations

import itertools
import math
import os
import re
import zlib
from collections.abc import Container, Sequence
from pathlib import Path
from typing import NamedTuple, Protocol, TypeVar

#: Whether the matcher re-ranks its candidates (see the README's matcher section for the
#: measurements behind this switch).
ENABLED = False

#: The feature extractor's version; the weights file must carry the same tag.
VERSION = "rerank-1"

#: How many of the matcher's candidates are re-ordered (and how many it is asked for).
DEPTH = 10

#: Feature hashing: the index space is 2**BITS.
BITS = 20
_MASK = (1 << BITS) - 1

#: The entry that only an out-of-scope verdict may put first (the matcher's OUT_OF_SCOPE_ID).
_OUT_OF_SCOPE = "out-of-scope"

_WEIGHTS_FILE = Path(__file__).resolve().parent / "data" / "rerank.json"

_TOKEN = re.compile(r"[a-z][a-z0-9_]*|\d+(?:\.\d+)?(?:e[-+]?\d+)?")
_NUMBER = re.compile(r"\d")
#: Words too common to say anything about an entry on their own (they still form pairs).
_STOP_WORDS = (
    "a an the and or but of to in on at for with by from as is are was were be been it its "
    "this that these those i we you my our your me us he she they them his her their what "
    "which who how when where why do does did have has had not no so if then than there here "
    "can could would should will just also very some any all about into out up after before "
    "while each per one"
)
_STOP = frozenset(_STOP_WORDS.split())

#: Reason prefixes (see ``matcher.Matcher.match``), most specific first.
_REASON_KINDS: tuple[tuple[str, str], ...] = (
    ("words:", "words"),
    ("phrases:", "phrases"),
    ("names it:", "names"),
    ("close to:", "close"),
    ("typo:", "typo"),
    ("code:", "code"),
    ("found in the code", "code"),
    ("a mistake in the code", "code"),
    ("text:", "rule"),
    ("described in the text", "rule"),
    ("named as the cause", "cause"),
    ("measured in the text as the cause", "cause"),
    ("the first of the events", "cause"),
    ("a learning-rate-only", "scope"),
    ("the value the text worries about", "band"),
)
_REASON_KIND = dict(_REASON_KINDS)
_REASON_PREFIX = re.compile("|".join(re.escape(prefix) for prefix, _ in _REASON_KINDS))
_CLOSENESS = re.compile(r"\((\d(?:\.\d+)?)\)\s*$")


class Ranked(Protocol):
    """What the re-ranker reads of one candidate: fields of ``matcher.Match``."""

    @property
    def id(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def score(self) -> float: ...
    @property
    def reasons(self) -> Sequence[str]: ...


class Candidate(NamedTuple):
    """A candidate read back from stored lists (the training script's form of a match)."""

    id: str
    kind: str
    score: float
    reasons: Sequence[str]


class _Match(Protocol):
    @property
    def id(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def score(self) -> float: ...
    @property
    def reasons(self) -> list[str]: ...


_M = TypeVar("_M", bound=_Match)


def _hash(name: str) -> int:
    return zlib.crc32(name.encode())


_NAMED: dict[str, int] = {}


def _feature(name: str) -> int:
    """The index of a named feature (memoised: the names come from a small fixed set)."""
    index = _NAMED.get(name)
    if index is None:
        index = _NAMED[name] = _hash(name) & _MASK
    return index


_SPREAD = 1000003


def _cross(left: int, right: int) -> int:
    """The index of a word (``left``) crossed with a candidate's id or kind (``right``)."""
    return ((left * _SPREAD) ^ right) & _MASK


def text_grams(text: str) -> list[int]:
    """Hashes of the query's content words and adjacent word pairs (deduplicated, in order)."""
    tokens = ["#" if _NUMBER.match(t) else t for t in _TOKEN.findall(text.lower())]
    grams: dict[int, None] = {}
    for token in tokens:
        if token not in _STOP and token != "#" and len(token) > 1:
            grams[_hash("w " + token)] = None
    for left, right in itertools.pairwise(tokens):
        grams[_hash("b " + left + " " + right)] = None
    return list(grams)


def _reason_kinds(reasons: Sequence[str]) -> tuple[dict[str, float], int]:
    """Which kinds of evidence the reasons show (with the closest paraphrase's closeness), and
    how many reasons beyond shared words are there."""
    found: dict[str, float] = {}
    strong = 0
    for reason in reasons:
        prefix = _REASON_PREFIX.match(reason)
        kind = _REASON_KIND[prefix.group()] if prefix else "number"
        if kind == "close":
            close = _CLOSENESS.search(reason)
            found["close"] = max(found.get("close", 0.0), float(close.group(1)) if close else 0.5)
            continue
        found[kind] = 1.0
        if kind not in ("words", "phrases", "typo"):
            strong += 1
    return found, strong


def candidate_features(
    text: str,
    code: str | None,
    candidates: Sequence[Ranked],
    code_detected: bool,
    known: Container[int] | None = None,
) -> list[tuple[list[tuple[int, float]], list[int]]]:
    """The hashed features of each candidate, candidates in the matcher's order: the dense ones
    (index, value) and the query's words crossed with the candidate's id and kind (indices of
    value 1).

    The training script calls this very function on the matcher's output, so training and
    scoring read the same features. ``known``: the word hashes the weights know (the others
    only cost time when scoring).
    """
    if not candidates:
        return []
    grams = text_grams(text + ("\n" + code if code else ""))
    if known is not None:
        grams = [gram for gram in grams if gram in known]
    spreads = [gram * _SPREAD for gram in grams]  # the left half of _cross, once per word
    top = max(candidates[0].score, 1e-6)
    query = []
    if code_detected:
        query.append("code")
    if text.rstrip().endswith("?"):
        query.append("asks")
    if _NUMBER.search(text):
        query.append("numbers")
    if len(text) > 400:
        query.append("long")
    rows: list[tuple[list[tuple[int, float]], list[int]]] = []
    for rank, cand in enumerate(candidates):
        kind = cand.kind
        above = candidates[rank - 1].score if rank else cand.score
        below = candidates[rank + 1].score if rank + 1 < len(candidates) else 0.0
        named: list[tuple[str, float]] = [
            ("bias", 1.0),
            (f"rank={rank}", 1.0),
            ("rel", cand.score / top),
            ("gap", (top - cand.score) / top),
            ("above", (above - cand.score) / top),
            ("below", (cand.score - below) / top),
            ("log", math.log1p(max(cand.score, 0.0)) / 5.0),
            (f"kind={kind}", 1.0),
            (f"kind={kind}&rank={min(rank, 2)}", 1.0),
            (f"id={cand.id}", 1.0),
        ]
        evidence, strong = _reason_kinds(cand.reasons)
        for name, value in evidence.items():
            named.append((f"ev={name}", value))
            named.append((f"ev={name}&kind={kind}", value))
            if rank == 0:
                named.append((f"ev={name}&first", value))
        named.append(("strong", min(strong, 3) / 3.0))
        for fact in query:
            named.append((f"q={fact}&kind={kind}", 1.0))
        dense = [(_feature(name), value) for name, value in named]
        id_hash = _hash("id " + cand.id)
        kind_hash = _hash("kind " + kind)
        crossed = [(spread ^ id_hash) & _MASK for spread in spreads]
        crossed.extend((spread ^ kind_hash) & _MASK for spread in spreads)
        rows.append((dense, crossed))
    return rows


class Model(NamedTuple):
    """Trained weights by feature index, and the word hashes that have any."""

    weights: dict[int, float]
    grams: frozenset[int]


_LOADED: list[Model | None] = []


def load_weights(path: Path = _WEIGHTS_FILE) -> Model | None:
    """The model in ``path``, or None when the file is missing, unreadable or written for
    another :data:`VERSION` of the features."""
    import json  # only when re-ranking (the matcher's start-up never needs it)

    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("version") != VERSION or data.get("bits") != BITS:
            return None
        weights = dict(zip(data["index"], data["weight"], strict=True))
        return Model(weights, frozenset(data["grams"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _shipped() -> Model | None:
    if not _LOADED:
        _LOADED.append(load_weights())
    return _LOADED[0]


def enabled() -> bool:
    """Whether the matcher re-ranks (:data:`ENABLED`, or ``$GRADIENT_DOCTOR_RERANK``)."""
    override = os.environ.get("GRADIENT_DOCTOR_RERANK", "")
    return override == "1" if override in ("0", "1") else ENABLED


def scores(
    model: Model,
    text: str,
    code: str | None,
    candidates: Sequence[Ranked],
    code_detected: bool,
) -> list[float]:
    """The model's score of each candidate (higher is better)."""
    get = model.weights.get
    return [
        sum(get(index, 0.0) * value for index, value in dense)
        + sum(get(index, 0.0) for index in crossed)
        for dense, crossed in candidate_features(text, code, candidates, code_detected, model.grams)
    ]


def order(
    text: str,
    code: str | None,
    candidates: Sequence[Ranked],
    code_detected: bool,
    model: Model | None = None,
) -> list[int]:
    """The candidates' positions in re-ranked order, by ``model`` (default: the shipped one;
    the matcher's order when there is none).

    The out-of-scope entry keeps its place: only the matcher's out-of-scope verdict may put it
    first (the caller does not re-rank such a result at all).
    """
    if model is None:
        model = _shipped()
    if model is None or len(candidates) < 2:
        return list(range(len(candidates)))
    values = scores(model, text, code, candidates, code_detected)
    movable = [i for i, c in enumerate(candidates) if c.id != _OUT_OF_SCOPE]
    ranked = sorted(movable, key=lambda i: (-values[i], i))
    result = list(range(len(candidates)))
    for slot, position in zip(movable, ranked, strict=True):
        result[slot] = position
    return result


def rerank_matches(text: str, code: str | None, matches: list[_M], code_detected: bool) -> list[_M]:
    """``matches`` (the matcher's order, best first) with the first :data:`DEPTH` re-ordered;
    a match moved up says so in its reasons. The rest keep their places."""
    head = matches[:DEPTH]
    positions = order(text, code, head, code_detected)
    for new, old in enumerate(positions):
        if old > new:
            head[old].reasons.append(f"re-ranked from {old + 1} to {new + 1} (learned re-ranker)")
    return [head[i] for i in positions] + matches[DEPTH:]
