"""Run a training script under the probe in a child process (parent side; never imports torch).

The process tree (``probes.runtime.supervisor`` says why each piece is there)::

    caller ── supervisor ── shim ── child: INTERPRETER -m _gradient_doctor_probe SCRIPT ARGS...

The child runs in the user's interpreter (``probes.runtime.interpreter``: ``--python``, else the
project's virtualenv, ``$VIRTUAL_ENV``, ``$CONDA_PREFIX``, the tool's own), with only the child
package (``probes.runtime.child``, copied into the run's temporary folder) added to its path,
in the script's folder (or ``cwd``), with the caller's secrets removed from its environment and
an optional address-space cap. ``probes.runtime.launch`` (standard library only) checks the
input and starts it; this module watches the run: measurements come back over the side channel
(``probes.runtime.child.channel``), stdout and stderr are drained and only their tails kept, and
the diagnosis (``probes.runtime.diagnose``) runs here, in the parent.

The CLI starts the run first and imports this module while the script's interpreter starts
(:func:`complete_probe`); the server and the library call :func:`run_probe_async`.
"""

from __future__ import annotations

import inspect
import json
import os
import re
import signal
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Any

import anyio

from gradient_doctor.knowledge.models import ThresholdProfile
from gradient_doctor.probes.runtime.child import STAGED_PACKAGE
from gradient_doctor.probes.runtime.child.channel import ChannelReader
from gradient_doctor.probes.runtime.diagnose import build_result, resolve_profile
from gradient_doctor.probes.runtime.launch import (
    Launch,
    ProbeInputError,
    StartedRun,
    check_options,
    check_script,
    start_probe,
)
from gradient_doctor.probes.runtime.ranks import RankCollector
from gradient_doctor.probes.runtime.result import (
    ChildSummary,
    InterpreterInfo,
    IsolationInfo,
    ProbeResult,
    SeedingInfo,
    StepRecord,
)
from gradient_doctor.probes.runtime.signals.base import warm_knowledge

__all__ = [
    "ProbeInputError",
    "complete_probe",
    "complete_probe_async",
    "run_probe",
    "run_probe_async",
]

ProgressCallback = Callable[[int, int], Awaitable[None] | None]

#: How often the channel is read while the script runs.
POLL_S = 0.05
#: The same without a progress callback (the CLI): nothing needs the messages before the end,
#: and the wake-ups of a 20 Hz loop cost some 14 ms of CPU over a 3 s run, on the cores the
#: script runs on. The timeout is then seen at most this late.
QUIET_POLL_S = 0.25


async def _notify(on_progress: ProgressCallback | None, done: int, total: int) -> None:
    if on_progress is None:
        return
    outcome = on_progress(done, total)
    if inspect.isawaitable(outcome):
        await outcome


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


def _profile(profile: str | None) -> ThresholdProfile:
    try:
        return resolve_profile(profile, warm=False)
    except KeyError as exc:
        raise ProbeInputError(str(exc.args[0]) if exc.args else str(exc)) from None


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
    launch = launch or Launch()
    # The cheap checks first, in the order the launcher makes them, then the profile.
    check_script(script)
    check_options(steps, timeout_s, device, sample_every, nproc, launch.max_memory)
    threshold_profile = _profile(profile)
    started = start_probe(
        script,
        args,
        steps=steps,
        timeout_s=timeout_s,
        device=device,
        sample_every=sample_every,
        cwd=cwd,
        nproc=nproc,
        launch=launch,
        seed=seed,
        source=source,
        threads=threads,
    )
    return await complete_probe_async(started, profile=threshold_profile, on_progress=on_progress)


