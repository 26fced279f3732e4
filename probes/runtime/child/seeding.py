"""Seeds for a verification run, and what tells whether two runs started alike (child side).

``check --verify`` runs the script twice, the original and a patched copy, and compares them.
That comparison means something only if both runs start from the same weights and data, so
before the script runs:

- :func:`seed_generators` seeds Python's ``random``, torch (every device) and, when it can be
  imported, numpy's global generator with the same number in both runs;
- :class:`SeedRecorder` wraps ``torch.manual_seed``, ``random.seed`` and ``numpy.random.seed``
  to record the script's own calls (a script that reseeds itself replaces our seed; with a
  constant both runs still start alike, with the clock they do not);
- :class:`StartFingerprint` reads, at the first forward call of a module that has parameters,
  sums of those parameters and of the tensors given to it: the starting weights and the first
  batch. The parent compares the two runs' fingerprints (no patch of ours changes the code that
  runs before the first forward, so a difference means the script is not deterministic).

Standard library + torch only (this runs in the user's interpreter).
"""

from __future__ import annotations

import functools
import os
import random
import sys
from typing import Any

#: Calls recorded in full; the rest are only counted.
MAX_RECORDED_CALLS = 12
#: numpy's legacy global seed must fit in 32 bits.
_NUMPY_SEED_MODULUS = 2**32


def seed_generators(torch: Any, seed: int) -> list[str]:
    """Seed ``random``, torch and (if importable) numpy with ``seed``; the names seeded."""
    seeded = ["random", "torch"]
    random.seed(seed)
    torch.manual_seed(seed)  # also seeds every CUDA device
    try:
        import numpy
    except Exception:  # numpy absent or broken in this interpreter: nothing to seed there
        return seeded
    numpy.random.seed(seed % _NUMPY_SEED_MODULUS)
    seeded.append("numpy")
    return seeded


def _caller_location(probe_folder: str) -> str | None:
    """``file:line`` of the first frame outside this package (the script or its library)."""
    frame = sys._getframe(1)
    while frame is not None:
        filename = frame.f_code.co_filename
        if not os.path.abspath(filename).startswith(probe_folder):
            return f"{filename}:{frame.f_lineno}"
        frame = frame.f_back  # type: ignore[assignment]
    return None


class SeedRecorder:
    """Records the script's calls to the global seeding functions (they still run)."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.count = 0
        self._folder = os.path.dirname(os.path.abspath(__file__)) + os.sep

    def install(self, torch: Any) -> None:
        """Wrap ``torch.manual_seed`` (and its ``torch.random`` alias), ``random.seed`` and,
        when numpy is already imported, ``numpy.random.seed``."""
        wrapped = self._wrap(torch.manual_seed, "torch.manual_seed")
        torch.manual_seed = wrapped
        if getattr(torch, "random", None) is not None:
            torch.random.manual_seed = wrapped
        random.seed = self._wrap(random.seed, "random.seed")
        numpy = sys.modules.get("numpy")
        if numpy is not None and hasattr(numpy, "random"):
            numpy.random.seed = self._wrap(numpy.random.seed, "numpy.random.seed")

    def _wrap(self, original: Any, label: str) -> Any:
        @functools.wraps(original)
        def seeding(*args: Any, **kwargs: Any) -> Any:
            self.count += 1
            if len(self.calls) < MAX_RECORDED_CALLS:
                value = args[0] if args else kwargs.get("seed", kwargs.get("a"))
                self.calls.append(
                    {
                        "function": label,
                        "seed": repr(value)[:60],
                        "where": _caller_location(self._folder),
                    }
                )
            return original(*args, **kwargs)

        return seeding


def _tensors(value: Any, depth: int = 0) -> list[Any]:
    """Tensors in a forward call's arguments (lists, tuples and dicts, two levels deep)."""
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if depth >= 2:
        return []
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in _tensors(item, depth + 1)]
    if isinstance(value, dict):
        return [t for item in value.values() for t in _tensors(item, depth + 1)]
    return []


def _sums(tensors: list[Any]) -> list[float]:
    """[sum, sum of |x|, element count] over the floating-point ``tensors`` (float64)."""
    import torch

    total = 0.0
    absolute = 0.0
    count = 0
    with torch.no_grad():
        for tensor in tensors:
            if tensor.is_complex():
                values = torch.view_as_real(tensor.detach()).double()
            else:
                values = tensor.detach().double()
            total += float(values.sum())
            absolute += float(values.abs().sum())
            count += tensor.numel()
    return [total, absolute, float(count)]


class StartFingerprint:
    """Sums of the starting weights and the first batch, read at the first forward call of a
    module with parameters (a global forward pre-hook, removed once it has read them)."""

    def __init__(self) -> None:
        self.values: list[float] | None = None
        self.module: str | None = None
        self._handle: Any = None

    def install(self, torch: Any) -> None:
        register = getattr(torch.nn.modules.module, "register_module_forward_pre_hook", None)
        if register is not None:
            self._handle = register(self._first_forward)

    def _first_forward(self, module: Any, args: Any) -> None:
        if self.values is not None:
            return
        parameters = list(module.parameters())
        if not parameters:
            return
        try:
            self.values = _sums(parameters) + _sums(_tensors(args))
            self.module = type(module).__name__
        except Exception:  # an exotic tensor subclass: no fingerprint rather than a failure
            self.values = []
        if self._handle is not None:
            self._handle.remove()
            self._handle = None


def report(
    seed: int | None,
    seeded: list[str],
    recorder: SeedRecorder | None,
    fingerprint: StartFingerprint | None,
    threads: int | None,
) -> dict[str, Any]:
    """The ``seeding`` message the parent reads (``probes.runtime.result.SeedingInfo``)."""
    return {
        "seed": seed,
        "seeded": seeded,
        "reseeds": list(recorder.calls) if recorder is not None else [],
        "reseed_count": recorder.count if recorder is not None else 0,
        "start_fingerprint": (fingerprint.values or None) if fingerprint is not None else None,
        "start_module": fingerprint.module if fingerprint is not None else None,
        "threads": threads,
    }
