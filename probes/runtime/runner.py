"""Run a training script under the probe in a child process (parent side; never imports torch).

The process tree (``probes.runtime.supervisor`` says why each piece is there)::

    caller ── supervisor ── shim ── child: INTERPRETER -m _gradient_doctor_probe SCRIPT ARGS...

The child runs in the user's interpreter (``probes.runtime.interpreter``: ``--python``, else the
project's virtualenv, ``$VIRTUAL_ENV``, ``$CONDA_PREFIX``, the tool's own), with only the child
package (``probes.runtime.child``, copied into the run's temporary folder) added to its path,
in the script's folder (or ``cwd``), with the caller's secrets removed from its environment and
an optional address-space cap. Measurements come back over the side channel
(``probes.runtime.child.channel``); stdout and stderr are drained and only their tails kept.
The diagnosis (``probes.runtime.diagnose``) runs here, in the parent.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Collection, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import anyio
from anyio.abc import ByteReceiveStream, Process

from gradient_doctor.probes.runtime import child as child_package
from gradient_doctor.probes.runtime import interpreter as interpreters
from gradient_doctor.probes.runtime import supervisor as supervisor_module
from gradient_doctor.probes.runtime.child import STAGED_PACKAGE
from gradient_doctor.probes.runtime.child.channel import CHANNEL_ENV, SETTINGS_ENV, ChannelReader
from gradient_doctor.probes.runtime.child.rankenv import LAUNCHER_GD
from gradient_doctor.probes.runtime.diagnose import build_result, resolve_profile
from gradient_doctor.probes.runtime.launch import Launch
from gradient_doctor.probes.runtime.ranks import RankCollector, torchrun_command
from gradient_doctor.probes.runtime.result import (
    ChildSummary,
    InterpreterInfo,
    IsolationInfo,
    ProbeResult,
    SeedingInfo,
    StepRecord,
)
from gradient_doctor.probes.runtime.signals.base import warm_knowledge

ProgressCallback = Callable[[int, int], Awaitable[None] | None]

DEVICES = ("auto", "cpu", "cuda")
POLL_S = 0.05
TERM_GRACE_S = 1.0
KILL_WAIT_S = 0.8
OUTPUT_TAIL_BYTES = 16_384
MAX_SCRIPT_BYTES = 10_000_000
#: Ranks ``--nproc`` may start on one machine.
MAX_NPROC = 64
#: The smallest ``max_memory`` accepted: below it no Python interpreter starts.
MIN_MEMORY_BYTES = 64 * 2**20
#: Environment variables never passed to the script: the server's bearer token.
SECRET_ENV = frozenset({"GRADIENT_DOCTOR_TOKEN"})
#: How long the supervisor may take to stop everything after ``stop`` (its grace + sweeps).
SUPERVISOR_STOP_S = TERM_GRACE_S + 3.0


class ProbeInputError(ValueError):
    """The probe's input is unusable (missing script, bad option): one line, no traceback."""


def _check_script(script: str | os.PathLike[str]) -> Path:
    path = Path(script).expanduser()
    if not path.exists():
        raise ProbeInputError(f"no such script: {path}")
    if not path.is_file():
        raise ProbeInputError(f"not a file: {path}")
    try:
        with path.open("rb") as handle:
            head = handle.read(8192)
    except OSError as exc:
        raise ProbeInputError(f"cannot read {path}: {exc.strerror or exc}") from None
    if b"\x00" in head:
        raise ProbeInputError(f"{path} is a binary file, not a Python script")
    if path.stat().st_size > MAX_SCRIPT_BYTES:
        raise ProbeInputError(f"{path} is larger than {MAX_SCRIPT_BYTES // 1_000_000} MB")
    return path.resolve()


def _check_options(steps: int, timeout_s: float, device: str, sample_every: int) -> None:
    if steps < 1:
        raise ProbeInputError(f"steps must be at least 1 (got {steps})")
    if not (timeout_s > 0 and math.isfinite(timeout_s)):
        raise ProbeInputError(f"timeout must be a positive number of seconds (got {timeout_s})")
    if device not in DEVICES:
        raise ProbeInputError(f"device must be one of {', '.join(DEVICES)} (got {device!r})")
    if sample_every < 1:
        raise ProbeInputError(f"sample_every must be at least 1 (got {sample_every})")


