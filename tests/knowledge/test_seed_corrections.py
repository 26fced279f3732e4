"""Proofs, with real PyTorch on CPU, of what is true where the seeds are wrong (catalog.md §5).

Each test runs the actual mechanics (GradScaler, autograd accumulation, a forward pass over a
corrupt batch) and would fail if the seed's claim were the true one. knowledge/data/
corrections.yaml names these tests.
"""

from __future__ import annotations

import math
import warnings

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

SCALE = 2.0**16
MAX_NORM = 1.0


def _model_and_batch(seed: int = 0) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    x = torch.randn(32, 8)
    # Large targets make the true gradient norm well above MAX_NORM, so clipping matters.
    y = torch.randn(32, 1) * 50
    return model, x, y


def _params(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1).clone() for p in model.parameters()])


def _grad_norm(model: nn.Module) -> float:
    return float(torch.cat([p.grad.reshape(-1) for p in model.parameters()]).norm())


def _true_grad_norm() -> float:
    model, x, y = _model_and_batch()
    nn.functional.mse_loss(model(x), y).backward()
    return _grad_norm(model)


def _update_norm(step: str) -> float:
    """Norm of one SGD(lr=1) update under a GradScaler, for one ordering of the AMP calls."""
    model, x, y = _model_and_batch()
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    scaler = torch.amp.GradScaler("cpu", init_scale=SCALE)
    before = _params(model)
    loss = nn.functional.mse_loss(model(x), y)
    scaler.scale(loss).backward()
    if step == "unscale-then-clip":
        scaler.unscale_(optimizer)
        nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
        scaler.step(optimizer)
    elif step == "clip-scaled":
        nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
        scaler.step(optimizer)
    elif step == "optimizer-step-without-unscale":
        optimizer.step()
        # The scaler never saw this step: update() refuses to run instead of adjusting S.
        with pytest.raises(AssertionError, match="No inf checks were recorded"):
            scaler.update()
        return float((_params(model) - before).norm())
    else:  # pragma: no cover - a typo in the test itself
        raise ValueError(step)
    scaler.update()
    return float((_params(model) - before).norm())


def test_gradscaler_runs_on_cpu_with_the_seed_scale() -> None:
    scaler = torch.amp.GradScaler("cpu", init_scale=SCALE)
    assert scaler.is_enabled() and scaler.get_scale() == SCALE
    assert _true_grad_norm() > 10 * MAX_NORM


def test_clipping_scaled_gradients_clips_far_too_hard() -> None:
    true_norm = _true_grad_norm()
    correct = _update_norm("unscale-then-clip")
    wrong = _update_norm("clip-scaled")
    # Unscale-then-clip: the update is clipped to exactly max_norm (lr = 1).
    assert correct == pytest.approx(MAX_NORM, rel=1e-4)
    # Clip on scaled gradients: clipped to max_norm in *scaled* units, then divided by S.
    assert wrong == pytest.approx(MAX_NORM / SCALE, rel=1e-3)
    assert correct / wrong == pytest.approx(SCALE, rel=1e-3)
    # The seed's claim ("clipping does nothing") would leave the unclipped update, of norm
    # ||g||; the real update is more than 65,536 times smaller than that.
    assert wrong < true_norm / SCALE


def test_clip_on_scaled_gradients_sees_the_scaled_norm() -> None:
    model, x, y = _model_and_batch()
    scaler = torch.amp.GradScaler("cpu", init_scale=SCALE)
    scaler.scale(nn.functional.mse_loss(model(x), y)).backward()
    seen = float(nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM))
    assert seen == pytest.approx(SCALE * _true_grad_norm(), rel=1e-4)
    assert _grad_norm(model) == pytest.approx(MAX_NORM, rel=1e-4)


