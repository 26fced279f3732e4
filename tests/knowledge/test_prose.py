"""The prose of the knowledge base: rationalizations, symptoms and topic guides.

These tests read the data files directly and validate them with the pydantic models, so they do
not depend on the loader; where ``knowledge.load_knowledge`` is available they also go through
it. The catalogue (``../shared/catalog.md``) and the seed documents are the references: every id
must exist in the catalogue, and no text may copy a seed sentence.
"""

from __future__ import annotations

import ast
import re
import string
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pydantic
import pytest
import yaml

import gradient_doctor.knowledge.models
from gradient_doctor.knowledge.models import SEED_FILES, Guide, Rationalization, Symptom

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "knowledge" / "data"
SHARED = REPO.parent / "shared"
CATALOG = SHARED / "catalog.md"
SEEDS = SHARED / "seeds"
GM_SEED = SEEDS / SEED_FILES["GM"]


def _shipped_snippet_ids() -> frozenset[str]:
    """The snippet ids the templates package really ships (not a copy of the list)."""
    from gradient_doctor.templates.snippets import list_snippets

    return frozenset(spec.id for spec in list_snippets())


SNIPPET_IDS = _shipped_snippet_ids()
TOPICS = (
    "clipping",
    "accumulation",
    "amp",
    "ddp",
    "vanishing",
    "exploding",
    "nan",
    "monitoring",
    "checkpointing",
    "per-layer-clipping",
    "small-gradients",
)
# A shared run of this many words with a seed counts as copying.
COPY_WINDOW = 8
# Paraphrases must not reuse this many consecutive words of the seed's own claim.
CLAIM_WINDOW = 5

_ID = re.compile(r"`([a-z0-9]+(?:-[a-z0-9]+)*)`")


def _load(name: str) -> dict[str, Any]:
    with (DATA / name).open(encoding="utf-8") as fh:
        loaded = yaml.safe_load(fh)
    assert isinstance(loaded, dict), f"{name}: top level must be a mapping"
    return loaded


@pytest.fixture(scope="module")
def rationalizations() -> list[Rationalization]:
    raw = _load("rationalizations.yaml")["entries"]
    return pydantic.TypeAdapter(list[Rationalization]).validate_python(raw)


@pytest.fixture(scope="module")
def symptoms() -> list[Symptom]:
    raw = _load("symptoms.yaml")["entries"]
    return pydantic.TypeAdapter(list[Symptom]).validate_python(raw)


@pytest.fixture(scope="module")
def guides() -> list[Guide]:
    raw = _load("guides.yaml")["guides"]
    return pydantic.TypeAdapter(list[Guide]).validate_python(raw)


def _catalog_sections() -> dict[int, list[str]]:
    """Ids per catalogue section (1 red flags, 2 signals, 3 rationalizations, 4 symptoms)."""
    if not CATALOG.is_file():
        pytest.skip(f"catalogue not found at {CATALOG}; cannot check ids against it")
    sections: dict[int, list[str]] = {}
    current: int | None = None
    for line in CATALOG.read_text(encoding="utf-8").splitlines():
        heading = re.match(r"^## (\d+)\.", line)
        if heading:
            current = int(heading.group(1))
            continue
        if current not in (1, 2, 3, 4) or not line.startswith("|"):
            continue
        first = _ID.search(line)
        if first:
            sections.setdefault(current, []).append(first.group(1))
    return sections


@pytest.fixture(scope="module")
def catalog() -> dict[int, list[str]]:
    return _catalog_sections()


def _words(text: str) -> list[str]:
    """Lower-cased words with surrounding punctuation removed (code tokens stay whole)."""
    strip = string.punctuation + "“”‘’…"
    return [w for w in (raw.strip(strip) for raw in text.lower().split()) if w]


def _windows(words: list[str], size: int) -> set[tuple[str, ...]]:
    return {tuple(words[i : i + size]) for i in range(len(words) - size + 1)}


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _strings(item)


def _seed_claims() -> list[str]:
    """The 'When Agent Wants To Say' column of the GM rationalization table, in order."""
    claims = []
    in_table = False
    for line in GM_SEED.read_text(encoding="utf-8").splitlines():
        if line.startswith("## Rationalization Prevention Table"):
            in_table = True
        elif in_table and line.startswith("## "):
            break
        elif in_table and line.startswith('| "'):
            claims.append(line.split("|")[1].strip().strip('"'))
    return claims


# --- structure ------------------------------------------------------------------------------


