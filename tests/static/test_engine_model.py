"""The engine through ``lint_source``: bad input, positions, aliases, frameworks, helpers."""

from __future__ import annotations

import json

import libcst as cst
import pytest

from gradient_doctor.knowledge.findings import severity_at_least
from gradient_doctor.probes.static import lint_source
from gradient_doctor.probes.static.engine import rule_ids
from gradient_doctor.probes.static.model import FileModel


def _serious(source: str) -> list[tuple[str, int | None]]:
    report = lint_source(source, "train.py")
    assert report.error is None
    return [(f.id, f.line) for f in report.findings if severity_at_least(f.severity, "warning")]


def _ids(source: str) -> set[str]:
    return {f.id for f in lint_source(source).findings}


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("def f(:\n    pass\n", "syntax error at line 1:"),
        ("x = (\n", "syntax error at line 1:"),
        ("x = 1\0\n", "syntax error at line 1:1:"),
        ("x = " + "(" * 5000 + "1" + ")" * 5000 + "\n", "syntax error at line 1:"),
        ("print 'python 2'\n", "syntax error at line 1:"),
    ],
)
def test_unparsable_source_gives_one_line_error(source: str, expected: str) -> None:
    report = lint_source(source, "bad.py")
    assert report.error is not None and report.error.startswith(expected)
    assert "\n" not in report.error
    assert report.findings == []


@pytest.mark.parametrize(
    "source",
    ["", "\n\n", "# only a comment", "x = [[[[1]]]]\n" * 3, "\ufeffimport torch\n", "if x:\n  y"],
)
def test_odd_but_valid_source_never_raises(source: str) -> None:
    report = lint_source(source)
    assert report.error is None


def test_unknown_rule_id_is_a_value_error_naming_it() -> None:
    with pytest.raises(ValueError, match="no-such-rule"):
        lint_source("x = 1\n", select=["no-such-rule"])
    assert len(rule_ids()) == 23


TWO_BUGS = """\
import torch
for x, y in loader:
    loss = criterion(model(x), y)
    loss.backward()
    optimizer.step()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.01)
    optimizer.zero_grad()
"""


def test_findings_point_at_the_call_and_are_sorted() -> None:
    report = lint_source(TWO_BUGS, "train.py")
    keys = [(f.line, f.col, f.id) for f in report.findings]
    assert keys == sorted(keys)
    by_id = {f.id: f for f in report.findings}
    clip = by_id["clip-after-step"]
    assert (clip.line, clip.col, clip.end_line) == (6, 5, 6)
    assert (
        clip.end_col
        == len("    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.01)") + 1
    )
    assert "line 5" in clip.message and "line 6" in clip.message
    assert clip.evidence["step_line"] == 5 and clip.evidence["clip_line"] == 6
    assert by_id["clip-too-aggressive"].evidence["limit"] == 0.01
    json.dumps([f.model_dump() for f in report.findings])


PARAMS = "model.parameters()"


@pytest.mark.parametrize(
    ("setup", "clip"),
    [
        ("scaler = torch.amp.GradScaler('cuda')", f"torch.nn.utils.clip_grad_norm_({PARAMS}, 1.0)"),
        ("scaler = torch.cuda.amp.GradScaler()", f"nn.utils.clip_grad_norm_({PARAMS}, 1.0)"),
        ("scaler = GradScaler(enabled=use_amp)", f"clip({PARAMS}, max_norm=1.0)"),
        ("scaler = ShardedGradScaler()", "model.clip_grad_norm_(1.0)"),
    ],
)
def test_alias_and_api_spellings_are_understood(setup: str, clip: str) -> None:
    source = f"""\
import torch
import torch.nn as nn
from torch.amp import GradScaler
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler
from torch.nn.utils import clip_grad_norm_ as clip
{setup}
for x, y in loader:
    scaler.scale(loss_fn(model(x), y)).backward()
    {clip}
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad()
"""
    assert ("amp-clip-without-unscale", 9) in _serious(source)
    fixed = source.replace(f"    {clip}", f"    scaler.unscale_(optimizer)\n    {clip}")
    assert _serious(fixed) == []