def stage_child(folder: Path) -> Path:
    """Copy the child package into ``folder/STAGED_PACKAGE``; returns the folder to put on
    ``PYTHONPATH``. Only these few stdlib-and-torch modules enter the user's interpreter.

    The bytecode compiled at install time comes along: the sources keep their modification
    times (``copy2``), so a child interpreter of the same version loads the cached bytecode
    instead of compiling some 3,000 lines on every run (about 0.1 s); another version ignores
    it (its tag differs) and compiles, as it would anyway."""
    target = folder / STAGED_PACKAGE
    target.mkdir()
    source = Path(child_package.__file__).parent
    for module in source.glob("*.py"):
        shutil.copy2(module, target / module.name)
    cached = [
        compiled
        for compiled in (source / "__pycache__").glob("*.pyc")
        if (source / f"{compiled.name.split('.', 1)[0]}.py").is_file()
    ]
    if cached:
        (target / "__pycache__").mkdir()
        for compiled in cached:
            shutil.copy2(compiled, target / "__pycache__" / compiled.name)
    return folder


class _Tail:
    """Keeps the last bytes of a stream the script writes (which may be megabytes)."""

    def __init__(self) -> None:
        self.data = bytearray()

    def add(self, chunk: bytes) -> None:
        self.data += chunk
        if len(self.data) > 2 * OUTPUT_TAIL_BYTES:
            del self.data[: len(self.data) - OUTPUT_TAIL_BYTES]

    def text(self) -> str:
        return bytes(self.data[-OUTPUT_TAIL_BYTES:]).decode("utf-8", "replace")


async def _drain(stream: ByteReceiveStream | None, tail: _Tail, done: anyio.Event) -> None:
    try:
        if stream is None:
            return
        async for chunk in stream:
            tail.add(chunk)
    except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
        return
    finally:
        done.set()


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


async def _stop_supervisor(process: Process, child_pid: int | None) -> None:
    """Ask the supervisor to stop the run (SIGTERM to the script's tree, a grace, SIGKILL) and
    wait for it; SIGKILL it and the script's group only if it does not answer in time."""
    if process.returncode is None and process.stdin is not None:
        with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            await process.stdin.send(b"stop\n")
    with anyio.move_on_after(SUPERVISOR_STOP_S):
        await process.wait()
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        if child_pid is not None:
            _signal_group(child_pid, signal.SIGKILL)
        with anyio.move_on_after(KILL_WAIT_S):
            await process.wait()


async def _notify(on_progress: ProgressCallback | None, done: int, total: int) -> None:
    if on_progress is None:
        return
    outcome = on_progress(done, total)
    if inspect.isawaitable(outcome):
        await outcome


def _child_environment(
    chosen: interpreters.Interpreter, scrub_env: Collection[str]
) -> tuple[dict[str, str], list[str]]:
    """The caller's environment for the script: secrets removed, the environment activated."""
    secret = SECRET_ENV | {name for name in scrub_env if name}
    env = {k: v for k, v in os.environ.items() if k not in secret}
    removed = sorted(k for k in os.environ if k in secret)
    return interpreters.activation(chosen, env), removed


def _read_json(path: Path) -> dict[str, Any]:
    try:
        loaded = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


