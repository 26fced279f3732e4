"""The runnable fix snippets, rendered and RUN on tiny CPU models, checked for what they claim.

Every snippet marked ``runnable`` has a runner below (and only those do); the parametrised
test runs each runner and checks that the runner really executed the rendered snippet, so
the ``runnable`` flag cannot claim more than is tested.
"""

from __future__ import annotations

import contextlib
import copy
import io
import math
import socket
import statistics
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from snippet_harness import (
    EXECUTED,
    Batch,
    StepRecorder,
    clipped,
    exec_snippet,
    max_abs_diff,
    mlp,
    reference_grads,
    regression_batches,
    scaled,
    total_norm,
)
from torch import nn

from gradient_doctor.templates.snippets import list_snippets

TOLERANCE = 1e-6


def training_namespace(
    batches: list[Batch], *, lr: float = 0.0, dtype: torch.dtype = torch.float64
) -> dict[str, Any]:
    """model / optimizer / criterion / train_loader for the loop snippets.

    ``lr=0`` keeps the parameters fixed, so every step's gradient can be compared with a
    reference computed on the same weights.
    """
    model = mlp(dtype=dtype)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    return {
        "model": model,
        "optimizer": optimizer,
        "criterion": nn.MSELoss(),
        "train_loader": batches,
        "accumulation_steps": 4,
        "num_epochs": 1,
    }


def windows(batches: list[Batch], size: int) -> list[list[Batch]]:
    return [batches[start : start + size] for start in range(0, len(batches), size)]


def assert_steps_match(recorded: list[dict[str, torch.Tensor]], expected: list[Any]) -> None:
    assert len(recorded) == len(expected)
    for got, want in zip(recorded, expected, strict=True):
        assert max_abs_diff(got, want) <= TOLERANCE


# --- accumulation family ------------------------------------------------------------------


def run_accumulation() -> None:
    """(a) N micro-batches accumulate to the gradient of one batch N times as large."""
    batches = regression_batches(8)
    ns = training_namespace(batches)
    recorder = StepRecorder(ns["optimizer"], ns["model"])
    exec_snippet("accumulation", ns)
    expected = [reference_grads(ns["model"], w, nn.MSELoss()) for w in windows(batches, 4)]
    assert_steps_match(recorder.steps, expected)
    assert all(p.grad is None for p in ns["model"].parameters()), "zeroed after the step"


def run_accumulation_clip() -> None:
    batches = regression_batches(8)
    ns = training_namespace(batches)
    recorder = StepRecorder(ns["optimizer"], ns["model"])
    exec_snippet("accumulation-clip", ns, {"max_norm": 0.2})
    full = [reference_grads(ns["model"], w, nn.MSELoss()) for w in windows(batches, 4)]
    assert all(total_norm(g) > 0.2 for g in full), "the test must exercise clipping"
    # Clipped once, on the whole accumulated gradient: same direction, norm max_norm.
    assert_steps_match(recorder.steps, [clipped(g, 0.2) for g in full])


def run_accumulation_scheduler() -> None:
    batches = regression_batches(8)
    ns = training_namespace(batches, lr=0.1)
    ns["scheduler"] = torch.optim.lr_scheduler.StepLR(ns["optimizer"], step_size=1, gamma=0.5)
    recorder = StepRecorder(ns["optimizer"], ns["model"])
    exec_snippet("accumulation-scheduler", ns, {"max_norm": 1e6})
    # 8 micro-batches, 4 per update: two updates, two scheduler steps.
    assert len(recorder.steps) == 2
    assert ns["scheduler"].last_epoch == 2
    assert ns["optimizer"].param_groups[0]["lr"] == pytest.approx(0.1 * 0.5**2)


def run_accumulation_leftover() -> None:
    """(d) the partial window at the end gives the mean gradient of the batches it saw."""
    batches = regression_batches(10)  # windows of 4, 4 and 2
    ns = training_namespace(batches)
    recorder = StepRecorder(ns["optimizer"], ns["model"])
    exec_snippet("accumulation-leftover", ns)
    expected = [reference_grads(ns["model"], w, nn.MSELoss()) for w in windows(batches, 4)]
    assert_steps_match(recorder.steps, expected)
    # Dividing the short window by N (=4) instead would have halved that update.
    half = scaled(expected[-1], 2 / 4)
    assert max_abs_diff(recorder.steps[-1], half) > 1e-3


