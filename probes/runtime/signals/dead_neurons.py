"""dead-neurons: activation units that never fired during a sampled step.

Between the warning and the critical share, dead units are reported only while the loss is not
improving. Measured on pytorch/examples ``mnist`` (Adadelta, lr 1.0) with real handwritten digits
(scikit-learn's UCI digits in the MNIST layout): 57 of fc1's 128 units never fire on any of the
6,000 training images at step 30 (34 at step 900: they are really dead, and a few revive), yet
the run trains (test accuracy 73 % at step 30, 98 % at step 900); with a tenth of the learning
rate fewer units die (33, then 19) and accuracy is lower at every step (67 %, 97 %). There, dead
units are unused capacity, not a failure, and "lower the learning rate" would make it worse.
Above the critical share (GS: the model is not learning) they are reported whatever the loss.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

from gradient_doctor.knowledge.findings import Finding
from gradient_doctor.probes.runtime.signals.base import Context, Example, Signal
from gradient_doctor.probes.runtime.signals.series import RunSeries
from gradient_doctor.probes.runtime.signals.stats import loss_improving


class DeadNeurons(Signal):
    id = "dead-neurons"
    severities = ("warning", "critical")
    summary = (
        "More than dead_fraction_warning of ReLU units never fired in the last sampled step "
        "while the loss is not improving (more than dead_fraction_critical: whatever the loss)."
    )
    reads = frozenset({"dead_units"})
    optional = frozenset({"loss", "losses"})
    thresholds = ("dead_fraction_warning", "dead_fraction_critical")
    message = (
        "{fraction:.0%} of ReLU-family units ({dead} of {units}) never fired during step "
        "{step}; the first dead layer in forward order is `{module}` ({module_dead} of "
        "{module_units} units dead){more}{loss_note}."
    )
    advice = "Use LeakyReLU/GELU, He init, a small positive bias, or a lower learning rate."
    rank = 48  # before zero-gradients: dead units are why their layers get no gradient
    scope = "finite"
    healthy: ClassVar[list[Example]] = [
        Example(
            "silent from the start and coming back (a policy on low-diversity states)",
            None,
            series={
                "dead_units": [
                    {"relu after affine1": (45, 128)},
                    {"relu after affine1": (26, 128)},
                ],
                "grad_norm": [0.5, 0.5],
            },
        ),
        Example(
            "42 % of fc1 dead while the loss falls fast (pytorch/examples mnist, Adadelta lr 1)",
            None,
            series={
                "dead_units": [
                    {"relu after conv1": (0, 32), "relu after fc1": (2, 128)},
                    None,
                    {"relu after conv1": (0, 32), "relu after fc1": (53, 128)},
                    None,
                    None,
                    {"relu after conv1": (0, 32), "relu after fc1": (54, 128)},
                ],
                "loss": [2.3, 2.12, 1.81, 1.35, 0.91, 0.59],
            },
        ),
        Example(
            "a few dead units",
            None,
            series={"dead_units": [{"relu": (3, 64)}, {"relu": (2, 64)}], "grad_norm": [0.5, 0.5]},
        ),
    ]
    pathological: ClassVar[list[Example]] = [
        Example(
            "30 % dead and a loss that does not fall",
            "warning",
            series={
                "dead_units": [
                    {"relu": (19, 64)},
                    None,
                    {"relu": (19, 64)},
                    None,
                    {"relu": (20, 64)},
                ],
                "loss": [2.3, 2.31, 2.3, 2.29, 2.3],
                "grad_norm": [0.5] * 5,
            },
            check={"step": 5, "dead_units": 20},
        ),
        Example(
            "60 of 64 units dead",
            "critical",
            series={
                "dead_units": [{"relu": (60, 64)}, {"relu": (60, 64)}],
                "grad_norm": [0.5, 0.5],
            },
            check={"step": 2, "module": "relu", "dead_units": 60},
        ),
        Example(
            "the first dead layer is named, not the worst",
            "critical",
            each={
                "dead_units": {
                    "relu after conv1": (0, 32),
                    "relu after conv2": (60, 64),
                    "relu after fc1": (128, 128),
                }
            },
            series={"grad_norm": [0.5, 0.5]},
            check={"module": "relu after conv2"},
        ),
    ]

    def check(self, run: RunSeries, ctx: Context) -> Iterator[Finding]:
        sampled = [p for p in run.steps if p.dead_units]
        if not sampled:
            return
        point = sampled[-1]
        counts = point.dead_units or {}
        dead = sum(d for d, _ in counts.values())
        units = sum(u for _, u in counts.values())
        if units == 0:
            return
        fraction = dead / units
        warn = ctx.threshold("dead_fraction_warning")
        crit = ctx.threshold("dead_fraction_critical")
        if fraction <= warn:
            return
        first_counts = sampled[0].dead_units or {}
        first_units = sum(u for _, u in first_counts.values())
        if len(sampled) > 1 and first_units == units:
            first_fraction = sum(d for d, _ in first_counts.values()) / units
            if fraction < first_fraction:
                # Fewer silent units than at the start: they come back, they are not dead
                # (inputs of low diversity, such as a policy's states, leave many units silent
                # from initialisation on).
                return
        improving = loss_improving(run)
        if fraction <= crit and improving:
            # Unused capacity while the run trains (see the module's note): not a failure.
            return
        # The first site (in forward order) above the warning line: layers after a dead one
        # often die of it, so the first is where to look.
        dead_sites = [(k, v) for k, v in counts.items() if v[1] and v[0] / v[1] > warn]
        module, (module_dead, module_units) = (
            dead_sites[0]
            if dead_sites
            else max(counts.items(), key=lambda kv: kv[1][0] / max(kv[1][1], 1))
        )
        more = ""
        if len(dead_sites) > 1:
            more = "; also " + ", ".join(f"`{k}` ({v[0]}/{v[1]})" for k, v in dead_sites[1:4])
        yield ctx.finding(
            self.id,
            "critical" if fraction > crit else "warning",
            self.message.format(
                fraction=fraction,
                dead=dead,
                units=units,
                step=point.step,
                module=module,
                module_dead=module_dead,
                module_units=module_units,
                more=more,
                loss_note="; the loss is not improving" if improving is False else "",
            ),
            step=point.step,
            module=module,
            fix=self.advice,
            dead_units=dead,
            units=units,
            fraction=fraction,
            threshold_warning=warn,
            threshold_critical=crit,
        )
