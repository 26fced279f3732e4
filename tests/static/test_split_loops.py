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