class TokenModel(nn.Module):
    """Embedding + linear head: logits [batch, time, vocab]."""

    def __init__(self, vocab: int = 11) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(vocab, 8, dtype=torch.float64)
        self.head = nn.Linear(8, vocab, dtype=torch.float64)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.embed(tokens)))


def token_batches(real_tokens: list[int], ignore_index: int) -> list[Batch]:
    """Micro-batches of shape [2, 6] holding ``real_tokens[i]`` non-padding targets each."""
    generator = torch.Generator().manual_seed(3)
    batches = []
    for count in real_tokens:
        inputs = torch.randint(0, 11, (2, 6), generator=generator)
        targets = torch.randint(0, 11, (2, 6), generator=generator)
        flat = targets.view(-1)
        flat[count:] = ignore_index
        batches.append((inputs, targets))
    return batches


def run_accumulation_token_mean() -> None:
    """(e) equals the big-batch per-token mean with padding; the naive mean of means does not."""
    ignore_index = -1
    real_tokens = [12, 3, 7, 9, 2, 10]  # windows of 4 and 2, all with different token counts

    def token_mean(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(
            logits.reshape(-1, logits.size(-1)), targets.reshape(-1), ignore_index=ignore_index
        )

    batches = token_batches(real_tokens, ignore_index)
    model = TokenModel()
    expected = [reference_grads(model, w, token_mean) for w in windows(batches, 4)]

    ns: dict[str, Any] = {
        "model": model,
        "optimizer": torch.optim.SGD(model.parameters(), lr=0.0),
        "train_loader": batches,
        "accumulation_steps": 4,
    }
    recorder = StepRecorder(ns["optimizer"], model)
    exec_snippet("accumulation-token-mean", ns, {"ignore_index": ignore_index})
    assert_steps_match(recorder.steps, expected)

    # The plain accumulation snippet with a per-micro-batch token mean is biased here.
    naive = {**ns, "optimizer": torch.optim.SGD(model.parameters(), lr=0.0)}
    naive["train_loader"], naive["criterion"] = batches[:4], token_mean
    naive_recorder = StepRecorder(naive["optimizer"], model)
    exec_snippet("accumulation", naive)
    assert max_abs_diff(naive_recorder.steps[0], expected[0]) > 1e-3


# --- clipping -----------------------------------------------------------------------------


def fragment_namespace(loss_scale: float) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """Namespace for the snippets that start at ``loss.backward()``, and the raw gradients."""
    ((inputs, targets),) = regression_batches(1, batch_size=8)
    ns = training_namespace([])
    raw = reference_grads(ns["model"], [(inputs, targets)], nn.MSELoss())
    ns["loss"] = nn.MSELoss()(ns["model"](inputs), targets) * loss_scale
    return ns, scaled(raw, loss_scale)


def run_clip_norm() -> None:
    """(b) the norm ends at most max_norm, direction kept; unchanged when already below."""
    ns, raw = fragment_namespace(loss_scale=50.0)
    assert total_norm(raw) > 0.5
    recorder = StepRecorder(ns["optimizer"], ns["model"])
    exec_snippet("clip-norm", ns, {"max_norm": 0.5})
    (applied,) = recorder.steps
    assert total_norm(applied) <= 0.5 + TOLERANCE
    assert max_abs_diff(applied, clipped(raw, 0.5)) <= TOLERANCE
    assert float(ns["grad_norm"]) == pytest.approx(total_norm(raw))

    ns, raw = fragment_namespace(loss_scale=1.0)
    bound = total_norm(raw) * 2
    recorder = StepRecorder(ns["optimizer"], ns["model"])
    exec_snippet("clip-norm", ns, {"max_norm": bound})
    assert max_abs_diff(recorder.steps[0], raw) == 0.0


def run_value_to_norm_clipping() -> None:
    ns, raw = fragment_namespace(loss_scale=50.0)
    recorder = StepRecorder(ns["optimizer"], ns["model"])
    exec_snippet("value-to-norm-clipping", ns, {"max_norm": 0.5})
    (applied,) = recorder.steps
    assert max_abs_diff(applied, clipped(raw, 0.5)) <= TOLERANCE
    # Same direction as the raw gradient; element-wise value clipping would not keep it.
    flat_applied = torch.cat([g.flatten() for g in applied.values()])
    flat_raw = torch.cat([g.flatten() for g in raw.values()])
    assert F.cosine_similarity(flat_applied, flat_raw, dim=0) == pytest.approx(1.0)
    value_clipped = flat_raw.clamp(-0.01, 0.01)
    assert F.cosine_similarity(value_clipped, flat_raw, dim=0) < 0.99


def run_per_layer_clipping() -> None:
    ns, raw = fragment_namespace(loss_scale=5.0)
    recorder = StepRecorder(ns["optimizer"], ns["model"])
    exec_snippet("per-layer-clipping", ns, {"max_norm": 4.0})
    (applied,) = recorder.steps
    layers = sorted({name.rpartition(".")[0] for name in raw})
    for layer in layers:
        before = {k: v for k, v in raw.items() if k.startswith(layer + ".")}
        after = {k: v for k, v in applied.items() if k.startswith(layer + ".")}
        assert ns["layer_norms"][layer] == pytest.approx(total_norm(before))
        assert total_norm(after) <= 4.0 + TOLERANCE
        assert max_abs_diff(after, clipped(before, 4.0)) <= TOLERANCE
    # The case per-layer clipping is for: some layers above the bound, some below.
    assert min(ns["layer_norms"].values()) < 4.0 < max(ns["layer_norms"].values())


def run_training_loop_order() -> None:
    batches = regression_batches(5)
    ns = training_namespace(batches)
    recorder = StepRecorder(ns["optimizer"], ns["model"])
    exec_snippet("training-loop-order", ns, {"max_norm": 0.5})
    expected = [clipped(reference_grads(ns["model"], [b], nn.MSELoss()), 0.5) for b in batches]
    assert_steps_match(recorder.steps, expected)
    assert all(p.grad is None for p in ns["model"].parameters())


def run_max_norm_tuning() -> None:
    batches = regression_batches(9)
    ns = training_namespace(batches)
    norms = [total_norm(reference_grads(ns["model"], [b], nn.MSELoss())) for b in batches]
    chosen = statistics.median(norms)
    recorder = StepRecorder(ns["optimizer"], ns["model"])
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        exec_snippet("max-norm-tuning", ns, {"max_norm": chosen})
    assert ns["measured_norms"] == pytest.approx(norms)
    assert ns["suggested_max_norm"] == pytest.approx(
        statistics.quantiles(norms, n=10, method="inclusive")[-1]
    )
    assert ns["suggested_max_norm"] > statistics.median(norms)
    assert ns["clip_rate"] == pytest.approx(sum(n > chosen for n in norms) / len(norms))
    assert f"clipping active on {ns['clip_rate']:.0%} of steps" in printed.getvalue()
    assert 0 < ns["clip_rate"] < 1
    # Phase 1 measured without clipping; phase 2 clipped with the chosen value.
    raw = [reference_grads(ns["model"], [b], nn.MSELoss()) for b in batches]
    assert_steps_match(recorder.steps[:9], raw)
    assert all(total_norm(g) <= chosen + TOLERANCE for g in recorder.steps[9:])


def run_checkpointing_with_clipping() -> None:
    # First run with no data, only to get the class the snippet defines.
    ns = exec_snippet("checkpointing-with-clipping", training_namespace([]))
    torch.manual_seed(0)
    blocks = [nn.Sequential(nn.Linear(16, 16), nn.Tanh()).double() for _ in range(3)]
    model = nn.Sequential(
        nn.Linear(6, 16).double(), ns["CheckpointedBlocks"](blocks), nn.Linear(16, 3).double()
    )
    forward_calls = []
    # On the block's first layer: the recomputation stops early, before the block's own
    # forward hook would fire.
    blocks[0][0].register_forward_hook(lambda *_: forward_calls.append(1))
    plain = copy.deepcopy(model).eval()  # eval: the same blocks without checkpointing

    batches = regression_batches(8)
    ns = {**training_namespace(batches), "model": model}
    ns["optimizer"] = torch.optim.SGD(model.parameters(), lr=0.0)
    recorder = StepRecorder(ns["optimizer"], model)
    forward_calls.clear()
    exec_snippet("checkpointing-with-clipping", ns, {"max_norm": 0.5})
    # Checkpointing really happened: each micro-batch ran the block twice (recomputation).
    assert len(forward_calls) == 2 * len(batches)
    expected = [clipped(reference_grads(plain, w, nn.MSELoss()), 0.5) for w in windows(batches, 4)]
    assert_steps_match(recorder.steps, expected)


# --- mixed precision ----------------------------------------------------------------------

AMP_NAMES = {"device_type": "cpu", "dtype": "torch.bfloat16"}


def run_amp_clip() -> None:
    batches = regression_batches(4, dtype=torch.float32)
    ns = training_namespace(batches, lr=0.01, dtype=torch.float32)
    recorder = StepRecorder(ns["optimizer"], ns["model"])
    exec_snippet("amp-clip", ns, {**AMP_NAMES, "max_norm": 0.05})
    assert isinstance(ns["scaler"], torch.amp.GradScaler) and ns["scaler"].is_enabled()
    assert len(recorder.steps) == len(batches)
    # Clipped on unscaled gradients: the update's norm is max_norm, not max_norm / scale.
    for grads in recorder.steps:
        assert total_norm(grads) == pytest.approx(0.05, rel=1e-3)


def run_amp_accumulation_clip() -> None:
    """(c) bf16 autocast + GradScaler("cpu") + accumulation + clipping on unscaled grads."""
    batches = regression_batches(8, dtype=torch.float32)
    ns = training_namespace(batches, dtype=torch.float32)
    reference = [reference_grads(ns["model"], w, nn.MSELoss()) for w in windows(batches, 4)]
    recorder = StepRecorder(ns["optimizer"], ns["model"])
    exec_snippet("amp-accumulation-clip", ns, {**AMP_NAMES, "max_norm": 0.05})
    assert ns["scaler"].get_scale() == 65536.0, "no step was skipped"
    assert len(recorder.steps) == 2
    for grads, full in zip(recorder.steps, reference, strict=True):
        assert total_norm(grads) <= 0.05 * (1 + 1e-4)
        assert total_norm(grads) == pytest.approx(0.05, rel=1e-3)
        # bfloat16 forward: close to, not equal to, the float32 big-batch direction.
        assert max_abs_diff(grads, clipped(full, 0.05)) < 2e-3


# --- distributed --------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.contextmanager
def single_process_group() -> Iterator[None]:
    assert not dist.is_initialized()
    dist.init_process_group(
        "gloo", rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{free_port()}"
    )
    try:
        yield
    finally:
        dist.destroy_process_group()


def run_ddp_no_sync_accumulation() -> None:
    """(f) under a one-process gloo group: big-batch gradients, one all-reduce per update."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel

    batches = regression_batches(8)
    with single_process_group():
        inner = mlp()
        model = DistributedDataParallel(inner)
        all_reduces: list[int] = []

        # No annotations: DDP checks them at run time and would not resolve postponed ones.
        def counting_hook(state, bucket):  # type: ignore[no-untyped-def]
            all_reduces.append(bucket.index())
            return default_hooks.allreduce_hook(state, bucket)

        model.register_comm_hook(None, counting_hook)
        ns = {**training_namespace(batches), "model": model}
        ns["optimizer"] = torch.optim.SGD(model.parameters(), lr=0.0)
        recorder = StepRecorder(ns["optimizer"], inner)
        exec_snippet("ddp-no-sync-accumulation", ns, {"max_norm": 1e6})
    expected = [reference_grads(inner, w, nn.MSELoss()) for w in windows(batches, 4)]
    assert_steps_match(recorder.steps, expected)
    assert len(all_reduces) == 2, "one all-reduce per optimizer step, not per micro-batch"


# --- diagnosis ----------------------------------------------------------------------------


def run_grad_norm_monitor() -> None:
    batches = regression_batches(3)
    ns = training_namespace(batches)
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        exec_snippet("grad-norm-monitor", ns, {"max_norm": 1e6})
    first = reference_grads(ns["model"], batches[:1], nn.MSELoss())
    # log_every=100: only step 0 is measured, after backward and before zero_grad.
    assert ns["total_norm"] == pytest.approx(total_norm(first))
    assert ns["layer_norms"] == pytest.approx({k: float(v.norm()) for k, v in first.items()})
    assert printed.getvalue().startswith(f"step 0: grad norm {total_norm(first):.3e}")
    assert ns["gradient_norms"](mlp()) == (0.0, {})


class SqrtOfZero(nn.Module):
    """Identity in the forward pass; NaN in the backward pass (0 * the infinite slope of sqrt)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.sqrt(x * 0)


def run_nan_check_order() -> None:
    batches = regression_batches(6)
    ns = training_namespace(batches)
    recorder = StepRecorder(ns["optimizer"], ns["model"])
    exec_snippet("nan-check-order", ns)
    assert len(recorder.steps) == len(batches), "finite training runs through"

    # A corrupt batch is named before any model code runs on it (nonfinite-inputs).
    poisoned = [*batches]
    poisoned[3] = (poisoned[3][0].clone().fill_(math.nan), poisoned[3][1])
    with pytest.raises(FloatingPointError, match=r"step 3: the batch already holds NaN/Inf"):
        exec_snippet("nan-check-order", training_namespace(poisoned))

    # Finite inputs, non-finite loss (here from the targets): the loss check names it.
    poisoned = [*batches]
    poisoned[3] = (poisoned[3][0], poisoned[3][1].clone().fill_(math.nan))
    with pytest.raises(FloatingPointError, match=r"step 3: loss is nan before backward"):
        exec_snippet("nan-check-order", training_namespace(poisoned))

    # A finite loss whose gradient is not, broken in the middle of the model: layer 0 gets
    # NaN through backward, layer 2 (nearer the output) stays finite.
    ns = training_namespace(batches)
    ns["model"] = nn.Sequential(nn.Linear(6, 16), SqrtOfZero(), nn.Linear(16, 3)).double()
    ns["optimizer"] = torch.optim.SGD(ns["model"].parameters(), lr=0.0)
    with pytest.raises(FloatingPointError, match=r"step 0: 2 non-finite gradients, .* in 0\.bias"):
        exec_snippet("nan-check-order", ns)

    # Finite gradients, broken update.
    ns = training_namespace(batches, lr=math.inf)
    with pytest.raises(FloatingPointError, match=r"step 0: parameters \['0\.weight'.* non-finite"):
        exec_snippet("nan-check-order", ns)


def run_stable_loss_ops() -> None:
    ns = exec_snippet("stable-loss-ops", {})
    x = torch.zeros(3, dtype=torch.float64, requires_grad=True)
    for fn in (ns["safe_log"], ns["safe_sqrt"]):
        value = fn(x).sum()
        (grad,) = torch.autograd.grad(value, x)
        assert torch.isfinite(value) and torch.isfinite(grad).all()
    assert not torch.isfinite(torch.log(torch.zeros(1))).all()  # what the guard prevents

    denominators = torch.tensor([0.0, -1e-12, 2.0], dtype=torch.float64, requires_grad=True)
    quotient = ns["safe_div"](torch.ones(3, dtype=torch.float64), denominators)
    (grad,) = torch.autograd.grad(quotient.sum(), denominators)
    assert torch.isfinite(quotient).all() and torch.isfinite(grad).all()
    assert quotient[1] < 0 and quotient[2] == 0.5, "sign kept, ordinary values untouched"

    big = torch.tensor([1000.0, 1000.0], dtype=torch.float64)
    assert ns["safe_log_sum_exp"](big) == pytest.approx(1000 + math.log(2))
    assert not torch.isfinite(torch.log(torch.exp(big).sum()))


def run_vanishing_fixes() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(64, 64) for _ in range(4)]).double()
    ns = exec_snippet("vanishing-fixes", {"model": model})
    for layer in model:
        assert float(layer.weight.detach().std()) == pytest.approx(math.sqrt(2 / 64), rel=0.1)
        assert float(layer.bias.detach().abs().max()) == 0.0

    def first_layer_grad(layers: list[nn.Module]) -> float:
        net = nn.Sequential(nn.Linear(16, 16), *layers, nn.Linear(16, 1)).double()
        torch.manual_seed(1)
        net(torch.randn(32, 16, dtype=torch.float64)).pow(2).mean().backward()
        return float(net[0].weight.grad.norm())

    torch.manual_seed(0)
    saturating = first_layer_grad([m for _ in range(30) for m in (nn.Linear(16, 16), nn.Sigmoid())])
    torch.manual_seed(0)
    residual = first_layer_grad([ns["ResidualBlock"](16) for _ in range(30)])
    # The fix keeps the first layer learning where a deep sigmoid stack starves it.
    assert saturating < 1e-6 < 1e-2 < residual


