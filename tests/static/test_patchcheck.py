"""Patches that never break working code: each shape below once got a patch marked safe that
moved a clip out of its guard, covered one branch only, used an unbound name, added a second
``unscale_`` per step or moved one of two optimizers' ``zero_grad``. The checks of
:mod:`probes.static.patchcheck` refuse those, and the engine then offers a correct patch or
none (saying why in the evidence)."""

from __future__ import annotations

import ast

import libcst as cst

from gradient_doctor.probes.static import lint_source
from gradient_doctor.probes.static.model import FileModel
from gradient_doctor.probes.static.patchcheck import amp_hazards, check_patch
from gradient_doctor.probes.static.patches import Patch, apply_unified_diff
from gradient_doctor.probes.static.traverse import walk


def _statement(module: cst.Module, text: str) -> cst.BaseStatement:
    """The one-statement line (or compound statement) whose code starts with ``text``."""
    for node in walk(module):
        if isinstance(node, cst.SimpleStatementLine | cst.BaseCompoundStatement):
            code = module.code_for_node(node).strip()
            if code.startswith(text):
                return node
    raise AssertionError(f"no statement starts with {text!r}")


def _fix(source: str, rule_id: str) -> tuple[str | None, dict[str, object]]:
    report = lint_source(source, "train.py")
    (finding,) = [f for f in report.findings if f.id == rule_id]
    if finding.fix is None:
        return None, finding.evidence
    return apply_unified_diff(source, finding.fix.diff or ""), finding.evidence


GUARDED_CLIP = """\
import torch
def train(model, loader, optimizer, max_grad_norm=None):
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
"""


def test_a_guarded_clip_moves_with_its_guard() -> None:
    patched, _ = _fix(GUARDED_CLIP, "clip-after-step")
    assert patched is not None
    assert "pass" not in patched
    body = patched.splitlines()
    guard = body.index("        if max_grad_norm is not None:")
    assert body[guard + 1].strip().startswith("torch.nn.utils.clip_grad_norm_")
    assert guard < body.index("        optimizer.step()")
    ast.parse(patched)


def test_emptying_a_guard_is_refused() -> None:
    module = cst.parse_module(GUARDED_CLIP)
    model = FileModel(module, "train.py")
    clip = _statement(module, "torch.nn.utils.clip_grad_norm_")
    step = _statement(module, "optimizer.step()")
    reason = check_patch(model, Patch().move_before(clip, step))
    assert reason is not None and "empty" in reason


AMP_BRANCHES = """\
import torch
def train(model, loader, optimizer, scaler, accum):
    for i, (x, y) in enumerate(loader):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y) / accum
        if scaler is not None:
            scaler.scale(loss).backward()
        else:
            loss.backward()
        if (i + 1) % accum == 0:
            if scaler is not None:
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
"""


def test_a_moved_zero_grad_covers_both_branches_of_the_update() -> None:
    patched, _ = _fix(AMP_BRANCHES, "accum-zero-grad-every-microstep")
    assert patched is not None
    tree = ast.parse(patched)
    gate = next(
        n for n in ast.walk(tree) if isinstance(n, ast.If) and "% accum" in ast.unparse(n.test)
    )
    # zero_grad comes after the whole `if scaler ... else ...`, inside the update.
    last = gate.body[-1]
    assert ast.unparse(last) == "optimizer.zero_grad()"
    assert isinstance(gate.body[0], ast.If)


def test_moving_into_one_branch_is_refused() -> None:
    module = cst.parse_module(AMP_BRANCHES)
    model = FileModel(module, "train.py")
    zero = _statement(module, "optimizer.zero_grad()")
    only_scaled = _statement(module, "scaler.update()")
    reason = check_patch(model, Patch().move_after(zero, only_scaled))
    assert reason is not None and "one path only" in reason


def test_an_inserted_name_must_be_bound_where_it_goes() -> None:
    source = """\
import torch
def train(model, loader):
    for x in loader:
        loss = model(x).sum()
        loss.backward()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        optimizer.step()
"""
    module = cst.parse_module(source)
    model = FileModel(module, "train.py")
    backward = _statement(module, "loss.backward()")
    reason = check_patch(model, Patch().insert_before(backward, "optimizer.zero_grad()"))
    assert reason is not None and "`optimizer` is not bound" in reason
    later = _statement(module, "optimizer.step()")
    assert check_patch(model, Patch().insert_after(later, "optimizer.zero_grad()")) is None


