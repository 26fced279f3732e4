"""The knowledge base: every catalogue id once with the right kind and severity, the loader's
failure modes, thresholds, the NaN tree, the seed corrections and the Markdown views."""

from __future__ import annotations

import re
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from catalog_tables import CATALOG, REPO, catalogue

from gradient_doctor.knowledge import KnowledgeError, build_knowledge, load_knowledge
from gradient_doctor.knowledge.findings import SEVERITY_RANK
from gradient_doctor.knowledge.models import SNIPPET_IDS

DATA = REPO / "knowledge" / "data"
SEEDS = ("CG", "GM", "GS", "TD")


@pytest.fixture(scope="module")
def rows() -> list[Any]:
    found = catalogue()  # catalog.md, or its checked-in snapshot in a clone
    assert len(found) >= 60, "the catalogue tables were not parsed"
    return found


@pytest.fixture(scope="module")
def kb() -> Any:
    return load_knowledge()


# --- every catalogue id is an entry, once, with the right kind, severity and source ----------


def test_catalogue_tables_parse_to_known_counts(rows: list[Any]) -> None:
    counts: dict[str, int] = {}
    for row in rows:
        counts[row.kind] = counts.get(row.kind, 0) + 1
    assert counts == {"red-flag": 24, "signal": 19, "rationalization": 28, "symptom": 16}
    assert len({r.id for r in rows}) == len(rows), "an id appears twice in catalog.md"


def test_every_catalogue_id_is_one_entry_of_the_right_kind(rows: list[Any], kb: Any) -> None:
    missing = [r.id for r in rows if r.id not in kb.entries]
    assert not missing, f"catalogue ids without an entry: {missing}"
    wrong_kind = [
        (r.id, r.kind, kb.entries[r.id].kind) for r in rows if kb.entries[r.id].kind != r.kind
    ]
    assert not wrong_kind
    # Each entry is stored once: the loader rejects duplicates, so the raw files must agree.
    raw_ids: list[str] = []
    for path in DATA.glob("*.yaml"):
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
        if isinstance(doc, dict) and "entries" in doc:
            raw_ids += [e["id"] for e in doc["entries"]]
    assert sorted({i for i in raw_ids if raw_ids.count(i) > 1}) == []


def test_severities_match_the_catalogue(rows: list[Any], kb: Any) -> None:
    for row in rows:
        entry = kb.entries[row.id]
        if row.kind not in ("red-flag", "signal"):
            assert entry.severity_or_none is None
            continue
        levels = [s.strip() for s in row.severity.split("/")]
        if len(levels) == 1:
            assert entry.severity == levels[0], row.id
            if row.kind == "signal":
                assert levels[0] in entry.severities, row.id
        else:
            assert set(entry.severities) == set(levels), row.id
            assert entry.severity == max(levels, key=SEVERITY_RANK.__getitem__), row.id


def test_red_flags_are_found_where_the_catalogue_says(rows: list[Any], kb: Any) -> None:
    for row in rows:
        if row.kind == "red-flag":
            assert sorted(kb.entries[row.id].where) == sorted(row.where.split()), row.id


def test_rationalizations_keep_table_order(rows: list[Any], kb: Any) -> None:
    for row in rows:
        if row.kind == "rationalization":
            assert kb.entries[row.id].number == row.number, row.id


def test_every_entry_names_the_seeds_the_catalogue_cites(rows: list[Any], kb: Any) -> None:
    for row in rows:
        entry = kb.entries[row.id]
        assert entry.sources, row.id
        cited = {s for s in SEEDS if re.search(rf"\b{s}\b", row.source or "")}
        if row.kind == "rationalization":
            cited = {"GM"}  # §3 is GM's table, one entry per row
        named = {s.seed for s in entry.sources}
        assert cited <= named, (
            f"{row.id}: catalogue cites {sorted(cited)}, entry names {sorted(named)}"
        )


def test_red_flags_and_signals_are_complete(kb: Any) -> None:
    for entry in [*kb.by_kind("red-flag"), *kb.by_kind("signal")]:
        assert len(entry.what) > 60 and len(entry.why) > 60 and len(entry.fix) > 30, entry.id
        assert entry.snippets, f"{entry.id} names no fix snippet"
        assert len(entry.keywords) >= 3, f"{entry.id} gives the matcher too few keywords"
    for entry in kb.by_kind("signal"):
        profile = kb.thresholds.profile()
        for key in entry.thresholds:
            assert hasattr(profile, key), f"{entry.id}: unknown threshold key {key!r}"


