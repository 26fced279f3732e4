"""Per-step overhead of the long-run monitor (``MonitorLog``: what the HF Trainer and Lightning
callbacks and the Accelerate helper run), against the same training step without it.

The model is the probe benchmark's scaled-down GPT-2 (``benchmarks/probe_overhead.py``:
token + position embeddings, pre-LayerNorm attention and 4x MLP blocks, tied head). Trials are
interleaved (plain, monitored, plain, ...) and summarised by medians of per-step times, so
machine noise hits both alike; CPU time of the process is used, which on a shared machine is
less noisy than wall time. The monitor writes its JSONL to a temporary folder, as in a run.

    python benchmarks/logs_callback_overhead.py [--layers 4] [--width 256] [--steps 20]
        [--trials 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from probe_overhead import SmallGPT, make_step

from gradient_doctor.probes.integrations.monitor_log import MonitorLog


def per_step(step: object, steps: int) -> list[float]:
    times = []
    for _ in range(steps):
        start = time.process_time()
        step()  # type: ignore[operator]
        times.append(time.process_time() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--trials", type=int, default=5)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = SmallGPT(args.layers, args.width, args.heads, args.vocab, args.context)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    data = torch.randint(0, args.vocab, (256, args.context + 1))
    step = make_step(model, optimizer, data, None)
    per_step(step, 3)  # warm up
    plain: list[float] = []
    monitored: list[float] = []
    with tempfile.TemporaryDirectory(prefix="gd-overhead-") as folder:
        for trial in range(args.trials):
            plain += per_step(step, args.steps)
            log = MonitorLog(model, optimizer, Path(folder) / f"grads{trial}.jsonl")
            monitored += per_step(step, args.steps)  # measured by the optimizer's own hooks
            log.close()
    base, watched_median = statistics.median(plain), statistics.median(monitored)
    params = sum(p.numel() for p in model.parameters())
    print(
        f"model: SmallGPT {args.layers} layers, width {args.width}, {params / 1e6:.1f} M "
        f"parameters, {len(list(model.parameters()))} tensors; torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads"
    )
    print(f"plain step: median {base * 1e3:.1f} ms CPU ({len(plain)} steps)")
    print(f"with MonitorLog: median {watched_median * 1e3:.1f} ms CPU ({len(monitored)} steps)")
    print(f"overhead: {100 * (watched_median - base) / base:+.2f} % per step (target <= 1.5 %)")


if __name__ == "__main__":
    main()
