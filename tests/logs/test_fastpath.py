"""The block reader (probes.logs.fastpath + Keeper.add_columns) gives exactly what the
line-by-line reader gives: the same kept steps, counts, first NaN and spikes."""

from __future__ import annotations

import dataclasses
import json
import math
import random
from pathlib import Path

import pytest
from logs_paths import FIXTURES

from gradient_doctor.probes.logs import fastpath
from gradient_doctor.probes.logs.reader import LogRun, read_log

LINE_FIXTURES = sorted(
    p.name
    for p in FIXTURES.iterdir()
    if p.suffix in {".log", ".jsonl", ".csv"} and not p.name.startswith("monitor_")
)


def _facts(run: LogRun) -> dict[str, object]:
    stats = dataclasses.asdict(run.stats)
    stats["fields"] = sorted(stats["fields"])
    return {
        "format": run.format.id,
        "steps": [
            json.dumps(p.model_dump(exclude_none=True), sort_keys=True) for p in run.series.steps
        ],
        "stats": stats,
        "records": run.records,
        "numbered": run.numbered,
        "went_back": run.went_back,
        "stride": run.stride,
        "notes": run.notes,
        "lines": run.read.lines,
        "bytes": run.read.bytes,
    }


def _same(path: Path, **limits: int) -> None:
    slow = read_log(path, spike_factor=10.0, fast=False, **limits)
    fast = read_log(path, spike_factor=10.0, fast=True, **limits)
    assert _facts(fast) == _facts(slow)


@pytest.mark.parametrize("name", LINE_FIXTURES)
def test_fixture_logs_read_the_same(name: str) -> None:
    _same(FIXTURES / name)


def _line(fmt: str, step: int, loss: float, norm: float, lr: float) -> str:
    if fmt == "nanogpt":
        return f"iter {step}: loss {loss:.4f}, time 12.5ms, mfu 41.20%\n"
    if fmt == "hf":
        return f"{{'loss': '{loss:.4g}', 'grad_norm': '{norm:.4g}', 'learning_rate': '{lr:.3g}'}}\n"
    if fmt == "jsonl":
        return json.dumps({"step": step, "train/loss": loss, "grad_norm": norm, "lr": lr}) + "\n"
    if fmt == "csv":
        return f"{step},{loss:.6f},{norm:.6f},{lr:.3e}\n"
    return f"epoch 0 | step {step:7d} | loss {loss:.5f} | grad_norm {norm:.4f} | lr {lr:.3e}\n"


@pytest.mark.parametrize("fmt", ["nanogpt", "hf", "jsonl", "csv", "console"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_long_logs_with_spikes_nan_and_odd_lines_read_the_same(
    tmp_path: Path, fmt: str, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Small blocks, so that templates, anomalies and odd lines meet block edges.
    monkeypatch.setattr(fastpath, "BLOCK_BYTES", 4096)
    rng = random.Random(seed)
    lines = ["step,train_loss,grad_norm,lr\n"] if fmt == "csv" else ["starting run\n"]
    nan_at = rng.randint(3000, 5000) if seed != 1 else None
    step = 0
    for _ in range(6000):
        step += 1 if rng.random() > 0.01 else rng.choice([0, -3, 5])  # repeats, going back, gaps
        step = max(step, 1)
        loss = 3.0 / math.sqrt(1 + step / 300) + 0.05 * rng.random()
        norm = 0.8 + 0.2 * rng.random()
        if rng.random() < 0.004:
            norm *= rng.choice([40.0, 15.0, 0.01])  # spikes, some isolated, some not
        if rng.random() < 0.002:
            loss *= 30.0
        lr = 6e-4 if step > 100 else 6e-4 * step / 100
        if nan_at is not None and step >= nan_at:
            loss = norm = math.nan
        lines.append(_line(fmt, step, loss, norm, lr))
        if rng.random() < 0.01 and fmt != "csv":
            lines.append("step 250: train loss 1.91, val loss 1.99\n")  # evaluation lines
        if rng.random() < 0.005 and fmt == "console":
            lines.append(f"step {step} | loss {loss:.3f}\n")  # another shape
    path = tmp_path / ("train.csv" if fmt == "csv" else "train.log")
    path.write_text("".join(lines))
    _same(path, head=64, tail=64, middle=256, max_anomalies=20)
    _same(path)
