"""How fast the MCP server answers over stdio, from process start.

Starts ``gradient-doctor serve`` (as ``python -m gradient_doctor.skill_server serve``) several
times, writes an ``initialize`` request on stdin the moment the process is spawned, and times
until its answer arrives on stdout; then sends ``notifications/initialized`` and
``tools/list`` and times that answer too (the SDK has loaded by then). The ``initialize``
answer comes from the server's cache when it has one (``skill_server.stdio``), so it is timed
twice: with the cache filled by an earlier start, and with an empty cache folder each run.

The baseline, measured in the same run, is a bare interpreter start (``python -c pass``).
Prints medians and their ratios to the baseline; the target is ``initialize`` under 0.5 s.

    .venv/bin/python benchmarks/server_startup.py [--runs 7] [--python OTHER/bin/python]

``--python`` times another installation (e.g. another checkout's venv) the same way.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO

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
INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}
LIST_TOOLS = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
TARGET_S = 0.5


def _send(stream: IO[bytes], message: dict[str, object]) -> None:
    stream.write((json.dumps(message) + "\n").encode())
    stream.flush()


def _answer(stream: IO[bytes], wanted_id: int) -> dict[str, object]:
    while True:
        line = stream.readline()
        if not line:
            raise RuntimeError("the server closed stdout before answering")
        message = json.loads(line)
        if message.get("id") == wanted_id:
            if "result" not in message:
                raise RuntimeError(f"error answer: {line[:300]!r}")
            return dict(message)


def time_server(python: str, cache_home: str) -> tuple[float, float]:
    """Seconds from spawning the server to its initialize answer and its tools/list answer."""
    started = time.perf_counter()
    process = subprocess.Popen(
        [python, "-m", "gradient_doctor.skill_server", "serve"],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "XDG_CACHE_HOME": cache_home},
    )
    assert process.stdin is not None and process.stdout is not None
    _send(process.stdin, INITIALIZE)
    _answer(process.stdout, 1)
    initialized = time.perf_counter() - started
    _send(process.stdin, INITIALIZED)
    _send(process.stdin, LIST_TOOLS)
    tools = _answer(process.stdout, 2)
    listed = time.perf_counter() - started
    process.stdin.close()
    process.wait(timeout=10)
    if not tools.get("result", {}).get("tools"):  # type: ignore[union-attr]
        raise RuntimeError("tools/list returned no tools")
    return initialized, listed


def time_bare_python(python: str) -> float:
    """Seconds to start and stop a bare interpreter."""
    started = time.perf_counter()
    subprocess.run([python, "-c", "pass"], check=True)
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--python", default=sys.executable, help="interpreter of the install")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as warm_home:
        time_server(args.python, warm_home)  # fills the cache, warms .pyc files; not counted
        warm, cold = [], []
        for _ in range(args.runs):  # interleaved, so that a change of load hits both alike
            warm.append(time_server(args.python, warm_home))
            with tempfile.TemporaryDirectory() as empty_home:
                cold.append(time_server(args.python, empty_home))
    bare_s = statistics.median(time_bare_python(args.python) for _ in range(args.runs))
    rows = [
        ("initialize (cache filled)", statistics.median(w[0] for w in warm)),
        ("tools/list (cache filled)", statistics.median(w[1] for w in warm)),
        ("initialize (empty cache)", statistics.median(c[0] for c in cold)),
        ("tools/list (empty cache)", statistics.median(c[1] for c in cold)),
    ]
    print(f"bare `python -c pass`: {bare_s:.3f} s (median of {args.runs})")
    for name, seconds in rows:
        print(f"{name:<27} {seconds:.3f} s  ratio {seconds / bare_s:5.1f}x")
    verdict = "meets" if rows[0][1] < TARGET_S else "misses"
    print(f"initialize {verdict} the {TARGET_S} s target")
    return 0 if rows[0][1] < TARGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