def test_a_moved_statement_may_not_jump_over_a_use_of_what_it_binds() -> None:
    source = """\
import torch
def step(model, optimizer, log):
    optimizer.step()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    log(norm)
"""
    module = cst.parse_module(source)
    model = FileModel(module, "train.py")
    clip = _statement(module, "norm =")
    logging = _statement(module, "log(norm)")
    reason = check_patch(model, Patch().move_after(clip, logging))
    assert reason is not None and "`norm`" in reason and "used between" in reason
    reason = check_patch(model, Patch().move_before(logging, clip))
    assert reason is not None and "`norm`" in reason


GAN = """\
import torch
def train(gen, disc, loader, g_opt, d_opt, accum):
    for i, real in enumerate(loader):
        d_opt.zero_grad()
        d_loss = disc(gen(real).detach()).mean() / accum
        d_loss.backward()
        g_opt.zero_grad()
        g_loss = -disc(gen(real)).mean() / accum
        g_loss.backward()
        if (i + 1) % accum == 0:
            d_opt.step()
            g_opt.step()
"""


def test_one_of_two_optimizers_zero_grad_is_never_moved() -> None:
    report = lint_source(GAN, "gan.py")
    zeros = [f for f in report.findings if f.id == "accum-zero-grad-every-microstep"]
    assert len(zeros) == 2
    assert all(f.fix is None for f in zeros)
    module = cst.parse_module(GAN)
    model = FileModel(module, "gan.py")
    zero = _statement(module, "d_opt.zero_grad()")
    step = _statement(module, "g_opt.step()")
    reason = check_patch(model, Patch().move_after(zero, step))
    assert reason is not None and "several optimizers" in reason


MICRO_STEP_CLIP = """\
import torch
scaler = torch.cuda.amp.GradScaler()
for i, (x, y) in enumerate(loader):
    with torch.autocast("cuda"):
        loss = torch.nn.functional.mse_loss(model(x), y) / 4
    scaler.scale(loss).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    if (i + 1) % 4 == 0:
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
"""


def test_no_unscale_is_inserted_before_a_clip_of_every_micro_step() -> None:
    report = lint_source(MICRO_STEP_CLIP, "train.py")
    by_id = {f.id: f for f in report.findings}
    # Inserting `scaler.unscale_(optimizer)` before this clip would call it on every
    # micro-step: the second call raises before update(). Moving clip (and nothing else)
    # into the update is the fix.
    assert by_id["amp-clip-without-unscale"].fix is None
    moved = by_id["accum-clip-every-microstep"].fix
    assert moved is not None
    patched = apply_unified_diff(MICRO_STEP_CLIP, moved.diff or "")
    assert amp_hazards(FileModel(cst.parse_module(patched), "train.py")) == 0


def test_an_unscale_on_every_micro_step_is_a_hazard() -> None:
    bad = MICRO_STEP_CLIP.replace(
        "    torch.nn.utils.clip_grad_norm_",
        "    scaler.unscale_(optimizer)\n    torch.nn.utils.clip_grad_norm_",
    )
    assert amp_hazards(FileModel(cst.parse_module(bad), "train.py")) == 1


def test_two_safe_unscale_patches_are_not_combined_into_a_second_unscale() -> None:
    source = """\
import torch
class Updater:
    def step(self, grad_scaler=None):
        if self.value_clip:
            torch.nn.utils.clip_grad_norm_(self.net.parameters(), self.value_clip)
        if self.norm_clip:
            torch.nn.utils.clip_grad_norm_(self.net.parameters(), self.norm_clip)
        if grad_scaler is not None:
            grad_scaler.step(self.optimizer)
            grad_scaler.update()
        else:
            self.optimizer.step()
"""
    report = lint_source(source, "updater.py")
    fixes = [f for f in report.findings if f.id == "amp-clip-without-unscale" and f.fix]
    assert len(fixes) == 2
    assert report.combined_diff is not None
    combined = apply_unified_diff(source, report.combined_diff)
    assert combined.count("unscale_") == 1
    for finding in fixes:
        patched = apply_unified_diff(source, finding.fix.diff or "")  # type: ignore[union-attr]
        # The unscale is guarded like the scaler's step: the None path still works.
        assert "if grad_scaler is not None:\n                grad_scaler.unscale_" in patched


def test_a_withheld_patch_says_why() -> None:
    source = """\
import torch
def train(model, loader, optimizer, scheduler, use_amp, accum):
    scaler = torch.cuda.amp.GradScaler()
    for i, (x, y) in enumerate(loader):
        if use_amp:
            scaler.scale(model(x).sum() / accum).backward()
            if (i + 1) % accum == 0:
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad()
        else:
            (model(x).sum() / accum).backward()
            if (i + 1) % accum == 0:
                optimizer.step()
                optimizer.zero_grad()
        scheduler.step()
"""
    patched, evidence = _fix(source, "accum-scheduler-per-microbatch")
    assert patched is None
    assert "one path only" in str(evidence["fix_withheld"])