async def run_probe_async(
    script: str | os.PathLike[str],
    args: Sequence[str] = (),
    *,
    steps: int = 30,
    timeout_s: float = 120.0,
    device: str = "auto",
    sample_every: int = 10,
    cwd: str | os.PathLike[str] | None = None,
    on_progress: ProgressCallback | None = None,
    profile: str | None = None,
    nproc: int | None = None,
    launch: Launch | None = None,
    seed: int | None = None,
    source: str | None = None,
    threads: int | None = None,
) -> ProbeResult:
    """Run ``script`` for up to ``steps`` optimizer steps under the probe and diagnose it.

    ``on_progress(done, total)`` (sync or async) is called as steps complete. On timeout, or if
    the awaiting task is cancelled, the script and everything it started are sent SIGTERM then
    SIGKILL (within 2 s), and a cancellation is re-raised. Raises :class:`ProbeInputError` for
    unusable input (missing script, bad option, unknown threshold profile, an interpreter that
    does not exist, is not Python or has no usable torch, ``device="cuda"`` without CUDA);
    everything the script does wrong is a status.

    ``cwd``: the script's working folder (default: the script's own folder). ``launch``: the
    interpreter, memory cap and secrets to scrub (:class:`Launch`).

    ``nproc`` > 1 launches the script like ``torchrun --nproc-per-node nproc`` (PyTorch's
    launcher, in the child): every rank is probed and rank 0 merges them
    (``probes.runtime.ranks``, ``ProbeResult.distributed``).

    For verification (``probes.verify``): ``source`` is a text (a patched copy of the script)
    that runs in place of the script's own, under the script's path, folder, argv and
    interpreter; it is written only to the run's temporary folder. ``seed`` seeds ``random``,
    torch and numpy in the child before the script runs and records the script's own seeding
    (``ProbeResult.seeding``). ``threads`` lowers torch's intra-op thread count (two runs that
    overlap on few cores).
    """
    path = _check_script(script)
    _check_options(steps, timeout_s, device, sample_every)
    launch = launch or Launch()
    max_memory = launch.max_memory
    if nproc is not None and not 1 <= nproc <= MAX_NPROC:
        raise ProbeInputError(f"nproc must be between 1 and {MAX_NPROC} (got {nproc})")
    if max_memory is not None and max_memory < MIN_MEMORY_BYTES:
        raise ProbeInputError(
            f"max_memory must be at least {MIN_MEMORY_BYTES // 2**20} MiB (got {max_memory} bytes)"
        )
    try:
        threshold_profile = resolve_profile(profile, warm=False)
    except KeyError as exc:
        raise ProbeInputError(str(exc.args[0]) if exc.args else str(exc)) from None
    workdir = Path(cwd).expanduser().absolute() if cwd is not None else path.parent
    if not workdir.is_dir():
        raise ProbeInputError(f"working directory does not exist: {workdir}")
    try:
        chosen = interpreters.choose(path, launch.python, boundary=launch.venv_boundary)
    except interpreters.InterpreterError as exc:
        raise ProbeInputError(str(exc)) from None

    tmp = Path(tempfile.mkdtemp(prefix="gradient-doctor-probe-"))
    channel = tmp / "channel.jsonl"
    channel.touch()
    report_path = tmp / "supervisor.json"
    env, scrubbed = _child_environment(chosen, launch.scrub_env)
    env[CHANNEL_ENV] = str(channel)
    settings: dict[str, Any] = {"steps": steps, "sample_every": sample_every, "device": device}
    if max_memory is not None:
        settings["max_memory"] = max_memory
    if seed is not None:
        settings["seed"] = int(seed)
    if threads is not None:
        settings["threads"] = max(1, int(threads))
    if source is not None:
        patched = tmp / "patched_source.py"
        patched.write_text(source, encoding="utf-8")
        settings["source_file"] = str(patched)
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    env.setdefault("PYTHONUNBUFFERED", "1")
    staged = stage_child(tmp)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(staged), env.get("PYTHONPATH", "")) if p)
    command = [chosen.path, "-m", STAGED_PACKAGE, str(path), *map(str, args)]
    ranks = RankCollector(channel, nproc)
    if nproc is not None and nproc > 1:
        settings.update(launcher=LAUNCHER_GD, timeout_s=timeout_s)
        env.setdefault("OMP_NUM_THREADS", "1")
        command = torchrun_command(chosen.path, nproc, command[2:])
    env[SETTINGS_ENV] = json.dumps(settings)
    supervision = {
        "command": command,
        "cwd": str(workdir),
        "max_memory": max_memory,
        "report": str(report_path),
        "run_folder": str(tmp),
        "caller_pid": os.getpid(),
        "grace_s": TERM_GRACE_S,
    }

    reader = ChannelReader(channel)
    records: list[StepRecord] = []
    summary: ChildSummary | None = None
    seeding: SeedingInfo | None = None
    hello: dict[str, Any] | None = None
    out_tail, err_tail = _Tail(), _Tail()
    timed_out = False
    started = time.perf_counter()
    report: dict[str, Any] = {}

    def absorb(messages: list[dict[str, Any]]) -> int:
        nonlocal summary, hello, seeding
        newest = 0
        for message in messages:
            kind = message.pop("kind", None)
            if kind == "step":
                records.append(StepRecord.model_validate(message))
            elif kind == "progress":
                newest = max(newest, int(message.get("step", 0)))
            elif kind == "summary":
                summary = ChildSummary.model_validate(message)
            elif kind == "hello":
                hello = hello or message
            elif kind == "seeding":
                seeding = SeedingInfo.model_validate(message)
            else:
                ranks.add(kind, message)
        return newest

    try:
        process = await anyio.open_process(
            [sys.executable, "-I", "-S", supervisor_module.__file__, json.dumps(supervision)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=str(tmp),
            env=env,
            start_new_session=True,
        )
        warm_knowledge()  # while the child starts its interpreter and imports torch
        try:
            async with anyio.create_task_group() as group:
                drained = (anyio.Event(), anyio.Event())
                group.start_soon(_drain, process.stdout, out_tail, drained[0])
                group.start_soon(_drain, process.stderr, err_tail, drained[1])
                exited = anyio.Event()

                async def wait_exit() -> None:
                    await process.wait()
                    exited.set()

                group.start_soon(wait_exit)
                deadline = started + timeout_s
                while not exited.is_set():
                    with anyio.move_on_after(POLL_S):
                        await exited.wait()
                    done = absorb(reader.read_new())
                    if done:
                        await _notify(on_progress, min(done, steps), steps)
                    if time.perf_counter() > deadline and not exited.is_set():
                        timed_out = True
                        await _stop_supervisor(process, _child_pid(tmp))
                        break
                ranks.stop()  # torchrun's ranks live in sessions of their own
                # The supervisor has stopped every process below it; the pipes close with them.
                with anyio.move_on_after(0.5):
                    for event in drained:
                        await event.wait()
                group.cancel_scope.cancel()
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True):
                await _stop_supervisor(process, _child_pid(tmp))
            raise
        absorb(reader.read_new())
        report = _read_json(report_path)
    finally:
        ranks.finish()
        shutil.rmtree(tmp, ignore_errors=True)

    wall_s = time.perf_counter() - started
    where = f"{chosen.path} ({chosen.reason})"
    if report.get("exec_error"):
        raise ProbeInputError(f"cannot run the interpreter {where}: {report['exec_error']}")
    if hello is None and not timed_out:
        why = _last_line(err_tail.text()) or _exit_text(report.get("returncode"))
        raise ProbeInputError(
            f"the interpreter {where} did not start the probe ({why}); is it Python 3.10 or newer?"
        )
    summary = ranks.summary(summary)
    if summary is not None and summary.input_error:
        raise ProbeInputError(summary.message or "the probe's input was not usable")
    # The shim dies by a signal when the script kills it, or when a stop had to SIGKILL it.
    parent_killed = None if report.get("stopped") else report.get("shim", {}).get("signal")
    if summary is None:
        summary = _summary_without_report(
            timed_out,
            timeout_s,
            report.get("returncode"),
            len(records),
            err_tail.text(),
            parent_killed=parent_killed,
            max_memory=max_memory,
        )
    elif timed_out:
        summary = summary.model_copy(update={"status": "timeout"})
    result = build_result(
        script=str(path),
        args=[str(a) for a in args],
        steps_requested=steps,
        sample_every=sample_every,
        records=ranks.records(records),
        summary=summary,
        profile=threshold_profile,
        wall_s=wall_s,
    )
    result = result.model_copy(
        update={
            "interpreter": InterpreterInfo(
                path=chosen.path,
                source=chosen.source,
                reason=chosen.reason,
                python_version=str(hello.get("python")) if hello else None,
            ),
            "isolation": IsolationInfo(
                working_dir=str(workdir),
                max_memory=max_memory,
                scrubbed_env=scrubbed,
                parent_signals=[
                    f"{s.get('signal')}"
                    + (f" from pid {s['from_pid']}" if s.get("from_pid") else "")
                    + " (ignored)"
                    for s in report.get("signals", [])
                ],
                parent_killed=parent_killed,
                left_behind=[str(n) for n in report.get("left_behind", [])],
            ),
            "seeding": seeding,
            "patched": source is not None,
        }
    )
    return ranks.apply(result, summary)


