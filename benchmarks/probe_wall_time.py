"""Wall and CPU time of ``gradient-doctor probe`` against a plain run of the same script.

The plain baseline runs SCRIPT unmodified (same interpreter, folder, arguments) and ends the
process after N optimizer steps (one global step post-hook calls ``os._exit``: the point where
the probe stops the script), or after N ``backward()`` calls (``--unit backward``, for scripts
that update their weights by hand). The probe is the CLI as a user runs it (``python -m
gradient_doctor.skill_server probe SCRIPT --steps N --format json -- ARGS``): its start-up, the
supervisor, the child's interpreter, the hooked run, the diagnosis and the JSON report. Rounds
are interleaved (plain, probe, [before]) and summarised by medians (of the times, and of each
round's own wall ratio), so machine noise hits every variant alike; CPU time (user + system of
the whole process tree) is printed beside wall time because wall time on a shared machine also
counts waiting.

Where the time goes, from the same runs (clock times each process writes to a marks file):

- plain: ``start-up`` (interpreter, torch and the script's imports until the script's first
  line) and ``script`` (from there to the N-th step);
- probe: ``launch`` (the tool's start until the supervisor is started), ``child start-up``
  (supervisor, the script's interpreter, torch, the hooks), ``script`` (the hooked run, as the
  child measures it), ``after`` (the supervisor's end, the diagnosis, the report and the exit).

and a timeline (median seconds after the command started) from marks that a
``sitecustomize`` module put first on every variant's ``PYTHONPATH`` writes in each process
that imports ``site`` (the supervisor runs ``-I -S``, so it writes none): ``tool up`` (the
probe's interpreter has run ``site``), ``supervisor started``, ``script python up``, ``torch
imported``, ``step 1``, ``step N`` (an optimizer post-hook registered when
``torch.optim.optimizer`` is imported, before any other), ``supervisor exited`` (seen by the
tool) and ``end``. Before the script's interpreter is up and after its N-th step the probe's
time adds straight to the wall time (serial); in between, the tool's own work (imports,
knowledge, the channel) runs beside the script and costs wall time only when the cores are busy.

    python benchmarks/probe_wall_time.py [SCRIPT] [--steps 30] [--rounds 5] [--threads 1]
        [--python PYTHON] [--cwd DIR] [--before SITE] [--format json|markdown]
        [--unit step|backward] [--summary FILE] [-- SCRIPT_ARGS...]

``--python``: the interpreter of the plain run and of the probed script (default: this one; the
probe itself always runs in this one). ``--before SITE``: also time the probe of another
gradient-doctor installation, a folder put first on ``PYTHONPATH`` (e.g. ``pip install
--no-deps --target SITE`` of an older commit): before/after ratios from the same rounds.
``--threads`` sets ``OMP_NUM_THREADS`` for every variant (default 1: on a small shared machine
two threads per run mostly measure the neighbours; 0 leaves it unset).

Bytecode matters: an installed package ships compiled modules, a checkout under
``PYTHONDONTWRITEBYTECODE=1`` compiles gradient-doctor's modules on every run (about 0.3 s of
CPU); run once without it so that ``__pycache__`` exists, as it does for an installed package.
(The probe's child package does not depend on it: ``launch.cached_child`` keeps one copy with its
own bytecode between runs.)
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_SCRIPT = REPO / "tests" / "fixtures" / "runtime" / "healthy_transformer.py"
MARKS_ENV = "GD_BENCH_MARKS"

PLAIN = """
import os, runpy, sys, time
import torch.optim.optimizer as optimizer_module
limit, unit, script, *args = int(sys.argv[1]), sys.argv[2], sys.argv[3], *sys.argv[4:]
done = [0]
def count(*_):
    done[0] += 1
    if done[0] >= limit:
        sys.stdout.flush()
        os._exit(0)
if unit == "step":
    optimizer_module.register_optimizer_step_post_hook(count)
