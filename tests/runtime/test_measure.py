"""The batched statistics against a brute-force per-tensor float64 reference (in process)."""

from __future__ import annotations

import math

import pytest
import torch

from probes.runtime import measure


def _tolerance(numel: int) -> float:
    # fp32 CPU norm kernels drift ~1e-3 relative on tens of millions of elements; small
    # tensors agree to ~1e-6. Scale the tolerance with the size.
    return 1e-6 + 1e-3 * min(1.0, numel / 2e7)


def _reference_norm(t: torch.Tensor) -> float:
    return t.detach().double().norm().item()


def test_norms_match_reference_across_dtypes_sizes_and_missing() -> None:
    torch.manual_seed(0)
    tensors: list[torch.Tensor | None] = [
        torch.randn(3),
        None,
        torch.randn(64, 32, dtype=torch.float64),
        torch.randn(1000, 100),
        torch.zeros(7),
        (torch.randn(256) * 1e-20),
        torch.randn(50, dtype=torch.bfloat16),
        torch.randn(2_000_000),
    ]
    grouping = measure.group_tensors(tensors)
    assert len(grouping.groups) == 3  # float32, float64, bfloat16
    norms = measure.per_tensor_norms(tensors, grouping).tolist()
    for value, tensor in zip(norms, tensors, strict=True):
        if tensor is None:
            assert value == measure.MISSING
            continue
        expected = _reference_norm(tensor)
        assert value == pytest.approx(
            expected,
            rel=_tolerance(tensor.numel()) + 1e-2 * (tensor.dtype == torch.bfloat16),
            abs=1e-30,
        )


def test_non_finite_values_name_their_tensor() -> None:
    clean = torch.ones(10)
    with_nan = torch.ones(10)
    with_nan[3] = math.nan
    with_inf = torch.ones(10)
    with_inf[0] = math.inf
    both = torch.ones(4)
    both[0], both[1] = math.inf, math.nan
    tensors: list[torch.Tensor | None] = [clean, with_nan, with_inf, both]
    norms = measure.per_tensor_norms(tensors, measure.group_tensors(tensors)).tolist()
    assert math.isfinite(norms[0])
    assert math.isnan(norms[1])
    assert math.isinf(norms[2])
    assert math.isnan(norms[3])  # NaN wins over Inf


def test_details_match_brute_force() -> None:
    torch.manual_seed(1)
    grads: list[torch.Tensor | None] = [torch.randn(40, 30), None, torch.randn(17), torch.zeros(9)]
    grads[0][0, :5] = 0.0  # type: ignore[index]
    params = [torch.randn(40, 30), torch.randn(3), torch.randn(17), torch.zeros(9)]
    grouping = measure.group_tensors(grads)
    norms = measure.per_tensor_norms(grads, grouping)
    details = measure.tensor_details(grads, params, grouping, measure.group_tensors(params), norms)
    values = details.pack().tolist()
    unpacked = measure.unpack_details(values, details.numel, norms.tolist())
    assert unpacked[1] is None
    for g, p, got in zip(grads, params, unpacked, strict=True):
        if g is None:
            continue
        assert got is not None
        g64 = g.double().flatten()
        assert got["max_abs"] == pytest.approx(g64.abs().max().item(), rel=1e-6)
        assert got["mean"] == pytest.approx(g64.mean().item(), rel=1e-5, abs=1e-7)
        assert got["std"] == pytest.approx(g64.std().item(), rel=1e-4, abs=1e-7)
        assert got["zeros"] == int((g64 == 0).sum())
        assert got["nans"] == 0 and got["infs"] == 0
        assert got["param_norm"] == pytest.approx(p.double().norm().item(), rel=1e-6)
        assert got["numel"] == g.numel()


def test_details_count_nan_and_inf_in_bad_tensors() -> None:
    g = torch.ones(20)
    g[:3] = math.nan
    g[5:7] = math.inf
    grads: list[torch.Tensor | None] = [g, torch.ones(4)]
    grouping = measure.group_tensors(grads)
    norms = measure.per_tensor_norms(grads, grouping)
    details = measure.tensor_details(
        grads, [torch.ones(20), torch.ones(4)], grouping, grouping, norms
    )
    unpacked = measure.unpack_details(details.pack().tolist(), details.numel, norms.tolist())
    assert unpacked[0] is not None and unpacked[0]["nans"] == 3 and unpacked[0]["infs"] == 2
    assert unpacked[1] is not None and unpacked[1]["nans"] == 0


def test_finite_flag() -> None:
    assert bool(measure.finite_flag(torch.randn(100)))
    bad = torch.randn(100)
    bad[50] = math.nan
    assert not bool(measure.finite_flag(bad))
    bad[50] = -math.inf
    assert not bool(measure.finite_flag(bad))


def test_host_transfer_cpu_is_immediate() -> None:
    transfer = measure.HostTransfer()
    transfer.submit("a", torch.tensor([1.0, 2.0]))
    assert transfer.ready() == [("a", [1.0, 2.0])]
    assert transfer.flush() == []


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_transfer_is_one_async_copy() -> None:
    grads: list[torch.Tensor | None] = [torch.randn(1000, device="cuda") for _ in range(50)]
    grouping = measure.group_tensors(grads)
    transfer = measure.HostTransfer()
    torch.cuda.set_sync_debug_mode("error")
    try:
        transfer.submit("s", measure.per_tensor_norms(grads, grouping))
    finally:
        torch.cuda.set_sync_debug_mode("default")
    ((_tag, values),) = transfer.flush()
    expected = [g.double().norm().item() for g in grads if g is not None]
    assert values == pytest.approx(expected, rel=1e-5)
