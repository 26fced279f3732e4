"""Turns hook callbacks into per-step measurements (child side; imports torch).

``probes.runtime.child.hooks`` (global patches, used by the probe's child process) and
``probes.runtime.monitor.GradientMonitor`` (per-object hooks, used inside a user's own loop)
both drive one :class:`Collector`. It keeps the order of events within each optimizer step,
measures the gradients at the moment the optimizer consumes them (``measure``), packs every
number of a step into one vector for a single device→host transfer, and hands finished step
records (plain dicts matching ``probes.runtime.result.StepRecord``) to a sink.

A step's *window* is everything after the previous optimizer step up to and including this one,
so a ``zero_grad`` or scheduler call placed after ``optimizer.step()`` shows up at the start of
the next window. The diagnosis reads the order of calls from these windows.
"""

from __future__ import annotations

import math
import os
import sys
import time
import weakref
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from . import measure

RELU_FAMILY: tuple[type[nn.Module], ...] = (nn.ReLU, nn.ReLU6, nn.LeakyReLU)
SATURATING: tuple[type[nn.Module], ...] = (nn.Sigmoid, nn.Tanh)
#: Activations whose units can die (never output > 0), under every name they are called by:
#: module forwards call these too, so one function mode counts both styles.
ACTIVATIONS: dict[Any, str] = {
    fn: name
    for fn, name in (
        (F.relu, "relu"),
        (F.relu_, "relu"),
        (torch.relu, "relu"),
        (torch.relu_, "relu"),
        (torch.Tensor.relu, "relu"),
        (torch.Tensor.relu_, "relu"),
        (F.relu6, "relu6"),
        (F.leaky_relu, "leaky_relu"),
        (F.leaky_relu_, "leaky_relu"),
    )
}
#: Elements sampled per parameter tensor to estimate ‖Δw‖ on sampled steps.
UPDATE_SAMPLE = 4096
#: Fresh floating-point inputs up to this many elements are held until the optimizer step
#: and checked for NaN/Inf together, in one concatenation and one reduction per device and
#: dtype; larger ones are checked as they enter (a held batch would stay alive). A loop with
#: many small forwards per step (RL: the policy called once per environment step) then pays
#: a list append per forward instead of two kernels.
SMALL_INPUT = 1 << 14
#: Elements held in all after which the held inputs are checked at once (bounded memory).
HELD_INPUT_LIMIT = 1 << 20
#: In-place tensor methods that write a parameter when a script updates weights by hand.
_INPLACE_DUNDERS = frozenset({"__iadd__", "__isub__", "__imul__", "__itruediv__"})
#: autograd nodes that mean "the loss was divided or multiplied before backward()".
#: Code that is not the user's: torch, the probe, the standard library, installed packages.
_NOT_USER_CODE = tuple(
    os.path.dirname(os.path.abspath(path)) + os.sep
    for path in (torch.__file__, __file__, os.__file__)
)


def user_name_of(target: object) -> str | None:
    """The script's own name for ``target`` (an optimizer whose step is running): a variable
    of the innermost frame of user code on the stack (its locals, an attribute of its
    ``self``, its module's globals) bound to that very object. None when there is no such
    frame or name, or when several names are bound to it (the caller's labels then fall back
    to the index). Runs once per optimizer, at its first step."""
    frame = sys._getframe(1)
    while frame is not None:
        filename = frame.f_code.co_filename
        if not (
            filename.startswith(_NOT_USER_CODE)
            or filename.startswith("<")
            or "site-packages" in filename
            or "dist-packages" in filename
        ):
            break
        frame = frame.f_back  # type: ignore[assignment]
    if frame is None:
        return None
    local_vars = frame.f_locals
    found = {name for name, value in local_vars.items() if value is target}
    owner = local_vars.get("self")
    if not found and isinstance(getattr(owner, "__dict__", None), dict):
        found = {name for name, value in vars(owner).items() if value is target}
    if not found:
        found = {name for name, value in frame.f_globals.items() if value is target}
    found = {name for name in found if name.isidentifier() and not name.startswith("__")}
    return found.pop() if len(found) == 1 else None


SCALED_LOSS_OPS = frozenset({"DivBackward0", "DivBackward1", "MulBackward0", "MulBackward1"})


class ProbeStop(BaseException):
    """Raised into the script once the requested number of steps is measured.

    A ``BaseException`` so that the script's own ``except Exception`` blocks let it through.
    """


class _Call:
    """One module call seen while tracing non-finite values."""

    __slots__ = ("inputs_finite", "name", "output_finite")

    def __init__(
        self, name: str, inputs_finite: torch.Tensor | None, output_finite: torch.Tensor | None
    ) -> None:
        self.name = name
        self.inputs_finite = inputs_finite
        self.output_finite = output_finite


class _Window:
    """What happened since the previous optimizer step.

    A plain class, not a dataclass, as are the child's other records: generating a dataclass's
    methods runs ``exec`` for each of them, some 6 ms in all before the script's first line."""

    def __init__(self, sampled: bool = False, traced: bool = False) -> None:
        self.events: list[str] = []
        self.losses: list[torch.Tensor | None] = []
        self.loss_ops: list[str] = []
        self.clip_norm: torch.Tensor | None = None
        #: The clip ran on GradScaler-scaled gradients (after a scaled backward, before any
        #: unscale_): the norm it returned is scale× the real one.
        self.clip_scaled = False
        self.clip_max_norm: float | None = None
        self.clip_value: float | None = None
        self.scaled: dict[int, tuple[torch.Tensor, str]] = {}
        self.scaler: Any = None
        self.unscales: Counter[int] = Counter()
        self.sampled = sampled
        self.traced = traced
        self.calls: list[_Call] = []
        self.grad_flags: list[tuple[str, torch.Tensor]] = []
        self.fired: dict[str, torch.Tensor] = {}
        #: DataLoader batches drawn since the previous step.
        self.batches = 0
        #: Finite flags of the fresh floating-point inputs given to the model's forward.
        self.input_flags: list[torch.Tensor] = []
        #: Small fresh inputs not checked yet (see SMALL_INPUT), their storages, their size.
        self.held_inputs: list[torch.Tensor] = []
        self.held_storages: set[int] = set()
        self.held_numel = 0
        #: Optimizer id → "its gradients were non-zero when this window's first backward began".
        self.carried: dict[int, torch.Tensor] = {}
        self.backward_seen = False
        #: Root module id → its forwards that took a fresh input (a batch, not a model's output).
        self.feeds: Counter[int] = Counter()
        #: Closure evaluations after the first one (LBFGS line searches), not separate backwards.
        self.closure_evals = 0


class _OptimizerState:
    """What the collector keeps about one optimizer's parameters."""

    def __init__(
        self,
        params: list[torch.Tensor],
        index: list[int] | None = None,
        groups_key: tuple[tuple[int, int], ...] = (),
        probe: torch.Tensor | None = None,
        root: int | None = None,
    ) -> None:
        self.params = params
        self.layout: tuple[Any, ...] = ()
        self.grouping: measure.Grouping | None = None
        self.param_grouping: measure.Grouping | None = None
        self.last_grad: Any = None
        #: Position of each of ``params`` in the collector's parameter list.
        self.index: list[int] = index if index is not None else []
        #: ``(id, length)`` of each param group's list when ``params`` was built.
        self.groups_key = groups_key
        #: The smallest parameter, whose gradient tells whether gradients were carried over.
        self.probe = probe
        #: The root module holding these parameters (whose fresh inputs are this step's batches).
        self.root = root


