"""Verify a patch by running it: a scratch copy, two probed runs, one comparison.

The patched text never touches the disk next to the user's files: it goes to the probe run's own
temporary folder and the child compiles it under the original script's path
(``probes.runtime.child``), so the copy runs in the same working folder, with the same
``sys.path[0]`` (the original script's folder: it imports its neighbours), argv, ``__file__``,
interpreter and seed as the original. The static part (the original's analysis) is done once by
the caller; here only the patched text is analysed, while the two runs go on.
"""

from __future__ import annotations

import inspect
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import anyio

from gradient_doctor.knowledge.findings import Finding
from gradient_doctor.probes.runtime.result import ProbeResult
from gradient_doctor.probes.verify.compare import compare, run_side
from gradient_doctor.probes.verify.model import Verification
from gradient_doctor.probes.verify.patching import (
    ChosenPatch,
    PatchError,
    apply_chosen,
    choose_patch,
    unified_diff,
)

#: The seed both runs start from unless the caller names one.
DEFAULT_SEED = 0

ProgressCallback = Callable[[int, int], Awaitable[None] | None]
#: ``run(source=..., seed=..., threads=..., on_progress=...)``: one probed run of the script
#: (``source`` None: its own text), with every other setting fixed by the caller.
RunProbe = Callable[..., Awaitable[ProbeResult]]


@dataclass(frozen=True)
class RunPlan:
    """Whether the two runs overlap, and torch's thread count in each when they do."""

    overlap: bool
    threads: int | None = None


def usable_cores() -> int:
    """CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def gpu_visible() -> bool:
    """Whether an NVIDIA GPU is visible (read from the driver's /proc entries, no torch)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return False
    folder = Path("/proc/driver/nvidia/gpus")
    try:
        return folder.is_dir() and any(folder.iterdir())
    except OSError:
        return False


def plan_runs(device: str = "auto", nproc: int | None = None, cores: int | None = None) -> RunPlan:
    """Overlap the two runs when they are CPU runs and there are at least two cores, each with
    half the cores as torch threads (the same count in both, so the same arithmetic); a GPU run
    or a multi-rank run goes one after the other (two copies of the model would share one
    device's memory)."""
    cores = usable_cores() if cores is None else cores
    on_cpu = device == "cpu" or (device == "auto" and not gpu_visible())
    if cores < 2 or not on_cpu or (nproc is not None and nproc > 1):
        return RunPlan(overlap=False)
    return RunPlan(overlap=True, threads=max(1, cores // 2))


async def _notify(on_progress: ProgressCallback | None, done: int, total: int) -> None:
    if on_progress is None:
        return
    outcome = on_progress(done, total)
    if inspect.isawaitable(outcome):
        await outcome


def _parse_error(text: str, path: str) -> str | None:
    """Why the patched text is not Python, or None."""
    try:
        compile(text, path, "exec", dont_inherit=True)
    except SyntaxError as exc:
        return f"the patched text does not parse: {exc.msg} (line {exc.lineno})"
    except ValueError as exc:  # NUL bytes
        return f"the patched text does not parse: {exc}"
    return None


def _lint_patched(text: str, path: str) -> tuple[list[Finding], str | None]:
    from gradient_doctor.probes.static import lint_source

    report = lint_source(text, path)
    if report.error:
        return [], f"the static analyser cannot read the patched text ({report.error})"
    return list(report.findings), None


@dataclass
class _Prepared:
    chosen: ChosenPatch
    patched: str | None
    diff: str | None
    error: str | None


def _prepare(
    text: str,
    display_path: str,
    findings: Sequence[Finding],
    combined_diff: str | None,
    unmerged: Sequence[str],
    ids: Sequence[str] | None,
) -> _Prepared:
    chosen = choose_patch(findings, combined_diff, ids, unmerged)
    if not chosen.diffs:
        return _Prepared(chosen, None, None, None)
    try:
        patched = apply_chosen(text, chosen)
    except PatchError as exc:
        return _Prepared(chosen, None, "".join(chosen.diffs), str(exc))
    diff = chosen.diffs[0] if chosen.combined else unified_diff(text, patched, display_path)
    if patched == text:
        return _Prepared(chosen, None, diff, "the patch changes nothing in the text")
    return _Prepared(chosen, patched, diff, _parse_error(patched, display_path))


async def verify_patch(
    *,
    text: str,
    display_path: str,
    findings: Sequence[Finding],
    combined_diff: str | None,
    run: RunProbe,
    steps: int,
    unmerged: Sequence[str] = (),
    ids: Sequence[str] | None = None,
    seed: int = DEFAULT_SEED,
    plan: RunPlan | None = None,
    on_progress: ProgressCallback | None = None,
) -> tuple[ProbeResult, Verification]:
    """Apply the combined patch (or the patches of ``ids``) to a copy of ``text``, probe the
    original and the copy alike (``run``, with ``seed``), and compare them.

    ``findings`` / ``combined_diff`` / ``unmerged``: the static analysis of ``text`` (done once,
    by the caller). Returns the original's run (the diagnosis reports it as its probe run) and
    the :class:`Verification`. An id in ``ids`` without a patch is a ``ValueError``.
    """
    started = time.perf_counter()
    plan = plan or RunPlan(overlap=False)
    prepared = _prepare(text, display_path, findings, combined_diff, unmerged, ids)
    both = prepared.patched is not None and prepared.error is None
    total = steps * (2 if both else 1)
    done = {"before": 0, "after": 0}

    def progress_of(side: str) -> Callable[[int, int], Awaitable[None]]:
        async def report(step: int, _total: int) -> None:
            done[side] = max(done[side], step)
            await _notify(on_progress, done["before"] + done["after"], total)

        return report

    results: dict[str, ProbeResult] = {}
    after_static: list[Finding] = []
    lint_error: str | None = None
    threads = plan.threads if both and plan.overlap else None

    async def probe(side: str, source: str | None) -> None:
        results[side] = await run(
            source=source, seed=seed, threads=threads, on_progress=progress_of(side)
        )

    async def lint_after(patched: str) -> None:
        nonlocal after_static, lint_error
        after_static, lint_error = await anyio.to_thread.run_sync(
            _lint_patched, patched, display_path, abandon_on_cancel=True
        )

    if not both:
        await probe("before", None)
    else:
        assert prepared.patched is not None
        async with anyio.create_task_group() as group:
            group.start_soon(lint_after, prepared.patched)
            if plan.overlap:
                group.start_soon(probe, "before", None)
                group.start_soon(probe, "after", prepared.patched)
            else:
                await probe("before", None)
                await probe("after", prepared.patched)
    before = run_side(findings, results["before"], steps_requested=steps)
    after_run = results.get("after")
    error = prepared.error or lint_error
    after = None
    if prepared.diff is not None:
        after = run_side(after_static, after_run if error is None else None, steps_requested=steps)
    verification = compare(
        patch=prepared.diff,
        targets=prepared.chosen.targets,
        before=before,
        after=after,
        no_patch_reason=prepared.chosen.reason,
        patch_error=error,
    )
    verification = verification.model_copy(
        update={
            "overlapped": both and plan.overlap,
            "wall_s": round(time.perf_counter() - started, 3),
        }
    )
    return results["before"], verification
