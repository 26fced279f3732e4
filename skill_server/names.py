"""Best-effort guess of the user's own names (model, optimizer, loss...) for fix snippets.

The report's "Code to Add" reads better in the user's vocabulary: ``net.parameters()`` rather
than ``model.parameters()``. Each name is taken from a plain, unambiguous pattern in the script
(an assignment from ``torch.optim.X(...)``, the receiver of ``.parameters()``, the ``% N == 0``
gate around the optimizer step, the loop that calls ``backward()``...). A name that
cannot be found is simply left out and the snippet keeps its default, so a wrong guess is
never forced: the snippet renderer also rejects anything that is not a valid name.
"""

from __future__ import annotations

import re
from collections import Counter

_NAME = r"[A-Za-z_][\w]*(?:\.[A-Za-z_]\w*)*"
_ASSIGNED_FROM: dict[str, re.Pattern[str]] = {
    "optimizer": re.compile(rf"^\s*({_NAME})\s*=\s*(?:torch\.)?optim\.[A-Z]\w*\(", re.M),
    "criterion": re.compile(rf"^\s*({_NAME})\s*=\s*(?:torch\.)?nn\.\w*Loss\w*\(", re.M),
    "scaler": re.compile(
        rf"^\s*({_NAME})\s*=\s*(?:torch\.(?:cuda\.)?amp\.|amp\.)?GradScaler\(", re.M
    ),
    "scheduler": re.compile(
        rf"^\s*({_NAME})\s*=\s*(?:torch\.optim\.|optim\.)?lr_scheduler\.\w+\(", re.M
    ),
}
_PARAMETERS_OF = re.compile(rf"({_NAME})\.parameters\(\)")
_BACKWARD_OF = re.compile(rf"(?<![\w.)])({_NAME})\.backward\(")
_GATED_EVERY = re.compile(r"%\s*([A-Za-z_]\w*|\d+)\s*==\s*0")
# ``optimizer.step()``, ``opt_d.step()``, ``scaler.step(optimizer)``; not a scheduler's step.
_OPTIMIZER_STEP = re.compile(r"(?<![\w.])(?![\w.]*sched)(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*\.step\(")
_LOOP_OVER = re.compile(rf"^\s*for\s+.+\s+in\s+(?:enumerate\()?({_NAME})\)?\s*:", re.M)
_MAX_NORM = re.compile(r"max_norm\s*=\s*([0-9]+(?:\.[0-9]*)?(?:e-?[0-9]+)?)")
# ``clip_grad_norm_(model.parameters(), args.clip)``: the threshold given by position.
_MAX_NORM_POSITIONAL = re.compile(
    rf"clip_grad_norm_?\(\s*{_NAME}\.parameters\(\)\s*,\s*"
    rf"({_NAME}|[0-9]+(?:\.[0-9]*)?(?:e-?[0-9]+)?)\s*[,)]"
)
# ``for i, (inputs, targets) in enumerate(loader...)`` or ``for inputs, targets in loader:``:
# the batch's own names, so the snippet's loop reads like the user's.
_BATCH_LOOP = re.compile(
    rf"^\s*for\s+(?:([A-Za-z_]\w*)\s*,\s*\(\s*([A-Za-z_]\w*)\s*,\s*([A-Za-z_]\w*)\s*\)"
    rf"\s+in\s+enumerate\(\s*({_NAME})\s*[,)]"
    rf"|\(?\s*([A-Za-z_]\w*)\s*,\s*([A-Za-z_]\w*)\s*\)?\s+in\s+({_NAME})\s*:)",
    re.M,
)
# ``loss = F.nll_loss(...)``: a functional loss stands where the snippets call ``criterion``.
_FUNCTIONAL_LOSS = re.compile(
    r"^\s*([A-Za-z_]\w*)\s*=\s*((?:F|nn\.functional|torch\.nn\.functional)\.\w+)\(", re.M
)


def _most_common(pattern: re.Pattern[str], source: str, exclude: set[str]) -> str | None:
    counts = Counter(m for m in pattern.findall(source) if m not in exclude)
    return counts.most_common(1)[0][0] if counts else None


def guess_names(source: str) -> dict[str, str]:
    """The snippet parameters this script names unambiguously (see ``templates.snippets``)."""
    names: dict[str, str] = {}
    for key, pattern in _ASSIGNED_FROM.items():
        found = set(pattern.findall(source))
        if len(found) == 1:
            names[key] = found.pop()
    model = _most_common(_PARAMETERS_OF, source, exclude={"torch", "nn"})
    if model is not None:
        names["model"] = model
    loss = _most_common(_BACKWARD_OF, source, exclude=set())
    if loss is not None and "." not in loss:
        names["loss"] = loss
    lines = source.splitlines()
    # Only a ``% N == 0`` gate around an optimizer step is accumulation; one around a print,
    # a checkpoint or an evaluation (``if i % 100 == 0: print(...)``) says nothing about it.
    every = {
        found
        for index, line in enumerate(lines)
        if line.lstrip().startswith(("if ", "elif "))
        for found in _GATED_EVERY.findall(line)
        if _OPTIMIZER_STEP.search(_block(lines, index))
    }
    if len(every) == 1:
        names["accumulation_steps"] = every.pop()
    # ``for group in optimizer.param_groups:`` (a learning-rate update) is no data loader.
    loops = [
        (m.group(1), _block(lines, source.count("\n", 0, m.start())))
        for m in _LOOP_OVER.finditer(source)
        if m.group(1) not in ("range",) and not m.group(1).endswith("param_groups")
    ]
    loaders = {name for name, _ in loops}
    # Separate train and test loops: the loader is the one whose loop calls backward().
    training = {name for name, body in loops if ".backward(" in body}
    if len(loaders) == 1:
        names["loader"] = loaders.pop()
    elif len(training) == 1:
        names["loader"] = training.pop()
    norms = set(_MAX_NORM.findall(source)) | set(_MAX_NORM_POSITIONAL.findall(source))
    if len(norms) == 1:
        names["max_norm"] = norms.pop()
    names.update(_batch_names(source, names.get("loader")))
    if "criterion" not in names and "loss" in names:
        loss_name = names["loss"]
        functional = {f for target, f in _FUNCTIONAL_LOSS.findall(source) if target == loss_name}
        if len(functional) == 1:
            names["criterion"] = functional.pop()
    return names


def _block(lines: list[str], index: int) -> str:
    """The compound statement starting at ``lines[index]``: what follows its header's last
    colon on the same line, and the lines indented deeper than the header below it."""
    header = lines[index]
    indent = len(header) - len(header.lstrip())
    body = [header.rpartition(":")[2]]
    for line in lines[index + 1 :]:
        stripped = line.strip()
        if stripped and not stripped.startswith("#") and len(line) - len(line.lstrip()) <= indent:
            break
        body.append(line)
    return "\n".join(body)


def _batch_names(source: str, loader: str | None) -> dict[str, str]:
    """``step``, ``inputs``, ``targets`` from the one loop that unpacks a batch of ``loader``."""
    if loader is None:
        return {}
    found = set()
    for m in _BATCH_LOOP.finditer(source):
        if m.group(4) == loader:
            found.add((m.group(1), m.group(2), m.group(3)))
        elif m.group(7) == loader:
            found.add((None, m.group(5), m.group(6)))
    if len(found) != 1:
        return {}
    step, inputs, targets = found.pop()
    if inputs == targets or step in (inputs, targets):
        return {}
    names = {"inputs": inputs, "targets": targets}
    if step is not None and step != "_":
        names["step"] = step
    return names
