"""Accumulation counts in less common spellings and helpers too deep to follow (own fixtures,
written from the shapes of real bugs; the corpus item each one was learned from is named)."""

from __future__ import annotations

from pathlib import Path

from gradient_doctor.probes.static import lint_paths, lint_source


def _found(source: str, rule_id: str) -> list[tuple[int | None, str]]:
    report = lint_source(source, "train.py")
    assert report.error is None
    return [(f.line, f.severity) for f in report.findings if f.id == rule_id]


# leads7 PyTorch-YOLOv3: the count is an item of a dict kept on the model, and the loss comes
# from a box-geometry helper the provenance cannot follow to its end.
DETECTION = """
import torch

def box_overlap(pred, true):
    px1, px2 = pred[:, 0] - pred[:, 2] / 2, pred[:, 0] + pred[:, 2] / 2
    tx1, tx2 = true[:, 0] - true[:, 2] / 2, true[:, 0] + true[:, 2] / 2
    inter = (torch.min(px2, tx2) - torch.max(px1, tx1)).clamp(0)
    spread = ((px1 + px2 - tx1 - tx2) ** 2) / 4
    return inter / (px2 - px1 + tx2 - tx1 - inter + 1e-9) - spread

def detection_loss(pred, true, net):
    total = torch.zeros(1)
    total += (1.0 - box_overlap(pred, true)).mean()
    total *= 0.05
    return total, total.detach()

def fit(net, loader, opt, epochs):
    for epoch in range(1, epochs + 1):
        for i, (x, y) in enumerate(loader):
            done = len(loader) * epoch + i
            loss, parts = detection_loss(net(x), y, net)
            loss.backward()
            if done % net.settings["pieces"] == 0:
                opt.step()
                opt.zero_grad()
"""


def test_an_undivided_loss_from_a_deep_helper_is_reported() -> None:
    assert _found(DETECTION, "accum-unscaled-loss") == [(22, "critical")]


def test_a_deep_helper_that_names_the_count_keeps_the_rule_silent() -> None:
    # The unfollowed geometry reads the count itself: what it does with it is not known.
    source = (
        DETECTION.replace("def box_overlap(pred, true):", "def box_overlap(pred, true, pieces):")
        .replace(" ** 2) / 4", " ** 2) / 4 / pieces")
        .replace("box_overlap(pred, true)", 'box_overlap(pred, true, net.settings["pieces"])')
    )
    assert _found(source, "accum-unscaled-loss") == []


def test_a_deep_helper_handed_an_accumulation_word_keeps_the_rule_silent() -> None:
    source = DETECTION.replace(
        "def detection_loss(pred, true, net):", "def detection_loss(pred, true, net, accum=1):"
    ).replace("    total *= 0.05\n", "    total *= 0.05\n    total = total / accum ** 1\n")
    assert _found(source, "accum-unscaled-loss") == []


# leads7 unilm (detectron2 trainer): the whole micro-step, forward, backward and the gated
# step, is a method the per-iteration hook calls; no_sync belongs around its backward.
WINDOW_METHOD = """
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

class Runner:
    def __init__(self, net, opt, accum):
        self.model = DDP(net)
        self.opt = opt
        self.accum = accum
        self.iter = 0

    def one_iteration(self, batch):
        if self.accum == 1:
            self.plain_step(batch)
        else:
            self.window_step(batch)

    def window_step(self, batch):
        loss = self.model(batch).mean() / self.accum
        loss.backward()
        if (self.iter + 1) % self.accum == 0:
            self.opt.step()
            self.opt.zero_grad()
"""


def test_no_sync_is_reported_at_the_backward_of_a_method_that_also_steps() -> None:
    assert _found(WINDOW_METHOD, "ddp-accum-without-no-sync") == [(20, "warning")]


def test_no_sync_is_reported_at_the_helper_call_when_only_the_backward_is_inside() -> None:
    # The helper holds the backward only: the call in the stepping function is what no_sync
    # must surround, as before.
    source = (
        WINDOW_METHOD.replace("        loss.backward()\n", "        self.push(loss)\n")
        + "\n    def push(self, loss):\n        loss.backward()\n"
    )
    assert _found(source, "ddp-accum-without-no-sync") == [(20, "warning")]


# leads7 refiners: gradient clipping lives in a callback class whose method the trainer runs
# by name (`getattr(callback, event)(self)`) right after every micro-batch's backward.
CALLBACKS = """
import torch


class ClipHook:
    def __init__(self, limit):
        self.limit = limit

    def after_backward(self, trainer):
        torch.nn.utils.clip_grad_norm_(trainer.params, self.limit)


class Runner:
    def __init__(self, cfg):
        self.hooks = {"clip": ClipHook(cfg.limit)}
        self.params = cfg.params
        self.optimizer = torch.optim.SGD(cfg.params, lr=0.1)
        self.micro_per_step = cfg.micro_per_step
        self.seen = 0

    def fire(self, event):
        for hook in self.hooks.values():
            getattr(hook, event)(self)

    def backward(self, loss):
        (loss / self.micro_per_step).backward()
        self.fire("after_backward")
        self.seen += 1
        if self.seen % self.micro_per_step == 0:
            self.optimizer.step()
            self.optimizer.zero_grad()
"""


def test_a_clip_in_a_callback_dispatched_on_every_micro_batch_is_reported() -> None:
    assert _found(CALLBACKS, "accum-clip-every-microstep") == [(27, "warning")]


def test_a_callback_dispatched_inside_the_update_is_silent() -> None:
    gated = CALLBACKS.replace('        self.fire("after_backward")\n', "").replace(
        "            self.optimizer.step()",
        '            self.fire("after_backward")\n            self.optimizer.step()',
    )
    assert _found(gated, "accum-clip-every-microstep") == []


def test_an_event_name_not_written_out_is_not_followed() -> None:
    dynamic = CALLBACKS.replace('self.fire("after_backward")', "self.fire(self.event_name)")
    assert _found(dynamic, "accum-clip-every-microstep") == []


def test_a_callback_class_the_file_never_builds_is_not_followed() -> None:
    unbuilt = CALLBACKS.replace('{"clip": ClipHook(cfg.limit)}', "dict(cfg.hooks)")
    assert _found(unbuilt, "accum-clip-every-microstep") == []


def test_a_callback_class_from_another_module_is_followed(tmp_path: Path) -> None:
    package = tmp_path / "kit"
    package.mkdir()
    (package / "__init__.py").write_text("")
    hook, runner = CALLBACKS.split("class Runner:")
    (package / "hooks.py").write_text(hook)
    (package / "runner.py").write_text(
        "import torch\nfrom kit.hooks import ClipHook\n\n\nclass Runner:" + runner
    )
    report = lint_paths([tmp_path])
    found = [
        (Path(file.path).name, f.line)
        for file in report.files
        for f in file.findings
        if f.id == "accum-clip-every-microstep"
    ]
    assert found == [("runner.py", 19)]
