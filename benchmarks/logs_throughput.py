"""Reading speed and memory of ``gradient-doctor logs`` on a generated log of a given size.

Writes a console log in the chosen format (default: Accelerate-style ``step N | loss X |
grad_norm Y | lr Z`` lines, with spikes and a NaN late in the run) of ``--mb`` megabytes, then
reads it in a fresh process through :func:`probes.logs.diagnose_log` and prints MB/s, the
steps read and kept, and the peak resident memory of the reading process (``ru_maxrss``).
CPU time is printed beside wall time: on a shared machine wall time also counts waiting. The
baseline of the same run is a plain ``for line in file`` over the same bytes (the disk and
decode floor), so the ratio says what parsing and judging cost on top of reading.

    python benchmarks/logs_throughput.py [--mb 1024] [--format console|hf|jsonl|csv|nanogpt]
        [--formats nanogpt,hf,jsonl,csv] [--compare OTHER_PYTHON]

``--compare`` reads each log a second time with another interpreter (one with another version
of gradient-doctor installed, e.g. the previous release), in the same run and on the same
file, so the two speeds are measured on the same machine under the same load.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FORMATS = ("console", "hf", "jsonl", "csv", "nanogpt")


def line(fmt: str, step: int, loss: float, norm: float, lr: float) -> str:
    if fmt == "hf":
        return (
            f"{{'loss': '{loss:.4g}', 'grad_norm': '{norm:.4g}', 'learning_rate': '{lr:.4g}', "
            f"'epoch': '{step / 1e5:.4g}'}}\n"
        )
    if fmt == "jsonl":
        return json.dumps({"step": step, "train/loss": loss, "grad_norm": norm, "lr": lr}) + "\n"
    if fmt == "csv":
        return f"{step},{loss:.6f},{norm:.6f},{lr:.3e}\n"
    if fmt == "nanogpt":
        return f"iter {step}: loss {loss:.4f}, time 123.45ms, mfu 41.20%\n"
    return f"epoch 0 | step {step:9d} | loss {loss:.5f} | grad_norm {norm:.4f} | lr {lr:.3e}\n"


def generate(path: Path, fmt: str, megabytes: float) -> int:
    target = int(megabytes * 1e6)
    rng = random.Random(0)
    written = 0
    step = 0
    nan_at = None
    with path.open("w", buffering=1 << 22) as handle:
        if fmt == "csv":
            header = "step,train_loss,grad_norm,lr\n"
            handle.write(header)
            written += len(header)
        chunk: list[str] = []
        while written < target:
            step += 1
            loss = 3.0 / math.sqrt(1 + step / 1000) + 0.05 * rng.random()
            norm = 0.8 + 0.2 * rng.random()
            if step % 250_000 == 0:
                norm *= 40  # an isolated spike
            if nan_at is None and written > 0.9 * target:
                nan_at = step
            if nan_at is not None and step >= nan_at:
                loss = norm = math.nan
            text = line(fmt, step, loss, norm, 6e-4)
            chunk.append(text)
            written += len(text)
            if len(chunk) >= 10_000:
                handle.write("".join(chunk))
                chunk = []
        handle.write("".join(chunk))
    return step


def _child(path: str) -> None:
    """Runs in a fresh process: read the log, print the figures as JSON."""
    started = time.perf_counter()
    with open(path, "rb") as handle:
        lines = sum(1 for _ in handle)
    floor_s = time.perf_counter() - started
    from gradient_doctor.probes.logs import diagnose_log

    started, cpu = time.perf_counter(), time.process_time()
    report = diagnose_log(path, with_series=False)
    read_s = time.perf_counter() - started
    cpu_s = time.process_time() - cpu
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(
        json.dumps(
            {
                "lines": lines,
                "floor_s": floor_s,
                "read_s": read_s,
                "cpu_s": cpu_s,
                "steps_read": report.steps_read,
                "kept_steps": report.kept_steps,
                "first_nonfinite_step": report.counts.first_nonfinite_step,
                "norm_spikes": report.counts.norm_spikes,
                "format": report.format,
                "peak_rss_mb": peak_kb / 1024,
            }
        )
    )


def _read(python: str, path: Path) -> dict[str, float]:
    out = subprocess.run(
        [python, __file__, "--child", str(path)],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    figures: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return figures


def _print(label: str, mb: float, steps: int, figures: dict[str, float]) -> None:
    print(f"[{label}] log: {mb:,.0f} MB, {steps:,} steps, format {figures['format']}")
    print(
        f"[{label}] read + diagnose: {figures['read_s']:.1f} s = {mb / figures['read_s']:.1f} "
        f"MB/s (plain line iteration: {mb / figures['floor_s']:.0f} MB/s; "
        f"{figures['read_s'] / figures['floor_s']:.1f}x of it)"
    )
    print(
        f"[{label}] CPU time of the reading: {figures['cpu_s']:.1f} s = "
        f"{mb / figures['cpu_s']:.1f} MB/s (wall time is longer on a shared machine)"
    )
    print(
        f"[{label}] steps read {figures['steps_read']:,}, kept {figures['kept_steps']:,}; first "
        f"NaN at step {figures['first_nonfinite_step']}; isolated norm spikes "
        f"{figures['norm_spikes']}"
    )
    print(f"[{label}] peak RSS of the reading process: {figures['peak_rss_mb']:.0f} MB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=1024.0, help="log size (default 1024 MB)")
    parser.add_argument("--format", choices=FORMATS, default="console")
    parser.add_argument("--formats", help="comma-separated formats (instead of --format)")
    parser.add_argument("--compare", help="another Python to read the same logs with")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.child)
        return
    formats = args.formats.split(",") if args.formats else [args.format]
    for fmt in formats:
        if fmt not in FORMATS:
            parser.error(f"unknown format {fmt!r} (one of {', '.join(FORMATS)})")
        with tempfile.TemporaryDirectory(prefix="gd-logs-bench-") as folder:
            path = Path(folder) / f"train.{'csv' if fmt == 'csv' else 'log'}"
            steps = generate(path, fmt, args.mb)
            mb = path.stat().st_size / 1e6
            readers = [("this", sys.executable)]
            if args.compare:
                readers.insert(0, ("compare", args.compare))
            results = {label: _read(python, path) for label, python in readers}
        for label, figures in results.items():
            _print(label, mb, steps, figures)
        if args.compare:
            this, other = results["this"], results["compare"]
            for key in ("steps_read", "first_nonfinite_step", "norm_spikes"):
                if this[key] != other[key]:
                    print(f"!! {key} differs: {this[key]} vs {other[key]}")
            print(
                f"{fmt}: {mb / other['read_s']:.1f} -> {mb / this['read_s']:.1f} MB/s "
                f"({other['read_s'] / this['read_s']:.1f}x); peak RSS "
                f"{other['peak_rss_mb']:.0f} -> {this['peak_rss_mb']:.0f} MB"
            )


if __name__ == "__main__":
    main()