def _child_pid(run_folder: Path) -> int | None:
    """The script process's pid, as the shim recorded it (for the last-resort group kill)."""
    pid = _read_json(run_folder / "supervisor.json.parent").get("child_pid")
    return int(pid) if isinstance(pid, int) else None


def _exit_text(return_code: int | None) -> str:
    if return_code is None:
        return "no exit status"
    if return_code < 0:
        number = -return_code
        name = signal.Signals(number).name if number in signal.valid_signals() else str(number)
        return f"killed by {name}"
    return f"exit code {return_code}, nothing on stderr"


#: What native libraries print when an allocation fails before they end the process.
_MEMORY_FAILURE = re.compile(
    r"memory allocation (still )?failed|cannot allocate memory|std::bad_alloc|out of memory",
    re.IGNORECASE,
)


def _summary_without_report(
    timed_out: bool,
    timeout_s: float,
    return_code: int | None,
    steps: int,
    stderr_tail: str,
    *,
    parent_killed: str | None = None,
    max_memory: int | None = None,
) -> ChildSummary:
    """What we can say when the child never sent its summary (killed, os._exit, crash)."""
    tail = "\n".join(stderr_tail.strip().splitlines()[-15:]) or None

    def summary(status: Any, message: str) -> ChildSummary:
        return ChildSummary(
            status=status, message=message, parameters=[], shapes=[], layers=[], traceback_tail=tail
        )

    if timed_out:
        return summary(
            "timeout",
            f"the script ran past the {timeout_s:g} s limit after {steps} optimizer "
            "steps and was stopped (with every process it had started)",
        )
    if f"{STAGED_PACKAGE}{os.sep}" in stderr_tail and "Traceback" in stderr_tail:
        # The child's own code failed outside the script (after the script's error, or
        # while reporting): say so rather than blame the script or call it a non-training one.
        return summary(
            "script-error",
            f"the probe failed in its own code after {steps} optimizer steps (a bug in "
            f"gradient-doctor): {_last_line(stderr_tail)}",
        )
    if parent_killed is not None:
        return summary(
            "script-error",
            f"the script killed its parent process with {parent_killed} after {steps} optimizer "
            "steps, which ended the run (the probe's supervisor and the caller were not harmed)",
        )
    if _MEMORY_FAILURE.search(stderr_tail[-4000:]):
        # Native libraries (OpenBLAS, the C++ runtime) end the process themselves when an
        # allocation fails, so no Python exception (and no summary) tells us.
        cap = f" under the {max_memory / 2**20:g} MiB --max-memory cap" if max_memory else ""
        return summary(
            "out-of-memory",
            f"the script's process ran out of memory{cap} after {steps} optimizer steps: "
            f"{_last_line(stderr_tail)}",
        )
    if return_code is not None and return_code < 0:
        name = signal.Signals(-return_code).name if -return_code in signal.valid_signals() else ""
        hint = ""
        if name == "SIGKILL":
            hint = " (the kernel's out-of-memory killer does this)"
        if max_memory is not None and name in ("SIGKILL", "SIGABRT", "SIGSEGV"):
            hint = f" (it may have run out of the {max_memory / 2**20:g} MiB --max-memory cap)"
        killed = f"the script's process was killed by signal {name or -return_code}"
        return summary("script-error", killed + hint)
    if steps == 0:
        return summary(
            "no-training-loop",
            f"the script ended (exit code {return_code}) before any optimizer step",
        )
    return summary(
        "script-error",
        f"the script's process ended (exit code {return_code}) after {steps} optimizer steps "
        "without reporting",
    )


def run_probe(
    script: str | os.PathLike[str],
    args: Sequence[str] = (),
    **options: Any,
) -> ProbeResult:
    """Synchronous :func:`run_probe_async` (runs its own event loop); same keyword options."""
    return anyio.run(partial(run_probe_async, script, args, **options))
