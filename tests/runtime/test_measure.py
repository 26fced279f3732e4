"""The batched statistics against a brute-force per-tensor float64 reference (in process)."""

from __future__ import annotations

import math

import pytest
import torch

from gradient_doctor.probes.runtime.child import measure


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


def _awkward_gradients() -> list[torch.Tensor | None]:
    """Both CPU norm paths (BLAS dot for large float tensors, the norm kernel otherwise)."""
    torch.manual_seed(2)
    large = torch.randn(300, 200)  # 60,000 elements: dot path
    large[0, :7] = 0.0
    large[1, :5] = -0.0  # a negative zero is a zero
    with_nan = torch.randn(40_000)
    with_nan[123] = math.nan
    with_nan[9] = math.inf
    with_inf = torch.randn(20_000, dtype=torch.float64)
    with_inf[5] = -math.inf
    return [
        large,
        None,
        torch.randn(200, 300).t(),  # large but not contiguous: norm kernel
        with_nan,
        with_inf,
        torch.randn(17),
        torch.zeros(0),
        torch.randn(30_000, dtype=torch.bfloat16),
        torch.randn(4, 5, dtype=torch.complex64),
    ]


def test_cpu_norm_paths_agree_with_reference() -> None:
    grads = _awkward_gradients()
    norms = measure.per_tensor_norms(grads, measure.group_tensors(grads)).tolist()
    assert norms[1] == measure.MISSING
    assert math.isnan(norms[3])  # NaN wins over Inf on the dot path too
    assert math.isinf(norms[4])
    for value, g in zip(norms, grads, strict=True):
        if g is None or not torch.isfinite(g).all():
            continue
        rel = 1e-2 if g.dtype == torch.bfloat16 else _tolerance(g.numel())
        assert value == pytest.approx(_reference_norm(g.abs()), rel=rel, abs=1e-30)


@pytest.mark.parametrize("chunk_bytes", [None, 4096], ids=["default-pieces", "small-pieces"])
def test_sampled_statistics_match_brute_force_and_the_plain_norms(
    chunk_bytes: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    if chunk_bytes is not None:
        # Every tensor above 1,024 float32 elements is then swept in many pieces.
        monkeypatch.setattr(measure, "CPU_SWEEP_CHUNK_BYTES", chunk_bytes)
    grads = _awkward_gradients()
    params = [torch.randn(g.shape) if g is not None else torch.randn(3) for g in grads]
    grouping = measure.group_tensors(grads)
    plain = measure.per_tensor_norms(grads, grouping).tolist()
    norms_tensor, details = measure.sampled_statistics(
        grads, params, grouping, measure.group_tensors(params)
    )
    norms = norms_tensor.tolist()
    # Same rule as the plain steps (exactly so for a tensor swept whole): a series mixing
    # plain and sampled steps is consistent.
    for got, want, g in zip(norms, plain, grads, strict=True):
        if math.isnan(want):
            assert math.isnan(got)
        elif g is not None and g.numel() * g.element_size() > measure.CPU_SWEEP_CHUNK_BYTES:
            assert got == pytest.approx(want, rel=1e-5)
        else:
            assert got == want
    unpacked = measure.unpack_details(details.pack().tolist(), details.numel, norms)
    for g, p, got in zip(grads, params, unpacked, strict=True):
        if g is None or g.numel() == 0:
            assert got is None
            continue
        assert got is not None
        g64 = g.detach().to(torch.complex128 if g.is_complex() else torch.float64).flatten()
        finite = g64[torch.isfinite(g64)] if not g.is_complex() else g64
        assert got["nans"] == int(torch.isnan(g64).sum())
        assert got["infs"] == int(torch.isinf(g64).sum())
        assert got["zeros"] == int((g64 == 0).sum())
        if got["nans"]:
            assert math.isnan(got["max_abs"])
            continue
        assert got["max_abs"] == pytest.approx(g64.abs().max().item(), rel=1e-6)
        if got["infs"]:
            continue
        rel = 1e-2 if g.dtype == torch.bfloat16 else 1e-5
        assert got["mean"] == pytest.approx(finite.real.mean().item(), rel=rel, abs=1e-6)
        assert got["param_norm"] == pytest.approx(p.double().norm().item(), rel=1e-5)


@pytest.mark.parametrize("chunk", [7, 1000, 1 << 24])
def test_segment_statistics_match_brute_force(monkeypatch: pytest.MonkeyPatch, chunk: int) -> None:
    """The accelerator path's sums and counts (prefix sums over chunks of concatenated
    tensors), with tensors cut across chunks, empty ones, and NaN/Inf that must not spill
    into the tensors after them."""
    monkeypatch.setattr(measure, "SEGMENT_CHUNK", chunk)
    torch.manual_seed(3)
    tensors = [torch.randn(40, 30), torch.zeros(9), torch.randn(2500), torch.randn(0)]
    tensors += [torch.randn(17), torch.randn(3, 3, 3)]
    tensors[0][0, :5] = 0.0
    tensors[2][100] = math.nan
    tensors[2][1700] = math.inf
    tensors[2][2400] = -math.inf
    tensors[5][1, 1, 1] = math.inf
    stats = measure.segment_statistics(tensors)
    assert stats.shape == (4, len(tensors)) and stats.dtype == torch.float32
    for column, tensor in zip(stats.T.tolist(), tensors, strict=True):
        flat = tensor.double().flatten()
        total, nonzero, nans, infs = column
        if torch.isfinite(flat).all():
            assert total == pytest.approx(flat.sum().item(), rel=1e-6, abs=1e-6)
        else:
            assert math.isnan(total)
        assert nonzero == int((flat != 0).sum())
        assert nans == int(flat.isnan().sum()) and infs == int(flat.isinf().sum())
