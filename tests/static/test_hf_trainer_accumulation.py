"""accum-unscaled-loss for a Hugging Face ``Trainer`` subclass whose ``compute_loss`` returns a
micro-batch mean and ignores ``num_items_in_batch`` (transformers 4.46+ then skips its own
division by the accumulation count for models that accept loss kwargs).

The shapes are our own, modelled on a distillation trainer (leads5 distillKitPlus, issue #5).
The findings are warnings (or info), not the rule's critical: whether accumulation is on and
whether the model accepts loss kwargs are decided outside the file.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gradient_doctor.probes.static import lint_paths, lint_source

RULE = "accum-unscaled-loss"

DISTILL = """
import torch.nn.functional as F
from trl import SFTTrainer


class KDTrainer(SFTTrainer):
    def __init__(self, *args, teacher=None, tau=2.0, **kwargs):
        self.teacher = teacher
        self.tau = tau
        super().__init__(*args, **kwargs)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        student = model(**inputs)
        teacher_logits = self.teacher(**inputs).logits.detach()
        kd = self.soft_targets(student.logits, teacher_logits)
        return (kd, student) if return_outputs else kd

    def soft_targets(self, student_logits, teacher_logits):
        log_p = F.log_softmax(student_logits / self.tau, dim=-1)
        q = F.softmax(teacher_logits / self.tau, dim=-1)
        return F.kl_div(log_p, q, reduction="batchmean") * self.tau**2
"""
DISTILL_LINE = 15

PLAIN_CAUSAL = """
from transformers import AutoModelForCausalLM, Trainer


class WeightedTrainer(Trainer):
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        weights = inputs.pop("weights")
        outputs = model(**inputs)
        weighted = outputs.loss * weights.mean()
        return (weighted, outputs) if return_outputs else weighted


model = AutoModelForCausalLM.from_pretrained("some/checkpoint")
"""
PLAIN_CAUSAL_LINE = 9


def _rule_findings(code: str) -> list[tuple[int, str]]:
    report = lint_source(code, "example.py")
    assert report.error is None
    return [(f.line, f.severity) for f in report.findings if f.id == RULE]


def test_sft_subclass_returning_a_mean_is_reported_where_the_loss_is_made() -> None:
    report = lint_source(DISTILL, "example.py")
    found = [f for f in report.findings if f.id == RULE]
    assert [(f.line, f.severity) for f in found] == [(DISTILL_LINE, "warning")]
    message = found[0].message
    assert "num_items_in_batch" in message and "4.46 or later" in message
    # No diff: no one edit is right for every release and model.
    assert found[0].fix is None or found[0].fix.diff is None


def test_plain_trainer_with_a_causal_lm_returning_the_model_loss_is_reported() -> None:
    assert _rule_findings(PLAIN_CAUSAL) == [(PLAIN_CAUSAL_LINE, "warning")]


def test_plain_trainer_with_an_unknown_model_is_only_info() -> None:
    code = PLAIN_CAUSAL.replace("AutoModelForCausalLM", "AutoModel")
    assert _rule_findings(code) == [(PLAIN_CAUSAL_LINE, "info")]


VALID = {
    # The window's token count normalises the summed loss: the Trainer is right not to divide.
    "normalised_by_window_tokens": DISTILL.replace(
        "        kd = self.soft_targets(student.logits, teacher_logits)\n",
        "        kd = self.soft_targets(student.logits, teacher_logits)\n"
        "        if num_items_in_batch is not None:\n"
        "            kd = kd * inputs['attention_mask'].sum() / num_items_in_batch\n",
    ),
    # The model normalises its own loss by the count it is handed.
    "count_passed_to_the_model": """
from transformers import AutoModelForCausalLM, Trainer


class PassThrough(Trainer):
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        outputs = model(**inputs, num_items_in_batch=num_items_in_batch)
        return (outputs.loss, outputs) if return_outputs else outputs.loss
