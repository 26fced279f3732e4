"""What a runtime signal is: its catalogue id, what it reads, its thresholds, its examples.

A module under ``probes/runtime/signals/`` defines one subclass of :class:`Signal`; the package
discovers it (``probes.runtime.signals.all_signals``). A signal reads a
:class:`~probes.runtime.signals.series.RunSeries` (from the probe or from a training log) and
the findings of the signals it consults, and yields :class:`~knowledge.findings.Finding`
objects made with :meth:`Context.finding` (which records the threshold profile and the fix
snippet). Its healthy and pathological step series are data (:class:`Example`); the tests are
generated from them.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from gradient_doctor.knowledge.findings import Finding, Fix, Severity, evidence_number
from gradient_doctor.knowledge.models import ThresholdProfile
from gradient_doctor.probes.runtime.signals.series import RunSeries, StepPoint

#: Which steps a signal judges: all of them, or only those before the first non-finite step
#: (the run up to a NaN is what explains it; after it, norms are meaningless).
Scope = Literal["all", "finite"]

#: Ordering bugs that make the applied updates larger than the script's learning rate and
#: clipping say, each with the reason. When one of them is found in the same run (or by the
#: static analyser in the same script), it is the first thing to fix for a diverging loss,
#: exploding norms or oversized updates: lowering the learning rate would only hide it.
UPDATE_INFLATING: dict[str, str] = {
    "clip-after-step": "the clip runs after the step and limits nothing",
    "clip-before-backward": "the clip runs before backward() and limits nothing",
    "accum-unscaled-loss": (
        "undivided micro-batch losses multiply the gradient by the number of micro-batches"
    ),
    "accum-missing-zero-grad": "gradients are never zeroed and keep adding up",
    "accum-scheduler-per-microbatch": (
        "the schedule steps once per micro-batch, so its warmup ends too early"
    ),
    "amp-step-bypasses-scaler": "the step applies gradients still multiplied by the loss scale",
}

#: The findings whose catalogue fix is about the step size (:func:`ordering_bugs_first`
#: applies; update-param-ratio's fix covers updates too small as well, so only the signal's own
#: advice for oversized updates takes the bugs first).
STEP_SIZE_FINDINGS = ("loss-diverging", "exploding-gradients")


def ordering_bugs_first(advice: str, found: Iterable[str]) -> str:
    """``advice`` (a step-size advice) preceded by the ordering bugs among ``found`` (catalogue
    ids of the same run or script) that inflate the updates; ``advice`` unchanged if none."""
    bugs = [bug for bug in dict.fromkeys(found) if bug in UPDATE_INFLATING]
    if not bugs or not advice:
        return advice
    reasons = "; ".join(f"`{bug}`: {UPDATE_INFLATING[bug]}" for bug in bugs)
    plural = len(bugs) > 1
    return (
        f"First fix the ordering bug{'s' if plural else ''} reported with this ({reasons}): "
        f"while {'they are' if plural else 'it is'} there, the updates are larger than the "
        f"learning rate and clipping intend. If the run still climbs once fixed: "
        f"{advice[0].lower()}{advice[1:]}"
    )


@dataclass(frozen=True)
class Example:
    """A step series a signal must judge a given way, written as data.

    ``each`` holds fields repeated on every step, ``series`` per-step values (lists of the same
    length, one per step), ``steps`` per-step overrides by position; steps are numbered from 1.
    ``length`` is the number of steps when no series sets it (default 4).
    ``run`` holds run-level fields of :class:`RunSeries`. ``expect`` is the severity the signal
    must report (``None``: it must stay silent); ``profile`` names another threshold profile.
    """

    name: str
    expect: Severity | None
    each: Mapping[str, Any] = field(default_factory=dict)
    series: Mapping[str, Sequence[Any]] = field(default_factory=dict)
    steps: Mapping[int, Mapping[str, Any]] = field(default_factory=dict)
    run: Mapping[str, Any] = field(default_factory=dict)
    length: int | None = None
    profile: str | None = None
    check: Mapping[str, Any] = field(default_factory=dict)
    """Extra expectations on the finding: attribute (step, module, parameter) or evidence key
    → value."""

    def build(self) -> RunSeries:
        """The :class:`RunSeries` this example describes."""
        lengths = {len(values) for values in self.series.values()}
        if len(lengths) > 1:
            raise ValueError(f"example {self.name!r}: series of different lengths {lengths}")
        if lengths:
            count = lengths.pop()
        elif self.length is not None:
            count = self.length
        else:
            count = max(max(self.steps, default=0) + 1, 4)
        points = []
        for index in range(count):
            values: dict[str, Any] = {"step": index + 1, **self.each}
            values.update({key: column[index] for key, column in self.series.items()})
            values.update(self.steps.get(index, {}))
            points.append(StepPoint.model_validate(values))
        return RunSeries.model_validate({"source": "probe", **self.run, "steps": points})


class Context:
    """What a signal may use besides the series: the profile and the findings so far."""

    def __init__(self, profile: ThresholdProfile, first_nonfinite: int | None) -> None:
        self.profile = profile
        self.first_nonfinite = first_nonfinite
        """Step of the first non-finite loss, gradient or parameter (None: none)."""
        self.findings: list[Finding] = []

    def has(self, *entry_ids: str) -> bool:
        """True when any of ``entry_ids`` was already reported."""
        return any(f.id in entry_ids for f in self.findings)

    def get(self, entry_id: str) -> Finding | None:
        """The finding reported for ``entry_id`` so far, if any."""
        return next((f for f in self.findings if f.id == entry_id), None)

    def step_size_advice(self, advice: str) -> str:
        """``advice`` about the step size, preceded by the update-inflating ordering bugs
        already reported for this run (:data:`UPDATE_INFLATING`)."""
        return ordering_bugs_first(advice, (f.id for f in self.findings))

    def threshold(self, key: str) -> float:
        """The number ``key`` of the active profile."""
        value: float = getattr(self.profile, key).value
        return value

    def finding(
        self,
        entry_id: str,
        severity: Severity,
        message: str,
        *,
        step: int | None = None,
        parameter: str | None = None,
        module: str | None = None,
        fix: str | None = None,
        **evidence: Any,
    ) -> Finding:
        """A runtime finding: the profile is added to the evidence, floats are rounded for it
        (non-finite ones as strings), and the fix points at the entry's first snippet."""
        numbers = {
            key: evidence_number(value) if isinstance(value, float) else value
            for key, value in evidence.items()
        }
        numbers["profile"] = self.profile.name
        return Finding(
            id=entry_id,
            severity=severity,
            message=message,
            origin="runtime",
            step=step,
            parameter=parameter,
            module=module,
            evidence=numbers,
            fix=Fix(description=fix, snippet_id=snippet_for(entry_id)) if fix else None,
        )


