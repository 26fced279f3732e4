"""What the probe saw of the learning rate, in the words both step-size signals use.

``loss-diverging`` and ``update-param-ratio`` both blame a step size that is too large; the
finding names the rate and the warmup seen and the advice gives a concrete lower value, so the
user reads the same story whichever of the two noticed the problem first.
"""

from __future__ import annotations

from gradient_doctor.probes.runtime.signals.series import StepPoint


def lr_story(points: list[StepPoint]) -> tuple[str, dict[str, float | int | None]]:
    """What the learning rate did over ``points``: a sentence and the numbers."""
    rates = [(p.step, p.lr) for p in points if p.lr is not None]
    if not rates:
        return "learning rate not seen (no optimizer's param_groups, e.g. a hand-written update)", {
            "lr": None
        }
    first_lr = rates[0][1]
    peak_step, peak = max(rates, key=lambda item: item[1] or 0.0)
    last_lr = rates[-1][1]
    numbers: dict[str, float | int | None] = {"lr": peak, "lr_first": first_lr, "lr_last": last_lr}
    if peak is not None and first_lr is not None and peak > first_lr * 1.01:
        warmup = peak_step - rates[0][0] + 1
        numbers["warmup_steps"] = warmup
        return (
            f"learning rate {first_lr:.3g} → {peak:.3g} (a warmup of {warmup} step(s), peak at "
            f"step {peak_step}), {last_lr:.3g} at the end",
            numbers,
        )
    numbers["warmup_steps"] = 0
    return f"learning rate {peak:.3g} from the first measured step on: no warmup seen", numbers


def sentence(story: str) -> str:
    """``story`` as a sentence of its own."""
    return story[0].upper() + story[1:]


def lower_lr_hint(numbers: dict[str, float | int | None]) -> str:
    """A concrete lower peak rate to try (a tenth of the one seen), or nothing when no rate
    was seen."""
    peak = numbers.get("lr")
    if not peak:
        return ""
    return f" (try {float(peak) / 10:.2g}, a tenth of {float(peak):.3g})"
