"""The MCP probe text block (templates/server/probe.md.j2): one norm series per optimizer."""

from __future__ import annotations

from typing import Any

from gradient_doctor.skill_server.results import ProbeReport
from gradient_doctor.templates import render


def _record(step: int, optimizer: int, norm: float) -> dict[str, Any]:
    return {"step": step, "optimizer": optimizer, "grad_norms": [norm], "total_norm": norm}


def _report(records: list[dict[str, Any]], kinds: list[str]) -> ProbeReport:
    return ProbeReport(
        path="gan.py",
        status="stopped",
        steps=len(records),
        steps_requested=len(records),
        findings=[],
        measurements={
            "records": records,
            "optimizer_kinds": kinds,
            "total_norm": [r["total_norm"] for r in records],
        },
    )


def _norm_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if "gradient norm per step" in line]


def test_two_optimizers_get_one_line_each_with_only_their_own_norms() -> None:
    # A GAN: the discriminator (optimizer 0) and the generator (optimizer 1) alternate.
    records = []
    for step in range(1, 7):
        records.append(_record(2 * step - 1, 0, 0.1 * step))
        records.append(_record(2 * step, 1, 10.0 + step))
    text = render("server/probe.md.j2", r=_report(records, ["Adam", "SGD"]))
    lines = _norm_lines(text)
    assert lines == [
        "Optimizer 0 (Adam), total gradient norm per step: 0.1, 0.2, 0.3, 0.4, 0.5, 0.6",
        "Optimizer 1 (SGD), total gradient norm per step: 11.0, 12.0, 13.0, 14.0, 15.0, 16.0",
    ]
    # No merged series besides the per-optimizer ones.
    assert "Total gradient norm per step" not in text


def test_a_long_per_optimizer_series_is_cut_at_twelve_with_its_own_count() -> None:
    records = [_record(step, step % 2, float(step)) for step in range(1, 31)]
    text = render("server/probe.md.j2", r=_report(records, ["Adam", "Adam"]))
    first, second = _norm_lines(text)
    assert first.startswith("Optimizer 0 (Adam), total gradient norm per step: 2.0, 4.0, ")
    assert first.endswith("24.0 … (15 steps)")
    assert second.startswith("Optimizer 1 (Adam), total gradient norm per step: 1.0, 3.0, ")
    assert second.endswith("23.0 … (15 steps)")


def test_one_optimizer_keeps_the_single_series() -> None:
    records = [_record(step, 0, 0.5) for step in range(1, 4)]
    for kinds in (["AdamW"], []):
        text = render("server/probe.md.j2", r=_report(records, kinds))
        assert _norm_lines(text) == ["Total gradient norm per step: 0.5, 0.5, 0.5"]
        assert "Optimizer 0" not in text