def test_disabled_scaler_literal_is_not_amp() -> None:
    source = """\
import torch
scaler = torch.amp.GradScaler("cuda", enabled=False)
for x, y in loader:
    scaler.scale(loss_fn(model(x), y)).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad()
"""
    assert _serious(source) == []


NANOGPT_SHAPE = """\
import torch
from contextlib import nullcontext
from torch.nn.parallel import DistributedDataParallel as DDP

scaler = torch.cuda.amp.GradScaler(enabled=(dtype == "float16"))
if ddp:
    model = DDP(model, device_ids=[local_rank])
X, Y = get_batch("train")
while True:
    lr = get_lr(iter_num) if decay_lr else learning_rate
    for param_group in optimizer.param_groups:
        param_group["lr"] = lr
    if iter_num % eval_interval == 0:
        losses = estimate_loss()
    for micro_step in range(gradient_accumulation_steps):
        if ddp:
            model.require_backward_grad_sync = micro_step == gradient_accumulation_steps - 1
        with ctx:
            logits, loss = model(X, Y)
            loss = loss / gradient_accumulation_steps
        X, Y = get_batch("train")
        scaler.scale(loss).backward()
    if grad_clip != 0.0:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    iter_num += 1
    if iter_num > max_iters:
        break


@torch.no_grad()
def estimate_loss():
    out = {}
    model.eval()
    for split in ["train", "val"]:
        losses = torch.zeros(eval_iters)
        for k in range(eval_iters):
            X, Y = get_batch(split)
            with ctx:
                logits, loss = model(X, Y)
            losses[k] = loss.item()
        out[split] = losses.mean()
    model.train()
    return out
"""


def test_nanogpt_shaped_loop_gets_no_warning() -> None:
    assert _serious(NANOGPT_SHAPE) == []


def test_nanogpt_shape_without_the_division_is_reported_at_backward() -> None:
    broken = NANOGPT_SHAPE.replace("            loss = loss / gradient_accumulation_steps\n", "")
    assert _serious(broken) == [("accum-unscaled-loss", 21)]


FRAMEWORKS = {
    "accelerate": """\
from accelerate import Accelerator
accelerator = Accelerator(gradient_accumulation_steps=4, mixed_precision="fp16")
model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
for batch in loader:
    with accelerator.accumulate(model):
        loss = model(**batch).loss
        accelerator.backward(loss)
        if accelerator.sync_gradients:
            accelerator.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
""",
    "lightning": """\
import lightning as L
import torch
from torch import nn

class LitModel(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(32, 64)

    def training_step(self, batch, batch_idx):
        return self.loss(batch)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters())

trainer = L.Trainer(gradient_clip_val=1.0, accumulate_grad_batches=4)
trainer.fit(LitModel())
""",
    "lightning-manual": """\
import lightning as L

class Manual(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        loss = self.compute_loss(batch) / 2
        self.manual_backward(loss)
        if (batch_idx + 1) % 2 == 0:
            self.clip_gradients(opt, gradient_clip_val=0.5, gradient_clip_algorithm="norm")
            opt.step()
            opt.zero_grad()
""",
    "deepspeed": """\
import deepspeed
model_engine, optimizer, _, _ = deepspeed.initialize(model=model, config=ds_config)
for step, batch in enumerate(loader):
    loss = model_engine(batch)
    model_engine.backward(loss)
    model_engine.step()
""",
}


@pytest.mark.parametrize("name", sorted(FRAMEWORKS))
def test_frameworks_that_do_the_work_are_not_flagged(name: str) -> None:
    assert _serious(FRAMEWORKS[name]) == []


def test_clipping_in_a_helper_between_backward_and_step_is_correct() -> None:
    source = """\
import torch

class Trainer:
    def _clip(self):
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)

    def _update(self):
        self._clip()
        self.optimizer.step()
        self.optimizer.zero_grad()

    def train_step(self, batch):
        loss = self.model(batch).loss
        loss.backward()
        return loss

    def fit(self, loader):
        for batch in loader:
            self.train_step(batch)
            self._update()
"""
    assert _serious(source) == []
    broken = source.replace(
        "        self._clip()\n        self.optimizer.step()\n",
        "        self.optimizer.step()\n        self._clip()\n",
    )
    # The loop is split across methods; the finding points at the moved call, in `_update`.
    assert _serious(broken) == [("clip-after-step", 9)]