class _Watch:
    """The parent's view of one run: the channel's messages and the timeout while it goes on,
    the result once it has ended. Shared by the two watchers, :func:`complete_probe_async`
    (an event loop: the server, the library) and :func:`complete_probe` (none: the CLI, which
    then never imports asyncio)."""

    def __init__(self, started: StartedRun, profile: str | ThresholdProfile | None) -> None:
        try:
            self.profile = profile if isinstance(profile, ThresholdProfile) else _profile(profile)
        except BaseException:
            started.close()
            raise
        self.started = started
        self.ranks = RankCollector(started.channel, started.nproc)
        self.reader = ChannelReader(started.channel)
        self.records: list[StepRecord] = []
        self.summary: ChildSummary | None = None
        self.seeding: SeedingInfo | None = None
        self.hello: dict[str, Any] | None = None
        self.timed_out = False
        self.deadline = started.started + started.timeout_s

    def absorb(self) -> int:
        """Take the channel's new messages; the newest step reported done (0: none)."""
        newest = 0
        for message in self.reader.read_new():
            kind = message.pop("kind", None)
            if kind == "step":
                self.records.append(StepRecord.model_validate(message))
            elif kind == "progress":
                newest = max(newest, int(message.get("step", 0)))
            elif kind == "summary":
                self.summary = ChildSummary.model_validate(message)
            elif kind == "hello":
                self.hello = self.hello or message
            elif kind == "seeding":
                self.seeding = SeedingInfo.model_validate(message)
            else:
                self.ranks.add(kind, message)
        return newest

    def overdue(self) -> bool:
        """Whether the run has gone past its timeout."""
        return time.perf_counter() > self.deadline

    def ended(self) -> dict[str, Any]:
        """After the supervisor exited: the last messages; its report."""
        self.absorb()
        return _read_report(self.started)

    def close(self, wait: bool = True) -> None:
        """Read the other ranks' files, stop stragglers, remove the run's folder (always;
        ``wait=False``: in a thread, see :meth:`StartedRun.close`)."""
        try:
            self.ranks.finish()
        finally:
            self.started.close(wait=wait)

    def result(self, report: dict[str, Any]) -> ProbeResult:
        """The diagnosed result of the ended run (see :func:`run_probe_async` for the errors)."""
        started = self.started
        wall_s = time.perf_counter() - started.started
        chosen = started.interpreter
        max_memory = started.max_memory
        err_tail = started.stderr.text()
        hello, ranks = self.hello, self.ranks
        where = f"{chosen.path} ({chosen.reason})"
        if report.get("exec_error"):
            raise ProbeInputError(f"cannot run the interpreter {where}: {report['exec_error']}")
        if hello is None and not self.timed_out:
            why = _last_line(err_tail) or _exit_text(report.get("returncode"))
            raise ProbeInputError(
                f"the interpreter {where} did not start the probe ({why}); "
                "is it Python 3.10 or newer?"
            )
        summary = ranks.summary(self.summary)
        if summary is not None and summary.input_error:
            raise ProbeInputError(summary.message or "the probe's input was not usable")
        # The shim dies by a signal when the script kills it, or when a stop had to SIGKILL it.
        parent_killed = None if report.get("stopped") else report.get("shim", {}).get("signal")
        if summary is None:
            summary = _summary_without_report(
                self.timed_out,
                started.timeout_s,
                report.get("returncode"),
                len(self.records),
                err_tail,
                parent_killed=parent_killed,
                max_memory=max_memory,
            )
        elif self.timed_out:
            summary = summary.model_copy(update={"status": "timeout"})
        elif summary.status == "script-error" and not summary.traceback_tail and err_tail.strip():
            # sys.exit(2) from argparse: the reason is what the script printed on stderr
            lines = err_tail.strip().splitlines()
            message = summary.message or "the script exited"
            summary = summary.model_copy(
                update={
                    "message": f"{message}: {lines[-1].strip()}",
                    "traceback_tail": "\n".join(lines[-15:]),
                }
            )
        result = build_result(
            script=str(started.script),
            args=started.args,
            steps_requested=started.steps,
            sample_every=started.sample_every,
            records=ranks.records(self.records),
            summary=summary,
            profile=self.profile,
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
                    working_dir=str(started.workdir),
                    max_memory=max_memory,
                    scrubbed_env=started.scrubbed,
                    parent_signals=[
                        f"{s.get('signal')}"
                        + (f" from pid {s['from_pid']}" if s.get("from_pid") else "")
                        + " (ignored)"
                        for s in report.get("signals", [])
                    ],
                    parent_killed=parent_killed,
                    left_behind=[str(n) for n in report.get("left_behind", [])],
                ),
                "seeding": self.seeding,
                "patched": started.patched,
            }
        )
        return ranks.apply(result, summary)