else:  # a hand-written update: count backward() calls
    import torch.autograd
    original = torch.autograd.backward
    def backward(*a, **k):
        result = original(*a, **k)
        count()
        return result
    torch.autograd.backward = backward
sys.argv = [script, *args]
sys.path[0] = os.path.dirname(os.path.abspath(script))
with open(os.environ["GD_BENCH_MARKS"], "a") as marks:
    marks.write(f"script {time.time()}\\n")
runpy.run_path(script, run_name="__main__")
"""

# The probe's CLI, with marks: the clock times at which it starts the supervisor, sees it exit
# (the first wait that returns a status) and ends (``os._exit``, or the interpreter's exit).
PROBE = """
import atexit, os, runpy, subprocess, sys, time
def mark(name):
    with open(os.environ["GD_BENCH_MARKS"], "a") as marks:
        marks.write(f"{name} {time.time()}\\n")
original, original_wait, original_exit = subprocess.Popen.__init__, subprocess.Popen.wait, os._exit
def marked(self, *args, **kwargs):
    mark("launch")
    original(self, *args, **kwargs)
def waited(self, *args, **kwargs):
    code = original_wait(self, *args, **kwargs)
    mark("reaped")
    return code
def ended(code):
    mark("end")
    original_exit(code)
subprocess.Popen.__init__, subprocess.Popen.wait, os._exit = marked, waited, ended
atexit.register(mark, "end")
sys.argv[0] = "gradient-doctor"
runpy.run_module("gradient_doctor.skill_server", run_name="__main__", alter_sys=True)
"""

# Imported by every interpreter that runs ``site`` with the benchmark's PYTHONPATH: marks when
# the interpreter is up, when torch is imported, and the first and last optimizer steps (the
# hook is registered when torch.optim.optimizer is imported, so it runs before the probe's own
# and before the plain run's stop). Written with the process id: the script's process is the
# one that imports torch.
SITECUSTOMIZE = """
import os, sys, time
_MARKS, _STEPS = os.environ.get("GD_BENCH_MARKS"), int(os.environ.get("GD_BENCH_STEPS", "0"))
def _mark(name):
    with open(_MARKS, "a") as marks:
        marks.write(f"{name}@{os.getpid()} {time.time()}\\n")
class _Finder:
    @staticmethod
    def find_spec(name, path, target=None):
        if name not in ("torch", "torch.optim.optimizer"):
            return None
        import importlib.machinery
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module
        def exec_module(module):
            run(module)
            if name == "torch":
                _mark("torch")
                return
            done = [0]
            def count(*_):
                done[0] += 1
                if done[0] in (1, _STEPS):
                    _mark("step1" if done[0] == 1 else "stepN")
            module.register_optimizer_step_post_hook(count)
        spec.loader.exec_module = exec_module
        return spec
if _MARKS:
    _mark("python")
    sys.meta_path.insert(0, _Finder)