class _Pending:
    """A step measured at the optimizer's pre-hook, sent once the update is done."""

    __slots__ = ("before", "meta", "params", "parts")

    def __init__(
        self,
        meta: dict[str, Any],
        parts: list[torch.Tensor],
        params: list[torch.Tensor],
        before: list[torch.Tensor] | None,
    ) -> None:
        self.meta = meta
        self.parts = parts
        self.params = params
        self.before = before


class _ManualOptimizer:
    """Stands for a script's hand-written update (``p -= lr * p.grad`` under ``no_grad``)."""

    def __init__(self, params: list[torch.Tensor]) -> None:
        self.param_groups = [{"params": params, "lr": None}]


class _ActivationMode(TorchFunctionMode):
    """Counts, per call site, the units of ReLU-family activations that fired (sampled
    windows only, inside the model's forward)."""

    def __init__(self, collector: Collector) -> None:
        super().__init__()
        self.collector = collector

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        kind = ACTIVATIONS.get(func)
        if kind is not None and isinstance(out, torch.Tensor):
            self.collector._count_activation(kind, out)
        return out


class _UpdateWatch(TorchFunctionMode):
    """Between a backward() and the next training call of a script with no optimizer step
    yet: the first in-place write to a parameter is a hand-written update."""

    def __init__(self, collector: Collector) -> None:
        super().__init__()
        self.collector = collector
        self.armed = True

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if self.armed and args:
            name = getattr(func, "__name__", "")
            if name in _INPLACE_DUNDERS or (name.endswith("_") and not name.startswith("_")):
                target = args[0]
                if isinstance(target, (list, tuple)) and target:
                    target = target[0]
                if (
                    isinstance(target, torch.Tensor)
                    and target.data_ptr() in self.collector._manual_ptrs
                ):
                    self.armed = False
                    self.collector._manual_update_begins()
        return func(*args, **(kwargs or {}))


def _op_name(tensor: torch.Tensor) -> str:
    fn = tensor.grad_fn
    return type(fn).__name__ if fn is not None else "leaf"


def _first_tensor(value: Any) -> torch.Tensor | None:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (tuple, list)):
        for item in value:
            found = _first_tensor(item)
            if found is not None:
                return found
    return None


def _tensors(value: Any) -> list[torch.Tensor]:
    """The tensors of a forward's arguments or output: top level and one level of nesting
    (an LSTM's ``(h, c)``, a dict of outputs)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        items = list(value.values())
    elif isinstance(value, (tuple, list)):
        items = list(value)
    else:
        return []
    found: list[torch.Tensor] = []
    for item in items:
        if isinstance(item, torch.Tensor):
            found.append(item)
        elif isinstance(item, (tuple, list)):
            found.extend(t for t in item if isinstance(t, torch.Tensor))
        elif isinstance(item, dict):
            found.extend(t for t in item.values() if isinstance(t, torch.Tensor))
    return found


def _update_sample(param: torch.Tensor) -> torch.Tensor:
    """At most UPDATE_SAMPLE elements of a parameter, evenly strided (a view: no copy)."""
    flat = measure.local_tensor(param).detach().reshape(-1)
    stride = max(1, flat.numel() // UPDATE_SAMPLE)
    return flat[::stride][:UPDATE_SAMPLE]


def _snapshot_update_samples(params: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Copies of every parameter's update sample, taken before the optimizer step.

    One concatenation split back into views when the samples share a device and dtype: a
    single batched copy kernel instead of one copy per tensor (GPT-2-124M's 148 parameters
    on an H100: 0.08 ms instead of 1.8 ms).
    """
    samples = [_update_sample(p) for p in params]
    if samples and len({(s.device, s.dtype) for s in samples}) == 1:
        return list(torch.cat(samples).split([s.numel() for s in samples]))
    return [s.clone() for s in samples]


def _pop_mode(mode: TorchFunctionMode) -> None:
    """Leave ``mode`` if it is the innermost torch function mode (a script's own mode pushed
    after it is never popped by us)."""
    depth = torch._C._len_torch_function_stack()
    if depth and torch._C._get_function_stack_at(depth - 1) is mode:
        mode.__exit__(None, None, None)


def _fired_units(out: torch.Tensor) -> torch.Tensor:
    """Which units of an activation fired (> 0) for any sample: channels (dim 1) of conv maps,
    the last dim otherwise. The comparison comes before the conv map's layout change, so that
    the copy moves one byte per value rather than four (a 64x64x24x24 map: 3.4 rather than
    12 ms on one CPU thread, in every sampled window of a CNN)."""
    positive = out > 0
    if out.dim() >= 4:
        return positive.transpose(0, 1).reshape(out.shape[1], -1).any(1)
    if out.dim() == 1:
        return positive
    return positive.reshape(-1, out.shape[-1]).any(0)


