"""Data parallelism, child side: every rank measures, rank 0 merges (imports torch).

Installed by the probe's child process when ``WORLD_SIZE`` > 1, after the ordinary hooks
(``probes.runtime.child.hooks``), so its optimizer step pre-hook runs after the collector has
measured
the step. At every optimizer step each rank computes, on the gradients the optimizer is about
to consume (after DDP's all-reduce or FSDP's reduce-scatter):

- the L2 norm of each of its gradient tensors (the local shard, for DTensor parameters);
- whether its own loss and gradients are finite;
- on sampled steps, the norm of each replicated parameter;
- how many gradient all-reduce rounds ran since the previous step (a counting wrapper around
  DDP's communication hook: the default all-reduce, or the script's own Python hook).

The ranks send these to rank 0 with ``gather_object`` over a gloo group of the probe's own (CPU
tensors, whatever the training backend), and rank 0 writes one merged ``ranks`` message per step
(``probes.runtime.ranks.RankStep``). The collective runs where every rank is anyway (the
optimizer step), so it adds one small synchronisation per step and cannot deadlock with DDP's
own collectives.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.optim.optimizer as optimizer_module
from torch.nn.parallel import DistributedDataParallel

from . import measure
from .channel import ChannelWriter
from .collector import Collector
from .rankenv import DIVERGENCE_RTOL, LAUNCHER_GD, LAUNCHER_USER, RankEnv

#: Extra seconds the probe's own collective waits beyond the probe's timeout before giving up.
GROUP_TIMEOUT_MARGIN_S = 30.0


def _is_sharded(param: torch.Tensor) -> bool:
    placements = getattr(param, "placements", None)
    return bool(placements) and any(p.is_shard() for p in placements)  # type: ignore[union-attr]


def _optional(values: list[float]) -> list[float | None]:
    return [None if v == measure.MISSING else v for v in values]


def _rel_diff(a: float | None, b: float | None) -> float:
    """Relative difference of two norms; a gradient present on one rank only is infinitely far."""
    if a is None and b is None:
        return 0.0
    if a is None or b is None:
        return math.inf
    if not (math.isfinite(a) and math.isfinite(b)):
        return 0.0 if (math.isnan(a) and math.isnan(b)) or a == b else math.inf
    scale = max(abs(a), abs(b))
    return abs(a - b) / scale if scale > 0 else 0.0


def _vector_diff(a: list[float | None], b: list[float | None]) -> float:
    if len(a) != len(b):
        return math.inf
    return max((_rel_diff(x, y) for x, y in zip(a, b, strict=True)), default=0.0)


def _split_reference(vectors: list[list[float | None]]) -> tuple[list[int], float]:
    """Ranks whose vector differs from the reference, and the largest relative difference.

    The reference is the vector most ranks agree with (rank 0 wins ties, so with two ranks the
    other rank is named).
    """
    world = len(vectors)
    best, best_votes = 0, -1
    for candidate in range(world):
        votes = sum(
            _vector_diff(vectors[candidate], vectors[r]) <= DIVERGENCE_RTOL for r in range(world)
        )
        if votes > best_votes:
            best, best_votes = candidate, votes
    diffs = [_vector_diff(vectors[best], vectors[r]) for r in range(world)]
    diverging = [r for r in range(world) if diffs[r] > DIVERGENCE_RTOL]
    finite = [d for d in diffs if math.isfinite(d)]
    largest = max(diffs) if diffs else 0.0
    if not math.isfinite(largest):
        largest = max(finite, default=0.0) if not diverging else largest
    return diverging, largest


class RankProbe:
    """Per-rank measurement and rank-0 merging for one probed process."""

    def __init__(
        self,
        collector: Collector,
        writer: ChannelWriter,
        env: RankEnv,
        *,
        timeout_s: float = 120.0,
    ) -> None:
        self.collector = collector
        self.writer = writer
        self.env = env
        self.timeout_s = timeout_s
        self.pid = os.getpid()
        self.group: Any = None
        self.initialised: bool | None = None
        self.disabled: str | None = None
        self.rounds = 0
        self.buckets = 0
        self.counting = "none"
        self.sharded = 0
        self._grouping_cache: dict[int, tuple[tuple[Any, ...], measure.Grouping]] = {}

    # -- DDP communication hook --------------------------------------------------------------
    def _count(self, bucket: Any) -> bool:
        self.buckets += 1
        if bucket.is_last():
            self.rounds += 1
        return True

    def _counting(self, hook: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
        # DDP inspects the hook's signature: the parameters must be named (state, bucket) and
        # carry no annotation other than GradBucket, hence a lambda.
        return lambda state, bucket: self._count(bucket) and hook(state, bucket)

    def _attach(self, ddp: Any, register: Callable[..., Any]) -> None:
        """Register a counting default all-reduce on a DDP model the script did not hook."""
        if getattr(ddp, "_gradient_doctor_hook", None):
            return
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        try:
            register(ddp, ddp.process_group, self._counting(allreduce_hook))
        except Exception:  # a hook this probe cannot see; counting stays off for this model
            ddp._gradient_doctor_hook = "builtin-hook"
            return
        ddp._gradient_doctor_hook = "comm-hook"
        self.counting = "comm-hook" if self.counting == "none" else self.counting

    def _patch_ddp(self) -> Callable[[], None]:
        cls = DistributedDataParallel
        original_forward = cls.forward
        original_register = cls.register_comm_hook
        original_builtin = cls._register_builtin_comm_hook
        probe = self

        def forward(ddp: Any, *args: Any, **kwargs: Any) -> Any:
            if os.getpid() == probe.pid and not getattr(ddp, "_gradient_doctor_hook", None):
                probe._attach(ddp, original_register)
            return original_forward(ddp, *args, **kwargs)

        def register_comm_hook(ddp: Any, state: object, hook: Callable[..., Any]) -> None:
            ddp._gradient_doctor_hook = "user-hook"
            probe.counting = "user-hook"
            original_register(ddp, state, probe._counting(hook))

        def register_builtin(ddp: Any, comm_hook_type: Any) -> None:
            ddp._gradient_doctor_hook = "builtin-hook"
            probe.counting = "builtin-hook"
            original_builtin(ddp, comm_hook_type)

        cls.forward = forward  # type: ignore[method-assign,assignment]
        cls.register_comm_hook = register_comm_hook  # type: ignore[method-assign,assignment]
        cls._register_builtin_comm_hook = register_builtin  # type: ignore[method-assign]

        def undo() -> None:
            cls.forward = original_forward  # type: ignore[method-assign]
            cls.register_comm_hook = original_register  # type: ignore[method-assign]
            cls._register_builtin_comm_hook = original_builtin  # type: ignore[method-assign]

        return undo

    # -- per step -----------------------------------------------------------------------------
    def _ready(self) -> bool:
        if self.group is not None:
            return True
        if self.disabled is not None:
            return False
        if not (dist.is_available() and dist.is_initialized()):
            self.initialised = False
            self.disabled = (
                "the script did not initialise torch.distributed before its first optimizer "
                "step: the ranks trained independently and were not compared"
            )
            return False
        self.initialised = True
        try:
            self.group = dist.new_group(
                backend="gloo",
                timeout=timedelta(seconds=self.timeout_s + GROUP_TIMEOUT_MARGIN_S),
            )
        except Exception as exc:  # e.g. gloo missing from this build
            self.disabled = f"could not create the probe's gloo group: {exc}"
            return False
        return True

    def _norms(
        self, key: int, tensors: list[torch.Tensor | None], ord: float = 2.0
    ) -> list[float | None]:
        layout = measure.layout_key(tensors)
        cached = self._grouping_cache.get(key)
        if cached is None or cached[0] != layout:
            cached = (layout, measure.group_tensors(tensors))
            self._grouping_cache[key] = cached
        values = measure.per_tensor_norms(tensors, cached[1], ord).double().cpu().tolist()
        return _optional(values)

    def on_step_pre(self, opt: torch.optim.Optimizer) -> None:
        """The optimizer is about to step on every rank: measure, gather on rank 0, merge."""
        if os.getpid() != self.pid or not self._ready():
            return
        params = [p for group in opt.param_groups for p in group["params"]]
        sharded = [_is_sharded(p) for p in params]
        with torch.no_grad():
            grad_norms = self._norms(id(opt), [p.grad for p in params])
            losses = [t for t in self.collector.window.losses if t is not None]
            loss_finite = True
            if losses:
                loss_finite = bool(torch.stack([t.float() for t in losses]).isfinite().all())
            param_norms = shard_numel = shard_max = None
            if self.collector.window.sampled:
                replicated = [p.detach() for p, s in zip(params, sharded, strict=True) if not s]
                param_norms = self._norms(-id(opt), list(replicated))
                if any(sharded):
                    # For the whole tensor's max |g| and element count (the pictures' RMS |g|).
                    grads = [p.grad for p in params]
                    shard_max = self._norms(id(opt), grads, math.inf)
                    shard_numel = [
                        0 if g is None else measure.local_tensor(g).numel() for g in grads
                    ]
        payload = {
            "norms": grad_norms,
            "params": param_norms,
            "numel": shard_numel,
            "max_abs": shard_max,
            "loss_finite": loss_finite,
            "rounds": self.rounds,
            "buckets": self.buckets,
        }
        self.rounds = self.buckets = 0
        gathered: list[Any] | None = None
        if dist.get_rank() == 0:
            gathered = [None] * dist.get_world_size(self.group)
        try:
            dist.gather_object(payload, gathered, dst=0, group=self.group)
        except Exception as exc:  # a rank died or timed out: the launcher reports that
            self.disabled = f"merging across ranks stopped at step {self._step()}: {exc}"
            self.group = None
            return
        if gathered is not None:
            index = [self.collector._param_index.get(id(p), -1) for p in params]
            self.sharded = max(self.sharded, sum(sharded))
            self.writer.send("ranks", self._merge(gathered, index, sharded))

    def _step(self) -> int:
        # The collector's own pre-hook ran first and counts this step once it returns.
        return self.collector.steps_done + 1

    def _merge(
        self, gathered: list[dict[str, Any]], index: list[int], sharded: list[bool]
    ) -> dict[str, Any]:
        world = len(gathered)
        norms: list[list[float | None]] = [g["norms"] for g in gathered]
        global_norms: dict[int, float] = {}
        for i, where in enumerate(index):
            if where < 0:
                continue
            values = [n[i] for n in norms if i < len(n)]
            if sharded[i]:
                present = [v for v in values if v is not None]
                if present:
                    global_norms[where] = math.sqrt(math.fsum(v * v for v in present))
            elif values and values[0] is not None:
                global_norms[where] = values[0]
        global_numel: dict[int, int] = {}
        global_max: dict[int, float] = {}
        if all(g.get("numel") is not None for g in gathered):
            for i, where in enumerate(index):
                if where >= 0 and sharded[i]:
                    global_numel[where] = sum(int(g["numel"][i]) for g in gathered)
                    peaks = [g["max_abs"][i] for g in gathered if g["max_abs"][i] is not None]
                    if peaks:
                        global_max[where] = max(peaks)

        def total(vector: list[float | None], keep: list[bool]) -> float:
            return math.sqrt(
                math.fsum(v * v for v, k in zip(vector, keep, strict=False) if k and v is not None)
            )

        replicated_mask = [not s for s in sharded]
        replicated = [[v for v, k in zip(n, replicated_mask, strict=False) if k] for n in norms]
        diverging: list[int] = []
        largest = 0.0
        if any(replicated_mask):
            diverging, largest = _split_reference(replicated)
        param_vectors = [g["params"] for g in gathered]
        param_diverging: list[int] = []
        param_largest = None
        if all(v is not None for v in param_vectors) and any(replicated_mask):
            param_diverging, param_largest = _split_reference(param_vectors)
        counted = self.counting in ("comm-hook", "user-hook")
        return {
            "step": self._step(),
            "world_size": world,
            "rank_norms": [total(n, [True] * len(n)) for n in norms],
            "replicated_norms": [total(n, replicated_mask) for n in norms],
            "max_rel_diff": largest if math.isfinite(largest) else 1e308,
            "diverging_ranks": diverging,
            "param_diverging_ranks": param_diverging,
            "param_max_rel_diff": param_largest,
            "nonfinite_grad_ranks": [
                r
                for r, n in enumerate(norms)
                if any(v is not None and not math.isfinite(v) for v in n)
            ],
            "nonfinite_loss_ranks": [r for r, g in enumerate(gathered) if not g["loss_finite"]],
            "allreduces": gathered[0]["rounds"] if counted else None,
            "allreduce_buckets": gathered[0]["buckets"] if counted else None,
            "global_grad_norms": global_norms,
            "global_numel": global_numel,
            "global_max_abs": global_max,
            "sharded_parameters": sum(sharded),
        }

    # -- lifecycle ----------------------------------------------------------------------------
    def install(self) -> Callable[[], None]:
        """Register the step hook (after the collector's) and the DDP patches; returns undo."""
        handle = optimizer_module.register_optimizer_step_pre_hook(
            lambda opt, args, kwargs: self.on_step_pre(opt)
        )
        undo_ddp = self._patch_ddp()

        def undo() -> None:
            handle.remove()
            undo_ddp()

        return undo

    def report(self) -> dict[str, Any]:
        """The end-of-run ``distributed`` message (``probes.runtime.ranks.DistributedInfo``)."""
        backend = None
        try:
            if dist.is_available() and dist.is_initialized():
                backend = str(dist.get_backend())
        except Exception:
            backend = None
        return {
            "world_size": self.env.world_size,
            "launcher": LAUNCHER_GD if self.env.launched_here else LAUNCHER_USER,
            "rank": self.env.rank,
            "backend": backend,
            "initialised": bool(self.initialised) if self.initialised is not None else True,
            "allreduce_counting": self.counting,
            "sharded_parameters": self.sharded,
            "note": self.disabled,
        }


def install(
    collector: Collector, writer: ChannelWriter, env: RankEnv, settings: dict[str, Any]
) -> RankProbe:
    """Start the rank probe for this process (call after ``hooks.install``)."""
    probe = RankProbe(collector, writer, env, timeout_s=float(settings.get("timeout_s", 120.0)))
    probe.install()
    return probe