def test_seed_corrections_reach_the_red_flags_they_concern(kb: Any) -> None:
    for flag_id in (
        "amp-clip-without-unscale",
        "amp-double-unscale",
        "amp-step-bypasses-scaler",
        "accum-leftover-batches",
    ):
        assert kb.get(flag_id).seed_correction, flag_id
    assert "65,536" in kb.get("amp-clip-without-unscale").seed_correction
    assert "RuntimeError" in kb.get("amp-double-unscale").seed_correction


# --- the KnowledgeBase API --------------------------------------------------------------------


def test_get_closest_and_by_kind(kb: Any) -> None:
    assert kb.get("clip-after-step").kind == "red-flag"
    with pytest.raises(KeyError, match="clip-after-step"):
        kb.get("clip-aftr-step")
    assert kb.closest("clip-aftr-step")[0] == "clip-after-step"
    assert kb.closest("unscale")  # fragments still find something
    assert len(kb.closest("amp", n=2)) <= 2
    assert {e.kind for e in kb.by_kind("signal")} == {"signal"}
    assert load_knowledge() is kb, "load_knowledge() must be cached"


def test_snippet_ids_match_the_shipped_snippet_templates() -> None:
    shipped = {
        p.name.removesuffix(".py.j2") for p in (REPO / "templates" / "snippets").glob("*.py.j2")
    }
    if not shipped:
        pytest.skip("templates/snippets has no snippet templates yet")
    assert shipped == set(SNIPPET_IDS)


def test_load_time_is_small() -> None:
    build_knowledge()  # warm the imports
    start = time.perf_counter()
    for _ in range(3):
        build_knowledge()
    elapsed = (time.perf_counter() - start) / 3
    print(f"\nknowledge base load (uncached, validated): {elapsed * 1000:.1f} ms")
    assert elapsed < 2.0


# --- loader failure modes --------------------------------------------------------------------


@pytest.fixture
def data_copy(tmp_path: Path) -> Path:
    target = tmp_path / "data"
    shutil.copytree(DATA, target)
    return target


def _edit(path: Path, change: Any) -> None:
    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    change(doc)
    path.write_text(yaml.safe_dump(doc, sort_keys=False, allow_unicode=True), encoding="utf-8")


def _entry(doc: dict[str, Any], entry_id: str) -> dict[str, Any]:
    return next(e for e in doc["entries"] if e["id"] == entry_id)


def test_copied_data_loads(data_copy: Path) -> None:
    assert len(build_knowledge(data_copy).entries) >= 82


def test_bad_entry_names_file_and_entry(data_copy: Path) -> None:
    _edit(
        data_copy / "red_flags.yaml",
        lambda d: _entry(d, "clip-after-step").update(severity="fatal"),
    )
    with pytest.raises(KnowledgeError) as err:
        build_knowledge(data_copy)
    message = str(err.value)
    assert "red_flags.yaml" in message and "'clip-after-step'" in message and "severity" in message


def test_entry_without_id_is_named_by_index(data_copy: Path) -> None:
    _edit(data_copy / "signals.yaml", lambda d: d["entries"][2].pop("id"))
    with pytest.raises(KnowledgeError, match=r"signals\.yaml: entry #2"):
        build_knowledge(data_copy)


def test_duplicate_id_is_rejected(data_copy: Path) -> None:
    def duplicate(doc: dict[str, Any]) -> None:
        copy = dict(_entry(doc, "healthy"))
        doc["entries"].append(copy)

    _edit(data_copy / "signals.yaml", duplicate)
    with pytest.raises(KnowledgeError, match=r"duplicate id 'healthy'"):
        build_knowledge(data_copy)


def test_all_dangling_references_are_reported_at_once(data_copy: Path) -> None:
    _edit(
        data_copy / "red_flags.yaml",
        lambda d: _entry(d, "value-clipping").update(related=["no-such-id"]),
    )
    _edit(
        data_copy / "signals.yaml",
        lambda d: _entry(d, "healthy").update(rationalizations=["not-a-claim"]),
    )
    _edit(data_copy / "nan_tree.yaml", lambda d: d["nodes"][0].update(if_yes="nowhere"))
    with pytest.raises(KnowledgeError) as err:
        build_knowledge(data_copy)
    message = str(err.value)
    assert "'no-such-id'" in message and "'value-clipping'" in message
    assert "'not-a-claim'" in message and "rationalizations" in message
    assert "'nowhere'" in message
    assert "(3 problems)" in message


