"""Run a training script under the probe in a child process (parent side; never imports torch).

The child is ``python -m _gradient_doctor_probe SCRIPT ARGS...`` (``probes.runtime.child``,
copied into the run's temporary folder so that only it enters the script's interpreter) in its
own session (so its whole process group — DataLoader workers, anything it spawns — can be
stopped at once), with the script's folder as the working directory by default. Measurements
come back over the side channel (``probes.runtime.child.channel``); stdout and stderr are
drained and only their tails kept.
The diagnosis (``probes.runtime.diagnose``) runs here, in the parent.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import anyio
from anyio.abc import ByteReceiveStream, Process

from gradient_doctor.probes.runtime import child as child_package
from gradient_doctor.probes.runtime.child import STAGED_PACKAGE
from gradient_doctor.probes.runtime.child.channel import CHANNEL_ENV, SETTINGS_ENV, ChannelReader
from gradient_doctor.probes.runtime.child.rankenv import LAUNCHER_GD
from gradient_doctor.probes.runtime.diagnose import build_result, resolve_profile
from gradient_doctor.probes.runtime.ranks import RankCollector, torchrun_command
from gradient_doctor.probes.runtime.result import ChildSummary, ProbeResult, StepRecord

ProgressCallback = Callable[[int, int], Awaitable[None] | None]

DEVICES = ("auto", "cpu", "cuda")
POLL_S = 0.05
TERM_GRACE_S = 1.0
KILL_WAIT_S = 0.8
OUTPUT_TAIL_BYTES = 16_384
MAX_SCRIPT_BYTES = 10_000_000
#: Ranks ``--nproc`` may start on one machine.
MAX_NPROC = 64


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
    ``PYTHONPATH``. Only these few stdlib-and-torch modules enter the user's interpreter."""
    target = folder / STAGED_PACKAGE
    target.mkdir()
    source = Path(child_package.__file__).parent
    for module in source.glob("*.py"):
        shutil.copyfile(module, target / module.name)
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


async def _stop_group(process: Process) -> None:
    """SIGTERM the child's process group, then SIGKILL after a short grace (≤ 2 s in all)."""
    _signal_group(process.pid, signal.SIGTERM)
    with anyio.move_on_after(TERM_GRACE_S):
        await process.wait()
    _signal_group(process.pid, signal.SIGKILL)
    with anyio.move_on_after(KILL_WAIT_S):
        await process.wait()


