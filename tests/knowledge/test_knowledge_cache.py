"""The on-disk cache of the validated packaged knowledge base (``knowledge.loader``): the same
objects and the same reports as validating the data, never stale, safe to read and to write
from several processes at once."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gradient_doctor.knowledge import loader
from gradient_doctor.knowledge.loader import build_knowledge

# Prints what the diagnosis and the views make of a fixed run (findings with fix snippets,
# the threshold profile, every entry's page), and whether the base came from the cache (no
# YAML was imported to get it).
REPORTS = r"""
import math, sys
from gradient_doctor.knowledge import load_knowledge
from gradient_doctor.knowledge.loader import load_thresholds
from gradient_doctor.probes.runtime.diagnose import build_result
from gradient_doctor.probes.runtime.result import ChildSummary, StepRecord
from gradient_doctor.skill_server.views import catalog_markdown, entry_markdown
from gradient_doctor.skill_server.views_probe import probe_markdown

profile = load_thresholds().profile()
summary = ChildSummary.model_validate({
    "status": "stopped", "parameters": ["fc1.weight", "fc2.weight"], "shapes": [[8, 4], [1, 8]],
    "layers": ["fc1", "fc2"], "layer_types": {"fc1": "Linear", "fc2": "Linear"},
})
records = []
for step in range(1, 31):
    norm = 0.5 * 3.0 ** (step / 3) if step < 30 else math.nan
    loss = 2.0 + step * step if step < 30 else math.nan
    records.append(StepRecord.model_validate({
        "step": step, "grad_norms": [norm, norm / 2], "total_norm": norm * 1.118,
        "losses": [loss], "loss_ops": ["MseLossBackward0"],
        "events": ["zero-grad", "backward", "step"],
    }))
result = build_result(script="train.py", args=[], steps_requested=30, sample_every=10,
                      records=records, summary=summary, profile=profile, wall_s=1.0)
kb = load_knowledge()
cached = "yaml" not in sys.modules
print(probe_markdown(result))
print(result.model_dump_json(indent=2))
print(catalog_markdown(kb))
for entry in kb:
    print(entry_markdown(entry, kb.thresholds))
print("FROM-CACHE", cached)
"""


def _run(code: str, cache: str) -> str:
    env = {**os.environ, "GRADIENT_DOCTOR_CACHE_DIR": cache}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def _split(output: str) -> tuple[str, bool]:
    text, _, flag = output.rpartition("FROM-CACHE ")
    return text, flag.strip() == "True"


def test_reports_are_byte_identical_with_and_without_the_cache(tmp_path: Path) -> None:
    uncached, from_cache = _split(_run(REPORTS, ""))  # caching off: validated
    assert not from_cache
    written, from_cache = _split(_run(REPORTS, str(tmp_path)))  # validated, then cached
    assert not from_cache
    assert len(list(tmp_path.glob("knowledge-*.pickle"))) == 1
    read, from_cache = _split(_run(REPORTS, str(tmp_path)))  # served from the cache
    assert from_cache
    assert "### Findings" in uncached and "(snippet `" in uncached  # findings with fixes
    assert written == uncached
    assert read == uncached


def test_the_cached_base_equals_the_validated_one(tmp_path: Path) -> None:
    path = tmp_path / "knowledge-test.pickle"
    validated = build_knowledge()
    loader._write_cache(path, validated)
    restored = loader._read_cache(path)
    assert restored is not None and restored is not validated
    assert restored == validated
    assert list(restored.entries) == list(validated.entries)  # catalogue order kept
    assert restored.entry_files == validated.entry_files
    assert not list(tmp_path.glob(".knowledge-*"))  # no temporary file left behind


def _copy_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the knowledge package's data and sources that the loader reads instead."""
    package = tmp_path / "package"
    shutil.copytree(loader.DATA_DIR, package / "data")
    for name in loader._CACHE_SOURCES:
        shutil.copy2(loader.PACKAGE_DIR / name, package / name)
    monkeypatch.setattr(loader, "PACKAGE_DIR", package)
    monkeypatch.setattr(loader, "DATA_DIR", package / "data")
    monkeypatch.setenv("GRADIENT_DOCTOR_CACHE_DIR", str(tmp_path / "cache"))
    loader._packaged_from_cache.cache_clear()
    return package