""",
    # The fix of the reported bug: divide while training.
    "divided_by_hand": DISTILL.replace(
        "        return (kd, student) if return_outputs else kd\n",
        "        if model.training:\n"
        "            kd = kd / self.args.gradient_accumulation_steps\n"
        "        return (kd, student) if return_outputs else kd\n",
    ),
    # 4.48+: the Trainer divides when the model is said not to take loss kwargs.
    "kwargs_turned_off": DISTILL.replace(
        "        super().__init__(*args, **kwargs)\n",
        "        super().__init__(*args, **kwargs)\n"
        "        self.model_accepts_loss_kwargs = False\n",
    ),
    # 5.19+: the subclass declares a per-micro-batch mean; the Trainer divides.
    "declared_unscaled": DISTILL.replace(
        "class KDTrainer(SFTTrainer):\n",
        "class KDTrainer(SFTTrainer):\n    loss_is_scaled_for_ga = False\n\n",
    ),
    # TRL's preference trainers turn loss kwargs off themselves.
    "preference_trainer": DISTILL.replace("SFTTrainer", "DPOTrainer"),
    # Written for transformers before 4.46: no count is passed, the Trainer divides.
    "old_signature": DISTILL.replace(", num_items_in_batch=None", ""),
    # The subclass runs the backward itself.
    "own_training_step": DISTILL
    + """
    def training_step(self, model, inputs, num_items_in_batch=None):
        loss = self.compute_loss(model, inputs)
        self.accelerator.backward(loss)
        return loss.detach()
""",
}


@pytest.mark.parametrize("name", sorted(VALID))
def test_valid_twins_are_silent(name: str) -> None:
    assert _rule_findings(VALID[name]) == []


def _project(root: Path, requirement: str | None, code: str = DISTILL) -> Path:
    (root / "pkg").mkdir()
    (root / "pkg" / "trainer.py").write_text(code)
    if requirement is not None:
        (root / "requirements.txt").write_text(f"torch\n{requirement}\naccelerate\n")
    return root


def _project_findings(root: Path) -> list[tuple[int, str, str]]:
    report = lint_paths([root])
    return [
        (f.line, f.severity or "", f.message)
        for file in report.files
        for f in file.findings
        if f.id == RULE
    ]


def test_a_release_that_divides_is_silent(tmp_path: Path) -> None:
    assert _project_findings(_project(tmp_path, "transformers==4.45.2")) == []


def test_an_upper_bound_below_4_46_is_silent(tmp_path: Path) -> None:
    assert _project_findings(_project(tmp_path, "transformers<4.46")) == []


def test_a_pinned_affected_release_is_named(tmp_path: Path) -> None:
    found = _project_findings(_project(tmp_path, "transformers==4.49.0"))
    assert [(line, severity) for line, severity, _ in found] == [(DISTILL_LINE, "warning")]
    assert "transformers 4.49.0" in found[0][2]


def test_the_releases_that_never_divide_say_so(tmp_path: Path) -> None:
    found = _project_findings(_project(tmp_path, "transformers==4.47.1"))
    assert [(line, severity) for line, severity, _ in found] == [(DISTILL_LINE, "warning")]
    assert "for no model at all" in found[0][2]


def test_pyproject_dependency_is_read(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "trainer.py").write_text(DISTILL)
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "kd"\ndependencies = [\n    "transformers>=4.51,<5",\n]\n'
    )
    found = _project_findings(tmp_path)
    assert [(line, severity) for line, severity, _ in found] == [(DISTILL_LINE, "warning")]


def test_a_loss_returned_on_several_paths_is_reported_at_the_def_line() -> None:
    # One line covers every return path (a return far down is easy to miss next to the others).
    code = """
import torch.nn.functional as F
from trl import SFTTrainer


class Fp32Trainer(SFTTrainer):
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        labels = inputs.pop("labels")
        outputs = model(**inputs)
        logits = outputs.logits.float()[:, :-1]
        if logits.numel() == 0:
            loss = logits.sum() * 0.0
            return (loss, outputs) if return_outputs else loss
        loss = F.cross_entropy(logits.flatten(0, 1), labels[:, 1:].flatten(), ignore_index=-100)
        return (loss, outputs) if return_outputs else loss
"""
    assert _rule_findings(code) == [(7, "warning")]


# A trainer class built inside the method that sets up the run, with the imports local to that
# method (our own shape, learned from leads6 Soup #720).
NESTED = """
from pathlib import Path