def test_unrecognised_update_condition_stays_silent() -> None:
    source = """\
for i, batch in enumerate(loader):
    loss = model(batch)
    loss.backward()
    if should_step(i):
        optimizer.step()
"""
    assert _serious(source) == []


def test_evaluation_loops_are_ignored() -> None:
    source = """\
import torch
model.eval()
with torch.no_grad():
    for x, y in val_loader:
        loss = torch.log(model(x)).mean()
        total += loss.item()
"""
    assert "no-grad-monitoring" not in _ids(source)
    assert {i for i in _ids(source) if i.startswith(("accum", "clip", "amp"))} == set()


def test_continue_guard_is_an_accumulation_gate() -> None:
    source = """\
for i, batch in enumerate(loader):
    optimizer.zero_grad()
    (model(batch) / accum).backward()
    if (i + 1) % accum != 0:
        continue
    optimizer.step()
"""
    assert _serious(source) == [("accum-zero-grad-every-microstep", 2)]


@pytest.mark.parametrize(
    "division",
    [
        "loss = loss / accum_steps",
        "loss /= accum_steps",
        "loss = loss * (1 / accum_steps)",
        "loss = loss * loss_scale",
        "loss = loss.div(accum_steps)",
    ],
)
def test_every_spelling_of_the_loss_division_is_recognised(division: str) -> None:
    source = f"""\
loss_scale = 1.0 / accum_steps
for step, batch in enumerate(loader):
    loss = model(batch).loss
    {division}
    loss.backward()
    if step % accum_steps == accum_steps - 1 or step == last_step:
        optimizer.step()
        optimizer.zero_grad()
"""
    assert _serious(source) == []
    undivided = source.replace(f"    {division}\n", "")
    assert _serious(undivided) == [("accum-unscaled-loss", 4)]


def test_division_inside_scaler_scale_is_recognised() -> None:
    source = """\
import torch
scaler = torch.amp.GradScaler("cuda")
for it in range(iters):
    for micro_step in range(accum):
        scaler.scale(model(next(batches)) / accum).backward()
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad()
"""
    assert _serious(source) == []


def test_update_flag_computed_earlier_is_an_accumulation_gate() -> None:
    source = """\
for i, batch in enumerate(loader):
    accumulating = (i + 1) % accum != 0 and i + 1 != len(loader)
    optimizer.zero_grad()
    (model(batch) / accum).backward()
    if not accumulating:
        optimizer.step()
"""
    assert _serious(source) == [("accum-zero-grad-every-microstep", 3)]


@pytest.mark.parametrize(
    "source",
    [
        # LBFGS: backward inside the closure the optimizer calls.
        """\
import torch
optimizer = torch.optim.LBFGS(model.parameters())
for x, y in loader:
    def closure():
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        return loss
    optimizer.step(closure)
""",
        # Two optimizers, each with its own backward and step.
        """\
import torch
for x in loader:
    opt_d.zero_grad()
    d_loss(x).backward()
    torch.nn.utils.clip_grad_norm_(disc.parameters(), 1.0)
    opt_d.step()
    opt_g.zero_grad()
    g_loss(x).backward()
    torch.nn.utils.clip_grad_norm_(gen.parameters(), 1.0)
    opt_g.step()
""",
        # Clipping measured with an infinite max_norm after the step is only a measurement.
        """\
import torch
for x, y in loader:
    loss_fn(model(x), y).backward()
    optimizer.step()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf"))
    optimizer.zero_grad()
""",
    ],
)
def test_other_correct_shapes_get_no_warning(source: str) -> None:
    assert _serious(source) == []


class _CrashingRule:
    """A rule with a bug: it raises on every file."""

    id = "crashing-rule"

    def check(self, model: object) -> list[object]:
        raise ValueError("rule bug")


