"""The real-code harness of the static analyser (benchmarks/static_corpus.py).

Its patch checks decide whether an offered fix "breaks" a file, so they are tested here on
small scripts written for these tests: each failure mode the issue lists (a name used before it
is bound, a clip moved out of its guard, a statement moved into one branch of an if/else, a
second unscale_, an unscale_ that runs on micro-steps) and the legitimate changes that must
pass (gating a call under the step condition, moving zero_grad after the step).
"""

from __future__ import annotations

import difflib
import importlib.util
import json
import sys
import textwrap
from pathlib import Path
from types import ModuleType

import libcst as cst
import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "static_corpus", ROOT / "benchmarks" / "static_corpus.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["static_corpus"] = module
    spec.loader.exec_module(module)
    return module


harness = _load()


def _diff(old: str, new: str, name: str = "train.py") -> str:
    return "".join(
        difflib.unified_diff(
            old.splitlines(keepends=True),
            new.splitlines(keepends=True),
            fromfile=f"a/{name}",
            tofile=f"b/{name}",
        )
    )


def _problems(old: str, new: str) -> list[str]:
    old, new = textwrap.dedent(old), textwrap.dedent(new)
    problems, patched = harness.check_patch(old, _diff(old, new), "train.py")
    if not problems:
        assert patched["train.py"] == new
    return problems


LOOP = """\
def train(model, loader, optimizer, scaler, max_norm=None, accum=4):
    for i, batch in enumerate(loader):
        loss = model(batch) / accum
        scaler.scale(loss).backward()
        if (i + 1) % accum == 0:
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
"""


def test_apply_diff_is_strict_about_the_text() -> None:
    new = LOOP.replace("            scaler.step(optimizer)\n", "            pass\n")
    applied = harness.apply_diff(LOOP, _diff(LOOP, new))
    assert applied.text == new
    assert applied.added == {6}
    assert applied.removed == {6}
    with pytest.raises(harness.PatchError, match="differs"):
        harness.apply_diff(LOOP.replace("% accum == 0", "% accum == 1"), _diff(LOOP, new))


def test_apply_diff_keeps_crlf_line_endings() -> None:
    crlf = LOOP.replace("\n", "\r\n")
    new = crlf.replace("optimizer.zero_grad()", "optimizer.zero_grad(set_to_none=True)")
    applied = harness.apply_diff(crlf, _diff(crlf, new))
    assert applied.text == new


def test_gating_a_clip_under_the_step_condition_passes() -> None:
    before = """\
    from torch.nn.utils import clip_grad_norm_ as clip


    def train(model, loader, optimizer, max_norm, accum):
        for i, batch in enumerate(loader):
            (model(batch) / accum).backward()
            clip(model.parameters(), max_norm)
            if (i + 1) % accum == 0:
                optimizer.step()
                optimizer.zero_grad()
    """
    after = """\
    from torch.nn.utils import clip_grad_norm_ as clip


    def train(model, loader, optimizer, max_norm, accum):
        for i, batch in enumerate(loader):
            (model(batch) / accum).backward()
            if (i + 1) % accum == 0:
                clip(model.parameters(), max_norm)
                optimizer.step()
                optimizer.zero_grad()
    """
    assert _problems(before, after) == []


def test_a_clip_moved_out_of_its_guard_is_broken() -> None:
    before = """\
    from torch.nn.utils import clip_grad_norm_ as clip


    def train(model, batch, optimizer, max_norm=None):
        model(batch).backward()
        optimizer.step()
        if max_norm is not None:
            clip(model.parameters(), max_norm)
    """
    after = """\
    from torch.nn.utils import clip_grad_norm_ as clip


    def train(model, batch, optimizer, max_norm=None):
        model(batch).backward()
        clip(model.parameters(), max_norm)
        optimizer.step()
        if max_norm is not None:
            pass
    """
    problems = _problems(before, after)
    assert any("moved out of `if max_norm is not None`" in p for p in problems)