async def complete_probe_async(
    started: StartedRun,
    *,
    profile: str | ThresholdProfile | None = None,
    on_progress: ProgressCallback | None = None,
) -> ProbeResult:
    """Watch a run :func:`~probes.runtime.launch.start_probe` started until it ends (or times
    out, or the awaiting task is cancelled: then it is stopped), diagnose it, and remove its
    folder. Raises :class:`ProbeInputError` as :func:`run_probe_async` does (an unknown
    ``profile`` stops the run first)."""
    watch = _Watch(started, profile)
    steps = started.steps
    try:
        warm_knowledge()  # while the child starts its interpreter and imports torch
        try:
            async with anyio.create_task_group() as group:
                exited = anyio.Event()

                async def wait_exit() -> None:
                    # A worker thread waits on the process: no polling, no delay at its exit.
                    await anyio.to_thread.run_sync(started.wait_exit, abandon_on_cancel=True)
                    exited.set()

                group.start_soon(wait_exit)
                while not exited.is_set():
                    with anyio.move_on_after(POLL_S):
                        await exited.wait()
                    done = watch.absorb()
                    if done:
                        await _notify(on_progress, min(done, steps), steps)
                    if watch.overdue() and not exited.is_set():
                        watch.timed_out = True
                        await anyio.to_thread.run_sync(started.stop)
                        break
                watch.ranks.stop()  # torchrun's ranks live in sessions of their own
                # The supervisor has stopped every process below it; the pipes close with them.
                await anyio.to_thread.run_sync(started.finish_output)
                group.cancel_scope.cancel()
        except BaseException:
            # Cancelled (or failed here): stop the script and everything it started, in a
            # worker thread, so that the event loop is not blocked for the grace period.
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(started.stop)
            raise
        report = watch.ended()
    finally:
        watch.close()
    return watch.result(report)


def complete_probe(
    started: StartedRun,
    *,
    profile: str | ThresholdProfile | None = None,
    on_progress: Callable[[int, int], object] | None = None,
) -> ProbeResult:
    """:func:`complete_probe_async` without an event loop (the CLI: asyncio, its import and its
    worker threads cost some 30 ms of CPU that a command line does not need). A thread waits
    on the process; Ctrl-C or any failure stops the run before it propagates.

    The run's folder is removed by a thread while the result is diagnosed and reported:
    ``started.close()`` waits for it (the CLI calls it once its report is written)."""
    watch = _Watch(started, profile)
    steps = started.steps
    poll_s = POLL_S if on_progress is not None else QUIET_POLL_S
    try:
        warm_knowledge()  # while the child starts its interpreter and imports torch
        try:
            exited = threading.Event()

            def wait_exit() -> None:
                started.wait_exit()
                exited.set()

            threading.Thread(target=wait_exit, name="gd-wait", daemon=True).start()
            while not exited.is_set():
                exited.wait(poll_s)
                done = watch.absorb()
                if done and on_progress is not None:
                    on_progress(min(done, steps), steps)
                if watch.overdue() and not exited.is_set():
                    watch.timed_out = True
                    started.stop()
                    break
            watch.ranks.stop()  # torchrun's ranks live in sessions of their own
            started.finish_output()
        except BaseException:
            started.stop()
            raise
        report = watch.ended()
    finally:
        watch.close(wait=False)
    return watch.result(report)


def _read_report(started: StartedRun) -> dict[str, Any]:
    """What the supervisor wrote about the run (empty when it wrote nothing)."""
    try:
        loaded = json.loads(started.report.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


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