def test_a_crashing_rule_propagates_under_the_switch_and_is_dropped_without(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import libcst as cst

    from gradient_doctor.probes.static import engine
    from gradient_doctor.probes.static.model import FileModel

    model = FileModel(cst.parse_module("x = 1\n"), "train.py")
    monkeypatch.setenv(engine.RAISE_RULE_ERRORS_ENV, "1")
    with pytest.raises(ValueError, match="rule bug"):
        engine._run_rules(model, [_CrashingRule()])  # type: ignore[list-item]
    monkeypatch.setenv(engine.RAISE_RULE_ERRORS_ENV, "0")
    with caplog.at_level("DEBUG", logger="gradient_doctor.static"):
        assert engine._run_rules(model, [_CrashingRule()]) == []  # type: ignore[list-item]
    assert "crashing-rule" in caplog.text


def test_the_test_suite_runs_with_rule_errors_raised() -> None:
    from gradient_doctor.probes.static import engine

    assert engine.raise_rule_errors()


def _windows(source: str) -> list[tuple[str, str]]:
    """(style, N) of every accumulation the loop model recognises in ``source``."""
    model = FileModel(cst.parse_module(source))
    found: list[tuple[str, str]] = []
    for whole in model.units:
        for unit in [whole, *whole.variants]:
            if unit.accumulation is not None:
                found.append((unit.accumulation.style, unit.accumulation.divisor_text))
    return found


def test_a_delayed_update_of_another_optimizer_is_no_window() -> None:
    # One GradScaler steps the critic on every batch and the actor every `delay` batches
    # under its own zero_grad and backward: no optimizer accumulates.
    source = (
        "import torch\n"
        "scaler = torch.amp.GradScaler('cuda')\n"
        "critic_opt = torch.optim.Adam(critic.parameters())\n"
        "actor_opt = torch.optim.Adam(actor.parameters())\n"
        "for i, batch in enumerate(loader):\n"
        "    critic_opt.zero_grad()\n"
        "    scaler.scale(critic(batch).mean()).backward()\n"
        "    scaler.step(critic_opt)\n"
        "    if i % delay == 0:\n"
        "        actor_opt.zero_grad()\n"
        "        scaler.scale(-critic(actor(batch)).mean()).backward()\n"
        "        scaler.step(actor_opt)\n"
        "    scaler.update()\n"
    )
    assert _windows(source) == []
    assert _serious(source) == []


@pytest.mark.parametrize(
    ("source", "window"),
    [
        # Slices of one sequence inside, the step under `% N` outside: N sequences.
        (
            "for step, seq in enumerate(loader):\n"
            "    for piece in seq.split(64, dim=1):\n"
            "        (model(piece).mean() / accum).backward()\n"
            "    if (step + 1) % accum == 0:\n"
            "        opt.step()\n"
            "        opt.zero_grad()\n",
            ("conditional", "accum"),
        ),
        # The last pass of the micro-step loop steps.
        (
            "for step in range(steps):\n"
            "    for k in range(n_micro):\n"
            "        (model(next(data)).mean() / n_micro).backward()\n"
            "        if k + 1 == n_micro:\n"
            "            opt.step()\n"
            "            opt.zero_grad()\n",
            ("conditional", "n_micro"),
        ),
        # A flag the caller computes with `% N`, tested in the helper.
        (
            "def micro(batch, sync):\n"
            "    (model(batch).mean() / accum).backward()\n"
            "    if sync:\n"
            "        opt.step()\n"
            "        opt.zero_grad()\n"
            "for i, batch in enumerate(loader):\n"
            "    micro(batch, (i + 1) % accum == 0)\n",
            ("conditional", "accum"),
        ),
    ],
)
def test_hand_written_windows_are_recognised(source: str, window: tuple[str, str]) -> None:
    assert window in _windows(source)
    assert _serious(source) == []


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ('state["scheduler"]', "scheduler"),
        ('optimizer_state["scheduler"]', "scheduler"),
        ('optimizer_state["optimizer"]', "optimizer"),
        ('bundle["grad_scaler"]', "scaler"),
        ('optimizers["disc"]', "optimizer"),
        ("self.optimizers[i]", "optimizer"),
        ('config["model"]', None),
    ],
)
def test_a_string_key_that_names_a_role_decides_the_item_kind(text: str, kind: str | None) -> None:
    model = FileModel(cst.parse_module("x = 1\n"))
    assert model.kind_of(text) == kind


