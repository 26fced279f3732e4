"""What the training frameworks do for the user, as the rules need it.

Each fact below was read in the framework's source; the versions are pinned here and in the
rules' docs.

* Accelerate 1.15.0 (``accelerate/accelerator.py``): ``backward`` divides the loss by
  ``gradient_accumulation_steps`` unless DeepSpeed runs it (lines 2849-2851); that count is the
  constructor's ``gradient_accumulation_steps`` (default 1, or the environment variable
  ``ACCELERATE_GRADIENT_ACCUMULATION_STEPS``, lines 541-549). ``accumulate(model)`` sets
  ``sync_gradients`` on every N-th call (``_do_sync``, 1230-1237) and enters ``no_sync`` on the
  others (1285-1297). A prepared optimizer's ``step`` and ``zero_grad`` do nothing unless
  ``sync_gradients`` (``optimizer.py`` 112-113, 169); a prepared scheduler skips too
  (``scheduler.py`` 61). ``clip_grad_norm_`` unscales and clips on every call, sync or not
  (``accelerator.py`` 2989-3047). ``prepare`` wraps the model in DDP on several processes
  (1898, 2060).
* Lightning 2.6.6 (``lightning/pytorch``): automatic optimisation divides the loss returned by
  ``training_step`` by ``accumulate_grad_batches`` (``loops/optimization/automatic.py`` 81-83);
  the closure runs ``training_step``, then ``zero_grad`` (on the first batch of a window),
  then backward (130-140, 210-225); ``on_before_optimizer_step`` and
  ``configure_gradient_clipping`` run after the closure, after AMP unscaling
  (``plugins/precision/precision.py`` 84-95, ``amp.py`` 84-90). Manual optimisation
  (``self.automatic_optimization = False``) does none of this.
* DeepSpeed 0.19.8 (``deepspeed/runtime/engine.py``): ``engine.backward(loss)`` divides the
  loss by ``gradient_accumulation_steps()`` unless ``scale_wrt_gas=False`` (3382-3413);
  ``engine.step()`` updates only at the accumulation boundary, clips by the config's
  ``gradient_clipping`` and zeroes the gradients itself (3504-3535, 3567ff).
* transformers 5.23.0 (``transformers/trainer.py``): the Trainer builds its Accelerator with
  ``num_steps=1`` ("The Trainer handles GAS itself", 824-825) and its ``training_step`` divides
  the loss by the accumulation count unless the loss was already normalised by
  ``num_items_in_batch`` (the model accepts loss kwargs) or a ``compute_loss_func`` is set
  (2102-2111).
"""

from __future__ import annotations

from collections.abc import Iterator

import libcst as cst

from gradient_doctor.probes.static.model import Event, FileModel, FuncInfo
from gradient_doctor.probes.static.names import call_arg, code_of, dotted_name, number_value
from gradient_doctor.probes.static.traverse import walk

LIGHTNING_BASES = frozenset({"LightningModule"})


def _bases(model: FileModel, class_name: str, depth: int = 0) -> set[str]:
    """The qualified names of every base of ``class_name`` (through local classes)."""
    out: set[str] = set()
    if depth > 8:
        return out
    for base in model.class_bases.get(class_name, []):
        out.add(model.qualify_text(base))
        if base in model.class_nodes:
            out |= _bases(model, base, depth + 1)
    return out


def is_lightning_module(model: FileModel, class_name: str) -> bool:
    return any(b.rsplit(".", 1)[-1] in LIGHTNING_BASES for b in _bases(model, class_name))


def is_hf_trainer(model: FileModel, class_name: str) -> bool:
    """A subclass of Hugging Face's ``Trainer`` (or TRL's trainers)."""
    for base in _bases(model, class_name):
        head = base.split(".", 1)[0]
        if head in {"transformers", "trl"} and base.endswith("Trainer"):
            return True
    return False


def lightning_modules(model: FileModel) -> Iterator[str]:
    for name in model.class_nodes:
        if is_lightning_module(model, name):
            yield name


def hf_trainers(model: FileModel) -> Iterator[str]:
    for name in model.class_nodes:
        if is_hf_trainer(model, name):
            yield name


def automatic_optimization(model: FileModel, class_name: str) -> bool:
    """False when the LightningModule turns automatic optimisation off."""
    node = model.class_nodes.get(class_name)
    if node is None:
        return True
    for inner in walk(node):
        if isinstance(inner, cst.Assign):
            for target in inner.targets:
                text = dotted_name(target.target) or ""
                if text.endswith("automatic_optimization"):
                    value = inner.value
                    if isinstance(value, cst.Name) and value.value == "False":
                        return False
        if isinstance(inner, cst.FunctionDef) and inner.name.value == "automatic_optimization":
            return False
    return True