def test_rationalizations_follow_the_catalogue_table_order(
    rationalizations: list[Rationalization], catalog: dict[int, list[str]]
) -> None:
    assert [r.id for r in rationalizations] == catalog[3]
    assert [r.number for r in rationalizations] == list(range(1, 29))
    assert len(rationalizations) == 28


def test_every_rationalization_cites_its_table_row(
    rationalizations: list[Rationalization],
) -> None:
    for r in rationalizations:
        rows = [
            s
            for s in r.sources
            if s.seed == "GM"
            and s.section == "Rationalization Prevention Table"
            and s.note is not None
            and re.search(rf"\brow {r.number}\b", s.note)
        ]
        assert rows, f"{r.id}: no source pointing at GM table row {r.number}"


def test_symptoms_cover_the_catalogue(
    symptoms: list[Symptom], catalog: dict[int, list[str]]
) -> None:
    ids = [s.id for s in symptoms]
    assert len(ids) == len(set(ids)) == 16
    assert ids == catalog[4]


def test_every_topic_has_exactly_one_guide(guides: list[Guide]) -> None:
    assert sorted(g.topic for g in guides) == sorted(TOPICS)


def test_guides_are_compact_but_complete(guides: list[Guide]) -> None:
    for g in guides:
        count = len(g.body.split())
        assert 150 <= count <= 420, f"guide {g.topic!r} has {count} words"
        assert g.summary.strip() and g.title.strip()


def test_guide_code_blocks_are_valid_python(guides: list[Guide]) -> None:
    for g in guides:
        blocks = re.findall(r"```python\n(.*?)```", g.body, flags=re.S)
        for block in blocks:
            try:
                ast.parse(block)
            except SyntaxError as exc:  # pragma: no cover - the message is the point
                pytest.fail(f"guide {g.topic!r}: code block does not parse: {exc}")


def test_matcher_material_is_rich_enough(
    rationalizations: list[Rationalization], symptoms: list[Symptom]
) -> None:
    for r in rationalizations:
        assert len(r.paraphrases) >= 5, r.id
        assert len({p.lower() for p in r.paraphrases}) == len(r.paraphrases), r.id
        assert r.keywords, r.id
        assert r.say_instead.strip(), r.id
    for s in symptoms:
        assert len(s.phrasings) >= 4, s.id
        assert len({p.lower() for p in s.phrasings}) == len(s.phrasings), s.id
        assert s.keywords, s.id


def test_out_of_scope_points_elsewhere(symptoms: list[Symptom]) -> None:
    by_id = {s.id: s for s in symptoms}
    pointer = by_id["out-of-scope"].pointer
    assert pointer, "out-of-scope needs a pointer"
    lowered = pointer.lower()
    assert "learning-rate" in lowered or "learning rate" in lowered
    assert "data" in lowered
    assert "gradient" in lowered, "the pointer should say which gradient checks still apply"
    assert all(s.pointer is None for s in symptoms if s.id != "out-of-scope")


# --- references -----------------------------------------------------------------------------


def test_every_referenced_id_is_in_the_catalogue(
    rationalizations: list[Rationalization],
    symptoms: list[Symptom],
    guides: list[Guide],
    catalog: dict[int, list[str]],
) -> None:
    known = {i for ids in catalog.values() for i in ids}
    red_flags = set(catalog[1])
    problems = []
    for r in rationalizations:
        problems += [f"{r.id}.related: {i}" for i in r.related if i not in known]
        problems += [f"{r.id}.red_flags: {i}" for i in r.red_flags if i not in red_flags]
        problems += [f"{r.id}.related lists itself" for i in r.related if i == r.id]
    for s in symptoms:
        problems += [f"{s.id}.related: {i}" for i in s.related if i not in known]
        problems += [f"{s.id}.causes: {i}" for i in s.causes if i not in known]
        problems += [f"{s.id}.causes lists itself" for i in s.causes if i == s.id]
    for g in guides:
        problems += [f"guide {g.topic}.related: {i}" for i in g.related if i not in known]
    assert not problems, problems


def test_every_snippet_id_is_in_the_fixed_list(
    rationalizations: list[Rationalization], symptoms: list[Symptom]
) -> None:
    assert gradient_doctor.knowledge.models.SNIPPET_IDS == SNIPPET_IDS, (
        "models and templates disagree"
    )
    for entry in [*rationalizations, *symptoms]:
        unknown = set(entry.snippets) - SNIPPET_IDS
        assert not unknown, f"{entry.id}: unknown snippet ids {sorted(unknown)}"