"""

#: The timeline's rows: (mark, label).
TIMELINE = (
    ("python@tool", "tool up"),
    ("launch", "supervisor started"),
    ("python@script", "script python up"),
    ("torch", "torch imported"),
    ("step1", "step 1"),
    ("stepN", "step N"),
    ("reaped", "supervisor exited"),
    ("end", "end"),
)


def timed(
    command: list[str], cwd: Path, env: dict[str, str], marks: Path
) -> tuple[float, float, dict[str, float], str]:
    """Wall and CPU seconds (user + system of the process tree) of one command, the marks it
    wrote (seconds after its start) and its stdout."""
    marks.write_text("")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    clock, started = time.time(), time.perf_counter()
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, check=False, text=True)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    found: dict[str, float] = {"end": wall}
    script_pid = ""
    lines = [line.split() for line in marks.read_text().splitlines()]
    for name, _ in lines:
        if name.startswith("torch@"):
            script_pid = name.split("@")[1]
    for name, value in lines:
        mark, _, pid = name.partition("@")
        if mark == "python":
            mark = "python@script" if pid == script_pid else "python@tool"
        found.setdefault(mark, float(value) - clock)
    if done.returncode not in (0, 1):
        sys.stderr.write(f"{command[:3]} exited {done.returncode}: {done.stderr[-2000:]}\n")
    return wall, cpu, found, done.stdout


def _parts(name: str, wall: float, marks: dict[str, float], stdout: str) -> dict[str, float]:
    """The phases of one run (see the module docstring), seconds."""
    if name == "plain":
        start_up = marks.get("script", float("nan"))
        return {"start-up": start_up, "script": wall - start_up}
    try:
        result = json.loads(stdout)
        watched, script = float(result["wall_s"]), float(result["script_s"])
    except (ValueError, KeyError, TypeError):
        watched = script = float("nan")
    launch = marks.get("launch", float("nan"))
    return {
        "launch": launch,
        "child start-up": watched - script,
        "script": script,
        "after": wall - launch - watched,
    }


def _timeline(timelines: dict[str, list[dict[str, float]]]) -> str:
    """The marks' medians per variant (seconds after the command started), a row per mark."""
    names = list(timelines)
    rows = ["  timeline (s)        " + "".join(f"{name:>9}" for name in names)]
    for mark, label in TIMELINE:
        cells = []
        for name in names:
            values = [found[mark] for found in timelines[name] if mark in found]
            cells.append(f"{statistics.median(values):9.3f}" if values else f"{'-':>9}")
        rows.append(f"  {label:19}" + "".join(cells))
    return "\n".join(rows)