_warming: threading.Thread | None = None
_warming_lock = threading.Lock()


def warm_knowledge() -> None:
    """Start loading the knowledge base and importing the signal modules in a daemon thread
    (idempotent): the probe's parent does it while the script runs, so the diagnosis does not
    wait for them afterwards."""
    global _warming
    with _warming_lock:
        if _warming is None:
            _warming = threading.Thread(target=_warm, name="gd-knowledge", daemon=True)
            _warming.start()


def _warm() -> None:
    from gradient_doctor.knowledge import load_knowledge
    from gradient_doctor.probes.runtime.signals import all_signals

    for load in (load_knowledge, all_signals):
        try:
            load()
        except Exception:  # the diagnosis reports a broken knowledge base itself, later
            continue


def _knowledge() -> Any:
    """The knowledge base, after the background load (if one was started) finished."""
    from gradient_doctor.knowledge import load_knowledge

    thread = _warming
    if thread is not None and thread is not threading.current_thread():
        thread.join()
    return load_knowledge()


def snippet_for(entry_id: str) -> str | None:
    """The first fix snippet of catalogue entry ``entry_id`` (None when it has none)."""
    try:
        snippets = _knowledge().get(entry_id).snippets
    except Exception:  # the diagnosis must not fail because the knowledge base is incomplete
        return None
    return snippets[0] if snippets else None


class Signal:
    """Base class of the runtime signals. Subclasses fill the class attributes and ``check``."""

    id: ClassVar[str]
    """Catalogue identifier (catalog.md §2, or a §1 row marked R)."""
    severities: ClassVar[tuple[Severity, ...]]
    """The severities it may report."""
    summary: ClassVar[str]
    """One sentence: what it detects."""
    reads: ClassVar[frozenset[str]]
    """Fields of the series it needs (StepPoint / RunSeries names); skipped when one is absent."""
    optional: ClassVar[frozenset[str]] = frozenset()
    """Fields it uses when they are there (it judges without them, with less detail)."""
    thresholds: ClassVar[tuple[str, ...]] = ()
    """Keys of :class:`~knowledge.models.ThresholdProfile` it judges with."""
    message: ClassVar[str]
    """The message template (``{name}`` fields are filled with the measured numbers)."""
    advice: ClassVar[str]
    """What to do about it (the finding's fix description)."""
    rank: ClassVar[int]
    """Run order, and the order of findings of equal severity at the same step: causes first."""
    consults: ClassVar[tuple[str, ...]] = ()
    """Ids whose findings it reads; they run before it."""
    scope: ClassVar[Scope] = "all"
    per_optimizer: ClassVar[bool] = False
    """With several optimizers (a GAN, actor-critic), judge each one's steps on their own:
    their norms and clipping are separate series."""
    healthy: ClassVar[list[Example]] = []
    pathological: ClassVar[list[Example]] = []

    def check(self, run: RunSeries, ctx: Context) -> Iterable[Finding]:
        """Yield this signal's findings for ``run``."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<Signal {self.id}>"


def points_with(run: RunSeries, *fields: str) -> list[StepPoint]:
    """The steps of ``run`` where every one of ``fields`` is set."""
    return [p for p in run.steps if all(getattr(p, name) is not None for name in fields)]
