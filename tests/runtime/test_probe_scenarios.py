"""Real tiny training scripts under the probe, each in its own child process (slow).

All scenarios run once, concurrently (a few at a time), in one module-scoped fixture; each
test then checks one verdict.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import anyio
import pytest

from gradient_doctor.knowledge.findings import severity_at_least
from gradient_doctor.probes.runtime import ProbeResult, run_probe_async

from .conftest import fixture

pytestmark = pytest.mark.slow

STEPS = 12
SCENARIOS: dict[str, dict[str, Any]] = {
    name: {}
    for name in (
        "healthy_mlp",
        "healthy_cnn",
        "healthy_lstm_clip",
        "healthy_transformer",
        "amp_healthy",
        "accum_healthy",
        "exploding",
        "vanishing",
        "dead_relu",
        "nan_loss",
        "nan_grad",
        "amp_clip_without_unscale",
        "amp_bypass",
        "amp_double_unscale",
        "accum_unscaled_loss",
        "accum_zero_every_micro",
        "accum_missing_zero",
        "accum_clip_sched_micro",
        "clip_after_step",
        "clip_before_backward",
        "clip_too_aggressive",
        "syntax_error",
        "import_error",
        "exit_early",
        "never_trains",
        "spawns_child",
        "prints_megabytes",
        "raises_midway",
        "out_of_memory",
        "swallows_stop",
        "gan_two_optimizers",
        "lbfgs_closure",
        "manual_sgd",
        "functional_dead_relu",
        "nan_input_batch",
        "zero_init_gain",
        "accum_zero_grad_once",
        "ddp_single_accum",
        "amp_scale_collapse",
    )
}
# The learning-rate shapes of nanoGPT / minGPT / word_language_model, in a small Transformer.
SCENARIOS["lr_x1000"] = {"script": "lr_blowup", "args": ["--lr", "1.0"], "steps": 20}
SCENARIOS["lr_x1000_warmup_clip"] = {
    "script": "lr_blowup",
    "args": ["--lr", "1.0", "--warmup", "10", "--clip", "1.0"],
    "steps": 20,
}
SCENARIOS["lr_usual_clip"] = {
    "script": "lr_blowup",
    "args": ["--lr", "0.001", "--clip", "1.0"],
    "steps": 20,
}
SCENARIOS["infinite_loop"] = {"timeout_s": 8.0}
SCENARIOS["args_and_cwd"] = {"args": ["--lr", "0.05"], "steps": 3}


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ProbeResult]:
    reference = tmp_path_factory.mktemp("reference") / "reference.json"
    SCENARIOS["reference_stats"] = {"args": [str(reference)], "steps": 6, "sample_every": 2}
    found: dict[str, ProbeResult] = {}

    async def run_all() -> None:
        limiter = anyio.CapacityLimiter(3)

        async def one(name: str, options: dict[str, Any]) -> None:
            async with limiter:
                found[name] = await run_probe_async(
                    fixture(options.get("script", name)),
                    options.get("args", ()),
                    steps=options.get("steps", STEPS),
                    timeout_s=options.get("timeout_s", 120.0),
                    sample_every=options.get("sample_every", 10),
                )

        async with anyio.create_task_group() as group:
            for name, options in SCENARIOS.items():
                group.start_soon(one, name, options)

    anyio.run(run_all)
    found["reference_stats"].__dict__["reference_path"] = reference
    return found


def ids(result: ProbeResult) -> list[str]:
    return [f.id for f in result.findings]


def serious(result: ProbeResult) -> list[str]:
    return [f.id for f in result.findings if severity_at_least(f.severity, "warning")]


@pytest.mark.parametrize(
    "name",
    [
        "healthy_mlp",
        "healthy_cnn",
        "healthy_lstm_clip",
        "healthy_transformer",
        "amp_healthy",
        "accum_healthy",
        "gan_two_optimizers",
        "lbfgs_closure",
        "manual_sgd",
        "zero_init_gain",
        "lr_usual_clip",
    ],
)
def test_healthy_scripts_report_nothing_serious(results: dict[str, ProbeResult], name: str) -> None:
    result = results[name]
    assert result.status == "stopped", result.message
    assert result.steps == SCENARIOS[name].get("steps", STEPS)
    assert serious(result) == []
    assert ids(result) == ["healthy"]
    assert result.profile == "default"


@pytest.mark.parametrize(
    ("name", "expected", "severity"),
    [
        ("exploding", "exploding-gradients", "critical"),
        ("vanishing", "vanishing-gradients", "warning"),
        ("vanishing", "saturating-deep-net", "warning"),
        ("dead_relu", "dead-neurons", "critical"),
        ("nan_loss", "nan-loss-before-backward", "critical"),
        ("nan_grad", "nan-gradients", "critical"),
        ("amp_clip_without_unscale", "amp-clip-without-unscale", "critical"),
        ("amp_bypass", "amp-step-bypasses-scaler", "critical"),
        ("amp_double_unscale", "amp-double-unscale", "warning"),
        ("accum_unscaled_loss", "accum-unscaled-loss", "critical"),
        ("accum_zero_every_micro", "accum-zero-grad-every-microstep", "critical"),
        ("accum_missing_zero", "accum-missing-zero-grad", "critical"),
        ("accum_clip_sched_micro", "accum-clip-every-microstep", "warning"),
        ("accum_clip_sched_micro", "accum-scheduler-per-microbatch", "warning"),
        ("clip_after_step", "clip-after-step", "critical"),
        ("clip_before_backward", "clip-before-backward", "critical"),
        ("clip_too_aggressive", "clip-too-aggressive", "warning"),
        ("functional_dead_relu", "dead-neurons", "critical"),
        ("nan_input_batch", "nonfinite-inputs", "critical"),
        ("accum_zero_grad_once", "accum-missing-zero-grad", "critical"),
        ("ddp_single_accum", "ddp-accum-without-no-sync", "warning"),
        ("lr_x1000", "loss-diverging", "critical"),
        ("lr_x1000_warmup_clip", "loss-diverging", "critical"),
    ],
)
def test_mistakes_are_found(
    results: dict[str, ProbeResult], name: str, expected: str, severity: str
) -> None:
    result = results[name]
    matching = [f for f in result.findings if f.id == expected]
    assert matching, (name, ids(result), result.message)
    assert matching[0].severity == severity
    assert matching[0].origin == "runtime"
    assert matching[0].evidence.get("profile") == "default"
    assert "healthy" not in ids(result)


def test_amp_clip_without_unscale_is_not_reported_as_a_bypass(
    results: dict[str, ProbeResult],
) -> None:
    assert "amp-step-bypasses-scaler" not in ids(results["amp_clip_without_unscale"])


def test_nan_loss_is_not_blamed_on_gradients(results: dict[str, ProbeResult]) -> None:
    result = results["nan_loss"]
    assert ids(result)[0] == "nan-loss-before-backward"
    assert result.findings[0].step == 5
    assert "nan-gradients" not in ids(result)


def test_nan_gradient_origin_names_the_module(results: dict[str, ProbeResult]) -> None:
    result = results["nan_grad"]
    first = result.findings[0]
    assert first.step == 1 and first.parameter == "0.weight"
    assert result.nan_origin is not None
    assert result.nan_origin.phase == "backward"
    assert result.nan_origin.module == "3"
    assert first.module == "3"
    assert "`3`" in result.nan_origin.detail  # the Distance module, index 3 of the Sequential


def test_statistics_match_brute_force_reference(results: dict[str, ProbeResult]) -> None:
    result = results["reference_stats"]
    assert result.status == "ok", result.message
    reference = json.loads(Path(result.__dict__["reference_path"]).read_text())
    assert len(result.records) == len(reference) == 6
    assert result.parameters == [
        "frozen",
        "conv.weight",
        "conv.bias",
        "fc.weight",
        "fc.bias",
        "fc64.weight",
        "fc64.bias",
        "unused.weight",
        "unused.bias",
    ]
    for record, expected in zip(result.records, reference, strict=True):
        for got, want in zip(record.grad_norms, expected, strict=True):
            if want is None:
                assert got is None
            else:
                assert got == pytest.approx(want["norm"], rel=1e-5)
        total = math.sqrt(sum(w["norm"] ** 2 for w in expected if w is not None))
        assert record.total_norm == pytest.approx(total, rel=1e-5)
        if record.detail is None:
            continue
        for got_detail, want in zip(record.detail, expected, strict=True):
            if want is None:
                assert got_detail is None
                continue
            assert got_detail is not None
            assert got_detail.max_abs == pytest.approx(want["max_abs"], rel=1e-5)
            assert got_detail.mean == pytest.approx(want["mean"], rel=1e-4, abs=1e-9)
            assert got_detail.std == pytest.approx(want["std"], rel=1e-3)
            assert got_detail.zeros == want["zeros"]
            assert got_detail.param_norm == pytest.approx(want["param_norm"], rel=1e-5)
    assert sum(1 for r in result.records if r.detail) >= 3  # steps 1, 2, 4, 6


@pytest.mark.parametrize(
    ("name", "status", "fragment"),
    [
        ("syntax_error", "script-error", "SyntaxError"),
        ("import_error", "script-error", "a_module_that_is_not_installed"),
        ("exit_early", "no-training-loop", "sys.exit(0)"),
        ("never_trains", "no-training-loop", "5 backward() calls"),
        ("infinite_loop", "timeout", "8 s limit"),
        ("raises_midway", "script-error", "shape mismatch in evaluation"),
        ("out_of_memory", "out-of-memory", "can't allocate memory"),
    ],
)
def test_awkward_scripts_get_a_clear_status(
    results: dict[str, ProbeResult], name: str, status: str, fragment: str
) -> None:
    result = results[name]
    assert result.status == status
    assert result.message is not None and fragment in result.message
    assert "\n" not in result.message


def test_script_error_keeps_the_traceback_tail(results: dict[str, ProbeResult]) -> None:
    result = results["raises_midway"]
    assert result.steps == 2
    assert result.traceback_tail is not None
    assert "evaluate()" in result.traceback_tail
    assert "probes/runtime" not in result.traceback_tail


@pytest.mark.parametrize("name", ["spawns_child", "prints_megabytes", "swallows_stop"])
def test_noisy_and_spawning_scripts_are_measured(
    results: dict[str, ProbeResult], name: str
) -> None:
    result = results[name]
    assert result.status == "stopped", result.message
    assert result.steps == STEPS


def test_script_gets_its_own_argv_and_folder(results: dict[str, ProbeResult]) -> None:
    result = results["args_and_cwd"]
    assert result.status == "ok", (result.message, result.traceback_tail)
    assert result.steps == 3


def test_result_round_trips_through_json(results: dict[str, ProbeResult]) -> None:
    for name in ("nan_loss", "exploding"):
        text = results[name].model_dump_json()
        again = ProbeResult.model_validate_json(text)
        assert again.findings == results[name].findings
        assert len(again.records) == len(results[name].records)
        json.loads(text)  # standard JSON: non-finite numbers are strings


def test_a_gan_is_two_series_and_not_accumulation(results: dict[str, ProbeResult]) -> None:
    result = results["gan_two_optimizers"]
    assert result.optimizer_kinds == ["Adam", "Adam"]
    assert {r.optimizer for r in result.records} == {0, 1}
    # The discriminator's step: two backward() calls on one DataLoader batch.
    discriminator = [r for r in result.records if r.optimizer == 0]
    assert all(r.events.count("backward") == 2 and r.batches == 1 for r in discriminator)
    assert "accum-unscaled-loss" not in ids(result)


def test_a_gan_probe_text_has_a_norm_line_per_optimizer(results: dict[str, ProbeResult]) -> None:
    # The MCP tool's text block, from the real run's measurements as the server passes them.
    from gradient_doctor.skill_server.results import ProbeReport
    from gradient_doctor.templates import render

    result = results["gan_two_optimizers"]
    data = result.model_dump(mode="json")
    report = ProbeReport(
        path="gan.py",
        status=data.pop("status"),
        steps=data.pop("steps"),
        steps_requested=STEPS,
        findings=[],
        measurements=data,
    )
    lines = [
        line
        for line in render("server/probe.md.j2", r=report).splitlines()
        if "gradient norm per step" in line
    ]
    # Named as the script names them (``optD``, ``optG``), in the order they first stepped.
    assert result.optimizer_names == ["optD", "optG"]
    assert [line.split(",")[0] for line in lines] == [
        "Optimizer `optD` (Adam)",
        "Optimizer `optG` (Adam)",
    ]
    for index, line in enumerate(lines):
        own = [r.total_norm for r in result.records if r.optimizer == index][:12]
        assert line.split(": ", 1)[1].split(" …")[0] == ", ".join(str(round(v, 4)) for v in own)


def test_an_amp_scale_collapse_is_overflow_skips_not_exploding_or_nan(
    results: dict[str, ProbeResult],
) -> None:
    result = results["amp_scale_collapse"]
    assert all(r.skipped for r in result.records)
    assert all(not math.isfinite(r.total_norm) for r in result.records)
    finding = result.findings[0]
    assert finding.id == "amp-overflow-skips" and finding.severity == "warning"
    assert finding.evidence["every_step_skipped"] is True
    assert "skipped every step (12 of 12)" in finding.message
    # The skipped steps' non-finite norms were never applied: no explosion, spike or NaN.
    assert not {
        "exploding-gradients",
        "grad-norm-spikes",
        "nan-gradients",
        "inf-gradients",
        "loss-diverging",
    } & set(ids(result))


def test_closure_optimizer_measures_the_first_evaluation(results: dict[str, ProbeResult]) -> None:
    result = results["lbfgs_closure"]
    first = result.records[0]
    assert first.total_norm > 0
    assert first.losses and first.losses[0] is not None and first.losses[0] > 0
    assert result.optimizer_kinds == ["LBFGS"]


def test_hand_written_updates_are_steps(results: dict[str, ProbeResult]) -> None:
    result = results["manual_sgd"]
    assert result.optimizer_kinds == ["manual"]
    assert result.steps == STEPS
    assert all(r.total_norm > 0 and r.losses for r in result.records)


def test_dead_units_behind_functional_relu_name_the_first_layer(
    results: dict[str, ProbeResult],
) -> None:
    result = results["functional_dead_relu"]
    assert result.findings[0].id == "dead-neurons"
    assert result.findings[0].module == "relu after conv2"


def test_a_nan_batch_is_blamed_on_the_data(results: dict[str, ProbeResult]) -> None:
    result = results["nan_input_batch"]
    first = result.findings[0]
    assert first.id == "nonfinite-inputs"
    assert first.step == 6
    assert not {"nan-loss-before-backward", "nan-parameters", "nan-gradients"} & set(ids(result))


@pytest.mark.parametrize(
    ("name", "warmup"), [("lr_x1000", "no warmup"), ("lr_x1000_warmup_clip", "warmup of 10")]
)
def test_learning_rate_blowup_headline_names_the_step_size(
    results: dict[str, ProbeResult], name: str, warmup: str
) -> None:
    result = results[name]
    first = result.findings[0]
    assert first.id == "loss-diverging", ids(result)
    assert warmup in first.message
    assert first.fix is not None and first.fix.description.startswith("Reduce the step size")
    assert "clip-too-aggressive" not in ids(result)
    assert "grad-param-ratio" not in ids(result)
