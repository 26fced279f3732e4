"""Global hook installation for the probe's child process (imports torch).

Installed before the user's script runs, so the script needs no change: optimizer step pre/post
hooks (``torch.optim.optimizer.register_optimizer_step_pre_hook``), wrappers of
``torch.autograd.backward`` (which ``Tensor.backward`` calls), ``clip_grad_norm_`` /
``clip_grad_value_``, ``GradScaler.scale/unscale_/step/update``, LR scheduler ``step``,
``Optimizer.zero_grad`` / ``Module.zero_grad``, DataLoader iterators' ``__next__``, and global
module forward hooks (plus the models' own forward hooks, added by the collector). The forward
hooks cost a Python call per module call, so they are present only while the collector wants
them (the first step, sampled steps, armed steps after an anomaly, and after the last step to
stop the script at its next forward).

Every patch forwards the call unchanged; the collector only observes. :func:`install` returns a
function that removes everything again.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.utils.clip_grad as clip_grad_module
import torch.optim.lr_scheduler as lr_scheduler
import torch.optim.optimizer as optimizer_module
import torch.utils.data.dataloader as dataloader_module
from torch import nn
from torch.amp import grad_scaler
from torch.nn.modules import module as module_module
from torch.utils.hooks import RemovableHandle

from .collector import Collector


def _limit(args: tuple[Any, ...], kwargs: dict[str, Any], name: str) -> float:
    value = args[1] if len(args) > 1 else kwargs.get(name, float("nan"))
    try:
        return float(value)
    except (TypeError, ValueError):
        return float("nan")


def install(collector: Collector) -> Callable[[], None]:
    """Patch torch so that ``collector`` sees the training events; returns the undo function."""
    undo: list[Callable[[], None]] = []

    def patch(owner: Any, name: str, make: Callable[[Any], Any]) -> None:
        original = getattr(owner, name)
        replacement = make(original)
        functools.update_wrapper(replacement, original)
        setattr(owner, name, replacement)
        undo.append(lambda: setattr(owner, name, original))

    # backward: Tensor.backward delegates to torch.autograd.backward.
    def make_backward(original: Any) -> Any:
        def backward(tensors: Any, *args: Any, **kwargs: Any) -> Any:
            collector.on_backward(tensors)
            result = original(tensors, *args, **kwargs)
            collector.on_backward_done()
            return result

        return backward

    patch(torch.autograd, "backward", make_backward)

    # clipping, under both names the functions are reachable by.
    def make_clip(kind: str, limit_name: str) -> Callable[[Any], Any]:
        def make(original: Any) -> Any:
            def clip(*args: Any, **kwargs: Any) -> Any:
                result = original(*args, **kwargs)
                collector.on_clip(kind, _limit(args, kwargs, limit_name), result)
                return result

            return clip

        return make

    # Newer torch splits the norm clip in two public halves (get_total_norm, then
    # clip_grads_with_norm_(parameters, max_norm, total_norm)); the second is the clip.
    def make_split_clip(original: Any) -> Any:
        def clip_grads_with_norm_(*args: Any, **kwargs: Any) -> Any:
            result = original(*args, **kwargs)
            total = args[2] if len(args) > 2 else kwargs.get("total_norm")
            collector.on_clip("norm", _limit(args, kwargs, "max_norm"), total)
            return result

        return clip_grads_with_norm_

    for owner in (torch.nn.utils, clip_grad_module):
        patch(owner, "clip_grad_norm_", make_clip("norm", "max_norm"))
        patch(owner, "clip_grad_value_", make_clip("value", "clip_value"))
        if hasattr(owner, "clip_grads_with_norm_"):
            patch(owner, "clip_grads_with_norm_", make_split_clip)

    # GradScaler (torch.cuda.amp.GradScaler subclasses torch.amp.GradScaler).
    scaler_cls = grad_scaler.GradScaler

    def make_scale(original: Any) -> Any:
        def scale(self: Any, outputs: Any) -> Any:
            result = original(self, outputs)
            if self.is_enabled():
                collector.on_scale(self, outputs, result)
            return result

        return scale

    def make_unscale(original: Any) -> Any:
        def unscale_(self: Any, optimizer: Any) -> Any:
            if self.is_enabled():
                collector.on_unscale(self, optimizer)
            return original(self, optimizer)

        return unscale_

    def make_scaler_step(original: Any) -> Any:
        def step(self: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
            if not self.is_enabled():
                return original(self, optimizer, *args, **kwargs)
            collector.on_scaler_step_pre()
            try:
                result = original(self, optimizer, *args, **kwargs)
            except BaseException:
                collector._in_scaler_step = False
                raise
            collector.on_scaler_step_post(optimizer)
            return result

        return step

    def make_update(original: Any) -> Any:
        def update(self: Any, *args: Any, **kwargs: Any) -> Any:
            if self.is_enabled():
                collector.on_scaler_update()
            return original(self, *args, **kwargs)

        return update

    patch(scaler_cls, "scale", make_scale)
    patch(scaler_cls, "unscale_", make_unscale)
    patch(scaler_cls, "step", make_scaler_step)
    patch(scaler_cls, "update", make_update)

    # LR schedulers: the step a scheduler takes inside its own constructor is not the script's.
    def make_sched_step(original: Any) -> Any:
        def step(self: Any, *args: Any, **kwargs: Any) -> Any:
            if getattr(self, "_step_count", 0) > 0:
                collector.on_scheduler_step()
            return original(self, *args, **kwargs)

        return step

    def make_plateau_step(original: Any) -> Any:
        def step(self: Any, *args: Any, **kwargs: Any) -> Any:
            collector.on_scheduler_step()
            return original(self, *args, **kwargs)

        return step

    patch(lr_scheduler.LRScheduler, "step", make_sched_step)
    if "step" in vars(lr_scheduler.ReduceLROnPlateau):
        patch(lr_scheduler.ReduceLROnPlateau, "step", make_plateau_step)

    # zero_grad on optimizers and modules.
    def make_zero_grad(original: Any) -> Any:
        def zero_grad(self: Any, *args: Any, **kwargs: Any) -> Any:
            collector.on_zero_grad()
            return original(self, *args, **kwargs)

        return zero_grad

    patch(torch.optim.Optimizer, "zero_grad", make_zero_grad)
    patch(nn.Module, "zero_grad", make_zero_grad)

    # DataLoader batches: a step that draws one batch but calls backward() twice (a GAN's
    # real/fake losses) is not gradient accumulation.
    def make_next(original: Any) -> Any:
        def __next__(self: Any) -> Any:
            result = original(self)
            collector.on_batch()
            return result

        return __next__

    patch(dataloader_module._BaseDataLoaderIter, "__next__", make_next)

    # optimizer step hooks (fire for every optimizer, including subclasses' own step()).
    handles: list[RemovableHandle] = [
        optimizer_module.register_optimizer_step_pre_hook(
            lambda opt, args, kwargs: collector.on_step_pre(opt, args, kwargs)
        ),
        optimizer_module.register_optimizer_step_post_hook(
            lambda opt, args, kwargs: collector.on_step_post(opt)
        ),
    ]

    forward_handles: list[RemovableHandle] = []

    def want_forward_hooks(wanted: bool) -> None:
        if wanted and not forward_handles:
            forward_handles.append(
                module_module.register_module_forward_pre_hook(
                    lambda module, args: collector.on_forward_pre(module, args)
                )
            )
            forward_handles.append(
                module_module.register_module_forward_hook(
                    lambda module, args, output: collector.on_forward_post(module, output)
                )
            )
        elif not wanted and forward_handles:
            for handle in forward_handles:
                handle.remove()
            forward_handles.clear()

    collector.forward_hooks_wanted = want_forward_hooks
    collector.active = True
    window = collector.window
    want_forward_hooks(window.sampled or window.traced or collector.stop_pending)

    def uninstall() -> None:
        want_forward_hooks(False)
        # The models' own forward hooks stay (inert until the next install): removing and
        # re-adding them around every step would cost more than they do.
        collector.active = False
        collector.pop_modes()
        collector.forward_hooks_wanted = None
        for handle in handles:
            handle.remove()
        for restore in reversed(undo):
            restore()

    return uninstall