def main() -> None:
    words = sys.argv[1:]
    script_args: list[str] = []
    if "--" in words:
        cut = words.index("--")
        words, script_args = words[:cut], words[cut + 1 :]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("script", nargs="?", default=str(DEFAULT_SCRIPT))
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--unit",
        choices=("step", "backward"),
        default="step",
        help="what ends the plain run: optimizer steps, or backward() calls for a script that "
        "updates its weights by hand (the probe counts those updates as steps)",
    )
    parser.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS (default 1)")
    parser.add_argument(
        "--format",
        choices=("json", "markdown"),
        default="json",
        help="the probe's report (markdown: as a user runs it, with the report rendered after "
        "the run; the child's parts then come from the timeline alone)",
    )
    parser.add_argument("--python", default=sys.executable, help="the script's interpreter")
    parser.add_argument("--cwd", default=None, help="the script's folder (default: its own)")
    parser.add_argument("--before", default=None, metavar="SITE", help="an older installation")
    parser.add_argument(
        "--summary", default=None, metavar="FILE", help="also write the numbers as JSON to FILE"
    )
    args = parser.parse_args(words)
    script = Path(args.script).resolve()
    cwd = Path(args.cwd).resolve() if args.cwd else script.parent
    steps = str(args.steps)
    marks = Path(tempfile.mkstemp(prefix="gd-wall-marks-")[1])
    site = Path(tempfile.mkdtemp(prefix="gd-wall-site-"))
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    pythonpath = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p)
    base_env = {**os.environ, MARKS_ENV: str(marks), "GD_BENCH_STEPS": steps}
    base_env["PYTHONPATH"] = pythonpath
    if args.threads > 0:
        base_env["OMP_NUM_THREADS"] = str(args.threads)
    probe_options = ["--steps", steps, "--format", args.format, "--fail-on", "never"]
    probe_options += ["--python", args.python, "--cwd", str(cwd)]
    probe = [sys.executable, "-c", PROBE, "probe", str(script), *probe_options, "--"]
    plain = [args.python, "-c", PLAIN, steps, args.unit, str(script), *script_args]
    commands = {
        "plain": (plain, base_env),
        "probe": ([*probe, *script_args], base_env),
    }
    if args.before:
        path = os.pathsep.join(p for p in (args.before, base_env.get("PYTHONPATH")) if p)
        commands["before"] = ([*probe, *script_args], {**base_env, "PYTHONPATH": path})
    results: dict[str, list[tuple[float, float, dict[str, float]]]] = {n: [] for n in commands}
    timelines: dict[str, list[dict[str, float]]] = {n: [] for n in commands}
    loads = [os.getloadavg()[0]]
    try:
        for round_index in range(args.rounds + 1):  # round 0 warms the caches
            for name, (command, env) in commands.items():
                wall, cpu, found, stdout = timed(command, cwd, env, marks)
                if round_index:
                    results[name].append((wall, cpu, _parts(name, wall, found, stdout)))
                    timelines[name].append(found)
    finally:
        marks.unlink(missing_ok=True)
        shutil.rmtree(site, ignore_errors=True)
    loads.append(os.getloadavg()[0])
    load = sum(loads) / 2

    def median(name: str, index: int) -> float:
        return statistics.median(float(value[index]) for value in results[name])  # type: ignore[arg-type]

    def part(name: str, key: str) -> float:
        return statistics.median(value[2][key] for value in results[name])

    print(
        f"{script.name} {' '.join(script_args)}".strip()
        + f", {args.steps} steps, {args.rounds} rounds (medians), load {load:.1f} on "
        f"{os.cpu_count()} cores (1-min load average {loads[0]:.2f} at the start, "
        f"{loads[1]:.2f} at the end)"
    )
    for name in commands:
        breakdown = ", ".join(f"{key} {part(name, key):.2f}" for key in results[name][0][2])
        print(
            f"  {name:7} wall {median(name, 0):6.2f} s   cpu {median(name, 1):6.2f} s   "
            f"({breakdown})"
        )
    print(_timeline(timelines))
    plain_wall, plain_cpu = median("plain", 0), median("plain", 1)
    summary: dict[str, object] = {
        "script": f"{script.name} {' '.join(script_args)}".strip(),
        "steps": args.steps,
        "rounds": args.rounds,
        "load": [round(loads[0], 2), round(loads[1], 2)],
        "variants": {},
    }
    for name in commands:
        row: dict[str, object] = {"wall_s": median(name, 0), "cpu_s": median(name, 1)}
        if name != "plain":
            # Also the median of each round's own ratio: the load of a shared machine drifts
            # over minutes, and a round's variants run seconds apart. The quartiles of those
            # ratios say how far one round can be trusted.
            walls = _per_round(results[name], results["plain"], 0)
            cpus = _per_round(results[name], results["plain"], 1)
            row.update(
                wall_ratio=median(name, 0) / plain_wall,
                wall_ratio_per_round=statistics.median(walls),
                wall_ratio_quartiles=_quartiles(walls),
                cpu_ratio=median(name, 1) / plain_cpu,
                cpu_ratio_per_round=statistics.median(cpus),
                cpu_ratio_quartiles=_quartiles(cpus),
            )
            low, high = row["wall_ratio_quartiles"]  # type: ignore[misc]
            print(
                f"{name} / plain: wall {row['wall_ratio']:.3f}x (per round "
                f"{row['wall_ratio_per_round']:.3f}x, quartiles {low:.3f}-{high:.3f}), "
                f"cpu {row['cpu_ratio']:.3f}x (per round {row['cpu_ratio_per_round']:.3f}x)"
            )
        summary["variants"][name] = row  # type: ignore[index]
    if args.summary:
        Path(args.summary).write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")


def _per_round(
    mine: list[tuple[float, float, dict[str, float]]],
    plain: list[tuple[float, float, dict[str, float]]],
    index: int,
) -> list[float]:
    """Each round's own ratio of wall (index 0) or CPU (index 1) time to the plain run's."""
    return [float(a[index]) / float(b[index]) for a, b in zip(mine, plain, strict=True)]


def _quartiles(values: list[float]) -> tuple[float, float]:
    """The lower and upper quartiles (the values themselves when there are fewer than 4)."""
    if len(values) < 4:
        return min(values), max(values)
    low, _, high = statistics.quantiles(values, n=4)
    return low, high


if __name__ == "__main__":
    main()