def test_second_unscale_raises() -> None:
    model, x, y = _model_and_batch()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=SCALE)
    scaler.scale(nn.functional.mse_loss(model(x), y)).backward()
    scaler.unscale_(optimizer)
    once = [p.grad.clone() for p in model.parameters()]
    with pytest.raises(RuntimeError, match=r"unscale_\(\) has already been called"):
        scaler.unscale_(optimizer)
    # Nothing was divided a second time: the gradients are still the true ones.
    for grad, p in zip(once, model.parameters(), strict=True):
        assert torch.equal(grad, p.grad)
    assert _grad_norm(model) == pytest.approx(_true_grad_norm(), rel=1e-5)


def test_optimizer_step_after_scaled_backward_applies_scaled_gradients() -> None:
    true_norm = _true_grad_norm()
    wrong = _update_norm("optimizer-step-without-unscale")
    # SGD with lr = 1 moves the parameters by the gradient it reads: S * g, not g.
    assert wrong == pytest.approx(SCALE * true_norm, rel=1e-4)
    assert wrong / true_norm > 60_000


@pytest.mark.filterwarnings("ignore:.*CUDA is not available:UserWarning")
def test_cuda_amp_api_is_deprecated() -> None:
    with pytest.warns(FutureWarning, match="deprecated"):
        torch.cuda.amp.GradScaler()
    with pytest.warns(FutureWarning, match="deprecated"):
        torch.cuda.amp.autocast()


def test_current_amp_api_does_not_warn() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        scaler = torch.amp.GradScaler("cpu")
        model = nn.Linear(4, 1)
        with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
            out = model(torch.randn(2, 4))
        assert out.dtype == torch.bfloat16
        assert scaler.is_enabled()


def _accumulated_grad(
    chunks: list[tuple[torch.Tensor, torch.Tensor]], divisor: int
) -> torch.Tensor:
    torch.manual_seed(1)
    model = nn.Linear(6, 1).double()
    for x, y in chunks:
        (nn.functional.mse_loss(model(x), y) / divisor).backward()
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])


def test_leftover_window_needs_its_own_divisor() -> None:
    torch.manual_seed(0)
    n_accum, batch = 4, 5
    micro_batches = [
        (torch.randn(batch, 6, dtype=torch.float64), torch.randn(batch, 1, dtype=torch.float64))
        for _ in range(10)
    ]
    leftover = micro_batches[8:]  # 10 = 2 * 4 + 2: two micro-batches left at epoch end
    k = len(leftover)
    assert k < n_accum
    # The gradient of one big batch made of exactly those samples.
    big_x = torch.cat([x for x, _ in leftover])
    big_y = torch.cat([y for _, y in leftover])
    reference = _accumulated_grad([(big_x, big_y)], divisor=1)

    divided_by_n = _accumulated_grad(leftover, divisor=n_accum)
    divided_by_k = _accumulated_grad(leftover, divisor=k)
    assert torch.allclose(divided_by_k, reference, atol=1e-6, rtol=0)
    assert torch.allclose(divided_by_n, reference * k / n_accum, atol=1e-6, rtol=0)
    assert not torch.allclose(divided_by_n, reference, atol=1e-3, rtol=0)


def test_corrupt_batch_mid_epoch_breaks_loss_at_that_step() -> None:
    torch.manual_seed(0)
    n_batches = 40
    data = [(torch.randn(8, 4), torch.randn(8, 1)) for _ in range(n_batches)]
    corrupt_index = 23
    x_bad = data[corrupt_index][0].clone()
    x_bad[3, 1] = math.nan
    data[corrupt_index] = (x_bad, data[corrupt_index][1])

    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    order = torch.randperm(n_batches, generator=torch.Generator().manual_seed(7)).tolist()
    first_bad_step = None
    for step, index in enumerate(order):
        x, y = data[index]
        loss = nn.functional.mse_loss(model(x), y)
        if not torch.isfinite(loss):
            first_bad_step = step
            break
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    expected_step = order.index(corrupt_index)
    assert expected_step > 0, "the shuffle must put the corrupt batch after the start"
    # Training ran cleanly until the corrupt batch arrived, then broke on exactly that step.
    assert first_bad_step == expected_step