def run_dead_relu_fixes() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3)).double()
    with torch.no_grad():
        model[0].bias.fill_(-100.0)  # every unit dead
    inputs = regression_batches(1, batch_size=32)[0][0]

    def first_layer_grad() -> float:
        model.zero_grad()
        model(inputs).pow(2).mean().backward()
        return float(model[0].weight.grad.abs().max())

    assert first_layer_grad() == 0.0
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        ns = exec_snippet("dead-relu-fixes", {"model": model, "inputs": inputs})
    assert ns["dead"] == {"1": 1.0}
    assert "dead ReLU units" in printed.getvalue()
    assert isinstance(model[1], nn.LeakyReLU)
    assert first_layer_grad() > 0.0

    healthy = nn.Sequential(nn.Linear(6, 16), nn.ReLU()).double()
    with torch.no_grad():
        healthy[0].bias.fill_(100.0)
    ns = exec_snippet("dead-relu-fixes", {"model": healthy, "inputs": inputs})
    assert ns["dead"] == {"1": 0.0} and isinstance(healthy[1], nn.ReLU)


RUNNERS: dict[str, Callable[[], None]] = {
    "accumulation": run_accumulation,
    "accumulation-clip": run_accumulation_clip,
    "accumulation-scheduler": run_accumulation_scheduler,
    "accumulation-leftover": run_accumulation_leftover,
    "accumulation-token-mean": run_accumulation_token_mean,
    "clip-norm": run_clip_norm,
    "value-to-norm-clipping": run_value_to_norm_clipping,
    "per-layer-clipping": run_per_layer_clipping,
    "training-loop-order": run_training_loop_order,
    "max-norm-tuning": run_max_norm_tuning,
    "checkpointing-with-clipping": run_checkpointing_with_clipping,
    "amp-clip": run_amp_clip,
    "amp-accumulation-clip": run_amp_accumulation_clip,
    "ddp-no-sync-accumulation": run_ddp_no_sync_accumulation,
    "grad-norm-monitor": run_grad_norm_monitor,
    "nan-check-order": run_nan_check_order,
    "stable-loss-ops": run_stable_loss_ops,
    "vanishing-fixes": run_vanishing_fixes,
    "dead-relu-fixes": run_dead_relu_fixes,
}

RUNNABLE = sorted(spec.id for spec in list_snippets() if spec.runnable)


def test_runnable_flag_matches_the_runners() -> None:
    assert sorted(RUNNERS) == RUNNABLE


@pytest.mark.parametrize("snippet_id", RUNNABLE)
def test_runnable_snippet_runs_and_does_what_it_says(snippet_id: str) -> None:
    EXECUTED.discard(snippet_id)
    RUNNERS[snippet_id]()
    assert snippet_id in EXECUTED, "the runner must execute the rendered snippet itself"