class KDRun:
    def __init__(self, cfg):
        self.cfg = cfg

    def build(self, train_ds):
        import torch
        from transformers import (
            AutoModelForCausalLM,
            Trainer,
            TrainingArguments,
        )

        student = AutoModelForCausalLM.from_pretrained(self.cfg.student)
        teacher = AutoModelForCausalLM.from_pretrained(self.cfg.teacher).eval()
        plain_ce = self.cfg.mode == "ce"

        class _KDTrainer(Trainer):
            def compute_loss(
                self,
                model,
                inputs,
                return_outputs=False,
                num_items_in_batch=None,
            ):
                out = model(**inputs)
                ce = out.loss
                if plain_ce:
                    return (ce, out) if return_outputs else ce
                with torch.no_grad():
                    t_logits = teacher(**inputs).logits
                kl = torch.nn.functional.kl_div(
                    out.logits.log_softmax(-1),
                    t_logits.log_softmax(-1),
                    log_target=True,
                    reduction="batchmean",
                )
                mixed = 0.5 * ce + 0.5 * kl
                return (mixed, out) if return_outputs else mixed

        args = TrainingArguments(output_dir=str(Path(self.cfg.out)))
        return _KDTrainer(model=student, args=args, train_dataset=train_ds)
"""
NESTED_DEF_LINE = 22

NESTED_ONE_RETURN = NESTED.replace(
    "                if plain_ce:\n"
    "                    return (ce, out) if return_outputs else ce\n",
    "",
)
NESTED_ASSIGN_LINE = 41


def test_a_trainer_built_inside_a_method_with_local_imports_is_reported_at_its_def() -> None:
    report = lint_source(NESTED, "example.py")
    found = [f for f in report.findings if f.id == RULE]
    assert [(f.line, f.severity) for f in found] == [(NESTED_DEF_LINE, "warning")]
    assert "2 return paths" in found[0].message
    assert "`ce`, `mixed`" in found[0].message


def test_a_nested_trainer_with_one_return_points_where_the_loss_is_made() -> None:
    assert _rule_findings(NESTED_ONE_RETURN) == [(NESTED_ASSIGN_LINE - 2, "warning")]


def test_a_class_nested_two_functions_deep_resolves_through_both_scopes() -> None:
    code = """
def make_factory(cfg):
    from trl import SFTTrainer

    def factory(model):
        class Inner(SFTTrainer):
            def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
                out = model(**inputs)
                loss = out.loss * cfg.scale
                return (loss, out) if return_outputs else loss

        return Inner(model=model)

    return factory
"""
    assert _rule_findings(code) == [(9, "warning")]


NESTED_VALID = {
    # The nested trainer normalises by the window's token count.
    "nested_uses_the_count": NESTED.replace(
        "                mixed = 0.5 * ce + 0.5 * kl\n",
        "                mixed = 0.5 * ce + 0.5 * kl\n"
        "                if num_items_in_batch is not None:\n"
        "                    tokens = inputs['labels'].ne(-100).sum()\n"
        "                    mixed = mixed * tokens / num_items_in_batch\n",
    ),
    # The project's own `Trainer`, imported in the enclosing method; transformers' Trainer is
    # imported in another method of the file (and the causal LM is there too).
    "own_trainer_in_the_enclosing_scope": NESTED.replace("            Trainer,\n", "").replace(
        "        import torch\n",
        "        import torch\n        from kdlib.engine import Trainer\n",
    )
    + """
    def baseline(self):
        from transformers import Trainer

        return Trainer
""",
    # Module level: the project's own `Trainer`; a function imports transformers' for itself.
    "module_class_with_a_local_import_elsewhere": """
from kdlib.engine import Trainer
from transformers import AutoModelForCausalLM


class Distiller(Trainer):
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        out = model(**inputs)
        return (out.loss, out) if return_outputs else out.loss


def hf_baseline():
    from transformers import Trainer

    return Trainer
""",
    # The base is whatever the caller hands in: not known here.
    "base_is_a_parameter": """
from transformers import AutoModelForCausalLM, Trainer


def with_kd(Trainer):
    class KD(Trainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            out = model(**inputs)
            return (out.loss, out) if return_outputs else out.loss

    return KD
""",
    # The nested trainer's parent (also nested) runs the backward itself.
    "nested_parent_with_training_step": NESTED.replace(
        "        class _KDTrainer(Trainer):\n",
        "        class _Stepper(Trainer):\n"
        "            def training_step(self, model, inputs, num_items_in_batch=None):\n"
        "                loss = self.compute_loss(model, inputs)\n"
        "                self.accelerator.backward(loss)\n"
        "                return loss.detach()\n\n"
        "        class _KDTrainer(_Stepper):\n",
    ),
}


@pytest.mark.parametrize("name", sorted(NESTED_VALID))
def test_nested_valid_twins_are_silent(name: str) -> None:
    assert _rule_findings(NESTED_VALID[name]) == []