def test_a_clip_taken_out_of_the_micro_batch_loop_is_the_fix() -> None:
    """Leaving the loop that runs the backward changes how often the clip runs, which is what
    the accumulation fix is for; its other guards are kept."""
    before = """\
    from torch.nn.utils import clip_grad_norm_ as clip


    def train(model, loader, optimizer, chunk):
        for batch in loader:
            if batch is not None:
                optimizer.zero_grad()
                for j in range(0, len(batch), chunk):
                    model(batch[j : j + chunk]).backward()
                    clip(model.parameters(), 1.0)
                optimizer.step()
    """
    after = """\
    from torch.nn.utils import clip_grad_norm_ as clip


    def train(model, loader, optimizer, chunk):
        for batch in loader:
            if batch is not None:
                optimizer.zero_grad()
                for j in range(0, len(batch), chunk):
                    model(batch[j : j + chunk]).backward()
                clip(model.parameters(), 1.0)
                optimizer.step()
    """
    assert _problems(before, after) == []


def test_a_clip_taken_out_of_a_loop_without_backward_is_broken() -> None:
    before = """\
    from torch.nn.utils import clip_grad_norm_ as clip


    def train(model, batch, optimizer, groups):
        model(batch).backward()
        for group in groups:
            clip(model.parameters(), 1.0)
        optimizer.step()
    """
    after = """\
    from torch.nn.utils import clip_grad_norm_ as clip


    def train(model, batch, optimizer, groups):
        model(batch).backward()
        for group in groups:
            pass
        clip(model.parameters(), 1.0)
        optimizer.step()
    """
    problems = _problems(before, after)
    assert any("moved out of `for group in groups`" in p for p in problems)


def test_a_removed_guard_is_broken() -> None:
    before = """\
    from torch.nn.utils import clip_grad_norm_ as clip


    def step(model, optimizer, max_norm=None):
        if max_norm is not None:
            clip(model.parameters(), max_norm)
        optimizer.step()
    """
    after = """\
    from torch.nn.utils import clip_grad_norm_ as clip


    def step(model, optimizer, max_norm=None):
        clip(model.parameters(), max_norm)
        optimizer.step()
    """
    assert any("removes `if max_norm is not None`" in p for p in _problems(before, after))


def test_zero_grad_moved_into_one_branch_is_broken() -> None:
    before = """\
    def train(model, loader, optimizer, scaler, accum):
        for i, batch in enumerate(loader):
            optimizer.zero_grad()
            loss = model(batch) / accum
            if scaler is not None:
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
            else:
                loss.backward()
                optimizer.step()
    """
    after = """\
    def train(model, loader, optimizer, scaler, accum):
        for i, batch in enumerate(loader):
            loss = model(batch) / accum
            if scaler is not None:
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
            else:
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
    """
    problems = _problems(before, after)
    assert any("only the else branch of `if scaler is not None`" in p for p in problems)


def test_the_same_clip_moved_before_the_step_in_each_branch_passes() -> None:
    before = """\
    import torch


    def train(model, batches, optimizer, teacher_forcing):
        for batch in batches:
            if teacher_forcing:
                optimizer.zero_grad()
                model(batch, teacher=True).backward()
                optimizer.step()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
            else:
                optimizer.zero_grad()
                model(batch).backward()
                optimizer.step()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
    """
    after = """\
    import torch


    def train(model, batches, optimizer, teacher_forcing):
        for batch in batches:
            if teacher_forcing:
                optimizer.zero_grad()
                model(batch, teacher=True).backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
                optimizer.step()
            else:
                optimizer.zero_grad()
                model(batch).backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
                optimizer.step()
    """
    assert _problems(before, after) == []
    # One copy put where the other branch's copy was, the other dropped: still judged.
    one_branch = """\
    import torch


    def train(model, batches, optimizer, teacher_forcing):
        for batch in batches:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
            if teacher_forcing:
                optimizer.zero_grad()
                model(batch, teacher=True).backward()
                optimizer.step()
            else:
                optimizer.zero_grad()
                model(batch).backward()
                optimizer.step()
    """
    assert any("moved out of `if teacher_forcing`" in p for p in _problems(before, one_branch))


