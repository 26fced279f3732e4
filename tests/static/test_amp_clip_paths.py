"""amp-clip-without-unscale on paths: an ``unscale_`` whose guard the scaled backward's path
does not imply, and torch's own clip after ``accelerator.backward`` (the Accelerator's
precision decides the verdict: fp16 visible, not visible, bf16 visible)."""

from __future__ import annotations

from gradient_doctor.probes.static import lint_source

RULE = "amp-clip-without-unscale"

HELPER = """
import torch


def apply(box, loss):
    box.accelerator.backward(loss)
    torch.nn.utils.clip_grad_norm_(box.model.parameters(), box.max_norm)
    box.optimizer.step()
    box.optimizer.zero_grad()
{extra}
"""


def _ours(code: str) -> list[tuple[int, str]]:
    report = lint_source(code, "example.py")
    assert report.error is None
    return [(f.line, f.severity) for f in report.findings if f.id == RULE]


def test_precision_not_visible_is_info_and_states_the_condition() -> None:
    report = lint_source(HELPER.format(extra=""), "example.py")
    (finding,) = [f for f in report.findings if f.id == RULE]
    assert (finding.line, finding.severity) == (7, "info")
    assert "fp16" in finding.message and "accelerate config" in finding.message
    assert finding.fix is None


def test_fp16_visible_is_the_rules_severity() -> None:
    extra = (
        "\nfrom accelerate import Accelerator\naccelerator = Accelerator(mixed_precision='fp16')\n"
    )
    assert _ours(HELPER.format(extra=extra)) == [(7, "critical")]


def test_legacy_fp16_flag_counts_as_fp16() -> None:
    extra = "\nfrom accelerate import Accelerator\naccelerator = Accelerator(fp16=True)\n"
    assert _ours(HELPER.format(extra=extra)) == [(7, "critical")]


def test_bf16_or_full_precision_is_silent() -> None:
    for precision in ("bf16", "no"):
        extra = (
            "\nfrom accelerate import Accelerator\n"
            f"accelerator = Accelerator(mixed_precision='{precision}')\n"
        )
        assert _ours(HELPER.format(extra=extra)) == []


def test_accelerators_own_clip_or_unscale_is_silent() -> None:
    own = HELPER.replace("torch.nn.utils.clip_grad_norm_(", "box.accelerator.clip_grad_norm_(")
    assert _ours(own.format(extra="")) == []
    unscaled = HELPER.replace(
        "    torch.nn.utils", "    box.accelerator.unscale_gradients()\n    torch.nn.utils"
    )
    assert _ours(unscaled.format(extra="")) == []


GUARDED = """
import torch


def step(self, batch, it):
    loss = self.net(batch)
    if {plain}:
        loss.backward()
    else:
        self.scaler.scale(loss).backward()
    if {unscale}:
        self.scaler.unscale_(self.opt)
    torch.nn.utils.clip_grad_norm_(self.net.parameters(), 1.0)
    self.scaler.step(self.opt)
    self.scaler.update()
"""


def test_unscale_under_an_independent_guard_is_reported_without_patch() -> None:
    code = GUARDED.format(plain="self.flat and it >= self.start", unscale="not self.flat")
    report = lint_source(code, "example.py")
    (finding,) = [f for f in report.findings if f.id == RULE]
    assert finding.line == 13 and finding.fix is None
    assert "not self.flat" in finding.message


def test_unscale_under_the_same_condition_is_silent() -> None:
    for plain, unscale in [
        ("self.flat", "not self.flat"),
        ("self.flat is not None", "self.flat is None"),
        ("self.flat and it >= self.start", "not (self.flat and it >= self.start)"),
        ("self.flat", "self.use_amp"),  # the precision switch turns the scaler on
    ]:
        assert _ours(GUARDED.format(plain=plain, unscale=unscale)) == [], (plain, unscale)


def test_unscale_and_clip_under_two_ifs_of_the_same_test_are_silent() -> None:
    code = """
import torch
scaler = torch.amp.GradScaler("cuda")
for x, y in loader:
    scaler.scale(loss_fn(model(x), y)).backward()
    if max_norm > 0:
        scaler.unscale_(optimizer)
    if max_norm > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad()
"""
    assert _ours(code) == []


def test_guards_on_which_optimizer_exists_or_unrelated_flags_are_silent() -> None:
    code = """
import torch


class Runner:
    def unscale_all(self, scaler):
        if self.opts.dense:
            scaler.unscale_(self.opts.dense)
        if self.opts.sparse:
            scaler.unscale_(self.opts.sparse)

    def step(self, batches, scaler):
        for batch in batches:
            loss = self.net(batch)
            if scaler:
                scaler.scale(loss).backward()
            else:
                loss.backward()
        if scaler:
            self.unscale_all(scaler)
        torch.nn.utils.clip_grad_norm_(self.net.parameters(), 1.0)
        scaler.step(self.opts.dense)
        scaler.update()
"""
    assert _ours(code) == []
    unrelated = GUARDED.format(plain="self.flat", unscale="self.verbose_rank == 0")
    assert _ours(unrelated) == []
