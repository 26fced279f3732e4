"""Wall and CPU time of ``gradient-doctor probe`` against a plain run of the same script.

The plain baseline runs SCRIPT unmodified in the same interpreter and ends the process after N
optimizer steps (one global step post-hook calls ``os._exit``: the point where the probe stops
the script). The probe is the CLI as a user runs it (``python -m gradient_doctor.skill_server
probe SCRIPT --steps N --format json``): its start-up, the supervisor, the child's interpreter,
the hooked run, the diagnosis and the JSON report. Rounds are interleaved (plain, probe, parts)
and summarised by medians, so machine noise hits both alike; CPU time (user + system of the
whole process tree) is printed beside wall time because wall time on a shared machine also
counts waiting.

The parts, measured in the same rounds, say where the extra time goes:
- ``launch imports``: a process that imports what the CLI imports before it starts the script
  (the command line, the probe's runner and result models, the threshold profile);
- ``child alone``: the probe's child package running the script for N steps without the
  parent (interpreter start, torch import, the hooks, the run), against ``plain``.

    python benchmarks/probe_wall_time.py [SCRIPT] [--steps 30] [--rounds 5] [--threads 1]

``--threads`` sets ``OMP_NUM_THREADS`` for every variant (default 1: on a small shared machine
two threads per run mostly measure the neighbours).

Bytecode matters: an installed package ships compiled modules, a checkout under
``PYTHONDONTWRITEBYTECODE=1`` compiles gradient-doctor's modules on every run (about 0.3 s of
CPU); run once without it so that ``__pycache__`` exists, as it does for an installed package.
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

PLAIN = """
import os, runpy, sys
import torch.optim.optimizer as optimizer_module
limit, script, *args = int(sys.argv[1]), sys.argv[2], *sys.argv[3:]
done = [0]
def count(*_):
    done[0] += 1
    if done[0] >= limit:
        sys.stdout.flush()
        os._exit(0)
optimizer_module.register_optimizer_step_post_hook(count)
sys.argv = [script, *args]
sys.path[0] = os.path.dirname(os.path.abspath(script))
runpy.run_path(script, run_name="__main__")
"""

LAUNCH_IMPORTS = """
from gradient_doctor.skill_server import cli
from gradient_doctor.skill_server.commands import probe
from gradient_doctor.probes.runtime import run_probe
from gradient_doctor.probes.runtime.diagnose import resolve_profile
resolve_profile(None, warm=False)
"""


def timed(command: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, float]:
    """Wall and CPU seconds (user + system of the process tree) of one command."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(command, cwd=cwd, env=env, capture_output=True, check=False)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("script", nargs="?", default=str(DEFAULT_SCRIPT))
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS (default 1)")
    args = parser.parse_args()
    base_env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    script = Path(args.script).resolve()
    python = sys.executable
    steps = str(args.steps)

    from gradient_doctor.probes.runtime.runner import stage_child

    staged = Path(tempfile.mkdtemp(prefix="gd-wall-"))
    stage_child(staged)
    channel = staged / "channel.jsonl"
    child_env = {
        **base_env,
        "PYTHONPATH": str(staged),
        "GRADIENT_DOCTOR_CHANNEL": str(channel),
        "GRADIENT_DOCTOR_PROBE": json.dumps({"steps": args.steps, "sample_every": 10}),
    }
    probe = [python, "-m", "gradient_doctor.skill_server", "probe", str(script)]
    options = ["--steps", steps, "--format", "json", "--fail-on", "never", "--python", python]
    commands = {
        "plain": ([python, "-c", PLAIN, steps, str(script)], base_env),
        "probe": ([*probe, *options], base_env),
        "launch imports": ([python, "-c", LAUNCH_IMPORTS], base_env),
        "child alone": ([python, "-m", "_gradient_doctor_probe", str(script)], child_env),
    }
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in commands}
    try:
        for round_index in range(args.rounds + 1):  # round 0 warms the caches
            for name, (command, env) in commands.items():
                channel.write_text("")
                measured = timed(command, script.parent, env)
                if round_index:
                    results[name].append(measured)
    finally:
        shutil.rmtree(staged, ignore_errors=True)

    def median(name: str, index: int) -> float:
        return statistics.median(value[index] for value in results[name])

    print(f"{script.name}, {args.steps} steps, {args.rounds} rounds (medians)")
    for name in commands:
        print(f"  {name:15} wall {median(name, 0):6.2f} s   cpu {median(name, 1):6.2f} s")
    plain_wall, plain_cpu = median("plain", 0), median("plain", 1)
    print(
        f"probe / plain: wall {median('probe', 0) / plain_wall:.3f}x, "
        f"cpu {median('probe', 1) / plain_cpu:.3f}x"
    )
    print(
        f"extra CPU: {median('probe', 1) - plain_cpu:+.2f} s = launch imports "
        f"{median('launch imports', 1):.2f} s + hooks in the child "
        f"{median('child alone', 1) - plain_cpu:+.2f} s + the rest (supervisor, knowledge "
        f"loaded during the run, diagnosis, report) "
        f"{median('probe', 1) - median('child alone', 1) - median('launch imports', 1):+.2f} s"
    )


if __name__ == "__main__":
    main()