@pytest.mark.parametrize(
    ("name", "clips"),
    [
        ("clip_grad", True),
        ("gradient_clipper", True),
        ("adaptive_clip_grad", True),
        ("adaptive_gradient_clipping_", True),
        ("_dispatch_clip_grad", True),
        ("get_grad_clip_value", False),
        ("configure_gradient_clipping", False),
        ("should_clip_gradients", False),
        ("clip_boxes", False),
        ("gradient_clipping_enabled", False),
        ("grad_clip_threshold", False),
        ("grad_norm", False),
    ],
)
def test_names_of_gradient_clippers(name: str, clips: bool) -> None:
    from gradient_doctor.probes.static.model import _injected_clipper

    assert _injected_clipper(name) is clips


@pytest.mark.parametrize(
    ("assignment", "zeroes"),
    [
        ("p.grad = torch.zeros_like(p)", True),
        ("p.grad = Variable(g.new().resize_as_(g).zero_())", True),
        ("p.grad = p.new_zeros(p.shape).to(device)", True),
        ("p.grad = torch.empty_like(p).fill_(0)", True),
        ("p.grad = p.grad + torch.zeros_like(p)", False),
        ("p.grad = shared[name]", False),
    ],
)
def test_assigning_a_zero_tensor_to_grad_is_a_reset(assignment: str, zeroes: bool) -> None:
    source = (
        "import torch\n"
        "for x in loader:\n"
        "    model(x).sum().backward()\n"
        "    opt.step()\n"
        "    for p in model.parameters():\n"
        f"        {assignment}\n"
    )
    unit = FileModel(cst.parse_module(source)).units[0]
    assert bool(unit.of_kind("zero_grad")) is zeroes


_TYPED_HOOK = """
import torch

class Task(torch.nn.Module):
    def before_update(self):
        torch.nn.utils.clip_grad_norm_(self.parameters(), 1.0)

class Runner:
{members}
    def train(self, batch, opt, scaler):
        task = {task}
        scaler.scale(task(batch)).backward()
        task.before_update()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
"""


def _hook_line(source: str) -> int:
    return source.splitlines().index("        task.before_update()") + 1


@pytest.mark.parametrize(
    ("members", "task"),
    [
        # A helper that declares the class it returns.
        ("    def current(self) -> Task:\n        return self.inner\n", "self.current()"),
        ("    def current(self) -> 'Task':\n        return self.inner\n", "self.current()"),
        # A helper returning a name declared with the class.
        (
            "    def current(self):\n        found: Task = self.inner\n        return found\n",
            "self.current()",
        ),
        # An attribute declared in `__init__`, or in the class body.
        ("    def __init__(self, t):\n        self.held: Task = t\n", "self.held"),
        ("    held: Task\n", "self.held"),
    ],
)
def test_a_declared_class_leads_to_its_methods(members: str, task: str) -> None:
    source = _TYPED_HOOK.format(members=members, task=task)
    assert ("amp-clip-without-unscale", _hook_line(source)) in _serious(source)


def test_a_declared_parameter_leads_to_its_methods() -> None:
    source = _TYPED_HOOK.format(members="    pass\n", task="t").replace(
        "def train(self, batch, opt, scaler):", "def train(self, batch, opt, scaler, t: Task):"
    )
    assert ("amp-clip-without-unscale", _hook_line(source)) in _serious(source)


def test_an_undeclared_or_self_referring_receiver_is_not_followed() -> None:
    # `Optional[Task]` is no class name: the hook is not followed, nothing is claimed.
    members = "    def current(self) -> Optional[Task]:\n        return self.inner\n"
    source = _TYPED_HOOK.format(members=members, task="self.current()")
    assert "amp-clip-without-unscale" not in {i for i, _ in _serious(source)}
    # `task = task.cuda()` refers to itself: the lookup ends instead of looping.
    looping = _TYPED_HOOK.format(members="    pass\n", task="self.current()").replace(
        "        task.before_update()", "        task = task.cuda()\n        task.before_update()"
    )
    assert lint_source(looping, "train.py").error is None
