"""Prove a fix by running it (``check --verify``, MCP ``diagnose(verify=true)``).

The static analyser's patch is applied to a scratch copy of the script (never to the user's
file), the original and the copy run under the runtime probe with the same steps, arguments,
working folder, interpreter and seed, and the two runs are compared: findings resolved,
remaining and new, the loss and gradient-norm series, and one status (``compare`` defines the
words). Never imports torch.

The names below load on first use (PEP 562), so that the result model (``verify.model``, part
of the server's output schema) comes without the runner.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gradient_doctor.probes.verify.compare import compare, run_side
    from gradient_doctor.probes.verify.model import (
        FoundId,
        RunSide,
        Verification,
        VerificationStatus,
    )
    from gradient_doctor.probes.verify.patching import (
        ChosenPatch,
        PatchError,
        apply_chosen,
        apply_diff,
        choose_patch,
    )
    from gradient_doctor.probes.verify.run import (
        DEFAULT_SEED,
        RunPlan,
        plan_runs,
        verify_patch,
    )

_HOMES = {
    "compare": "compare",
    "run_side": "compare",
    "FoundId": "model",
    "RunSide": "model",
    "Verification": "model",
    "VerificationStatus": "model",
    "ChosenPatch": "patching",
    "PatchError": "patching",
    "apply_chosen": "patching",
    "apply_diff": "patching",
    "choose_patch": "patching",
    "DEFAULT_SEED": "run",
    "RunPlan": "run",
    "plan_runs": "run",
    "verify_patch": "run",
}

__all__ = [
    "DEFAULT_SEED",
    "ChosenPatch",
    "FoundId",
    "PatchError",
    "RunPlan",
    "RunSide",
    "Verification",
    "VerificationStatus",
    "apply_chosen",
    "apply_diff",
    "choose_patch",
    "compare",
    "plan_runs",
    "run_side",
    "verify_patch",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value
