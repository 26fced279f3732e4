"""How fast the MCP server answers ``initialize`` over stdio, from process start.

Starts ``gradient-doctor serve`` (as ``python -m skill_server serve``) several times, sends an
``initialize`` request on stdin the moment the process is spawned, and times until the answer
arrives on stdout. The baseline, measured in the same run, is a bare interpreter start
(``python -c pass``). Prints the medians and their ratio; the target is under 1 s.

    .venv/bin/python benchmarks/server_startup.py [--runs 7]
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

REPO = Path(__file__).resolve().parent.parent
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "startup-benchmark", "version": "0"},
    },
}
TARGET_S = 1.0


def time_initialize() -> float:
    """Seconds from spawning the server to reading its initialize response."""
    started = time.perf_counter()
    process = subprocess.Popen(
        [sys.executable, "-m", "gradient_doctor.skill_server", "serve"],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert process.stdin is not None and process.stdout is not None
    process.stdin.write((json.dumps(INITIALIZE) + "\n").encode())
    process.stdin.flush()
    line = process.stdout.readline()
    elapsed = time.perf_counter() - started
    process.stdin.close()
    process.wait(timeout=10)
    answer = json.loads(line)
    if answer.get("id") != 1 or "result" not in answer:
        raise RuntimeError(f"unexpected answer to initialize: {line[:200]!r}")
    return elapsed


def time_bare_python() -> float:
    """Seconds to start and stop a bare interpreter."""
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    time_initialize()  # warm the file-system cache and .pyc files; not counted
    server = [time_initialize() for _ in range(args.runs)]
    bare = [time_bare_python() for _ in range(args.runs)]
    server_s, bare_s = statistics.median(server), statistics.median(bare)
    print(
        f"initialize answered after {server_s:.3f} s (median of {args.runs}; target < {TARGET_S} s)"
    )
    print(f"bare `python -c pass`: {bare_s:.3f} s; ratio {server_s / bare_s:.1f}x")
    return 0 if server_s < TARGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
