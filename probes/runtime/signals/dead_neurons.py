"""dead-neurons: activation units that never fired during a sampled step."""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

from gradient_doctor.knowledge.findings import Finding
from gradient_doctor.probes.runtime.signals.base import Context, Example, Signal
from gradient_doctor.probes.runtime.signals.series import RunSeries


class DeadNeurons(Signal):
    id = "dead-neurons"
    severities = ("warning", "critical")
    summary = "More than dead_fraction_warning of ReLU units never fired in the last sampled step."
    reads = frozenset({"dead_units"})
    thresholds = ("dead_fraction_warning", "dead_fraction_critical")
    message = (
        "{fraction:.0%} of ReLU-family units ({dead} of {units}) never fired during step "
        "{step}; the first dead layer in forward order is `{module}` ({module_dead} of "
        "{module_units} units dead){more}."
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
            "a few dead units",
            None,
            series={"dead_units": [{"relu": (3, 64)}, {"relu": (2, 64)}], "grad_norm": [0.5, 0.5]},
        ),
    ]
    pathological: ClassVar[list[Example]] = [
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
