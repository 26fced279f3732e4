"""The probe's CUDA path: every test here needs a CUDA device and is skipped without one.

CI has no GPU; these ran on a lent H100 (see the issue notes). They check what only a GPU can
show: that the probe's per-step measurement adds no host synchronisation on plain steps (its
norms travel in one asynchronous copy), and that the verdicts of a CUDA autocast run, float16
with a GradScaler or bfloat16 without one, are the same as on the CPU: healthy stays clean and
each injected bug is named.
"""

from __future__ import annotations

import json
import sys
import warnings

import pytest

torch = pytest.importorskip("torch")

from gradient_doctor.probes.runtime.child import hooks  # noqa: E402
from gradient_doctor.probes.runtime.child.collector import Collector  # noqa: E402
from tests.conftest import run_cli  # noqa: E402

from .conftest import fixture  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

SCRIPT = fixture("cuda_amp_transformer")

#: variant of the script: the ids of which one must head the findings at warning or above
#: (empty: clean).
CASES = [
    ("healthy-fp16", set()),
    ("healthy-bf16", set()),
    ("no-unscale", {"amp-clip-without-unscale"}),
    ("clip-after-step", {"clip-after-step"}),
    ("accum-undivided", {"accum-unscaled-loss"}),
    ("lr-blowup", {"loss-diverging", "update-param-ratio"}),
    ("nan-input", {"nonfinite-inputs"}),
]


def _synchronisations(step: object) -> int:
    """How many synchronising CUDA calls one call of ``step`` makes (sync debug mode)."""
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            step()  # type: ignore[operator]
        finally:
            torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    return sum("synchronizing" in str(w.message) for w in caught)


def test_plain_steps_add_no_host_synchronisation() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 10)
    ).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(128, 64, device="cuda")
    y = torch.randint(0, 10, (128,), device="cuda")

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()

    for _ in range(3):
        step()  # warm-up: kernels, allocator, optimizer state
    baseline = [_synchronisations(step) for _ in range(3)]
    sampled: dict[int, bool] = {}
    collector = Collector(
        lambda record: sampled.__setitem__(int(record["step"]), bool(record["sampled"])),
        sample_every=10,
    )
    uninstall = hooks.install(collector)
    try:
        probed = [_synchronisations(step) for _ in range(25)]
    finally:
        uninstall()
    collector.flush()
    assert len(sampled) == 25
    plain = [count for number, count in enumerate(probed, 1) if not sampled[number]]
    assert plain and max(plain) <= max(baseline), (baseline, probed, sampled)


@pytest.mark.slow
@pytest.mark.parametrize(("variant", "expected"), CASES, ids=[case[0] for case in CASES])
def test_cli_probe_of_a_cuda_autocast_run(variant: str, expected: set[str]) -> None:
    done = run_cli(
        "probe",
        str(SCRIPT),
        "--steps",
        "30",
        "--device",
        "cuda",
        "--python",
        sys.executable,
        "--format",
        "json",
        "--fail-on",
        "never",
        "--",
        variant,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert str(report["device"]).startswith("cuda"), report["device"]
    serious = [f["id"] for f in report["findings"] if f["severity"] in ("warning", "critical")]
    if not expected:
        assert serious == [], report["findings"]
    else:
        assert serious and serious[0] in expected, report["findings"]


def test_sampled_details_on_cuda_match_brute_force() -> None:
    """The accelerator branch of ``tensor_details`` (the CPU has its own sweep)."""
    from gradient_doctor.probes.runtime.child import measure

    torch.manual_seed(4)
    grads: list[torch.Tensor | None] = [
        torch.randn(300, 200, device="cuda"),
        None,
        torch.randn(17, device="cuda").bfloat16(),
        torch.zeros(9, device="cuda"),
        torch.randn(5000, device="cuda"),
    ]
    grads[0][0, :5] = 0.0  # type: ignore[index]
    grads[4][7] = float("nan")  # type: ignore[index]
    params = [torch.randn(g.shape if g is not None else (3,), device="cuda") for g in grads]
    grouping = measure.group_tensors(grads)
    norms, details = measure.sampled_statistics(
        grads, params, grouping, measure.group_tensors(params)
    )
    unpacked = measure.unpack_details(details.pack().tolist(), details.numel, norms.tolist())
    assert unpacked[1] is None
    for g, p, got in zip(grads, params, unpacked, strict=True):
        if g is None:
            continue
        assert got is not None
        flat = g.double().flatten().cpu()
        assert got["nans"] == int(flat.isnan().sum()) and got["infs"] == 0
        assert got["zeros"] == int((flat == 0).sum())
        assert got["param_norm"] == pytest.approx(p.double().norm().item(), rel=1e-5)
        if got["nans"]:
            continue
        assert got["max_abs"] == pytest.approx(flat.abs().max().item(), rel=1e-6)
        assert got["mean"] == pytest.approx(flat.mean().item(), rel=1e-4, abs=1e-6)