def test_seed_sections_named_in_sources_exist() -> None:
    if not SEEDS.is_dir():
        pytest.skip(f"seed documents not found at {SEEDS}")
    texts = {
        name: " ".join((SEEDS / file).read_text(encoding="utf-8").replace("¶", " ").split()).lower()
        for name, file in SEED_FILES.items()
        if (SEEDS / file).is_file()
    }
    missing = []
    for data_file, key in (
        ("rationalizations.yaml", "entries"),
        ("symptoms.yaml", "entries"),
        ("guides.yaml", "guides"),
    ):
        for item in _load(data_file)[key]:
            for src in item["sources"]:
                text = texts.get(src["seed"])
                if text is not None and src["section"].lower() not in text:
                    missing.append(f"{data_file}: {src['seed']} section {src['section']!r}")
    assert not missing, missing


# --- own words and seed corrections --------------------------------------------------------


def test_no_text_copies_a_seed_sentence() -> None:
    """No run of COPY_WINDOW words in any of our texts also occurs in a seed document."""
    seed_files = sorted(SEEDS.glob("*.txt")) if SEEDS.is_dir() else []
    if not GM_SEED.is_file():
        pytest.skip(f"GM seed not found at {GM_SEED}")
    seed_windows: set[tuple[str, ...]] = set()
    for path in seed_files:
        seed_windows |= _windows(_words(path.read_text(encoding="utf-8")), COPY_WINDOW)
    copied = []
    for data_file in ("rationalizations.yaml", "symptoms.yaml", "guides.yaml"):
        for text in _strings(_load(data_file)):
            shared = _windows(_words(text), COPY_WINDOW) & seed_windows
            copied += [f"{data_file}: {' '.join(w)!r}" for w in sorted(shared)]
    assert not copied, copied


def test_paraphrases_do_not_reuse_the_seed_claim(
    rationalizations: list[Rationalization],
) -> None:
    if not GM_SEED.is_file():
        pytest.skip(f"GM seed not found at {GM_SEED}")
    claims = _seed_claims()
    assert len(claims) == 28, "could not read the GM rationalization table"
    for r, claim in zip(rationalizations, claims, strict=True):
        claim_words = _words(claim)
        size = min(CLAIM_WINDOW, len(claim_words))
        claim_windows = _windows(claim_words, size)
        for p in r.paraphrases:
            reused = _windows(_words(p), size) & claim_windows
            assert not reused, f"{r.id}: paraphrase {p!r} reuses the seed claim {claim!r}"


def test_seed_corrections_are_stated(
    rationalizations: list[Rationalization], guides: list[Guide]
) -> None:
    by_id = {r.id: r for r in rationalizations}
    by_topic = {g.topic: g for g in guides}

    amp_text = by_id["amp-breaks-clipping"].say_instead + by_topic["amp"].body
    assert "unscale_" in amp_text
    assert "RuntimeError" in amp_text, "a second unscale_ raises; say so"
    assert "too hard" in amp_text, "clipping scaled gradients clips too hard, not 'nothing'"
    assert "torch.amp.GradScaler" in by_topic["amp"].body
    assert "torch.autocast" in by_topic["amp"].body
    assert "torch.cuda.amp.GradScaler(" not in by_topic["amp"].body

    data_nan = by_id["nan-means-bad-data"].say_instead.lower()
    assert "any point" in data_nan and "gradient norm" in data_nan

    assert "1 %" in by_id["clipping-is-expensive"].say_instead

    accumulation = by_topic["accumulation"].body.lower()
    assert "actually accumulated" in accumulation
    assert "token count" in accumulation and "2024" in accumulation

    nan_order = by_topic["nan"].body
    positions = [nan_order.index(step) for step in ("**The loss", "**The gradients", "**The param")]
    assert positions == sorted(positions), "NaN guide must check loss, then gradients, then params"


# --- through the loader, once it exists -----------------------------------------------------


def test_loader_serves_the_prose(
    rationalizations: list[Rationalization], symptoms: list[Symptom], guides: list[Guide]
) -> None:
    try:
        from gradient_doctor.knowledge import load_knowledge
    except ImportError as exc:
        pytest.skip(f"knowledge.load_knowledge not available yet: {exc}")
    kb = load_knowledge()
    for entry in [*rationalizations, *symptoms]:
        assert kb.get(entry.id) == entry
    assert [r.id for r in kb.by_kind("rationalization")] == [r.id for r in rationalizations]
    assert set(kb.guides) == set(TOPICS)
    for g in guides:
        assert kb.guides[g.topic].body == g.body
