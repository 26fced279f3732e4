"""Gradient statistics computed on the gradients' own device with batched kernels (imports torch).

Cost model (issue 4): every step gathers only the per-tensor L2 norms, one
``torch._foreach_norm`` per (device, dtype) group, so the number of kernel launches grows with
the number of groups and not the number of tensors. A NaN or Inf anywhere in a tensor makes its
norm non-finite (NaN wins over Inf), which names the tensor; a zero norm marks a frozen or dead
tensor. The richer statistics (:func:`tensor_details`) are several passes over the gradients and
run only on sampled steps and at the first anomaly.

Nothing here keeps a reference to a gradient after returning, and everything that goes to the
host is packed into one vector so a step costs one device→host transfer (:class:`HostTransfer`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

#: Norm value standing for "this parameter has no gradient" in packed vectors.
MISSING = -1.0

GroupKey = tuple[torch.device, torch.dtype]


@dataclass
class Grouping:
    """Tensor indices grouped by (device, dtype), with index tensors cached on each device."""

    groups: dict[GroupKey, list[int]]
    index_on_home: dict[GroupKey, torch.Tensor]
    home: torch.device


def home_device(tensors: Sequence[torch.Tensor | None]) -> torch.device:
    """The device the packed statistics live on: the first accelerator seen, else the CPU."""
    for t in tensors:
        if t is not None and t.device.type != "cpu":
            return t.device
    return torch.device("cpu")


def group_tensors(tensors: Sequence[torch.Tensor | None]) -> Grouping:
    """Group the non-None tensors by (device, dtype)."""
    groups: dict[GroupKey, list[int]] = {}
    for index, t in enumerate(tensors):
        if t is None:
            continue
        groups.setdefault((t.device, t.dtype), []).append(index)
    home = home_device(tensors)
    index_on_home = {
        key: torch.tensor(indices, dtype=torch.long, device=home) for key, indices in groups.items()
    }
    return Grouping(groups, index_on_home, home)


def layout_key(tensors: Sequence[torch.Tensor | None]) -> tuple[Any, ...]:
    """A cheap fingerprint of which tensors exist and where, to know when to regroup."""
    return tuple(None if t is None else (t.device, t.dtype) for t in tensors)


def local_tensor(tensor: Any) -> Any:
    """The rank's own shard of a DTensor (FSDP2, tensor parallel); any other tensor unchanged.

    Statistics are taken on local shards (no collective inside a hook); the distributed probe
    (``probes.runtime.distributed``) merges them across ranks.
    """
    to_local = getattr(tensor, "to_local", None)
    return to_local() if callable(to_local) else tensor


def _group_norms(members: list[torch.Tensor], ord: float, grouping: Grouping) -> torch.Tensor:
    """Norms of same-device, same-dtype tensors: one foreach kernel, as float32 on home."""
    if ord == math.inf:
        # A rank's shard can be empty (a 1-element bias split over 2 ranks), and the max
        # of nothing is undefined for _foreach_norm: an empty shard's max |g| is 0.
        members = [m if m.numel() else m.new_zeros(1) for m in members]
    # Low-precision and fp32 tensors accumulate in fp32; float64 keeps its own precision
    # (foreach_norm refuses to narrow) and is cast afterwards.
    wide = members[0].dtype in (torch.float64, torch.complex128)
    norms = torch._foreach_norm(members, ord, dtype=None if wide else torch.float32)  # type: ignore[arg-type]
    stacked = torch.stack(list(norms)).to(torch.float32)
    if stacked.device != grouping.home:
        stacked = stacked.to(grouping.home, non_blocking=True)
    return stacked


def per_tensor_norms(
    tensors: Sequence[torch.Tensor | None], grouping: Grouping, ord: float = 2.0
) -> torch.Tensor:
    """Norm of every tensor as one float32 vector on the home device (``MISSING`` for None)."""
    if len(grouping.groups) == 1:
        # The common case — every tensor present, one device and dtype — needs no scatter.
        ((key, indices),) = grouping.groups.items()
        if len(indices) == len(tensors):
            return _group_norms([local_tensor(tensors[i]) for i in indices], ord, grouping)
    out = torch.full((len(tensors),), MISSING, dtype=torch.float32, device=grouping.home)
    for key, indices in grouping.groups.items():
        stacked = _group_norms([local_tensor(tensors[i]) for i in indices], ord, grouping)
        out.index_copy_(0, grouping.index_on_home[key], stacked)
    return out


@dataclass
class DetailVectors:
    """Packed per-tensor statistics of a sampled step (all float32 on the home device)."""

    max_abs: torch.Tensor
    total: torch.Tensor
    nonzero: torch.Tensor
    nans: torch.Tensor
    infs: torch.Tensor
    param_norm: torch.Tensor
    numel: list[int] = field(default_factory=list)

    def pack(self) -> torch.Tensor:
        """All statistics in one vector (for the single device→host transfer)."""
        return torch.cat(
            [self.max_abs, self.total, self.nonzero, self.nans, self.infs, self.param_norm]
        )


def finite_flag(tensor: torch.Tensor) -> torch.Tensor:
    """A 0-dim bool tensor, True when every element is finite (no host sync).

    One reduction instead of ``isfinite(t).all()``'s elementwise mask plus reduction: a NaN or
    Inf anywhere makes the float32 sum non-finite. (Finite values whose sum overflows float32
    would read as non-finite; activations and gradients are far from 3e38.)
    """
    return torch.isfinite(tensor.detach().sum(dtype=torch.float32))


#: Integer dtype of each float width, to count non-zero elements on their bits.
_SAME_WIDTH_INT = {2: torch.int16, 4: torch.int32, 8: torch.int64}


def _cpu_details(
    grads: list[torch.Tensor | None],
    params: list[torch.Tensor],
    param_grouping: Grouping,
    norms: torch.Tensor,
) -> DetailVectors:
    """:func:`tensor_details` on the CPU: one sweep per gradient, while it is still in cache.

    The passes run back to back on each tensor (a tensor of a few MB stays in the cores' caches
    between them) and their 0-dim results are stacked once per statistic instead of written
    element by element. The CPU ``_foreach_norm`` has no fast kernel for the 0- and inf-"norms",
    and ``count_nonzero`` is about three times slower on floats than on integers, so max |g|
    and the non-zero count both come from one transient ``|g|`` (freed before the next tensor):
    its max, and the non-zero count of its bits read as integers (``|g|`` has no ``-0.0``, so a
    zero bit pattern is exactly a zero; a NaN's bits are non-zero, as ``NaN != 0``).
    """
    n = len(grads)
    suspects = {i for i, value in enumerate(norms.tolist()) if not math.isfinite(value)}
    present = [i for i, g in enumerate(grads) if g is not None and g.numel()]
    peaks: list[torch.Tensor] = []
    nonzeros: list[torch.Tensor] = []
    sums: list[torch.Tensor] = []
    nans = torch.zeros(n, dtype=torch.float32)
    infs = torch.zeros(n, dtype=torch.float32)
    for index in present:
        g = grads[index]
        assert g is not None
        g = g.detach()
        magnitude = g.abs()
        peaks.append(magnitude.amax())
        bits = _SAME_WIDTH_INT.get(magnitude.element_size())
        nonzeros.append(
            torch.count_nonzero(magnitude.view(bits) if bits is not None else magnitude)
        )
        del magnitude
        sums.append(g.sum(dtype=torch.float32))
        if index in suspects:
            nans[index] = torch.isnan(g).sum()
            infs[index] = torch.isinf(g).sum()
    max_abs = torch.full((n,), MISSING, dtype=torch.float32)
    nonzero = torch.full((n,), MISSING, dtype=torch.float32)
    total = torch.zeros(n, dtype=torch.float32)
    if present:
        max_abs[present] = torch.stack(peaks).float()
        nonzero[present] = torch.stack(nonzeros).float()
        total[present] = torch.stack(sums)
    with torch.no_grad():
        param_norm = per_tensor_norms([p.detach() for p in params], param_grouping)
    return DetailVectors(
        max_abs=max_abs,
        total=total,
        nonzero=nonzero,
        nans=nans,
        infs=infs,
        param_norm=param_norm.to("cpu"),
        numel=[0 if g is None else g.numel() for g in grads],
    )


def tensor_details(
    grads: Sequence[torch.Tensor | None],
    params: Sequence[torch.Tensor],
    grouping: Grouping,
    param_grouping: Grouping,
    norms: torch.Tensor,
) -> DetailVectors:
    """Max |g|, sum, non-zero count, NaN and Inf counts of every gradient, and ‖w‖.

    A few passes over the gradients: run on sampled steps only. NaN and Inf are counted only in
    tensors whose norm (``norms``, this step's per-tensor norms) is already non-finite — on
    the CPU, where reading ``norms`` costs nothing; on an accelerator they are counted in every
    tensor, which avoids a host sync.
    """
    # FSDP2 / tensor-parallel DTensors: this rank's shard (see local_tensor).
    local_grads = [None if g is None else local_tensor(g) for g in grads]
    local_params = [local_tensor(p) for p in params]
    home = grouping.home
    if home.type == "cpu":
        return _cpu_details(local_grads, local_params, param_grouping, norms)
    n = len(local_grads)
    # foreach kernels: the inf-"norm" is max |g|, the 0-"norm" counts the non-zero elements.
    max_abs = per_tensor_norms(local_grads, grouping, float("inf"))
    nonzero = per_tensor_norms(local_grads, grouping, 0.0)
    sums: list[torch.Tensor] = []
    nans: list[torch.Tensor] = []
    infs: list[torch.Tensor] = []
    zero = torch.zeros((), dtype=torch.float32, device=home)
    for g in local_grads:
        if g is None:
            sums.append(zero)
            nans.append(zero)
            infs.append(zero)
            continue
        sums.append(g.sum(dtype=torch.float32).to(home, non_blocking=True))
        nans.append(torch.isnan(g).sum().to(home, torch.float32, non_blocking=True))
        infs.append(torch.isinf(g).sum().to(home, torch.float32, non_blocking=True))
    with torch.no_grad():
        param_norm = per_tensor_norms([p.detach() for p in local_params], param_grouping)
    if param_norm.device != home:
        param_norm = param_norm.to(home, non_blocking=True)
    return DetailVectors(
        max_abs=max_abs,
        total=torch.stack(sums) if n else zero.new_zeros(0),
        nonzero=nonzero,
        nans=torch.stack(nans) if n else zero.new_zeros(0),
        infs=torch.stack(infs) if n else zero.new_zeros(0),
        param_norm=param_norm,
        numel=[0 if g is None else g.numel() for g in local_grads],
    )


def unpack_details(
    values: Sequence[float], numel: Sequence[int], norms: Sequence[float]
) -> list[dict[str, float | int] | None]:
    """Turn a packed detail vector (host floats) back into per-tensor dictionaries."""
    n = len(numel)
    parts = [values[i * n : (i + 1) * n] for i in range(6)]
    max_abs, total, nonzero, nans, infs, param_norm = parts
    details: list[dict[str, float | int] | None] = []
    for i in range(n):
        if norms[i] == MISSING or numel[i] == 0:
            details.append(None)
            continue
        count = numel[i]
        mean = total[i] / count
        sumsq = norms[i] ** 2
        # var = E[g²] - mean²; numerically fine in float64 for gradient-sized numbers.
        var = max(sumsq / count - mean * mean, 0.0) if math.isfinite(sumsq) else math.nan
        std = math.sqrt(var * count / (count - 1)) if count > 1 and math.isfinite(var) else 0.0
        if not math.isfinite(var):
            std = math.nan
        w = param_norm[i]
        ratio = norms[i] / w if w > 0 else math.inf
        details.append(
            {
                "max_abs": max_abs[i],
                "mean": mean,
                "std": std,
                "zeros": int(count - nonzero[i]) if math.isfinite(nonzero[i]) else 0,
                "nans": int(nans[i]),
                "infs": int(infs[i]),
                "numel": count,
                "param_norm": w,
                "ratio": ratio,
            }
        )
    return details


class HostTransfer:
    """One device→host copy per step; on an accelerator it is asynchronous and read later.

    On the CPU the values are available at once. On CUDA the packed vector is copied with
    ``non_blocking=True`` into pinned memory and a CUDA event is recorded; :meth:`ready` returns
    the copies whose event has completed, so reading them never blocks the training stream.
    :meth:`flush` waits for everything (end of run).
    """

    def __init__(self) -> None:
        self._pending: list[tuple[Any, torch.Tensor, Any]] = []

    def submit(self, tag: Any, vector: torch.Tensor) -> None:
        """Start copying ``vector`` to the host; ``tag`` comes back with the values."""
        if vector.device.type == "cuda":
            host = torch.empty(vector.shape, dtype=vector.dtype, pin_memory=True)
            host.copy_(vector, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
            self._pending.append((tag, host, event))
        else:
            self._pending.append((tag, vector.detach().to("cpu"), None))

    def ready(self) -> list[tuple[Any, list[float]]]:
        """Copies that have landed, in submission order (never blocks)."""
        done: list[tuple[Any, list[float]]] = []
        while self._pending:
            tag, host, event = self._pending[0]
            if event is not None and not event.query():
                break
            self._pending.pop(0)
            done.append((tag, host.tolist()))
        return done

    def flush(self) -> list[tuple[Any, list[float]]]:
        """Wait for every pending copy and return them all."""
        for _, _, event in self._pending:
            if event is not None:
                event.synchronize()
        return self.ready()
