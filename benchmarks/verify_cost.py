"""Cost of ``check --verify`` against a single probe run, both measured in the same run.

Target (issue 14): the whole verification (the static analysis once, the original and the
patched copy probed, the comparison, the report) takes at most 2.2× the wall time of one probe
run of the same script with the same steps.

For each script, three commands are timed as a user runs them (a fresh CLI process each, start-up
included), interleaved and repeated so machine noise hits them alike, and summarised by medians:

- ``probe``: ``gradient-doctor probe SCRIPT --steps N --format json`` (the baseline);
- ``check``: ``gradient-doctor check SCRIPT --steps N --format json`` (static + one probe run);
- ``verify``: ``gradient-doctor check SCRIPT --verify --steps N --format json``.

It prints each median and the ratios verify/probe (the target) and verify/check. The two runs
of a verification overlap on machines with at least two cores, each with half the cores as torch
threads (``probes.verify.run.plan_runs``); the verification's JSON says whether they did.

    python benchmarks/verify_cost.py [SCRIPT ...] [--steps 30] [--trials 3] [--python PATH]
        [--omp-threads N] [-- SCRIPT_ARGS...]

``--omp-threads N`` sets ``OMP_NUM_THREADS=N`` for every command (the baseline included), so the
thread count is the same in all three; without it each command runs as the user's environment
says (torch then uses every core in the single probe run).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_SCRIPTS = [
    REPO / "examples" / "buggy_train.py",
    REPO / "tests" / "fixtures" / "runtime" / "clip_after_step.py",
]
TARGET = 2.2


def _command(kind: str, script: Path, args: argparse.Namespace) -> list[str]:
    base = [sys.executable, "-m", "gradient_doctor.skill_server"]
    common = [str(script), "--steps", str(args.steps), "--format", "json"]
    if args.python:
        common += ["--python", args.python]
    if args.cwd:
        common += ["--cwd", args.cwd]
    tail = ["--", *args.script_args] if args.script_args else []
    if kind == "probe":
        return [*base, "probe", *common, "--timeout", "600", *tail]
    extra = ["--verify"] if kind == "verify" else []
    return [*base, "check", *common, "--timeout", "600", *extra, *tail]


def _timed(command: list[str], env: dict[str, str]) -> tuple[float, dict[str, object]]:
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=REPO)
    wall = time.perf_counter() - started
    if done.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(command)} failed ({done.returncode}): {done.stderr[-500:]}")
    return wall, json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("scripts", nargs="*", type=Path, default=DEFAULT_SCRIPTS)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--python", default=None, help="interpreter for the scripts")
    parser.add_argument("--cwd", default=None, help="working folder of the scripts")
    parser.add_argument("--omp-threads", type=int, default=None)
    words = sys.argv[1:]
    script_args: list[str] = []
    if "--" in words:
        cut = words.index("--")
        words, script_args = words[:cut], words[cut + 1 :]
    args = parser.parse_args(words)
    args.script_args = script_args
    env = dict(os.environ)
    if args.omp_threads is not None:
        env["OMP_NUM_THREADS"] = str(args.omp_threads)
    print(
        f"steps {args.steps}, trials {args.trials}, cores {os.cpu_count()}, "
        f"OMP_NUM_THREADS={env.get('OMP_NUM_THREADS', 'unset')}"
    )
    worst = 0.0
    for script in args.scripts:
        times: dict[str, list[float]] = {"probe": [], "check": [], "verify": []}
        status = "?"
        overlapped = None
        for _ in range(args.trials):
            for kind in times:
                wall, data = _timed(_command(kind, script, args), env)
                times[kind].append(wall)
                if kind == "verify":
                    verification = data.get("verification") or {}
                    status = str(verification.get("status"))
                    overlapped = verification.get("overlapped")
        medians = {kind: statistics.median(values) for kind, values in times.items()}
        ratio = medians["verify"] / medians["probe"]
        worst = max(worst, ratio)
        print(
            f"{script.name}: probe {medians['probe']:.2f} s, check {medians['check']:.2f} s, "
            f"check --verify {medians['verify']:.2f} s ({status}, runs overlapped: {overlapped})"
            f" -> verify/probe {ratio:.2f}x, verify/check "
            f"{medians['verify'] / medians['check']:.2f}x"
        )
    verdict = "within" if worst <= TARGET else "ABOVE"
    print(f"worst verify/probe ratio {worst:.2f}x: {verdict} the {TARGET}x target")


if __name__ == "__main__":
    main()