def method(model: FileModel, class_name: str, name: str) -> FuncInfo | None:
    return model.method_of(class_name, name)


def accelerator_divides(model: FileModel, backward: Event | None = None) -> bool | None:
    """True when the ``Accelerator`` behind ``backward`` is built with an accumulation count
    (its ``backward`` then divides the loss), False when it is built without one, None when
    no constructor is visible.

    The constructor bound to the backward's receiver in the backward's own function wins (a
    file may build one Accelerator with ``gradient_accumulation_steps`` for pre-training and
    another without it for fine-tuning, under the same name; learned from leads1
    chatlm-mini-chinese); otherwise any constructor of the file that divides counts."""
    calls = model.accelerator_calls
    if not calls:
        return None
    call = backward.call if backward is not None else None
    if backward is not None and isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute):
        receiver = code_of(call.func.value)
        own = [c for func, name, c in calls if func is backward.func and name == receiver]
        if own:
            return _any_divides([_accelerator_call_divides(call) for call in own])
    return _any_divides([_accelerator_call_divides(call) for _, _, call in calls])


def _any_divides(verdicts: list[bool | None]) -> bool | None:
    if any(v is True for v in verdicts):
        return True
    return None if any(v is None for v in verdicts) else False


def _accelerator_call_divides(call: cst.Call) -> bool | None:
    """None when the count may come in ``**kwargs`` (learned from static7
    rectified-flow: ``Accelerator(**accelerate_kwargs)``)."""
    if call_arg(call, None, "gradient_accumulation_plugin") is not None:
        return True
    steps = call_arg(call, None, "gradient_accumulation_steps")
    if steps is None:
        return None if any(a.star for a in call.args) else False
    value = number_value(steps)
    return value is None or value != 1


def deepspeed_accumulation(model: FileModel) -> list[str]:
    """The ``gradient_accumulation_steps`` values written in DeepSpeed config dicts."""
    values: list[str] = []
    for node in model.config_dicts:
        for element in node.elements:
            if (
                isinstance(element, cst.DictElement)
                and isinstance(element.key, cst.SimpleString)
                and element.key.evaluated_value == "gradient_accumulation_steps"
            ):
                values.append(code_of(element.value))
    return values


def lightning_accumulation(model: FileModel) -> str | None:
    """``accumulate_grad_batches`` of a Lightning ``Trainer(...)`` in this file."""
    for call in model.trainer_configs:
        value = call_arg(call, None, "accumulate_grad_batches")
        if value is not None:
            return code_of(value)
    return None


def lightning_clips(model: FileModel, class_name: str) -> bool:
    """Clipping configured for a LightningModule: ``gradient_clip_val`` on the Trainer, or
    clipping in ``configure_gradient_clipping`` / ``on_before_optimizer_step``."""
    if model.lightning_clipping:
        return True
    for hook in ("configure_gradient_clipping", "on_before_optimizer_step"):
        func = model.method_of(class_name, hook)
        if func is not None and any(
            e.kind == "clip" and not e.measures_only for e in model.expanded(func)
        ):
            return True
    return False


# Lightning 2.6.6 `precision=` values that train with a GradScaler (fp16 mixed precision;
# the legacy `16` / `"16"` map to "16-mixed" in `trainer/connectors/accelerator_connector.py`).
FP16_MIXED = frozenset({"16-mixed", "16"})


def lightning_fp16_mixed(model: FileModel) -> bool:
    """A Lightning ``Trainer(precision=...)`` of this file trains with fp16 mixed precision."""
    for call in model.trainer_configs:
        value = call_arg(call, None, "precision")
        if isinstance(value, cst.SimpleString) and value.evaluated_value in FP16_MIXED:
            return True
        if isinstance(value, cst.Integer) and value.value == "16":
            return True
    return False


def after_backward_clips(model: FileModel) -> Iterator[tuple[str, Event]]:
    """(class, clip event) for the clipping in ``on_after_backward`` of the file's
    LightningModules with automatic optimisation: Lightning calls that hook after every
    backward, before AMP unscaling and on every micro-batch of an accumulation window
    (``core/hooks.py`` 290-297: "the gradients will not be unscaled at this point")."""
    model.units  # noqa: B018 - builds the inlined event lists that `expanded` reads
    for class_name in lightning_modules(model):
        if not automatic_optimization(model, class_name):
            continue
        hook = model.methods.get((class_name, "on_after_backward"))
        if hook is None:
            continue
        for event in model.expanded(hook):
            if event.kind == "clip" and not event.measures_only:
                yield class_name, event