def test_unknown_snippet_id_is_rejected(data_copy: Path) -> None:
    _edit(
        data_copy / "red_flags.yaml",
        lambda d: _entry(d, "value-clipping").update(snippets=["clip-nrom"]),
    )
    with pytest.raises(KnowledgeError, match=r"unknown snippet id 'clip-nrom'"):
        build_knowledge(data_copy)


def test_broken_yaml_names_the_file(data_copy: Path) -> None:
    (data_copy / "signals.yaml").write_text("entries: [\n  - id: x\n", encoding="utf-8")
    with pytest.raises(KnowledgeError, match=r"signals\.yaml: not valid YAML"):
        build_knowledge(data_copy)


def test_missing_thresholds_file_is_reported(data_copy: Path) -> None:
    (data_copy / "thresholds.yaml").unlink()
    with pytest.raises(KnowledgeError, match=r"thresholds\.yaml: missing"):
        build_knowledge(data_copy)


def test_missing_directory_is_reported(tmp_path: Path) -> None:
    with pytest.raises(KnowledgeError, match="not found"):
        build_knowledge(tmp_path / "nope")


# --- thresholds ------------------------------------------------------------------------------


def test_threshold_profiles_keep_each_seeds_numbers(kb: Any) -> None:
    t = kb.thresholds
    assert {p.name for p in t.profiles} == {"default", "cg", "gs", "gm", "td"}
    assert t.profile().name == "default" == t.default_profile
    with pytest.raises(KeyError, match="known"):
        t.profile("nope")

    def v(profile: str, key: str) -> float:
        return float(getattr(t.profile(profile), key).value)

    # CG: warn > 100, critical > 1000, vanishing warn < 1e-3, > 50 % zero-gradient parameters.
    assert (v("cg", "exploding_warning"), v("cg", "exploding_critical")) == (100, 1000)
    assert v("cg", "vanishing_warning") == 1e-3
    assert v("cg", "zero_grad_fraction_warning") == 0.5
    # GS: 10-100 warning, > 100 critical, < 1e-7 vanishing, zero ratio 5-20 %, layers 10x/100x,
    # dead 20 %/50 %, ratio > 1 / < 1e-6.
    assert (v("gs", "exploding_warning"), v("gs", "exploding_critical")) == (10, 100)
    assert v("gs", "vanishing_warning") == 1e-7
    assert (v("gs", "zero_grad_fraction_warning"), v("gs", "zero_grad_fraction_critical")) == (
        0.05,
        0.2,
    )
    assert (v("gs", "layer_spread_warning"), v("gs", "layer_spread_critical")) == (10, 100)
    assert (v("gs", "dead_fraction_warning"), v("gs", "dead_fraction_critical")) == (0.2, 0.5)
    assert (v("gs", "grad_param_ratio_high"), v("gs", "grad_param_ratio_low")) == (1, 1e-6)
    # GM: > 100 (> 1000), < 1e-6 (code 1e-8), early/late 1000, ratio > 0.1 too large.
    assert (v("gm", "exploding_warning"), v("gm", "exploding_critical")) == (100, 1000)
    assert (v("gm", "vanishing_warning"), v("gm", "vanishing_critical")) == (1e-6, 1e-8)
    assert v("gm", "early_late_ratio") == 1000
    assert v("gm", "grad_param_ratio_high") == 0.1
    # TD: < 1e-7 in early layers, > 100, dead ReLU > 50 %, max/min > 1000.
    assert v("td", "vanishing_warning") == 1e-7
    assert v("td", "exploding_warning") == 100
    assert v("td", "dead_fraction_critical") == 0.5
    assert v("td", "early_late_ratio") == 1000
    # The reconciled default.
    assert (v("default", "exploding_warning"), v("default", "exploding_critical")) == (100, 1000)
    assert (v("default", "vanishing_warning"), v("default", "vanishing_critical")) == (1e-6, 1e-8)
    assert "reconcil" in t.profile().description.lower()


