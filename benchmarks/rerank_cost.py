"""What the learned re-ranker (knowledge/rerank.py) costs the matcher, measured in one run.

Every query of the evaluation set is matched with the re-ranker switched off and on
(``$GRADIENT_DOCTOR_RERANK``), alternating which goes first so that neither profits from the
other's warm caches; the baseline is the matcher alone in the same run. Also the one-off cost of
reading the weights file, in a fresh interpreter (CPU time).

    .venv/bin/python benchmarks/rerank_cost.py [--repeats N] [--check] [--clock wall|cpu]

Targets: the matcher's p50 with the re-ranker stays under 2 ms (the matcher's own target, see
match_latency.py), and reading the weights takes under 15 ms of CPU.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml

EVAL_FILE = Path(__file__).resolve().parent.parent / "tests" / "knowledge" / "match_eval.yaml"
P50_TARGET_MS = 2.0
LOAD_TARGET_MS = 15.0

_LOAD = """
import time
from gradient_doctor.knowledge import rerank
start = time.process_time()
assert rerank.load_weights() is not None
print((time.process_time() - start) * 1000)
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=2, help="passes over the eval set")
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    parser.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="wall: perf_counter; cpu: this process's CPU time (steadier on a busy machine)",
    )
    args = parser.parse_args()

    from gradient_doctor.knowledge import rerank
    from gradient_doctor.knowledge.matcher import get_matcher

    matcher = get_matcher()
    rerank.load_weights()
    items = yaml.safe_load(EVAL_FILE.read_text(encoding="utf-8"))["items"]
    clock = time.perf_counter if args.clock == "wall" else time.process_time
    times: dict[str, list[float]] = {"0": [], "1": []}
    for repeat in range(args.repeats):
        for number, item in enumerate(items):
            flags = ("0", "1") if (number + repeat) % 2 == 0 else ("1", "0")
            for flag in flags:
                os.environ["GRADIENT_DOCTOR_RERANK"] = flag
                start = clock()
                matcher.match(item["text"], code=item.get("code"), top_k=5)
                times[flag].append(clock() - start)
    off = statistics.median(times["0"]) * 1000
    on = statistics.median(times["1"]) * 1000
    off95, on95 = (statistics.quantiles(times[f], n=20)[-1] * 1000 for f in ("0", "1"))
    extra = statistics.median(b - a for a, b in zip(times["0"], times["1"], strict=True)) * 1000
    loads = sorted(
        float(
            subprocess.run(
                [sys.executable, "-c", _LOAD], capture_output=True, text=True, check=True
            ).stdout
        )
        for _ in range(3)
    )
    load = loads[1]
    print(
        f"match p50 over {len(times['0'])} queries: matcher alone {off:.2f} ms (baseline), "
        f"with the re-ranker {on:.2f} ms, ratio {on / off:.2f}; median extra {extra:.3f} ms"
    )
    print(
        f"  p95 ({args.clock} clock): matcher alone {off95:.2f} ms, "
        f"with the re-ranker {on95:.2f} ms"
    )
    print(f"  target p50 < {P50_TARGET_MS} ms with the re-ranker, ratio {on / P50_TARGET_MS:.2f}")
    print(
        f"reading the weights (fresh interpreter, CPU, median of 3): {load:.1f} ms; "
        f"target < {LOAD_TARGET_MS} ms, ratio {load / LOAD_TARGET_MS:.2f}"
    )
    missed = on >= P50_TARGET_MS or load >= LOAD_TARGET_MS
    if missed:
        print("TARGET MISSED")
    return 1 if missed and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
