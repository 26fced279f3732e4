"""Compare the original run with the patched copy's run: the verification status.

Let *B* be the catalogue ids found before (the static analysis of the original text plus its
probed run) and *A* the ids found after (the static analysis of the patched text plus the
patched copy's probed run), each with the worst severity any source gave it; ``healthy`` is a
verdict, not a finding, and is left out. *T* is the targets: the ids whose patches were
applied. A finding is *serious* at ``warning`` or ``critical``. A run *ran* when the probe
measured it as planned (status ``ok`` or ``stopped``).

- ``resolved`` = B − A, ``remaining`` = B ∩ A, ``new`` = A − B (every severity).
- ``no-patch``: nothing to apply (no finding has a patch, or none of the chosen ids).
- ``broken``: the patch does not apply to the text read, the patched text does not parse, or
  the patched copy does not run where the original ran (script error, time-out, out of
  memory, no optimizer step), or both fail but with different errors. The patch is reported
  unsafe, with the patched copy's traceback tail.
- ``worse``: not broken, and a serious id is new, or a remaining id got more severe, or an
  operation the original ran (gradient clipping, the optimizer update, ``backward()``) never
  runs in the patched copy. A patch may move or swap such an operation (clip before the step,
  norm clipping for value clipping), never take it off the path the script takes: a rule that
  moves a clip into one branch of an ``if`` drops it from the other, and with no clip left the
  probe sees no misplaced clip either. Such a patch is reported unsafe.
- ``fixed``: not broken or worse, the patched copy ran, and no target is left in A: neither
  the analyser (on the patched text) nor the probe (on the patched run) finds any problem the
  patch set out to fix. The status is about the patch: problems it does not target may remain;
  they are listed in ``remaining`` and the serious ones are named in the verdict.
- ``improved``: not one of the above, and a serious id of B is resolved, or the patched copy
  runs where the original did not (some targets are left).
- ``unchanged``: anything else: nothing serious was resolved and nothing serious is new.

Determinism: both runs seed ``random``, torch and numpy with the same number before the script
starts. A run also sends a fingerprint of where it started: sums of the weights of the first
module with parameters at its first forward call and of the tensors given to it (the starting
weights and the first batch). No patch of the analyser touches the code that runs before the
first forward, so differing fingerprints mean the script is not deterministic (it seeds from the
clock, draws fresh randomness, ...) and the two runs differ by more than the patch. Then a
runtime finding that appears or goes away without being a target may be chance, so it does
not count towards ``worse`` or ``improved`` (it is still listed in ``new`` / ``resolved``);
targets, static findings and ``broken`` count as always. The notes and the verdict say so.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from gradient_doctor.knowledge.findings import SEVERITY_RANK, Finding, Severity
from gradient_doctor.probes.runtime.norms import norm_summary
from gradient_doctor.probes.runtime.result import SUCCESS_STATUSES, ProbeResult, SeedingInfo
from gradient_doctor.probes.verify.model import FoundId, RunSide, Verification, VerificationStatus

#: Relative difference under which two start fingerprints are the same (float64 sums of the
#: same numbers differ only through summation order, far below this).
FINGERPRINT_RTOL = 1e-6
_NOT_FINDINGS = {"healthy"}
#: Gradient operations a patch may move or swap within a family but must keep running: the
#: probe's event names of each family, by what the verdict calls it.
KEPT_OPERATIONS: dict[str, tuple[str, ...]] = {
    "gradient clipping": ("clip", "clip-value"),
    "the optimizer update": ("step", "scaler-step"),
    "backward()": ("backward",),
}


def _serious(severity: str) -> bool:
    return SEVERITY_RANK[severity] >= SEVERITY_RANK["warning"]


def found_ids(static: Sequence[Finding], run: ProbeResult | None) -> list[FoundId]:
    """The ids of one side, worst severity first (static findings, then the run's)."""
    merged: dict[str, FoundId] = {}
    runtime = list(run.findings) if run is not None else []
    for finding, source in [(f, "static") for f in static] + [(f, "runtime") for f in runtime]:
        if finding.id in _NOT_FINDINGS:
            continue
        known = merged.get(finding.id)
        if known is None:
            merged[finding.id] = FoundId(
                id=finding.id,
                severity=finding.severity,
                sources=[source],  # type: ignore[list-item]
            )
            continue
        if SEVERITY_RANK[finding.severity] > SEVERITY_RANK[known.severity]:
            known.severity = finding.severity
        if source not in known.sources:
            known.sources.append(source)  # type: ignore[arg-type]
    return sorted(merged.values(), key=lambda f: (-SEVERITY_RANK[f.severity], f.id))


def _finite(values: Sequence[float | None]) -> list[float]:
    return [v for v in values if v is not None and math.isfinite(v)]


def run_side(
    static: Sequence[Finding], run: ProbeResult | None, *, steps_requested: int
) -> RunSide:
    """One side's facts: status, ids, series (the first optimizer's) and their summary."""
    if run is None:
        return RunSide(
            steps_requested=steps_requested, findings=found_ids(static, None), status=None
        )
    several = len({r.optimizer for r in run.records}) > 1
    steps: list[int] = []
    losses: list[float | None] = []
    norms: list[float | None] = []
    records = []
    for index, record in enumerate(run.records):
        if several and record.optimizer != 0:
            continue
        records.append(record)
        steps.append(record.step)
        losses.append(run.loss[index] if index < len(run.loss) else None)
        norms.append(record.total_norm)
    operations: dict[str, int] = {}
    for record in run.records:
        for event in set(record.events):
            operations[event] = operations.get(event, 0) + 1
    finite_losses = _finite(losses)
    # The median and largest norm are the raw ones (before the script's clip, when the clip
    # shaped the update): the applied norm sits at max_norm whenever the clip cuts, so a
    # patch that moves a clip into place would read as if it had shrunk the gradients.
    raw = norm_summary(records)
    return RunSide(
        status=run.status,
        steps=run.steps,
        steps_requested=run.steps_requested,
        message=run.message,
        traceback_tail=run.traceback_tail,
        findings=found_ids(static, run),
        steps_axis=steps,
        loss=losses,
        total_norm=norms,
        loss_first=finite_losses[0] if finite_losses else None,
        loss_last=finite_losses[-1] if finite_losses else None,
        norm_median=raw.median,
        norm_max=raw.maximum,
        operations=dict(sorted(operations.items())),
        wall_s=run.wall_s,
        seeding=run.seeding,
    )


def _ran(side: RunSide) -> bool:
    return side.status in SUCCESS_STATUSES


def dropped_operations(before: RunSide, after: RunSide) -> list[str]:
    """The operations of :data:`KEPT_OPERATIONS` the original ran and the patched copy never
    runs (both runs measured), each with how often the original ran it."""
    if not (_ran(before) and _ran(after)):
        return []
    dropped = []
    for name, events in KEPT_OPERATIONS.items():
        had = max((before.operations.get(e, 0) for e in events), default=0)
        if had and not any(after.operations.get(e, 0) for e in events):
            dropped.append(f"{name} (the original ran it in {had} of {before.steps} steps)")
    return dropped


def _failure_line(side: RunSide) -> str:
    """The last line of why a run ended (its message), or its status."""
    lines = (side.message or "").strip().splitlines()
    return lines[-1].strip() if lines else (side.status or "not run")


def _failure_kind(side: RunSide) -> tuple[str | None, str]:
    """Status and exception type of a failed run (its message may hold line numbers)."""
    return side.status, _failure_line(side).split(":", 1)[0]


def _same_start(before: SeedingInfo | None, after: SeedingInfo | None) -> bool | None:
    """Whether both runs started from the same weights and first batch (None: unknown)."""
    if before is None or after is None:
        return None
    first, second = before.start_fingerprint, after.start_fingerprint
    if not first or not second:
        return None
    if len(first) != len(second):
        return False
    pairs = zip(first, second, strict=True)
    return all(_same_sum(a, b) for a, b in pairs)


def _same_sum(a: float, b: float) -> bool:
    """Two fingerprint sums agree: close, or both NaN (a first batch that holds a NaN sums to
    NaN in both runs alike; NaN never equals itself), or the same infinity."""
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b or math.isclose(a, b, rel_tol=FINGERPRINT_RTOL, abs_tol=1e-9)


def seeding_notes(before: RunSide, after: RunSide | None, deterministic: bool | None) -> list[str]:
    """Sentences on how the runs were seeded, whether the script reseeds itself, and whether
    the two runs started alike."""
    notes: list[str] = []
    seeding = before.seeding
    if seeding is not None and seeding.seed is not None:
        names = ", ".join(seeding.seeded) or "the generators"
        both = "each run" if after is not None else "the run"
        notes.append(f"{names} were seeded with {seeding.seed} before {both} started.")
        if seeding.reseed_count:
            shown = "; ".join(
                f"{call.function}({call.seed})"
                + (f" at {_short(call.where)}" if call.where else "")
                for call in seeding.reseeds[:3]
            )
            more = seeding.reseed_count - min(3, len(seeding.reseeds))
            notes.append(
                f"The script seeds itself ({shown}{f', and {more} more' if more > 0 else ''}), "
                "which replaces that seed from then on."
            )
    if after is None:
        return notes
    if deterministic is True:
        notes.append(
            "Both runs started from the same weights and the same first batch, so what differs "
            "between them is the patch."
        )
    elif deterministic is False:
        notes.append(
            "The two runs did not start from the same weights and first batch: the script is "
            "not deterministic (it seeds from the clock or draws fresh randomness), so the "
            "runs differ by more than the patch."
        )
    elif _ran(before) and after.status in SUCCESS_STATUSES:
        notes.append(
            "Whether both runs started alike could not be checked (no forward call of a module "
            "with parameters was seen)."
        )
    return notes


def loss_scale_note(
    before: RunSide, after: RunSide | None, deterministic: bool | None
) -> str | None:
    """A sentence when the patched copy's loss values are the original's divided by a whole
    number (a patch that divides the loss by the accumulation count): from the same start, the
    first loss given to ``backward()`` is then exactly 1/k of the original's, and the two loss
    series compare by trend, not by value."""
    if deterministic is not True or after is None:
        return None
    first, second = before.loss_first, after.loss_first
    if first is None or second is None or second == 0 or first * second <= 0:
        return None
    ratio = first / second
    factor = round(ratio)
    if factor < 2 or not math.isclose(ratio, factor, rel_tol=1e-3):
        return None
    return (
        f"The patched copy's first loss given to backward() is 1/{factor} of the original's "
        f"({second:.3g} against {first:.3g}): the patch divides the loss, so compare the two "
        "loss series by their trend, not their values."
    )


def _short(where: str) -> str:
    path, _, line = where.rpartition(":")
    return f"{path.rsplit('/', 1)[-1]}:{line}" if path else where


def _ids(items: Sequence[str]) -> str:
    return ", ".join(f"`{i}`" for i in items) or "none"


def _loss_text(side: RunSide) -> str:
    if side.loss_first is None or side.loss_last is None:
        return "no loss measured"
    return f"loss {side.loss_first:.3g} → {side.loss_last:.3g}"


def compare(
    *,
    patch: str | None,
    targets: Sequence[str],
    before: RunSide,
    after: RunSide | None,
    no_patch_reason: str | None = None,
    patch_error: str | None = None,
) -> Verification:
    """The verification status of ``after`` against ``before`` (module docstring)."""
    deterministic = _same_start(before.seeding, after.seeding if after else None)
    notes = seeding_notes(before, after, deterministic)
    scale_note = loss_scale_note(before, after, deterministic)
    if scale_note is not None:
        notes.append(scale_note)
    dropped: list[str] = []

    def result(
        status: VerificationStatus, verdict: str, lists: tuple[list[str], ...] = ([], [], [])
    ) -> Verification:
        resolved, remaining, new = lists
        if deterministic is False and status not in ("broken", "no-patch"):
            verdict = (
                verdict.rstrip(".") + "; the runs did not start alike (the script is not "
                "deterministic), so runtime findings the patch does not target were not counted."
            )
        return Verification(
            status=status,
            verdict=verdict[:1].upper() + verdict[1:],
            patch=patch,
            targets=list(targets),
            resolved=resolved,
            remaining=remaining,
            new=new,
            unsafe=status == "broken" or bool(dropped),
            deterministic=deterministic,
            notes=notes,
            before=before,
            after=after,
        )

    if patch is None or (after is None and patch_error is None):
        return result("no-patch", f"nothing to verify: {no_patch_reason or 'no patch'}.")
    if patch_error is not None:
        return result("broken", f"{patch_error}. Do not apply this patch.")
    assert after is not None
    was = {f.id: f.severity for f in before.findings}
    now = {f.id: f.severity for f in after.findings}
    resolved = [i for i in was if i not in now]
    remaining = [i for i in was if i in now]
    new = [i for i in now if i not in was]
    # Without a common start, a runtime-only difference outside the targets may be chance.
    static_after = {f.id for f in after.findings if "static" in f.sources}
    static_before = {f.id for f in before.findings if "static" in f.sources}
    counted = {
        i
        for i in set(was) | set(now)
        if deterministic is not False or i in targets or i in static_after | static_before
    }
    dropped = dropped_operations(before, after)
    if dropped:
        status: VerificationStatus = "worse"
        verdict = (
            f"the patched copy never runs {'; '.join(dropped)}: the patch took it off the path "
            "the script takes, so what it targets is gone only because the operation is. Do not "
            "apply this patch."
        )
    else:
        status, verdict = _judge(before, after, targets, was, now, resolved, new, counted)
    return result(status, verdict, (resolved, remaining, new))


def _judge(
    before: RunSide,
    after: RunSide,
    targets: Sequence[str],
    was: dict[str, Severity],
    now: dict[str, Severity],
    resolved: list[str],
    new: list[str],
    counted: set[str],
) -> tuple[VerificationStatus, str]:
    if _ran(before) and not _ran(after):
        why = _failure_line(after)
        return "broken", (
            f"the patched copy stopped with {after.status} ({why}) after {after.steps} "
            f"steps where the original ran {before.steps}. Do not apply this patch."
        )
    if not _ran(before) and not _ran(after) and _failure_kind(before) != _failure_kind(after):
        return "broken", (
            f"the patched copy fails differently from the original ({_failure_line(after)}"
            f" instead of {_failure_line(before)}). Do not apply this patch."
        )
    if not _ran(before) and not _ran(after):
        return "unchanged", (
            f"the patched copy fails like the original ({_failure_line(after)}), so "
            "the probe could not measure whether the patch helps."
        )
    worse_now = [i for i in new if _serious(now[i]) and i in counted] + [
        i
        for i in was
        if i in now and i in counted and SEVERITY_RANK[now[i]] > SEVERITY_RANK[was[i]]
    ]
    gone = [i for i in resolved if _serious(was[i]) and i in counted]
    if worse_now:
        also = f" (while {_ids(gone)} went away)" if gone else ""
        return "worse", f"the patched copy shows {_ids(worse_now)}{also}."
    left = [t for t in targets if t in now]
    serious_left = [f.id for f in after.findings if _serious(f.severity)]
    if _ran(after) and not left:
        others = (
            f"; not targeted by the patch and still found: {_ids(serious_left)}"
            if serious_left
            else ", no warning or critical finding left"
        )
        return "fixed", (
            f"{_ids(list(targets))} no longer found in the patched text or its run "
            f"({after.steps} of {after.steps_requested} steps, {_loss_text(after)}; before: "
            f"{_loss_text(before)}){others}."
        )
    if gone or (_ran(after) and not _ran(before)):
        return "improved", (
            f"{_ids(gone) if gone else 'the patched copy now runs'}"
            f"{' no longer found' if gone else ''}; still found: {_ids(serious_left)}"
            f"{f' (targeted: {_ids(left)})' if left else ''}."
        )
    if not serious_left:
        return "unchanged", "the patched copy shows no change in any warning or critical finding."
    return "unchanged", f"the patched copy still shows {_ids(serious_left)}."