def test_every_threshold_cites_its_seed_or_borrows_the_default(kb: Any) -> None:
    t = kb.thresholds
    default = t.profile()
    for profile in t.profiles:
        for key in type(profile).model_fields:
            tv = getattr(profile, key)
            if not hasattr(tv, "source"):
                continue
            assert tv.source.section, (profile.name, key)
            if profile.name == "default" or tv.source.seed == profile.name.upper():
                continue
            # A seed silent on a number takes the default's number and says so.
            assert tv.value == getattr(default, key).value, (profile.name, key)
            assert "default" in (tv.source.note or ""), (profile.name, key)
        assert profile.exploding_warning.value < profile.exploding_critical.value
        assert profile.vanishing_critical.value < profile.vanishing_warning.value


def test_max_norm_advice_and_healthy_range(kb: Any) -> None:
    t = kb.thresholds
    assert t.healthy_range == (0.1, 10.0)
    by_arch = {a.architecture.split()[0].lower(): a for a in t.max_norm}
    assert by_arch["transformer"].values[0] == 1.0 and 5.0 in by_arch["transformer"].values
    assert by_arch["rnn"].values == [0.5, 1.0] and "5.0" in by_arch["rnn"].advice
    assert by_arch["reinforcement"].values == [0.5]
    assert by_arch["cnn"].clip_by_default is False and by_arch["cnn"].values == []
    assert by_arch["very"].values == [1.0]


# --- NaN tree and corrections ------------------------------------------------------------------


def test_nan_tree_checks_loss_then_gradients_then_parameters(kb: Any) -> None:
    tree = kb.nan_tree
    path = [tree.root]
    while (nxt := tree.node(path[-1]).if_no) is not None:
        path.append(nxt)
    assert path[:3] == ["loss-before-backward", "gradients-after-backward", "parameters-finite"]
    assert "nan-loss-before-backward" in tree.node(tree.root).related
    batch = tree.node(tree.node(tree.root).if_yes)
    assert "any point" in batch.means or "anywhere" in batch.means
    reachable = set()
    pending = [tree.root]
    while pending:
        node = tree.node(pending.pop())
        if node.id not in reachable:
            reachable.add(node.id)
            pending += node.next_nodes
    assert reachable == {n.id for n in tree.nodes}, "every node is reachable from the root"


def test_one_correction_per_catalogue_bullet_each_with_a_real_test(kb: Any) -> None:
    if CATALOG.is_file():
        text = CATALOG.read_text(encoding="utf-8").split("## 5.", 1)[1]
        bullets = [line for line in text.splitlines() if line.startswith("- ")]
        assert len(kb.corrections) == len(bullets)
    for correction in kb.corrections:
        path, _, test_name = correction.test.partition("::")
        source = (REPO / path).read_text(encoding="utf-8")
        assert f"def {test_name}(" in source, correction.test


# --- Markdown views ----------------------------------------------------------------------------


def test_views_render_every_part(kb: Any) -> None:
    from gradient_doctor.skill_server import views

    for entry in kb.entries.values():
        text = views.entry_markdown(entry)
        assert text.startswith(f"# {entry.title}") and f"`{entry.id}`" in text
        assert entry.sources[0].section in text
    catalog = views.catalog_markdown(kb)
    assert all(f"`{i}`" in catalog for i in kb.entries)
    table = views.rationalization_table_markdown(kb)
    assert len([line for line in table.splitlines() if re.match(r"^\| \d+ \|", line)]) == 28
    checklist = views.red_flag_checklist_markdown(kb)
    assert (
        checklist.index("## Critical") < checklist.index("## Warning") < checklist.index("## Info")
    )
    assert checklist.count("- [ ]") == 24
    thresholds = views.thresholds_markdown(kb.thresholds)
    for name in ("default", "cg", "gs", "gm", "td"):
        assert f"`{name}`" in thresholds
    assert "| 10 (GS) |" in thresholds and "max_norm" in thresholds
    tree = views.nan_tree_markdown(kb.nan_tree)
    assert tree.index("before backward") < tree.index("After backward")
    signal = views.entry_markdown(kb.get("exploding-gradients"))
    assert "`exploding_warning` = 100 (CG)" in signal
    corrections = views.corrections_markdown(kb.corrections)
    assert all(f"`{c.test}`" in corrections for c in kb.corrections)
    for guide in kb.guides.values():
        assert views.guide_markdown(guide).startswith(f"# {guide.title}")