async def _notify(on_progress: ProgressCallback | None, done: int, total: int) -> None:
    if on_progress is None:
        return
    outcome = on_progress(done, total)
    if inspect.isawaitable(outcome):
        await outcome


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
) -> ProbeResult:
    """Run ``script`` for up to ``steps`` optimizer steps under the probe and diagnose it.

    ``on_progress(done, total)`` (sync or async) is called as steps complete. The child runs in
    its own process group; on timeout or if the awaiting task is cancelled, the whole group is
    sent SIGTERM then SIGKILL (within 2 s), and a cancellation is re-raised. Raises
    :class:`ProbeInputError` for unusable input (missing script, bad option, unknown threshold
    profile, ``device="cuda"`` without CUDA); everything the script does wrong is a status.

    ``nproc`` > 1 launches the script like ``torchrun --nproc-per-node nproc`` (PyTorch's
    launcher, in the child): every rank is probed and rank 0 merges them
    (``probes.runtime.ranks``, ``ProbeResult.distributed``).
    """
    path = _check_script(script)
    _check_options(steps, timeout_s, device, sample_every)
    if nproc is not None and not 1 <= nproc <= MAX_NPROC:
        raise ProbeInputError(f"nproc must be between 1 and {MAX_NPROC} (got {nproc})")
    try:
        threshold_profile = resolve_profile(profile)
    except KeyError as exc:
        raise ProbeInputError(str(exc.args[0]) if exc.args else str(exc)) from None
    workdir = Path(cwd) if cwd is not None else path.parent
    if not workdir.is_dir():
        raise ProbeInputError(f"working directory does not exist: {workdir}")

    tmp = Path(tempfile.mkdtemp(prefix="gradient-doctor-probe-"))
    channel = tmp / "channel.jsonl"
    channel.touch()
    env = dict(os.environ)
    env[CHANNEL_ENV] = str(channel)
    env[SETTINGS_ENV] = json.dumps({"steps": steps, "sample_every": sample_every, "device": device})
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    env.setdefault("PYTHONUNBUFFERED", "1")
    staged = stage_child(tmp)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(staged), env.get("PYTHONPATH", "")) if p)
    command = [sys.executable, "-m", STAGED_PACKAGE, str(path), *map(str, args)]
    ranks = RankCollector(channel, nproc)
    if nproc is not None and nproc > 1:
        settings = json.loads(env[SETTINGS_ENV])
        settings.update(launcher=LAUNCHER_GD, timeout_s=timeout_s)
        env[SETTINGS_ENV] = json.dumps(settings)
        env.setdefault("OMP_NUM_THREADS", "1")
        command = torchrun_command(sys.executable, nproc, command[2:])

    reader = ChannelReader(channel)
    records: list[StepRecord] = []
    summary: ChildSummary | None = None
    out_tail, err_tail = _Tail(), _Tail()
    timed_out = False
    started = time.perf_counter()

    def absorb(messages: list[dict[str, Any]]) -> int:
        nonlocal summary
        newest = 0
        for message in messages:
            kind = message.pop("kind", None)
            if kind == "step":
                records.append(StepRecord.model_validate(message))
            elif kind == "progress":
                newest = max(newest, int(message.get("step", 0)))
            elif kind == "summary":
                summary = ChildSummary.model_validate(message)
            else:
                ranks.add(kind, message)
        return newest

    try:
        process = await anyio.open_process(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=str(workdir),
            env=env,
            start_new_session=True,
        )
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
                        await _stop_group(process)
                        break
                # Whatever the script spawned in its group goes with it.
                _signal_group(process.pid, signal.SIGKILL)
                ranks.stop()  # torchrun's ranks live in sessions of their own
                with anyio.move_on_after(1.0):
                    await process.wait()
                # A grandchild that left the group may hold the pipes open: do not wait on it.
                with anyio.move_on_after(0.5):
                    for event in drained:
                        await event.wait()
                group.cancel_scope.cancel()
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True):
                await _stop_group(process)
            raise
        absorb(reader.read_new())
    finally:
        ranks.finish()
        shutil.rmtree(tmp, ignore_errors=True)

    wall_s = time.perf_counter() - started
    return_code = process.returncode
    summary = ranks.summary(summary)
    if summary is not None and summary.input_error:
        raise ProbeInputError(summary.message or "the probe's input was not usable")
    if summary is None:
        summary = _summary_without_report(
            timed_out, timeout_s, return_code, len(records), err_tail.text()
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
    return ranks.apply(result, summary)


def _summary_without_report(
    timed_out: bool, timeout_s: float, return_code: int | None, steps: int, stderr_tail: str
) -> ChildSummary:
    """What we can say when the child never sent its summary (killed, os._exit, crash)."""
    tail = "\n".join(stderr_tail.strip().splitlines()[-15:]) or None
    if timed_out:
        return ChildSummary(
            status="timeout",
            message=f"the script ran past the {timeout_s:g} s limit after {steps} optimizer "
            "steps and was stopped (its process group was killed)",
            parameters=[],
            shapes=[],
            layers=[],
            traceback_tail=tail,
        )
    if return_code is not None and return_code < 0:
        name = signal.Signals(-return_code).name if -return_code in signal.valid_signals() else ""
        hint = " (the kernel's out-of-memory killer does this)" if name == "SIGKILL" else ""
        message = f"the script's process was killed by signal {name or -return_code}{hint}"
    elif steps == 0:
        return ChildSummary(
            status="no-training-loop",
            message=f"the script ended (exit code {return_code}) before any optimizer step",
            parameters=[],
            shapes=[],
            layers=[],
            traceback_tail=tail,
        )
    else:
        message = f"the script's process ended (exit code {return_code}) without reporting"
    return ChildSummary(
        status="script-error",
        message=message,
        parameters=[],
        shapes=[],
        layers=[],
        traceback_tail=tail,
    )


def run_probe(
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
) -> ProbeResult:
    """Synchronous :func:`run_probe_async` (runs its own event loop)."""
    return anyio.run(
        partial(
            run_probe_async,
            script,
            args,
            steps=steps,
            timeout_s=timeout_s,
            device=device,
            sample_every=sample_every,
            cwd=cwd,
            on_progress=on_progress,
            profile=profile,
            nproc=nproc,
        )
    )