def test_zero_grad_moved_into_every_branch_passes() -> None:
    before = """\
    def train(model, batch, optimizer, scaler):
        optimizer.zero_grad()
        loss = model(batch)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        else:
            loss.backward()
            optimizer.step()
    """
    after = """\
    def train(model, batch, optimizer, scaler):
        loss = model(batch)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
        else:
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    """
    assert _problems(before, after) == []


def test_zero_grad_moved_into_the_update_branch_of_an_accumulation_window_passes() -> None:
    """The else branch is the micro-batches that only backpropagate (a privacy engine's
    ``virtual_step``): zeroing there is the bug, so moving ``zero_grad`` after the real step
    loses no path."""
    before = """\
    def train(model, loader, optimizer, accum):
        for i, batch in enumerate(loader):
            optimizer.zero_grad()
            model(batch).backward()
            if (i + 1) % accum == 0:
                optimizer.step()
            else:
                optimizer.virtual_step()
    """
    after = """\
    def train(model, loader, optimizer, accum):
        for i, batch in enumerate(loader):
            model(batch).backward()
            if (i + 1) % accum == 0:
                optimizer.step()
                optimizer.zero_grad()
            else:
                optimizer.virtual_step()
    """
    assert _problems(before, after) == []


def test_a_name_used_before_it_is_bound_is_broken() -> None:
    before = """\
    from torch.nn.utils import clip_grad_norm_ as clip


    def train(model, batch, params, scaler):
        scaler.scale(model(batch)).backward()
        clip(params, 1.0)
        for optimizer in model.optimizers:
            scaler.step(optimizer)
        scaler.update()
    """
    after = before.replace("        clip(", "        scaler.unscale_(optimizer)\n        clip(")
    problems = _problems(before, after)
    assert any(p.startswith("optimizer (line 6)") for p in problems), problems


def test_a_fragments_free_names_are_its_context_not_a_patch_error() -> None:
    # A loop lifted out of a method reads ``self`` and ``loader`` that the real program binds.
    before = """\
    for batch in loader:
        self.optimizer.zero_grad()
        loss = self.model(batch) / 4
        loss.backward()
        self.optimizer.step()
    """
    after = before.replace(
        "        self.optimizer.step()\n",
        "        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)\n"
        "        self.optimizer.step()\n",
    )
    problems = _problems(before, after)
    # ``torch`` is new: the original never read it, so the patch must import it.
    assert problems == ["torch (line 5) is never bound"], problems


def test_names_bound_earlier_globally_or_as_builtins_pass() -> None:
    before = """\
    import torch

    LIMIT = 1.0

    def train(model, batch, optimizer, scaler):
        scaler.scale(model(batch)).backward()
        scaler.step(optimizer)
        scaler.update()
    """
    after = before.replace(
        "        scaler.step(optimizer)\n",
        "        scaler.unscale_(optimizer)\n"
        "        torch.nn.utils.clip_grad_norm_(list(model.parameters()), LIMIT)\n"
        "        scaler.step(optimizer)\n",
    )
    assert _problems(before, after) == []


def test_comprehension_targets_and_lambda_parameters_reach_their_uses() -> None:
    # The element of a comprehension reads its target left of the `for`, and a one-line
    # lambda reads its parameter on the line that binds it: both are bound there.
    before = """\
    import torch


    def clip(model, limit):
        torch.nn.utils.clip_grad_value_(
            [w for w in model.parameters() if w.grad is not None], limit
        )
    """
    after = before.replace(
        "        torch.nn.utils.clip_grad_value_(\n"
        "            [w for w in model.parameters() if w.grad is not None], limit\n"
        "        )\n",
        "        keep = sorted(model.parameters(), key=lambda w: w.numel())\n"
        "        torch.nn.utils.clip_grad_norm_(\n"
        "            [w for w in keep if w.grad is not None], max_norm=1.0)\n",
    )
    assert _problems(before, after) == []
    # A comprehension does not bind what it only reads.
    wrong = after.replace("[w for w in keep", "[v for w in keep")
    problems = _problems(before, wrong)
    assert problems == ["v (line 7) is never bound"]