class Collector:
    """Builds step records from the training events it is told about.

    ``sink`` receives each finished record (a dict); ``max_steps`` (if set) makes the collector
    raise :class:`ProbeStop` at the next training call after that many optimizer steps.
    """

    def __init__(
        self,
        sink: Callable[[dict[str, Any]], None],
        *,
        max_steps: int | None = None,
        sample_every: int = 10,
        on_progress: Callable[[int], None] | None = None,
    ) -> None:
        self.sink = sink
        self.max_steps = max_steps
        self.sample_every = max(1, sample_every)
        self.on_progress = on_progress
        self.pid = os.getpid()
        self.steps_done = 0
        self.backward_calls = 0
        self.stop_pending = False
        self.events_total: Counter[str] = Counter()
        self.double_unscale = 0
        self.probe_s = 0.0
        self.device = "cpu"
        self.optimizers: dict[int, int] = {}
        self._opt_state: dict[int, _OptimizerState] = {}
        self.param_names: dict[int, str] = {}
        self.parameters: list[str] = []
        self.shapes: list[list[int]] = []
        self.layers: list[str] = []
        self._param_index: dict[int, int] = {}
        self._roots: list[weakref.ReferenceType[nn.Module]] = []
        self._root_ids: set[int] = set()
        self._module_names: dict[int, str] = {}
        self._module_types: dict[str, str] = {}
        self.layer_types: dict[str, str] = {}
        self.saturating_per_forward = 0
        self._saturating_now = 0
        self.relu_modules: set[int] = set()
        self.ddp = False
        self._depth = 0
        self._root_input: torch.Tensor | None = None
        self._window_probe_start = 0.0
        self._stops_raised = 0
        #: Called when the script keeps training after swallowing ProbeStop (the child ends
        #: the process there); None raises ProbeStop again.
        self.on_stop_ignored: Callable[[], None] | None = None
        self._leaves: dict[int, bool] = {}
        self._weighted: dict[int, bool] = {}
        self.window = _Window(sampled=True, traced=True)
        self._in_scaler_step = False
        self._stepped_in_scaler = False
        self._transfer = measure.HostTransfer()
        self.anomaly_step: int | None = None
        self._armed = 0
        self.nan_origin: dict[str, Any] | None = None
        self.forward_hooks_wanted: Callable[[bool], None] | None = None
        #: Class name of each optimizer (by index); "manual" for a hand-written update.
        self.optimizer_kinds: list[str] = []
        #: The script's own name for each optimizer (``optimizerG``), None where unsure.
        self.optimizer_names: list[str | None] = []
        #: Whether the script draws batches from a DataLoader (then ``batches`` is counted).
        self._loader_seen = False
        #: Root modules (called at depth 0, with parameters) → their own forward hooks, which
        #: run on every step (DDP sync flag, input check, stop request, activation mode).
        self._root_handles: dict[int, list[Any]] = {}
        #: data_ptr → step of tensors a root module returned (recently): not fresh data.
        self._recent_outputs: dict[int, int] = {}
        #: Small inputs are held until the step unless the script refills one buffer in place.
        self._hold_inputs = True
        #: Root module id → whether it is a DDP wrapper (has require_backward_grad_sync).
        self._ddp_roots: dict[int, bool] = {}
        self._module_stack: list[tuple[str, bool]] = []
        self._last_leaf: str | None = None
        self._activation_mode: _ActivationMode | None = None
        self._activations_seen = False
        self._activation_checked = False
        self._pending: _Pending | None = None
        #: Inside an extra closure evaluation (LBFGS): calls are not events of the step.
        self._quiet = False
        self._closure_measured = True
        #: A torch optimizer stepped at least once (then no hand-written update is looked for).
        self._stepped = False
        self._manual_params: list[torch.Tensor] | None = None
        self._manual_ptrs: set[int] = set()
        self._manual_opt: _ManualOptimizer | None = None
        self._watch: _UpdateWatch | None = None
        self._manual_pending = False
        self._root_depth = 0
        #: Each activation site's fired units in the previous sampled window.
        self._fired_before: dict[str, torch.Tensor] = {}
        #: False while the hooks are uninstalled (the models' own hooks stay, inert).
        self.active = True

    # -- helpers --------------------------------------------------------------------------
    def _mine(self) -> bool:
        # Forked DataLoader workers inherit the patched functions; only the main process counts.
        return os.getpid() == self.pid

    def _event(self, name: str) -> None:
        if self._quiet:
            return
        self.window.events.append(name)
        self.events_total[name] += 1

    def _check_stop(self) -> None:
        if self.stop_pending:
            self._stops_raised += 1
            if self._stops_raised > 1 and self.on_stop_ignored is not None:
                self.on_stop_ignored()  # the first ProbeStop was swallowed by the script
            raise ProbeStop()

    def _module_name(self, module: nn.Module) -> str:
        name = self._module_names.get(id(module))
        if name is None:
            self._resolve_module_names()
            # Remember modules outside every model (a loss module) so they are looked up once.
            name = self._module_names.setdefault(id(module), type(module).__name__)
        return name

    def _resolve_module_names(self) -> None:
        roots = [m for m in (ref() for ref in self._roots) if m is not None]
        main_vars: dict[int, str] = {}
        main = sys.modules.get("__main__")
        if main is not None:
            for var, value in list(vars(main).items()):
                if isinstance(value, nn.Module):
                    main_vars.setdefault(id(value), var)
        if not roots and main is not None:
            # The model's forward was never seen (called as model.forward(x)?): fall back on
            # the modules the script holds in global variables.
            roots = [v for v in vars(main).values() if isinstance(v, nn.Module)]
        roots = [m for m in roots if any(True for _ in m.parameters())] or roots
        prefix_roots = len(roots) > 1
        for index, root in enumerate(roots):
            prefix = ""
            if prefix_roots:
                prefix = main_vars.get(id(root), f"{type(root).__name__}{index}") + "."
            for name, module in root.named_modules():
                full = (prefix + name).rstrip(".") or type(root).__name__
                self._module_names.setdefault(id(module), full)
                self._module_types.setdefault(
                    (prefix + name).rstrip(".") or "(root)", type(module).__name__
                )
            for name, param in root.named_parameters(remove_duplicate=False):
                self.param_names.setdefault(id(param), prefix + name)

    def name_model(self, model: nn.Module) -> None:
        """Name parameters and modules through ``model`` (when the caller knows the model)."""
        if id(model) not in self._root_ids:
            self._root_ids.add(id(model))
            self._roots.append(weakref.ref(model))
        self._resolve_module_names()

    def _register_params(self, opt: torch.optim.Optimizer) -> _OptimizerState:
        # Called every step: the parameter list is rebuilt only when a param group's list was
        # replaced or changed length (add_param_group, or a script that edits the groups).
        groups_key = tuple(
            (id(group["params"]), len(group["params"])) for group in opt.param_groups
        )
        state = self._opt_state.get(id(opt))
        if state is not None and state.groups_key == groups_key:
            return state
        params = [p for group in opt.param_groups for p in group["params"]]
        if state is not None and len(state.params) == len(params):
            state.groups_key = groups_key
            return state
        if id(opt) not in self.optimizers:
            self.optimizers[id(opt)] = len(self.optimizers)
            kind = type(opt).__name__
            manual = isinstance(opt, _ManualOptimizer)
            self.optimizer_kinds.append("manual" if manual else kind)
            self.optimizer_names.append(None if manual else user_name_of(opt))
        unknown = [p for p in params if id(p) not in self.param_names]
        if unknown:
            self._resolve_module_names()
        for p in params:
            if id(p) in self._param_index:
                continue
            name = self.param_names.get(id(p), f"param{len(self.parameters)}")
            self._param_index[id(p)] = len(self.parameters)
            self.parameters.append(name)
            self.shapes.append(list(p.shape))
            layer = name.rsplit(".", 1)[0] if "." in name else "(root)"
            self.layers.append(layer)
            self.layer_types.setdefault(layer, self._module_types.get(layer, ""))
        state = _OptimizerState(
            params=params,
            index=[self._param_index[id(p)] for p in params],
            groups_key=groups_key,
            probe=min(params, key=lambda p: p.numel()) if params else None,
            root=self._root_of(params),
        )
        self._opt_state[id(opt)] = state
        return state

    def _root_of(self, params: list[torch.Tensor]) -> int | None:
        """The hooked root module that owns the first of ``params``."""
        if not params:
            return None
        first = id(params[0])
        for ref in self._roots:
            root = ref()
            if (
                root is not None
                and id(root) in self._root_handles
                and any(id(p) == first for p in root.parameters())
            ):
                return id(root)
        return None

    # -- events ---------------------------------------------------------------------------
    def on_backward(self, tensors: Any) -> None:
        """``torch.autograd.backward`` is about to run on ``tensors``."""
        if not self._mine():
            return
        self._settle_manual("backward")
        self._check_stop()
        self._depth = 0
        self._root_input = None
        self.backward_calls += 1
        if self._quiet:
            self.window.closure_evals += 1
            return
        if not self.window.backward_seen:
            self.window.backward_seen = True
            self._note_carried()
        self._event("backward")
        loss = _first_tensor(tensors)
        if not self._stepped and self._manual_params is None and loss is not None:
            self._manual_params = self._find_manual_params(loss)
        if loss is None or loss.numel() != 1:
            self.window.losses.append(None)
            self.window.loss_ops.append("non-scalar")
            return
        scaled = self.window.scaled.get(id(loss))
        if scaled is not None:
            self.window.losses.append(scaled[0])
            self.window.loss_ops.append(scaled[1])
        else:
            self.window.losses.append(loss.detach().reshape(()))
            self.window.loss_ops.append(_op_name(loss))

    def on_backward_done(self) -> None:
        """``torch.autograd.backward`` returned: with no optimizer step seen so far, watch for
        a hand-written update of the parameters."""
        if not self._mine() or self._stepped or self._quiet or not self._manual_params:
            return
        if self._watch is None:
            self._manual_ptrs = {p.data_ptr() for p in self._manual_params}
            self._watch = _UpdateWatch(self)
            self._watch.__enter__()

    def _note_carried(self) -> None:
        """Before a window's first backward: is each optimizer's smallest gradient still
        non-zero from its previous update (no zero_grad in between)? No host sync."""
        for opt_id, state in self._opt_state.items():
            probe = state.probe
            grad = None if probe is None else probe.grad
            if grad is not None and not grad.is_sparse:
                self.window.carried[opt_id] = grad.detach().ne(0).any()

    def _find_manual_params(self, loss: torch.Tensor) -> list[torch.Tensor]:
        """The tensors a hand-written update would write: the models' parameters, else the
        leaves of the loss's graph (a script with plain tensors and no module)."""
        params: dict[int, torch.Tensor] = {}
        for ref in self._roots:
            root = ref()
            if root is not None and id(root) in self._root_handles:
                for p in root.parameters():
                    if p.requires_grad:
                        params.setdefault(id(p), p)
        if params:
            return list(params.values())
        seen: set[int] = set()
        stack = [loss.grad_fn]
        while stack:
            node = stack.pop()
            if node is None or id(node) in seen:
                continue
            seen.add(id(node))
            variable = getattr(node, "variable", None)
            if isinstance(variable, torch.Tensor):
                params.setdefault(id(variable), variable)
            stack.extend(fn for fn, _ in getattr(node, "next_functions", ()))
        return list(params.values())

    def _manual_update_begins(self) -> None:
        """The first in-place write to a parameter since the last backward: measure the
        gradients the hand-written update is using, as an optimizer's pre-hook would."""
        start = time.perf_counter()
        if self._manual_opt is None:
            self._manual_opt = _ManualOptimizer(list(self._manual_params or []))
        self._event("step")
        self._measure(self._manual_opt, skipped=False)  # type: ignore[arg-type]
        self._manual_pending = True
        self.probe_s += time.perf_counter() - start

    def _settle_manual(self, call: str) -> None:
        """At the next training call: a detected hand-written update ends its step; a new
        backward or forward without one ends the watch."""
        if self._watch is None and not self._manual_pending:
            return
        if self._manual_pending:
            self._manual_pending = False
            self._pop_watch()
            self._finish_step()
        elif call in ("backward", "forward", "step"):
            self._pop_watch()

    def _pop_watch(self) -> None:
        watch, self._watch = self._watch, None
        if watch is not None:
            watch.armed = False
            _pop_mode(watch)

    def _drop_manual(self) -> None:
        """A torch optimizer steps: the script does not update its weights by hand."""
        self._pop_watch()
        self._manual_pending = False
        self._manual_params = []

    def on_batch(self) -> None:
        """A DataLoader iterator returned a batch."""
        if self._mine():
            self._loader_seen = True
            self.window.batches += 1

    def on_scale(self, scaler: Any, loss: Any, scaled: Any) -> None:
        """``GradScaler.scale(loss)`` returned ``scaled``."""
        if not self._mine():
            return
        self._check_stop()
        self._event("scale")
        self.window.scaler = scaler
        if isinstance(loss, torch.Tensor) and isinstance(scaled, torch.Tensor):
            self.window.scaled[id(scaled)] = (loss.detach().reshape(-1)[0], _op_name(loss))

    def on_unscale(self, scaler: Any, opt: Any) -> None:
        """``GradScaler.unscale_(opt)`` is about to run (a second call raises in torch)."""
        if not self._mine() or self._in_scaler_step:
            return  # GradScaler.step unscales by itself when the script did not
        self._event("unscale")
        self.window.unscales[id(opt)] += 1
        if self.window.unscales[id(opt)] == 2:
            self.double_unscale += 1

    def on_clip(self, kind: str, limit: float, total: Any) -> None:
        """A clipping function ran; ``total`` is the norm ``clip_grad_norm_`` returned."""
        if not self._mine():
            return
        self._settle_manual("clip")
        if kind == "norm":
            self._event("clip")
            self.window.clip_max_norm = float(limit)
            if isinstance(total, torch.Tensor):
                self.window.clip_norm = total.detach()
                window = self.window
                self.window.clip_scaled = (
                    window.scaler is not None
                    and "backward" in window.events
                    and "unscale" not in window.events
                )
        else:
            self._event("clip-value")
            self.window.clip_value = float(limit)

    def on_zero_grad(self) -> None:
        """An optimizer's or module's ``zero_grad`` ran."""
        if self._mine():
            self._settle_manual("zero-grad")
            self._event("zero-grad")

    def on_scheduler_step(self) -> None:
        """An LR scheduler stepped (its initial step at construction is not reported)."""
        if self._mine():
            self._settle_manual("scheduler")
            self._event("scheduler")

    def on_scaler_update(self) -> None:
        """``GradScaler.update()`` ran."""
        if self._mine():
            self._event("scaler-update")

    def on_scaler_step_pre(self) -> None:
        """``GradScaler.step(opt)`` is starting."""
        if not self._mine():
            return
        self._check_stop()
        self._event("scaler-step")
        self._in_scaler_step = True
        self._stepped_in_scaler = False

    def on_scaler_step_post(self, opt: Any) -> None:
        """``GradScaler.step(opt)`` returned; if it skipped ``opt.step()``, record that."""
        if not self._mine():
            return
        self._in_scaler_step = False
        if not self._stepped_in_scaler:
            if not isinstance(opt, torch.optim.Optimizer):
                return
            start = time.perf_counter()
            self._measure(opt, skipped=True)
            self.probe_s += time.perf_counter() - start
        self._finish_step()

    def on_step_pre(
        self,
        opt: torch.optim.Optimizer,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
        """``opt.step()`` is about to consume the gradients: measure them now. With a closure
        (LBFGS), the gradients exist only once the closure ran: the closure is wrapped and the
        first evaluation is measured; returns the new ``(args, kwargs)`` then."""
        if not self._mine():
            return None
        self._check_stop()
        if not self._stepped:
            self._stepped = True
            self._drop_manual()
        start = time.perf_counter()
        self._event("step")
        if self._in_scaler_step:
            self._stepped_in_scaler = True
        # The hook's args start with the optimizer itself: step(closure) is (opt, closure).
        kwargs = dict(kwargs or {})
        closure = args[1] if len(args) > 1 else kwargs.get("closure")
        replaced = None
        if callable(closure):
            self._closure_measured = False
            wrapped = self._wrap_closure(opt, closure)
            if len(args) > 1:
                replaced = ((args[0], wrapped, *args[2:]), kwargs)
            else:
                kwargs["closure"] = wrapped
                replaced = (args, kwargs)
        else:
            self._measure(opt, skipped=False)
        self.probe_s += time.perf_counter() - start
        return replaced

    def _wrap_closure(self, opt: torch.optim.Optimizer, closure: Callable[..., Any]) -> Any:
        calls = 0

        def closure_measured(*args: Any, **kwargs: Any) -> Any:
            nonlocal calls
            calls += 1
            if calls > 1:
                # Line-search re-evaluations belong to the same step: not new backwards.
                self._quiet = True
                try:
                    return closure(*args, **kwargs)
                finally:
                    self._quiet = False
            loss = closure(*args, **kwargs)
            start = time.perf_counter()
            self._measure(opt, skipped=False)
            self._closure_measured = True
            self.probe_s += time.perf_counter() - start
            return loss

        return closure_measured

    def on_step_post(self, opt: torch.optim.Optimizer) -> None:
        """``opt.step()`` returned."""
        if not self._mine() or self._in_scaler_step:
            return
        if not self._closure_measured:  # a closure the optimizer never called
            self._closure_measured = True
            self._measure(opt, skipped=False)
        self._finish_step()

    def on_forward_pre(self, module: nn.Module, args: Any) -> None:
        """A module's forward is starting (global hooks are installed only when needed)."""
        if not self._mine():
            return
        start = time.perf_counter()
        try:
            self._forward_pre(module, args)
        finally:
            self.probe_s += time.perf_counter() - start

    def _forward_pre(self, module: nn.Module, args: Any) -> None:
        if self._depth == 0:
            if id(module) not in self._root_handles:
                self._check_stop()
                if id(module) not in self._root_ids:
                    self._root_ids.add(id(module))
                    self._roots.append(weakref.ref(module))
                if self._hook_root(module):
                    # Its own hooks run from the next call on; this call's root work is here
                    # (its post hook, registered now, already runs at the end of this call).
                    self._enter_root(module, args, {})
            self._saturating_now = 0
            self._module_stack.clear()
        self._depth += 1
        self._module_stack.append((self._module_name(module), isinstance(module, RELU_FAMILY)))
        if isinstance(module, SATURATING):
            self._saturating_now += 1
            self.saturating_per_forward = max(self.saturating_per_forward, self._saturating_now)
        if self._depth == 1 and self._tracing():
            # Only the batch entering the model is checked on the way in; inside the model,
            # a module's input is an earlier module's output, which is checked on the way out.
            tensors = [a for a in args if isinstance(a, torch.Tensor) and a.is_floating_point()]
            if tensors:
                self._root_input = torch.stack([measure.finite_flag(t) for t in tensors]).all()

    # -- root modules (hooked on every step) ----------------------------------------------
    def _hook_root(self, module: nn.Module) -> bool:
        """Give a model called at depth 0 its own forward hooks (a module without parameters,
        such as a loss module, gets none). True when hooks were added now."""
        if id(module) in self._root_handles or next(module.parameters(), None) is None:
            return False
        # Looked up on every call (not bound now), like the other event methods.
        self._root_handles[id(module)] = [
            module.register_forward_pre_hook(
                lambda m, args, kwargs: self.on_root_forward_pre(m, args, kwargs),
                with_kwargs=True,
            ),
            module.register_forward_hook(
                lambda m, args, output: self.on_root_forward_post(m, args, output),
                always_call=True,
            ),
        ]
        return True

    def remove_root_hooks(self) -> None:
        """Remove the models' own forward hooks (end of a GradientMonitor)."""
        for handles in self._root_handles.values():
            for handle in handles:
                handle.remove()
        self._root_handles.clear()
        self.pop_modes()

    def pop_modes(self) -> None:
        """Leave the collector's torch function modes (uninstall, end of a monitor)."""
        self._pop_watch()
        mode, self._activation_mode = self._activation_mode, None
        if mode is not None:
            _pop_mode(mode)
        self._root_depth = 0

    def on_root_forward_pre(self, module: nn.Module, args: Any, kwargs: Any) -> None:
        """A model (a module first called at depth 0) starts its forward."""
        if not self.active:
            return
        if self._root_depth == 0 and self._mine():
            self._enter_root(module, args, kwargs)
        else:
            self._root_depth += 1  # the same model called inside itself

    def on_root_forward_post(self, module: nn.Module, args: Any, output: Any) -> None:
        """A model's forward returned (or raised)."""
        if not self.active:
            return
        self._root_depth = max(0, self._root_depth - 1)
        if self._root_depth == 0 and self._mine():
            self._root_post(output)

    def _enter_root(self, module: nn.Module, args: Any, kwargs: Any) -> None:
        # Called for every forward of the model (an RL policy: once per environment step):
        # one pair of clock reads, and no call where nothing is pending.
        start = time.perf_counter()
        if self._watch is not None or self._manual_pending:
            self._settle_manual("forward")
        if self.stop_pending:
            self.probe_s += time.perf_counter() - start
            self._check_stop()  # before the depth moves: a stop leaves the counters as they were
        self._root_depth = 1
        if self._quiet:
            self.probe_s += time.perf_counter() - start
            return
        ddp = self._ddp_roots.get(id(module))
        if ddp is None:
            # Cached: a module without the attribute answers hasattr by raising inside
            # nn.Module.__getattr__, some microseconds a forward.
            ddp = self._ddp_roots[id(module)] = hasattr(module, "require_backward_grad_sync")
        if ddp:
            self.ddp = True
            sync = bool(module.require_backward_grad_sync)
            self._event("forward-ddp-sync" if sync else "forward-ddp-no-sync")
        self._check_inputs(module, args, kwargs)
        self._last_leaf = None
        if self._activation_mode is None and self._wants_activation_mode():
            self._activation_mode = _ActivationMode(self)
            self._activation_mode.__enter__()
        self.probe_s += time.perf_counter() - start

    def _root_post(self, output: Any) -> None:
        mode, self._activation_mode = self._activation_mode, None
        if mode is not None:
            _pop_mode(mode)
        step = self.steps_done
        for tensor in _tensors(output):
            self._recent_outputs[tensor.data_ptr()] = step

    def _check_inputs(self, module: nn.Module, args: Any, kwargs: Any) -> None:
        """Count the forward as fed with fresh data, and keep finite flags (no host sync) of
        its fresh floating-point tensors. Fresh: not a tensor a model returned in this or the
        previous step (a generator's sample, an RNN's carried hidden state), and not one
        computed in the autograd graph."""
        values = (*args, *kwargs.values()) if kwargs else args
        fed = False
        window = self.window
        for tensor in _tensors(values):
            if tensor.grad_fn is not None:
                continue
            numel = tensor.numel()
            storage = tensor.data_ptr()
            if numel == 0 or storage in self._recent_outputs:
                continue
            fed = True
            if not tensor.is_floating_point():
                continue
            if numel > SMALL_INPUT or not self._hold_inputs:
                window.input_flags.append(measure.finite_flag(tensor))
                continue
            if storage in window.held_storages:
                # One buffer refilled in place for each forward: a held reference would only
                # show its last content. Check it now, and from now on every input at once.
                self._hold_inputs = False
                self._check_held_inputs()
                window.input_flags.append(measure.finite_flag(tensor))
                continue
            window.held_inputs.append(tensor)
            window.held_storages.add(storage)
            window.held_numel += numel
            if window.held_numel > HELD_INPUT_LIMIT:
                self._check_held_inputs()
        if fed:
            window.feeds[id(module)] += 1

    def _check_held_inputs(self) -> None:
        """Turn the window's held small inputs into finite flags: per device and dtype, one
        concatenation and one reduction (no host sync), then let them go."""
        window = self.window
        held = window.held_inputs
        if not held:
            return
        window.held_inputs, window.held_storages, window.held_numel = [], set(), 0
        groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
        for tensor in held:
            groups.setdefault((tensor.device, tensor.dtype), []).append(tensor)
        with torch.no_grad():
            for group in groups.values():
                flat = torch.cat([t.detach().reshape(-1) for t in group])
                window.input_flags.append(measure.finite_flag(flat))

    def _wants_activation_mode(self) -> bool:
        """Sampled windows count activations: always on the first, later only when the first
        found a ReLU-family activation (a GELU Transformer skips the function mode's cost)."""
        return self.window.sampled and (self._activations_seen or not self._activation_checked)

    def _count_activation(self, kind: str, out: torch.Tensor) -> None:
        """Units of one ReLU-family call that fired, OR-ed over the window per call site."""
        if out.dim() < 1 or out.numel() == 0 or not out.is_floating_point():
            return
        self._activations_seen = True
        top = self._module_stack[-1] if self._module_stack else None
        if top is not None and top[1]:
            name = top[0]  # an nn.ReLU module: its own name
        elif self._last_leaf is not None:
            name = f"{kind} after {self._last_leaf}"
        else:
            name = f"{kind} in {top[0] if top else 'the model'}"
        with torch.no_grad():
            fired = _fired_units(out.detach())
        previous = self.window.fired.get(name)
        if previous is not None and previous.shape == fired.shape:
            fired = fired | previous
        self.window.fired[name] = fired

    def on_forward_post(self, module: nn.Module, output: Any) -> None:
        """A module's forward returned ``output``."""
        if not self._mine():
            return
        start = time.perf_counter()
        try:
            self._forward_post(module, output)
        finally:
            self.probe_s += time.perf_counter() - start

    def _forward_post(self, module: nn.Module, output: Any) -> None:
        self._depth = max(0, self._depth - 1)
        if self._module_stack:
            self._module_stack.pop()
        is_leaf = self._is_leaf(module)
        if is_leaf and self._has_weights(module):
            # Functional activations are named after the last layer with weights before them
            # (a Dropout or pooling in between does not own the units).
            self._last_leaf = self._module_name(module)
        if isinstance(module, RELU_FAMILY):
            self.relu_modules.add(id(module))
        if not self._tracing():
            return
        out = _first_tensor(output)
        if out is None or not out.is_floating_point():
            return
        if is_leaf:
            # Leaf modules only: a container's output is its last child's output, checking it
            # again would only double the cost. Calls are kept in completion order.
            name = self._module_name(module)
            inputs, self._root_input = self._root_input, None
            self.window.calls.append(_Call(name, inputs, measure.finite_flag(out)))
            if out.requires_grad:
                flags = self.window.grad_flags

                def _grad_hook(grad: torch.Tensor, _name: str = name) -> None:
                    flags.append((_name, measure.finite_flag(grad)))

                out.register_hook(_grad_hook)

    def _tracing(self) -> bool:
        return self.window.traced and self.nan_origin is None

    def _has_weights(self, module: nn.Module) -> bool:
        owns = self._weighted.get(id(module))
        if owns is None:
            owns = next(module.parameters(recurse=False), None) is not None
            self._weighted[id(module)] = owns
        return owns

    def _is_leaf(self, module: nn.Module) -> bool:
        leaf = self._leaves.get(id(module))
        if leaf is None:
            leaf = next(module.children(), None) is None
            self._leaves[id(module)] = leaf
        return leaf

    # -- measurement ----------------------------------------------------------------------
    def _measure(self, opt: torch.optim.Optimizer, *, skipped: bool) -> None:
        measure_start = time.perf_counter()
        state = self._register_params(opt)
        grads = [p.grad for p in state.params]
        layout = measure.layout_key(grads)
        if state.grouping is None or layout != state.layout:
            state.layout = layout
            state.grouping = measure.group_tensors(grads)
            state.param_grouping = measure.group_tensors([p.detach() for p in state.params])
            self.device = str(state.grouping.home)
        grouping = state.grouping
        assert state.param_grouping is not None
        window = self.window
        home = grouping.home
        with torch.no_grad():
            details = None
            if window.sampled:
                norms, details = measure.sampled_statistics(
                    grads, state.params, grouping, state.param_grouping
                )
            else:
                norms = measure.per_tensor_norms(grads, grouping)
            parts = [norms]
            losses = [t for t in window.losses if t is not None]
            if losses:
                parts.append(torch.stack([t.to(home, torch.float32) for t in losses]))
            if window.clip_norm is not None:
                parts.append(window.clip_norm.reshape(1).to(home, torch.float32))
            scaler_scale = getattr(window.scaler, "_scale", None)
            if isinstance(scaler_scale, torch.Tensor):
                parts.append(scaler_scale.reshape(1).to(home, torch.float32))
            grad_scale, found_inf = self._gradient_scale(opt, scaler_scale)
            if grad_scale is not None:
                parts.append(grad_scale.reshape(1).to(home, torch.float32))
            if found_inf is not None:
                parts.append(found_inf.reshape(1).to(home, torch.float32))
            if details is not None:
                parts.append(details.pack().to(home))
            # Forward order (the first dead layer is the one to name). A unit is dead when it
            # fired neither in this sampled window nor in the previous one: one batch in which
            # a unit stays silent is not death (small batches, dropout before the ReLU).
            fired_names = list(window.fired)
            for name in fired_names:
                fired = window.fired[name]
                previous = self._fired_before.get(name)
                if previous is not None and previous.shape == fired.shape:
                    fired = fired | previous
                parts.append(
                    torch.stack(
                        [(~fired).sum(), torch.full((), fired.numel(), device=fired.device)]
                    ).to(home, torch.float32)
                )
            if window.fired:
                self._fired_before = dict(window.fired)
            carried = window.carried.get(id(opt))
            if carried is not None:
                parts.append(carried.reshape(1).to(home, torch.float32))
            self._check_held_inputs()
            if window.input_flags:
                parts.append(
                    torch.stack(window.input_flags).all().reshape(1).to(home, torch.float32)
                )
            trace_parts = (
                [c.inputs_finite for c in window.calls]
                + [c.output_finite for c in window.calls]
                + [flag for _, flag in window.grad_flags]
            )
            if trace_parts:
                parts.append(
                    torch.stack(
                        [
                            (
                                t
                                if t is not None
                                else torch.ones((), dtype=torch.bool, device=home)
                            ).to(home, torch.float32)
                            for t in trace_parts
                        ]
                    )
                )
            vector = torch.cat(parts)
        first_grad = grads[0] if grads and grads[0] is not None else None
        if first_grad is None:
            first_grad = next((g for g in grads if g is not None), None)
        reused = None
        if first_grad is not None:
            reused = state.last_grad is not None and state.last_grad() is first_grad
            state.last_grad = weakref.ref(first_grad)
        rates = [g.get("lr") for g in opt.param_groups]
        numeric = [float(r) for r in rates if isinstance(r, (int, float))]
        # The largest step size of the groups: the one a divergence comes from.
        lr = max(numeric) if numeric else None
        meta = {
            "step": self.steps_done + 1,
            "optimizer": self.optimizers[id(opt)],
            "index": state.index,
            "n_losses": len(losses),
            "loss_slots": [t is not None for t in window.losses],
            "loss_ops": list(window.loss_ops),
            "has_clip": window.clip_norm is not None,
            "has_scale": isinstance(scaler_scale, torch.Tensor),
            "clip_scaled": window.clip_scaled and isinstance(scaler_scale, torch.Tensor),
            "has_grad_scale": grad_scale is not None,
            "has_found_inf": found_inf is not None,
            "clip_max_norm": window.clip_max_norm,
            "clip_value": window.clip_value,
            "events": list(window.events),
            "lr": lr,
            "skipped": skipped,
            "has_carried": carried is not None,
            "has_inputs": bool(window.input_flags),
            "batches": window.batches if self._loader_seen else None,
            "feeds": window.feeds.get(state.root) if state.root is not None else None,
            "closure_evals": window.closure_evals,
            "grad_reused": reused,
            "sampled": window.sampled,
            "numel": details.numel if details is not None else None,
            "fired_names": fired_names,
            "calls": [c.name for c in window.calls],
            "grad_names": [name for name, _ in window.grad_flags],
            "nonfinite_params": None,
        }
        # Probe time of this window so far: hooks during the window plus this measurement.
        meta["overhead_s"] = (
            self.probe_s - self._window_probe_start + time.perf_counter() - measure_start
        )
        if home.type == "cpu" and self.anomaly_step is None:
            # The record is sent after the update; which weights were already non-finite must
            # be read now, before the update touches them (only at a first anomaly: on the CPU
            # the values are at hand, the check is one reduction over the norms).
            head = vector[: len(state.index) + len(losses)]
            if not bool(torch.isfinite(head).all()):
                meta["nonfinite_params"] = self._nonfinite_params(state.params)
        before = None
        if window.sampled and not skipped:
            with torch.no_grad():
                before = _snapshot_update_samples(state.params)
        self._submit_pending()  # a previous step whose update never returned
        self._pending = _Pending(meta, [vector], list(state.params), before)

    def _gradient_scale(
        self, opt: torch.optim.Optimizer, scaler_scale: Any
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The factor the gradients carry as ``opt.step()`` starts (None: they are unscaled),
        and the GradScaler's overflow flag when the step decides the skip itself.

        A GradScaler unscales the gradients before a plain optimizer's step. A fused optimizer
        (``fused=True``, as nanoGPT builds AdamW on a GPU) receives the scale as
        ``opt.grad_scale`` instead and divides inside its kernel, skipping the update itself
        when ``opt.found_inf`` is set: its gradients are still scaled here, and its step runs
        even when the scaler's check found an overflow. A step that bypasses ``scaler.step``
        with no ``unscale_`` applies the scaled gradients. Reading the attributes costs no
        host sync: the tensors travel in the step's vector."""
        if self.window.scaler is None:
            return None, None
        if self._in_scaler_step:
            grad_scale = getattr(opt, "grad_scale", None)
            found_inf = getattr(opt, "found_inf", None)
            if not isinstance(grad_scale, torch.Tensor):
                grad_scale = None
            if not isinstance(found_inf, torch.Tensor):
                found_inf = None
            return grad_scale, found_inf
        if self.window.unscales[id(opt)] or not isinstance(scaler_scale, torch.Tensor):
            return None, None
        return scaler_scale, None

    def _submit_pending(self) -> None:
        """Send the measured step, with ‖Δw‖ estimates when its weights were sampled before
        the update (the update has happened by now)."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        parts = pending.parts
        pending.meta["has_update"] = False
        if pending.before is not None:
            with torch.no_grad():
                home = parts[0].device
                after = [_update_sample(p) for p in pending.params]
                deltas = torch._foreach_sub(after, pending.before)
                norms = torch.stack(torch._foreach_norm(deltas)).to(home, torch.float32)
                scale = torch.tensor(
                    [
                        math.sqrt(p.numel() / max(1, b.numel()))
                        for p, b in zip(pending.params, pending.before, strict=True)
                    ],
                    dtype=torch.float32,
                    device=home,
                )
                parts = [*parts, norms * scale]
            pending.meta["has_update"] = True
        self._transfer.submit(pending.meta, torch.cat(parts) if len(parts) > 1 else parts[0])
        self._drain(self._transfer.ready())

    def _finish_step(self) -> None:
        self._submit_pending()
        if self._activation_mode is None and self.window.sampled:
            self._activation_checked = True
        self.steps_done += 1
        if self.on_progress is not None:
            self.on_progress(self.steps_done)
        if self.max_steps is not None and self.steps_done >= self.max_steps:
            self.stop_pending = True
            self._drain(self._transfer.flush())
        upcoming = self.steps_done + 1
        # Sampled windows gather the richer statistics and dead units; traced windows also
        # follow every module's output and gradient to locate a non-finite value: the first
        # step and the steps right after the first anomaly.
        traced = self._armed > 0
        sampled = upcoming % self.sample_every == 0 or traced
        if self._armed > 0:
            self._armed -= 1
        self.window = _Window(sampled=sampled, traced=traced)
        self._window_probe_start = self.probe_s
        oldest = self.steps_done - 1
        if len(self._recent_outputs) > 64 or any(v < oldest for v in self._recent_outputs.values()):
            self._recent_outputs = {k: v for k, v in self._recent_outputs.items() if v >= oldest}
        if self.forward_hooks_wanted is not None:
            self.forward_hooks_wanted(
                traced or self.stop_pending or (sampled and self._sampling_needs_forward_hooks())
            )

    def _sampling_needs_forward_hooks(self) -> bool:
        """Whether a sampled (not traced) window has anything to learn from forward hooks.

        There they name the call sites of ReLU-family activations (the function mode counts
        them); a model with none (a Transformer with GELUs) saves the hooks' Python calls,
        about 0.5 ms a sampled step on the benchmark model. The first sampled window always
        looks. DDP's sync flag and the input check come from the root modules' own hooks.
        """
        return self._activations_seen or not self._activation_checked

    def flush(self) -> None:
        """Finish every pending transfer (end of run)."""
        if self._manual_pending:
            self._manual_pending = False
            self._pop_watch()
            self._finish_step()
        self._submit_pending()
        self._drain(self._transfer.flush())

    def _drain(self, ready: list[tuple[Any, list[float]]]) -> None:
        for meta, values in ready:
            record = self._decode(meta, values)
            self.sink(record)

    def _decode(self, meta: dict[str, Any], values: list[float]) -> dict[str, Any]:
        n_total = len(self.parameters)
        index: list[int] = meta["index"]
        pos = 0
        local = values[pos : pos + len(index)]
        pos += len(index)
        norms: list[float | None] = [None] * n_total
        for i, value in zip(index, local, strict=True):
            norms[i] = None if value == measure.MISSING else value
        present = [v for v in local if v != measure.MISSING]
        total = math.sqrt(math.fsum(v * v for v in present)) if present else 0.0
        losses_values = values[pos : pos + meta["n_losses"]]
        pos += meta["n_losses"]
        loss_iter = iter(losses_values)
        losses = [next(loss_iter) if slot else None for slot in meta["loss_slots"]]
        before = None
        if meta["has_clip"]:
            before = values[pos]
            pos += 1
        scale = None
        if meta["has_scale"]:
            scale = values[pos]
            pos += 1
        # Every norm leaves the child unscaled: divided by the GradScaler's scale the gradients
        # carried when measured (the clip's reading by the scale in force when it ran).
        grad_scale = None
        if meta["has_grad_scale"]:
            grad_scale = values[pos]
            pos += 1
        skipped = meta["skipped"]
        if meta["has_found_inf"]:
            skipped = skipped or values[pos] > 0
            pos += 1
        clip_seen = before
        if before is not None and meta["clip_scaled"] and scale:
            before = before / scale
        if grad_scale and math.isfinite(grad_scale) and grad_scale != 1.0:
            norms = [None if v is None else v / grad_scale for v in norms]
            total /= grad_scale
        record: dict[str, Any] = {
            "step": meta["step"],
            "optimizer": meta["optimizer"],
            "grad_norms": norms,
            "total_norm": total,
            "total_norm_before_clip": before,
            "clip_max_norm": meta["clip_max_norm"],
            "clip_value": meta["clip_value"],
            "clipped": (clip_seen > meta["clip_max_norm"])
            if clip_seen is not None and meta["clip_max_norm"] is not None
            else None,
            "losses": losses,
            "loss_ops": meta["loss_ops"],
            "events": meta["events"],
            "lr": meta["lr"],
            "scale": scale,
            "skipped": skipped,
            "grad_reused": meta["grad_reused"],
            "sampled": meta["sampled"],
        }
        if meta["numel"] is not None:
            width = 6 * len(index)
            packed = values[pos : pos + width]
            if grad_scale and math.isfinite(grad_scale) and grad_scale != 1.0:
                # The first two rows (largest |g|, sum of g) scale with the gradients.
                scaled_rows = 2 * len(index)
                packed = [v / grad_scale for v in packed[:scaled_rows]] + packed[scaled_rows:]
            details = measure.unpack_details(
                packed,
                meta["numel"],
                [measure.MISSING if v is None else v for v in (norms[i] for i in index)],
            )
            pos += width
            full: list[dict[str, Any] | None] = [None] * n_total
            for i, detail in zip(index, details, strict=True):
                full[i] = detail
            record["detail"] = full
        if meta["fired_names"]:
            dead: dict[str, list[int]] = {}
            for name in meta["fired_names"]:
                dead[name] = [int(values[pos]), int(values[pos + 1])]
                pos += 2
            record["dead_units"] = dead
        if meta["has_carried"]:
            record["grad_carried"] = values[pos] >= 0.5
            pos += 1
        if meta["has_inputs"]:
            record["inputs_finite"] = values[pos] >= 0.5
            pos += 1
        record["batches"] = meta["batches"]
        record["feeds"] = meta["feeds"]
        record["closure_evals"] = meta["closure_evals"]
        calls: list[str] = meta["calls"]
        grad_names: list[str] = meta["grad_names"]
        n_calls = len(calls)
        inputs_ok = values[pos : pos + n_calls]
        outputs_ok = values[pos + n_calls : pos + 2 * n_calls]
        grads_ok = values[pos + 2 * n_calls : pos + 2 * n_calls + len(grad_names)]
        pos += 2 * n_calls + len(grad_names)
        if meta.get("has_update"):
            updates: list[float | None] = [None] * n_total
            for i, value in zip(index, values[pos : pos + len(index)], strict=True):
                updates[i] = value
            pos += len(index)
            record["update_norms"] = updates
        anomalous = not math.isfinite(total) or any(
            v is not None and not math.isfinite(v) for v in losses
        )
        if anomalous and self.anomaly_step is None:
            self.anomaly_step = meta["step"]
            self._armed = 2
            if meta.get("nonfinite_params") is not None:
                record["nonfinite_params"] = meta["nonfinite_params"]
        if self.nan_origin is None and (calls or grad_names) and anomalous:
            broken = list(record.get("nonfinite_params") or [])
            for i, detail in enumerate(record.get("detail") or []):
                weight_norm = None if detail is None else detail.get("param_norm")
                if weight_norm is not None and not math.isfinite(weight_norm):
                    broken.append(self.parameters[i])
            broken_layers = {self.layers[self.parameters.index(name)] for name in broken}
            self.nan_origin = _locate_origin(
                meta["step"],
                calls,
                inputs_ok,
                outputs_ok,
                broken_layers,
                grad_names,
                grads_ok,
                losses,
            )
        record["overhead_s"] = meta["overhead_s"]
        return record

    def _nonfinite_params(self, params: list[torch.Tensor]) -> list[str]:
        with torch.no_grad():
            grouping = measure.group_tensors([p.detach() for p in params])
            norms = measure.per_tensor_norms([p.detach() for p in params], grouping).tolist()
        return [
            self.parameters[self._param_index[id(p)]]
            for p, value in zip(params, norms, strict=True)
            if not math.isfinite(value)
        ]

    def summary(self) -> dict[str, Any]:
        """What the collector saw over the whole run (for the child's summary message)."""
        return {
            "device": self.device,
            "parameters": self.parameters,
            "shapes": self.shapes,
            "layers": self.layers,
            "layer_types": self.layer_types,
            "optimizers": len(self.optimizers),
            "optimizer_kinds": list(self.optimizer_kinds),
            "optimizer_names": list(self.optimizer_names),
            "backward_calls": self.backward_calls,
            "saturating_modules": self.saturating_per_forward,
            "relu_modules": len(self.relu_modules),
            "ddp": self.ddp,
            "nan_origin": self.nan_origin,
            "events_total": dict(self.events_total),
            "double_unscale": self.double_unscale,
            "probe_s": self.probe_s,
        }


def _locate_origin(
    step: int,
    calls: list[str],
    inputs_ok: list[float],
    outputs_ok: list[float],
    broken_layers: set[str],
    grad_names: list[str],
    grads_ok: list[float],
    losses: list[float | None],
) -> dict[str, Any] | None:
    """The first place a non-finite value appeared in a traced step, forward before backward.

    Calls are in completion order (inner modules before the containers that hold them).
    """
    for i, name in enumerate(calls):
        if outputs_ok[i] >= 0.5:
            continue
        if name in broken_layers:
            return {
                "step": step,
                "phase": "parameters",
                "module": name,
                "detail": f"the parameters of `{name}` were already non-finite: an "
                "earlier update broke them",
            }
        if inputs_ok[i] < 0.5:
            if i == 0:
                return {
                    "step": step,
                    "phase": "input",
                    "module": name,
                    "detail": f"the input to `{name}` (the first module called) was "
                    "already non-finite: look at the batch",
                }
            return {
                "step": step,
                "phase": "forward",
                "module": name,
                "detail": f"the input to `{name}` was non-finite although no module "
                "before it produced a non-finite output: an operation between modules "
                "made it",
            }
        # Only the first module's input (the batch given to the model) is checked: a later
        # module's input may still come from the data (a model that slices its input per
        # time step), so "from finite inputs" is said only where it was measured.
        return {
            "step": step,
            "phase": "forward",
            "module": name,
            "detail": f"`{name}` produced a non-finite output from finite inputs"
            if i == 0
            else f"`{name}` produced the first non-finite output (every module called "
            "before it gave finite outputs)",
        }
    if any(v is not None and not math.isfinite(v) for v in losses):
        last = calls[-1] if calls else None
        return {
            "step": step,
            "phase": "loss",
            "module": last,
            "detail": "every module output was finite; the loss computation after "
            + (f"`{last}`" if last else "the model")
            + " produced the non-finite value",
        }
    for j, (name, ok) in enumerate(zip(grad_names, grads_ok, strict=False)):
        if ok >= 0.5:
            continue
        if j == 0:
            return {
                "step": step,
                "phase": "backward",
                "module": name,
                "detail": f"the gradient of the loss w.r.t. the output of `{name}` was "
                "already non-finite: the loss's backward made it",
            }
        consumer = None
        if name in calls:
            position = calls.index(name)
            consumer = calls[position + 1] if position + 1 < len(calls) else None
        where = f" (next module in forward order: `{consumer}`)" if consumer else ""
        return {
            "step": step,
            "phase": "backward",
            # The module where the non-finite gradient was born: the consumer when known.
            "module": consumer or name,
            "detail": f"the gradient w.r.t. the output of `{name}` is the first "
            f"non-finite one: it was born in the backward of what consumes it{where}",
        }
    return None