LIGHTNING_BEFORE_BACKWARD = ("training_step", "on_before_backward", "on_train_batch_start")
"""LightningModule hooks that automatic optimisation runs before backward: the closure runs
``training_step`` and then backward, which calls ``on_before_backward`` first (Lightning 2.6.6
``loops/optimization/automatic.py`` 130-140, ``core/hooks.py`` ``on_before_backward``);
``on_train_batch_start`` precedes the whole optimisation step of the batch."""
HF_BEFORE_BACKWARD = ("compute_loss",)
"""Methods of a Hugging Face ``Trainer`` subclass that its ``training_step`` calls before
``self.accelerator.backward(loss)`` (transformers 5.23.0 ``trainer.py`` ``training_step``)."""


def before_backward_clips(model: FileModel) -> Iterator[tuple[str, str, str, Event]]:
    """(framework, class, hook, clip event) for clipping that a framework runs before the
    backward of the same step, where the gradients are still the previous step's (already
    zeroed, or about to be):

    * a LightningModule with automatic optimisation: anywhere in the hooks of
      :data:`LIGHTNING_BEFORE_BACKWARD`, and in an ``optimizer_step`` override before the
      call that runs its closure (``optimizer.step(closure=optimizer_closure)`` or
      ``optimizer_closure()``): the closure is where ``training_step`` and backward run;
    * a Hugging Face ``Trainer`` subclass: anywhere in ``compute_loss``, and in a
      ``training_step`` override before its first backward.

    Clipping the framework itself runs (``self.clip_gradients``) and clips that only
    measure (an infinite limit) are left out."""
    model.units  # noqa: B018 - builds the inlined event lists that `expanded` reads
    for class_name in lightning_modules(model):
        if not automatic_optimization(model, class_name):
            continue
        for hook in LIGHTNING_BEFORE_BACKWARD:
            func = model.methods.get((class_name, hook))
            if func is not None:
                for event in _real_clips(model.expanded(func)):
                    yield "Lightning", class_name, hook, event
        func = model.methods.get((class_name, "optimizer_step"))
        if func is not None:
            closure_at = _closure_run(func)
            if closure_at is not None:
                for event in _real_clips(model.expanded(func)):
                    if _starts_before(func, event.anchor, closure_at):
                        yield "Lightning", class_name, "optimizer_step", event
    for class_name in hf_trainers(model):
        for hook in HF_BEFORE_BACKWARD:
            func = model.methods.get((class_name, hook))
            if func is not None:
                for event in _real_clips(model.expanded(func)):
                    yield "the Trainer", class_name, hook, event
        func = model.methods.get((class_name, "training_step"))
        if func is not None:
            events = model.expanded(func)
            backward = next((e for e in events if e.kind == "backward"), None)
            if backward is not None:
                for event in _real_clips(events):
                    if event.order < backward.order:
                        yield "the Trainer", class_name, "training_step", event


def _real_clips(events: list[Event]) -> Iterator[Event]:
    for event in events:
        if event.kind == "clip" and not event.measures_only and event.framework != "lightning":
            yield event


def _closure_run(func: FuncInfo) -> cst.CSTNode | None:
    """The first call in Lightning's ``optimizer_step(self, epoch, batch_idx, optimizer,
    optimizer_closure)`` that runs the closure: the closure called, or passed to a call
    (``optimizer.step(closure=optimizer_closure)``)."""
    node = func.node
    if not isinstance(node, cst.FunctionDef):
        return None
    params = [p.name.value for p in node.params.params]
    closure = next((p for p in params if "closure" in p), None)
    if closure is None:
        return None
    for inner in walk(node.body):
        if not isinstance(inner, cst.Call):
            continue
        if isinstance(inner.func, cst.Name) and inner.func.value == closure:
            return inner
        if any(isinstance(a.value, cst.Name) and a.value.value == closure for a in inner.args):
            return inner
    return None


def _starts_before(func: FuncInfo, first: cst.CSTNode, second: cst.CSTNode) -> bool:
    """``first`` comes before ``second`` in ``func`` (a walk of its body, in source order)."""
    order = {id(node): index for index, node in enumerate(walk(func.node))}
    return order.get(id(first), 1 << 30) < order.get(id(second), -1)


def enclosing_class(func: FuncInfo) -> str | None:
    return func.class_name


def accelerate_runs_deepspeed(model: FileModel) -> bool:
    """An ``Accelerator(deepspeed_plugin=...)`` in this file: DeepSpeed then zeroes, clips and
    steps itself, and the prepared optimizer's ``zero_grad``/``step`` do nothing (accelerate
    1.15.0 ``utils/deepspeed.py`` 308-312; ``accelerator.py`` 3023-3027 for clipping)."""
    return any(
        call_arg(call, None, "deepspeed_plugin") is not None or "deepspeed" in code_of(call)
        for _, _, call in model.accelerator_calls
    )