def test_an_edited_data_file_or_model_source_never_reads_the_old_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = _copy_package(tmp_path, monkeypatch)
    first_path = loader.knowledge_cache_path()
    assert first_path is not None
    first = loader._load_packaged()
    assert first_path.is_file()

    signals = package / "data" / "signals.yaml"
    text = signals.read_text(encoding="utf-8")
    entry = next(e for e in first.by_kind("signal") if e.summary in text)
    signals.write_text(text.replace(entry.summary, entry.summary + " Edited.", 1), "utf-8")
    loader._packaged_from_cache.cache_clear()
    second_path = loader.knowledge_cache_path()
    assert second_path != first_path
    edited = loader._load_packaged()  # not the old file: the edit is seen
    assert edited.entries[entry.id].summary == entry.summary + " Edited."
    assert second_path is not None and second_path.is_file()

    (package / "models.py").write_text(
        (package / "models.py").read_text(encoding="utf-8") + "\n# changed\n", "utf-8"
    )
    assert loader.knowledge_cache_path() not in (first_path, second_path)


@pytest.mark.parametrize("damage", ["truncated", "not-a-pickle", "wrong-type", "group-writable"])
def test_a_damaged_or_foreign_cache_file_falls_back_to_validation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, damage: str
) -> None:
    _copy_package(tmp_path, monkeypatch)
    path = loader.knowledge_cache_path()
    assert path is not None
    validated = loader._load_packaged()
    good = path.read_bytes()
    if damage == "truncated":
        path.write_bytes(good[: len(good) // 2])
    elif damage == "not-a-pickle":
        path.write_bytes(b"not a pickle at all")
    elif damage == "wrong-type":
        import pickle

        path.write_bytes(pickle.dumps({"entries": {}}))
    else:
        path.chmod(0o664)
    assert loader._read_cache(path) is None
    loader._packaged_from_cache.cache_clear()
    assert loader._load_packaged() == validated  # validated again, and the file rewritten
    assert loader._read_cache(path) == validated


def test_caching_off_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _copy_package(tmp_path, monkeypatch)
    monkeypatch.setenv("GRADIENT_DOCTOR_CACHE_DIR", "")
    assert loader.knowledge_cache_path() is None
    assert len(loader._load_packaged()) > 0
    assert not (tmp_path / "cache").exists()


def test_a_read_only_cache_folder_is_only_slower(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _copy_package(tmp_path, monkeypatch)
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the cache folder would be")
    monkeypatch.setenv("GRADIENT_DOCTOR_CACHE_DIR", str(blocked / "cache"))
    assert len(loader._load_packaged()) > 0


CONCURRENT = r"""
import sys
from gradient_doctor.knowledge import load_knowledge
from gradient_doctor.knowledge.loader import build_knowledge
kb = load_knowledge()
assert kb == build_knowledge(), "a reader got another knowledge base"
print("ok")
"""


@pytest.mark.slow
def test_concurrent_writers_and_readers_only_see_whole_files(tmp_path: Path) -> None:
    env = {**os.environ, "GRADIENT_DOCTOR_CACHE_DIR": str(tmp_path)}
    for _ in range(2):  # first: every process misses and writes; then they read
        processes = [
            subprocess.Popen(
                [sys.executable, "-c", CONCURRENT],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(6)
        ]
        for process in processes:
            out, err = process.communicate(timeout=120)
            assert process.returncode == 0, err[-2000:]
            assert out.strip() == "ok"
    assert len(list(tmp_path.glob("knowledge-*.pickle"))) == 1
    assert not list(tmp_path.glob(".knowledge-*"))