def test_unscale_outside_the_step_gate_is_broken() -> None:
    before = LOOP
    after = LOOP.replace(
        "        if (i + 1) % accum == 0:\n",
        "        scaler.unscale_(optimizer)\n        if (i + 1) % accum == 0:\n",
    )
    problems = _problems(before, after)
    assert any("runs where `scaler.step`" in p for p in problems)


def test_a_second_unscale_on_the_same_path_is_broken() -> None:
    before = LOOP.replace(
        "            scaler.step(optimizer)\n",
        "            scaler.unscale_(optimizer)\n            scaler.step(optimizer)\n",
    )
    after = before.replace(
        "            scaler.step(optimizer)\n",
        "            scaler.unscale_(optimizer)\n            scaler.step(optimizer)\n",
    )
    assert any("second `scaler.unscale_`" in p for p in _problems(before, after))


def test_a_patch_that_does_not_parse_is_broken() -> None:
    problems = _problems(LOOP, LOOP.replace("scaler.update()", "scaler.update("))
    assert any(p.startswith("does not parse") for p in problems)


def test_statement_map_records_branches() -> None:
    module = cst.parse_module(textwrap.dedent(LOOP))
    stmts = {s.code: s for s in harness.statement_map(module).statements}
    step = stmts["scaler.step(optimizer)"]
    assert [g.label() for g in step.guards] == [
        "for i, batch in enumerate(loader) [body]",
        "if (i + 1) % accum == 0 [body]",
    ]
    assert step.function == "train"


CORRECT = """\
import torch


def train(model, loader, optimizer):
    for batch in loader:
        optimizer.zero_grad()
        loss = model(batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
"""

BUGGY = """\
import torch


def train(model, loader, optimizer):
    for batch in loader:
        optimizer.zero_grad()
        loss = model(batch)
        loss.backward()
        optimizer.step()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
"""


def _corpus(tmp_path: Path) -> Path:
    (tmp_path / "seen/a/me+good@000/loop").mkdir(parents=True)
    (tmp_path / "seen/a/me+good@000/loop/train.py").write_text(CORRECT)
    (tmp_path / "seen/b/clip-after").mkdir(parents=True)
    (tmp_path / "seen/b/clip-after/train.py").write_text(BUGGY)
    items = [
        {
            "id": "a:me/good:loop/train.py",
            "corpus": "a",
            "split": "seen",
            "repo": "me/good",
            "commit": "0" * 40,
            "paths": ["loop/train.py"],
            "local_root": "seen/a/me+good@000",
            "accepted": [],
        },
        {
            "id": "b:clip-after",
            "corpus": "b",
            "split": "seen",
            "repo": "me/bad",
            "commit": "1" * 40,
            "paths": ["train.py"],
            "local_root": "seen/b/clip-after",
            "expected": [{"id": "clip-after-step", "path": "train.py", "line": 10}],
        },
    ]
    (tmp_path / "manifest.json").write_text(json.dumps({"items": items}))
    return tmp_path


def test_evaluate_scores_both_corpora(tmp_path: Path) -> None:
    results = harness.evaluate(_corpus(tmp_path), "seen", "all", per_file=False, run=False)
    assert results.corpus_a["files"] == 1
    assert results.corpus_a["false_warnings_and_criticals"] == 0
    outcome = results.corpus_b["outcomes"][0]
    assert outcome["status"] == "found"
    assert results.corpus_b["found"] == 1 and results.corpus_b["missed"] == 0
    for verdict in results.patches["verdicts"]:
        assert not verdict["problems"], verdict


def test_cli_writes_json_and_refuses_a_folder_without_manifest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    corpus = _corpus(tmp_path / "corpus")
    out = tmp_path / "out.json"
    assert harness.main([str(corpus), "--split", "seen", "--no-run", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["corpus_b"]["found"] == 1
    assert "corpus (b) real bugs: 1" in capsys.readouterr().out
    assert harness.main([str(tmp_path / "nothing")]) == 2
    assert harness.main([str(corpus), "--split", "unseen", "--compare", str(out)]) == 0
    assert "before" in capsys.readouterr().out
