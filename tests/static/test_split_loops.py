"""Training loops spread over methods, helpers and frameworks (own fixtures, written from the
shapes of real reported bugs: the corpus item each one was learned from is named)."""

from __future__ import annotations

from gradient_doctor.probes.static import lint_source


def _found(source: str, rule_id: str) -> list[tuple[int | None, str]]:
    report = lint_source(source, "train.py")
    assert report.error is None
    return [(f.line, f.severity) for f in report.findings if f.id == rule_id]


ACCELERATE_MINIBATCHES = """
from accelerate import Accelerator

class Trainer:
    def __init__(self, config):
        self.accelerator = Accelerator(log_with=config.tracker)

    def learn(self, batches):
        for minibatches in batches:
            for mb in minibatches:
                loss = self.loss_of(mb)
                loss /= self.num_mb
                self.accelerator.backward(loss)
            self.opt.step()
            self.opt.zero_grad()
"""


def test_accelerate_backward_over_minibatches_without_no_sync_is_reported_as_info() -> None:
    # static6 trlx: the model is prepared in a subclass's file; accelerator.backward implies it.
    assert _found(ACCELERATE_MINIBATCHES, "ddp-accum-without-no-sync") == [(13, "info")]


def test_accelerate_backward_over_minibatches_under_no_sync_is_silent() -> None:
    synced = ACCELERATE_MINIBATCHES.replace(
        "                self.accelerator.backward(loss)",
        "                with self.accelerator.no_sync(self.model):\n"
        "                    self.accelerator.backward(loss)",
    )
    assert _found(synced, "ddp-accum-without-no-sync") == []


def test_a_loop_over_several_losses_without_a_shared_count_is_no_accumulation() -> None:
    # Summing the gradients of several objectives is intended: no count divides them.
    source = """
import torch
model = torch.nn.parallel.DistributedDataParallel(net)
for batch in loader:
    for head in heads:
        head(model(batch)).backward()
    optimizer.step()
    optimizer.zero_grad()
"""
    assert _found(source, "ddp-accum-without-no-sync") == []
    assert _found(source, "accum-unscaled-loss") == []


WINDOW_TWO_CALLS_DOWN = """
import torch

class Runner:
    def _micro(self, batch):
        self.model(batch).loss.backward()

    def _window(self, batches):
        for micro_batch in batches:
            self._micro(micro_batch)

    def _apply(self):
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad()

    def train_step(self, batches):
        self._window(batches)
        self._apply()

    def fit(self, loader):
        for batches in loader:
            self.train_step(batches)
"""


def test_window_two_calls_down_and_update_in_another_helper_is_one_unit() -> None:
    # The shape of static6 minFM, spread further: the window loop one more call down, the
    # update in its own method. One finding, at the backward, from train_step's unit.
    assert _found(WINDOW_TWO_CALLS_DOWN, "accum-unscaled-loss") == [(6, "critical")]
    divided = WINDOW_TWO_CALLS_DOWN.replace(
        "self.model(batch).loss.backward()", "(self.model(batch).loss / self.parts).backward()"
    )
    assert _found(divided, "accum-unscaled-loss") == []


DIFFUSION_STYLE_STEP = """
from torch.nn.parallel import DistributedDataParallel as DDP
from .params import zero_grad

class Loop:
    def __init__(self, net, opt, chunk):
        self.ddp_net = DDP(net)
        self.params = list(net.parameters())
        self.opt = opt
        self.chunk = chunk

    def run_step(self, batch):
        self.forward_backward(batch)
        self.opt.step()

    def forward_backward(self, batch):
        zero_grad(self.params)
        for start in range(0, batch.shape[0], self.chunk):
            part = batch[start : start + self.chunk]
            last = start + self.chunk >= batch.shape[0]
            if last:
                loss = self.ddp_net(part).mean()
            else:
                with self.ddp_net.no_sync():
                    loss = self.ddp_net(part).mean()
            (loss * len(part) / len(batch)).backward()
"""


def test_window_helper_that_zeroes_and_skips_sync_itself_is_silent() -> None:
    # static seen improved-diffusion: the window helper zeroes through the project's own
    # zero_grad(params) (module not read) and runs the forward under no_sync().
    report = lint_source(DIFFUSION_STYLE_STEP, "train.py")
    assert report.error is None
    serious = [(f.id, f.line) for f in report.findings if f.severity in {"warning", "critical"}]
    assert serious == []
    without_zeroing = DIFFUSION_STYLE_STEP.replace("        zero_grad(self.params)\n", "")
    assert _found(without_zeroing, "accum-missing-zero-grad") == [(14, "critical")]


ADVERSARIAL_DIRECTION = """
import torch

def adversarial_direction(model, inputs, rounds, radius):
    direction = torch.randn_like(inputs).requires_grad_()
    for _ in range(rounds):
        model(inputs + radius * direction).sum().backward()
        direction = direction.grad.detach().requires_grad_()
        model.zero_grad()
    return direction.detach()

def train(model, optimizer, loader, rounds, radius):
    for inputs, targets in loader:
        direction = adversarial_direction(model, inputs, rounds, radius)
        loss = torch.nn.functional.cross_entropy(model(inputs + radius * direction), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
"""


def test_a_helper_loop_before_the_callers_own_backward_is_no_accumulation_window() -> None:
    # static2 TorchSSL VAT: the helper backpropagates to find an input direction; the
    # caller's own backward feeds the step.
    report = lint_source(ADVERSARIAL_DIRECTION, "train.py")
    assert report.error is None
    assert [f.id for f in report.findings if f.severity in {"warning", "critical"}] == []
