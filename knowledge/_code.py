"""Code in a question: finding it, repairing it, and reading it.

Private to ``knowledge.matcher``. Code arrives in pieces: fenced or indented blocks, inline
spans, statements joined by ``;`` in a sentence, a loop body without its loop, pseudo-code
with ``...``, lines at the wrong indentation. :func:`split_code` separates it from the prose,
:func:`fragment_source` repairs it into parseable Python, and :func:`code_hits` reads it twice:
with the static analyser (``probes.static.lint_source``, imported on first use) and with light
order rules over call events (clip after ``step()``, zeroing per micro-batch under a
``% N`` gate ...), which also read fragments too broken to parse. The module also holds the
sentence rules (:func:`prose_hits`: "I clip after the optimizer step").
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import NamedTuple

from gradient_doctor.knowledge import _regex

# Call events, in the order they appear in the fragment.
_EVENTS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("scaled_backward", _regex.compile(r"\.scale\s*\([^\n]*?\)\s*\.\s*backward\s*\(")),
    (
        "backward",
        _regex.compile(r"(?<![\w.])(?:[\w\]\)]+\s*\)?\s*\.\s*)?backward\s*\(|\.\s*backward\s*\("),
    ),
    ("unscale", _regex.compile(r"\.\s*unscale_\s*\(")),
    ("clip_norm", _regex.compile(r"clip_grad_norm_?\s*\(|clip_grad_norm\b|clip_gradients?\s*\(")),
    ("clip_value", _regex.compile(r"clip_grad_value_?\s*\(")),
    ("scaler_step", _regex.compile(r"\bscaler\w*\s*\.\s*step\s*\(")),
    ("sched_step", _regex.compile(r"\b\w*(?:sched|lr_sched|scheduler|warmup)\w*\s*\.\s*step\s*\(")),
    ("opt_step", _regex.compile(r"\b\w*(?:optim|opt)\w*\s*\.\s*step\s*\(")),
    ("zero_grad", _regex.compile(r"zero_grad\s*\(|\.grad\s*=\s*None|\.grad\.zero_\s*\(")),
    (
        "norm_read",
        # A computation of the norm (not a later use of a variable that holds it). A loop
        # written by hand measures it too: ``total += p.grad.norm() ** 2``,
        # ``p.grad.detach().pow(2).sum()``, ``torch.norm(p.grad)``, ``sum(g.norm() ** 2 for
        # ...)`` over the parameters' gradients.
        _regex.compile(
            r"\.grad\w*(?:\.data)?\s*\.\s*norm\s*\(|\b\w*(?:grad|total)_?norms?\w*\s*\("
            r"|\b\w*norm\w*\s*=\s*[^=\n]*\.grad\b"
            r"|\.grad\b(?:\s*\.\s*(?:data|detach\s*\(\s*\)|float\s*\(\s*\)|double\s*\(\s*\)"
            r"|clone\s*\(\s*\)|cpu\s*\(\s*\)|to\s*\([^()\n]*\)))*\s*(?:\.\s*(?:norm|pow|square|abs)"
            r"\s*\(|\)?\s*\*\*\s*2\b)"
            r"|\b(?:torch\s*\.\s*)?(?:linalg\s*\.\s*)?(?:vector_)?norm\s*\(\s*[\w.\[\]]*\.grad\b"
        ),
    ),
    (
        "grad_div",
        _regex.compile(
            r"\.grad(?:\.data)?\s*(?:/=|\*=|\.div_\s*\(|\.mul_\s*\(|=\s*[\w.]+\.grad\s*/)"
        ),
    ),
    ("accum_gate", _regex.compile(r"\bif\b[^\n]*%[^\n]*")),
)
_SCALER = _regex.compile(r"GradScaler\s*\(|\bscaler\s*\.\s*scale\s*\(|\bscaler\b")
_DDP = _regex.compile(r"DistributedDataParallel|\bDDP\s*\(|torchrun|init_process_group")
_NO_SYNC = _regex.compile(r"no_sync\s*\(|require_backward_grad_sync")
_LOSS_DIVIDED = _regex.compile(
    r"loss\w*\s*(?:/|\*\s*\(?\s*1(?:\.0)?\s*/|\.div)|loss\w*\s*/=|/\s*\w*(?:accum|grad_acc|gas|"
    r"n_micro|micro)\w*|\bloss\w*\s*=\s*[^\n]*/\s*[\w.()]+|\*\s*\(?\s*1\s*/\s*\w+"
    # The divided expression itself is backpropagated: ``(model(b) / 4).backward()``.
    r"|/\s*[\w.]+\s*\)\s*\.\s*backward\s*\("
    # A loss helper that returns the divided loss.
    r"|\breturn\s+[^\n]*/\s*[\w.()]+"
)
_MAX_NORM = _regex.compile(
    r"clip_grad_norm_?\s*\([^,()]*(?:\([^()]*\))?[^,()]*,\s*(?:max_norm\s*=\s*)?"
    r"(?P<num>\d*\.?\d+(?:e[-+]?\d+)?)|max_norm\s*=\s*(?P<kw>\d*\.?\d+(?:e[-+]?\d+)?)"
)
_SEQUENCE_MODEL = _regex.compile(
    r"nn\.(?:LSTM|GRU|RNN|Transformer\w*|MultiheadAttention)\b|GPT|Bert|T5|policy_gradient|"
    r"log_prob",
)
#: A sequence model or policy-gradient training named in the words around the code.
_DIVISOR = _regex.compile(r"/\s*([A-Za-z_][\w.]*(?:\(\s*\))?)")
_LOOP_HEADER = _regex.compile(r"^\s*(?:for|while)\b")
_ZEROED = _regex.compile(r"zero_grad|\.grad\s*=\s*None|set_to_none|\.grad\.zero_|zero_\(\)")
_NO_SYNC_BLOCK = _regex.compile(r"^\s*with\s+[\w.]*no_sync\s*\(\s*\)\s*:")
_NO_SYNC_CONDITIONAL = _regex.compile(
    r"nullcontext|ExitStack|require_backward_grad_sync|\bif\b[^\n]*no_sync|no_sync[^\n]*\bif\b"
)
_FP16_PRECISION = _regex.compile(r"precision\s*=\s*['\"]?16(?:-mixed)?\b|amp_backend")
_FP16_PROSE = _regex.compile(
    r"\bfp16\b|float16|16-mixed|precision\s*=\s*['\"]?16\b|half[\s-]precision|GradScaler",
    re.IGNORECASE,
)
_SEQUENCE_PROSE = _regex.compile(
    r"\b(?:transformers?|lstms?|grus?|rnns?|gpt\w*|bert|t5|llms?|seq2seq|language\s+models?|"
    r"policy[\s-]gradients?|ppo|reinforce)\b",
    re.IGNORECASE,
)
_CLIP_WORD = _regex.compile(r"\bclip", re.IGNORECASE)
_SATURATING = _regex.compile(r"nn\.(?:Sigmoid|Tanh)\s*\(|torch\.(?:sigmoid|tanh)\s*\(")
_UNSTABLE_OP = _regex.compile(
    r"torch\.log\s*\((?P<a>[^()\n]*(?:\([^()\n]*\))?[^()\n]*)\)|\.log\s*\(\s*\)|"
    r"torch\.sqrt\s*\((?P<b>[^\n]*)|torch\.exp\s*\("
)
_EPS = _regex.compile(r"eps|1e-|clamp|\+\s*\d")
_TOKEN_MEAN = _regex.compile(r"ignore_index|pad_token|pad_id|padding_idx|-100\b")
_DIVIDED_BY_N = _regex.compile(
    r"(?<!/)/\s*[\w.]*(?:accum|grad_acc|gas\b|n_micro|micro)\w*", re.IGNORECASE
)
_GRAD_DIV_BY_N = _regex.compile(
    r"\.grad(?:\.data)?\s*(?:/=\s*|\.div_\s*\(\s*|\*=\s*1(?:\.0)?\s*/\s*|\.mul_\s*\(\s*1(?:\.0)?\s*/\s*)"
    r"[\w.]*(?:accum|grad_acc|gas\b|n_micro|micro)",
    re.IGNORECASE,
)
#: ``from torch.nn.utils import clip_grad_norm_ as clip``: the alias is a clip call too.
#: A trainer configured to clip element by element (Lightning's ``gradient_clip_algorithm``).
_CLIP_BY_VALUE_SETTING = _regex.compile(r"gradient_clip_algorithm\s*[=:]\s*['\"]?value\b")
_CLIP_ALIAS = _regex.compile(r"\bclip_grad_(norm|value)_?\s+as\s+(\w+)")
_LEFTOVER_HANDLED = _regex.compile(r"len\s*\(\s*\w*loader\w*\s*\)|is_last|last_batch|remainder")
_LIGHTNING = _regex.compile(r"pl\.Trainer|Trainer\s*\(|LightningModule|on_after_backward")


@dataclass(frozen=True)
class Event:
    """One call event: its kind, line (0-based), indentation, line text and enclosing ``def``."""

    kind: str
    line: int
    indent: int
    text: str
    scope: int = 0


@dataclass(frozen=True)
class CodeHit:
    """A rule that fired: the entry id it points to, how sure (0–1) and why."""

    entry_id: str
    strength: float
    reason: str
    #: The rationalization to credit instead when the text gives this as advice.
    advice_id: str | None = None


_DEF = _regex.compile(r"^\s*(?:async\s+)?def\s")
_MICRO_LOOP = _regex.compile(
    r"^\s*for\b[^\n]*\bin\b[^\n]*(?:accum|micro|gas\b|grad_acc|n_acc|\bmbs?\b)"
    r"|^\s*for\s+(?:micro\w*|mb)\b",
    re.IGNORECASE,
)
_UNSCALE_ARG = _regex.compile(r"unscale_\s*\(\s*([^)]*)\)")


def _events(lines: list[str]) -> list[Event]:
    events: list[Event] = []
    scope = 0
    def_indent: int | None = None
    patterns = list(_EVENTS)
    for kind, alias in _CLIP_ALIAS.findall("\n".join(lines)):
        event = "clip_norm" if kind == "norm" else "clip_value"
        patterns.append((event, _regex.compile(rf"(?<![\w.]){re.escape(alias)}\s*\(")))
    for number, raw_line in enumerate(lines):
        line = raw_line.split("#", 1)[0] if "#" in raw_line else raw_line
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip(" \t"))
        if _DEF.match(line):
            scope += 1
            def_indent = indent
        elif def_indent is not None and indent <= def_indent:
            # Back at the def's own indentation: the helper's body has ended, and the code
            # after it (the loop that calls it) is a scope of its own.
            scope += 1
            def_indent = None
        hits: list[tuple[int, str]] = []
        taken: list[tuple[int, int]] = []
        for kind, pattern in patterns:
            for m in pattern.finditer(line):
                span = (m.start(), m.end())
                if any(s < span[1] and span[0] < e for s, e in taken):
                    continue
                taken.append(span)
                hits.append((m.start(), kind))
        for _, kind in sorted(hits):
            events.append(Event(kind, number, indent, line.strip(), scope))
    return events


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" \t"))


def _block_end(lines: list[str], header: int) -> int:
    """The line after the indented block that starts below ``header`` (a ``for``/``if`` line)."""
    base = _indent(lines[header])
    for number in range(header + 1, len(lines)):
        text = lines[number].split("#", 1)[0]
        if text.strip() and _indent(text) <= base:
            return number
    return len(lines)


@dataclass(frozen=True)
class _Accumulation:
    """Where the micro-steps and the update of an accumulation loop are."""

    form: str  # "gate" (if step % N: …) or "loop" (for micro in range(N): …)
    header: Event
    end: int
    indented: bool

    def is_update(self, e: Event) -> bool:
        """``e`` runs once per optimizer update."""
        if self.form == "gate":
            if e.line == self.header.line:
                return not self.header.text.rstrip().endswith(":")
            if self.indented:
                return self.header.line < e.line < self.end
            # No indentation left: the update is what follows the gate.
            return e.line > self.header.line
        return e.line >= self.end and e.scope == self.header.scope

    def is_micro(self, e: Event, loop_indent: int) -> bool:
        """``e`` runs on every micro-batch."""
        if e.scope != self.header.scope:
            return False
        if self.form == "loop":
            return self.header.line < e.line < self.end
        if self.is_update(e):
            return False
        if self.indented:
            return e.indent >= loop_indent and e.indent >= self.header.indent
        return e.line < self.header.line


def _accumulation(events: list[Event], lines: list[str]) -> _Accumulation | None:
    indented = any(e.indent > 0 for e in events)
    steps = [e for e in events if e.kind in ("opt_step", "scaler_step")]
    for gate in (e for e in events if e.kind == "accum_gate"):
        end = _block_end(lines, gate.line) if indented else len(lines)
        candidate = _Accumulation("gate", gate, end, indented)
        # A % gate that does not hold the optimizer step is logging or evaluation.
        gated = [s for s in steps if candidate.is_update(s) and s.scope == gate.scope]
        if gated and (indented or gated[0] == next((s for s in steps if s.line > gate.line), None)):
            return candidate
    for number, line in enumerate(lines):
        if _MICRO_LOOP.match(line):
            header = Event("micro_loop", number, _indent(line), line.strip(), 0)
            scope = next((e.scope for e in events if e.line >= number), 0)
            header = Event("micro_loop", number, _indent(line), line.strip(), scope)
            end = _block_end(lines, number)
            inside = {e.kind for e in events if number < e.line < end}
            # The micro-step loop holds backward() but not the optimizer step (an outer loop
            # over updates that mentions accumulation holds both).
            if inside & {"backward", "scaled_backward"} and not inside & {
                "opt_step",
                "scaler_step",
            }:
                return _Accumulation("loop", header, end, True)
    return None


def analyse(code: str, prose: str = "") -> list[CodeHit]:
    """The rules that fire on ``code`` (a fragment, possibly embedded in prose).

    ``prose`` is the text around the code: it may name what the code does not show (the
    model is "a Transformer", "we clip at 1.0 elsewhere").
    """
    code = code.replace("…", "...")
    lines = code.splitlines()
    events = _events(lines)
    kinds = [e.kind for e in events]
    hits: list[CodeHit] = []

    def add(entry_id: str, strength: float, reason: str) -> None:
        if all(h.entry_id != entry_id for h in hits):
            hits.append(CodeHit(entry_id, strength, reason))

    # A scaler the fragment does not show: Lightning's precision="16-mixed" (manual_backward
    # scales the loss), or fp16 named in the words around it.
    scaler_in_use = (
        bool(_SCALER.search(code))
        or "scaled_backward" in kinds
        or bool(_FP16_PRECISION.search(code))
        or (bool(_FP16_PROSE.search(prose)) and "manual_backward" in code)
    )
    backwards = [i for i, k in enumerate(kinds) if k in ("backward", "scaled_backward")]
    steps = [i for i, k in enumerate(kinds) if k in ("opt_step", "scaler_step")]
    order_kinds = ("backward", "scaled_backward", "opt_step", "scaler_step", "zero_grad")

    for i, event in enumerate(events):
        if event.kind not in ("clip_norm", "clip_value"):
            continue
        # Order is only meaningful inside one function: a helper defined above its caller
        # says nothing about when it runs.
        before = [e.kind for e in events[:i] if e.kind in order_kinds and e.scope == event.scope]
        later_backward = any(
            events[b].line > event.line and events[b].scope == event.scope for b in backwards
        )
        last = before[-1] if before else None
        if last in ("opt_step", "scaler_step"):
            add("clip-after-step", 1.0, "code: the clip call comes after optimizer.step()")
        elif last in (None, "zero_grad") and later_backward:
            add("clip-before-backward", 1.0, "code: the clip call comes before backward()")
        unscaled_before = any(
            e.kind == "unscale" for e in events[:i] if e.scope == event.scope
        ) or any(e.kind == "unscale" for e in events if e.scope != event.scope)
        if scaler_in_use and event.kind == "clip_norm" and not unscaled_before:
            add(
                "amp-clip-without-unscale",
                1.0,
                "code: GradScaler in use and the clip runs without scaler.unscale_() before it",
            )
        if event.kind == "clip_value":
            add("value-clipping", 0.9, "code: clip_grad_value_ clips each element, not the norm")
    if _CLIP_BY_VALUE_SETTING.search(code):
        add(
            "value-clipping",
            0.9,
            "code: the trainer is set to clip by value (each element), not by the norm",
        )

    for m in _MAX_NORM.finditer(code):
        raw = m.group("num") or m.group("kw")
        try:
            value = float(raw)
        except (TypeError, ValueError):
            continue
        if value < 0.1:
            add("clip-too-aggressive", 0.9, f"code: max_norm={raw} is below 0.1")

    if "scaled_backward" in kinds and "opt_step" in kinds and "scaler_step" not in kinds:
        add(
            "amp-step-bypasses-scaler",
            1.0,
            "code: scaler.scale(loss).backward() but optimizer.step() instead of scaler.step()",
        )
    elif scaler_in_use and "opt_step" in kinds and "scaler_step" not in kinds:
        add(
            "amp-step-bypasses-scaler",
            0.8,
            "code: a GradScaler exists but optimizer.step() is called directly",
        )
    unscale_args = [" ".join(a.split()) for a in _UNSCALE_ARG.findall(code)]
    if len(unscale_args) != len(set(unscale_args)):
        add("amp-double-unscale", 0.9, "code: scaler.unscale_() is called twice on one optimizer")

    accumulation = _accumulation(events, lines) if backwards and steps else None
    if accumulation is not None:
        _accumulation_rules(code, lines, events, kinds, accumulation, add)
    elif _DDP.search(code) and "accum_gate" in kinds and not _NO_SYNC.search(code):
        add("ddp-accum-without-no-sync", 0.6, "code: DDP with a % N gate and no no_sync()")
    if accumulation is None and _GRAD_DIV_BY_N.search(code):
        # The update branch alone ("for p in params: p.grad /= accum; opt.step()"): the
        # divisor's name says what it is even without the micro-batch loop around it.
        add("accum-manual-grad-scaling", 0.8, "code: .grad is divided by the accumulation count")

    zero_events = [e for e in events if e.kind == "zero_grad"]
    # A division by something the words around the code say is zero ("/ y.var()", "y.var() is
    # 0 for some batches").
    for divisor in _DIVISOR.findall(code):
        said_zero = _regex.compile(
            re.escape(divisor) + r"[^.;\n]{0,20}\b(?:is|was|are|were|can\s+be|becomes?|equals?|"
            r"hits?)\s+(?:exactly\s+)?(?:0|zero)\b",
            re.IGNORECASE,
        )
        if said_zero.search(prose):
            reason = f"code: divides by {divisor}, which the text says can be 0"
            add("unstable-loss-op", 0.85, reason)
            break
    # A whole training loop that steps but never zeroes: gradients add up over every update.
    if backwards and steps and not zero_events and not _ZEROED.search(code):
        training_loop = any(
            _LOOP_HEADER.match(line)
            and any(
                number < events[i].line < _block_end(lines, number)
                for i in (backwards[0], steps[0])
            )
            and all(number < events[i].line for i in (backwards[0], steps[0]))
            for number, line in enumerate(lines)
        )
    else:
        training_loop = False
    if training_loop:
        add(
            "accum-missing-zero-grad",
            0.85,
            "code: the loop steps but never zeroes the gradients, so they add up across updates",
        )
    # no_sync around every micro-batch, the one before the step included: never synchronised.
    blocks = [n for n, line in enumerate(lines) if _NO_SYNC_BLOCK.match(line)]
    if (
        accumulation is not None
        and blocks
        and not _NO_SYNC_CONDITIONAL.search(code)
        and not any(_inside_branch(lines, n) for n in blocks)
    ):
        add(
            "ddp-no-sync-misplaced",
            0.9,
            "code: no_sync() wraps every micro-batch, the one before the step too",
        )
    for i, event in enumerate(events):
        if event.kind != "norm_read":
            continue
        earlier = [z for z in zero_events if z.line <= event.line and z.scope == event.scope]
        if not earlier:
            continue
        between = [
            e.kind for e in events[:i] if e.line >= earlier[-1].line and e.scope == event.scope
        ]
        if "backward" not in between and "scaled_backward" not in between:
            add("monitor-after-zero-grad", 0.8, "code: the gradient norm is read after zero_grad()")

    has_clip = (
        "clip_norm" in kinds
        or "clip_value" in kinds
        or "gradient_clip" in code
        or bool(_CLIP_WORD.search(prose))
    )
    sequence_model = _SEQUENCE_MODEL.search(code) or _SEQUENCE_PROSE.search(prose)
    if sequence_model and not has_clip and (backwards or _LIGHTNING.search(code)):
        add("no-clip-sequence-model", 0.7, "code: a Transformer/RNN is trained with no clipping")
    if _repeated_saturating(lines) or len(_SATURATING.findall(code)) > 20:
        add("saturating-deep-net", 0.8, "code: a deep stack (> 20) of sigmoid/tanh layers")
    for m in _UNSTABLE_OP.finditer(code):
        arg = m.group("a") or m.group("b") or ""
        # sqrt/log of the gradients ("sqrt(sum(p.grad.pow(2).sum() ...))") measures them after
        # backward(): it is outside the loss, so it cannot make the loss non-finite.
        if not _EPS.search(arg) and not re.search(r"\.grad\b", arg):
            add("unstable-loss-op", 0.75, f"code: {m.group(0).strip()[:40]} without eps or clamp")
            break
    # Only a whole loop shows that nothing is measured; a three-line excerpt does not.
    has_loop = bool(re.search(r"^\s*(?:for|while)\b", code, re.MULTILINE))
    if has_loop and backwards and steps and "norm_read" not in kinds and "clip_norm" not in kinds:
        add("no-grad-monitoring", 0.45, "code: the loop never measures the gradient norm")
    return hits


def _inside_branch(lines: list[str], number: int) -> bool:
    """Whether line ``number`` sits in an ``if``/``elif``/``else`` block (the nearest line above
    it with less indentation is a branch header)."""
    width = _indent(lines[number])
    for above in range(number - 1, -1, -1):
        text = lines[above].split("#", 1)[0]
        if text.strip() and _indent(text) < width:
            return bool(re.match(r"\s*(?:if|elif|else)\b", text))
    return False


def _repeated_saturating(lines: list[str]) -> bool:
    """A sigmoid/tanh inside something repeated more than 20 times: ``[..., nn.Tanh()] * 30``,
    ``[... nn.Sigmoid() ... for _ in range(32)]``, or a ``for`` loop over ``range(N > 20)``
    that builds one (a single output Tanh after 48 residual blocks is not a stack). The count
    may be a name the code sets to a number (``depth=32`` as a default or an assignment),
    give or take a constant (``range(depth - 1)``)."""
    code = "\n".join(lines)
    for m in _REPEATED.finditer(code):
        count = _count(m.group("times") or m.group("range") or "0", code)
        if count > 20 and _SATURATING.search(m.group("body") or m.group("inner") or ""):
            return True
    for number, line in enumerate(lines):
        header = _DEEP_LOOP.match(line)
        if header and _count(header.group("n"), code) > 20:
            body = "\n".join(lines[number + 1 : _block_end(lines, number)])
            if _SATURATING.search(body):
                return True
    return False


_COUNT = r"(?:\d+|[A-Za-z_]\w*(?:\s*[-+]\s*\d+)?)"
_REPEATED = _regex.compile(
    r"\[(?P<body>[^\[\]]*)\]\s*\*\s*(?P<times>" + _COUNT + r")\b"
    r"|\[(?P<inner>[^\[\]]*?)\bfor\b[^\[\]]*?\brange\s*\(\s*(?P<range>" + _COUNT + r")\s*\)\s*\]"
)
_DEEP_LOOP = _regex.compile(r"^\s*for\b[^\n]*\brange\s*\(\s*(?P<n>" + _COUNT + r")\s*\)\s*:")
_NAMED_COUNT = re.compile(r"^(?P<name>[A-Za-z_]\w*)(?:\s*(?P<sign>[-+])\s*(?P<delta>\d+))?$")


def _count(expression: str, code: str) -> int:
    """The number ``expression`` (a literal, or a name the code sets to a literal, plus or
    minus a constant) stands for; 0 when the code does not say."""
    expression = expression.strip()
    if expression.isdigit():
        return int(expression)
    m = _NAMED_COUNT.match(expression)
    if m is None:
        return 0
    # "depth=32" as a parameter default or "DEPTH = 32" / "depth: int = 32" as an assignment.
    bound = re.search(
        r"\b" + re.escape(m.group("name")) + r"\s*(?::\s*int\s*)?=\s*(\d+)\b(?!\s*[*/.])", code
    )
    if bound is None:
        return 0
    delta = int(m.group("delta") or 0)
    return int(bound.group(1)) + (-delta if m.group("sign") == "-" else delta)


def _under_any_gate(e: Event, events: list[Event], lines: list[str], acc: _Accumulation) -> bool:
    """``e`` is inside some ``if … % N`` block (zeroing when a window starts is fine)."""
    if not acc.indented:
        return False
    return any(
        g.kind == "accum_gate" and g.line < e.line < _block_end(lines, g.line) for g in events
    )


def _accumulation_rules(
    code: str,
    lines: list[str],
    events: list[Event],
    kinds: list[str],
    acc: _Accumulation,
    add: Callable[[str, float, str], None],
) -> None:
    """Rules that need to know which calls run per micro-batch and which per update."""
    loop_indent = min(
        (e.indent for e in events if e.kind in ("backward", "scaled_backward")), default=0
    )
    updates = [e for e in events if e.kind in ("opt_step", "scaler_step") and acc.is_update(e)]
    zero_events = [e for e in events if e.kind == "zero_grad"]
    in_loop = [z for z in zero_events if acc.is_update(z) or acc.is_micro(z, loop_indent)]
    if not in_loop:
        add(
            "accum-missing-zero-grad",
            0.9,
            "code: steps every N micro-batches but never calls zero_grad() between updates",
        )
    elif any(
        acc.is_micro(z, loop_indent) and not _under_any_gate(z, events, lines, acc)
        for z in zero_events
    ) and not any(acc.is_update(z) for z in zero_events):
        add(
            "accum-zero-grad-every-microstep",
            1.0,
            "code: zero_grad() runs on every micro-batch while the step runs every N",
        )
    divided = bool(_LOSS_DIVIDED.search(code))
    if "grad_div" in kinds:
        add("accum-manual-grad-scaling", 1.0, "code: .grad is divided by hand")
    elif not divided:
        add(
            "accum-unscaled-loss",
            1.0,
            "code: backward() every micro-batch, step every N, loss never divided by N",
        )
    for e in events:
        if e.kind in ("clip_norm", "clip_value") and acc.is_micro(e, loop_indent):
            add(
                "accum-clip-every-microstep",
                0.8,
                "code: clipping runs on every micro-batch, not once per update",
            )
        if e.kind == "sched_step" and acc.is_micro(e, loop_indent) and updates:
            add(
                "accum-scheduler-per-microbatch",
                0.8,
                "code: scheduler.step() runs every micro-batch while the optimizer steps every N",
            )
    if _DDP.search(code) and not _NO_SYNC.search(code):
        add("ddp-accum-without-no-sync", 0.9, "code: DDP with accumulation and no no_sync()")
    # A token-level mean (padding ignored) averaged again over the micro-batches.
    if _DIVIDED_BY_N.search(code) and _TOKEN_MEAN.search(code):
        add(
            "accum-token-mean-bias",
            0.5,
            "code: a token-level mean loss divided by N per micro-batch",
        )
    if acc.form == "gate" and not _LEFTOVER_HANDLED.search(code):
        add("accum-leftover-batches", 0.45, "code: the % N gate ignores the last partial window")


_FENCED = _regex.compile(r"```[a-zA-Z0-9_+-]*\n?(.*?)(?:```|\Z)", re.DOTALL)
_INLINE = _regex.compile(r"`([^`\n]+)`")
_CODE_LINE = _regex.compile(
    r"^\s*(?:(?:for|if|elif|else|with|def|return|while|import|from|try|except)\b[^\n]*"
    r"|[\w.\[\]()'\"]+\s*(?:[-+*/]?=)\s*[^\s=][^\n]*"
    r"|[\w.\[\]()]+\.\w+\s*\([^\n]*\)[^\n]*"
    # A call on a parenthesised expression: "(loss / accum).backward()".
    r"|\([^\n]*\)\s*\.\s*\w+\s*\([^\n]*\)[^\n]*"
    r"|\w+\s*\([^\n]*\)\s*"
    r"|\.\.\.|…)\s*$"
)
# Prose lines start with a pronoun or article far more often than code does.
_PROSE_START = _regex.compile(
    r"^\s*(?:i|we|you|my|our|the|it|this|that|is|are|why|how|what|when)\b", re.IGNORECASE
)
#: Where a statement may start inside a prose line: a dotted name followed by a call, an
#: assignment or an index (``like this: opt.step()``), or a loop/branch header.
_STATEMENT_START = _regex.compile(
    r"(?<![\w.])(?:for|if|while|with)\s"
    r"|(?<![\w.])[A-Za-z_][\w.]*\s*(?:\(|=(?!=)|\[|[-+*/]=)"
)
_CALL = _regex.compile(r"[\w\])]\s*\(")
_REMARK = _regex.compile(r"\s+(?:--|—|–|<-+|←|//)\s*")
#: Longest code text the fragment repair works on (whole scripts are the analyser's job).
FRAGMENT_CHARS = 8_000
#: Most lines dropped while repairing one fragment before giving up on it.
_MAX_REPAIRS = 12
#: Longer lines are data or minified code, not a pasted loop (and slow to parse).
_MAX_LINE_CHARS = 400
#: What ``ast.parse`` raises on text it cannot read (MemoryError: a pathologically long or
#: nested expression).
_UNPARSEABLE = (SyntaxError, ValueError, MemoryError, RecursionError)


class CodeSplit(NamedTuple):
    """A question cut into its sentences and its code."""

    prose: str  #: the sentences, a line that starts with a call and goes on in words included
    code: str  #: the code parts, in the order they appear
    words: str  #: the sentences with every piece of code cut out
    #: Every piece of code was named inside a sentence (inline `spans` among words): the
    #: writer chose which calls to mention, so a call left out is only unsaid.
    told: bool = False


def split_code(text: str) -> CodeSplit:
    """``text`` cut into prose and code.

    Fenced blocks are code whole. Outside them, a line that looks like code (or is one inline
    `span`) is code, and so is a Markdown block indented by four spaces; a prose line gives
    its inline `spans`, one per line, and the statements it joins with ``;`` ("like this:
    opt.step(); opt.zero_grad()").
    """
    code: list[str] = []
    prose: list[str] = []
    words: list[str] = []
    whole = [False]
    position = 0
    for fence in _FENCED.finditer(text):
        _split_prose(text[position : fence.start()], code, prose, words, whole)
        code.append(fence.group(1))
        whole[0] = True
        position = fence.end()
    _split_prose(text[position:], code, prose, words, whole)
    joined = "\n".join(p for p in code if p.strip())
    return CodeSplit("\n".join(prose), joined, "\n".join(words), told=bool(joined) and not whole[0])


def extract_code(text: str) -> str:
    """The code parts of a question, in the order they appear (see :func:`split_code`)."""
    return split_code(text).code


def without_code(text: str) -> str:
    """``text`` less its code: fenced blocks, inline `spans` and lines that make calls.

    What is left is read for numbers written as a series, where ``log(x, -1)`` is not one.
    """
    if "`" not in text and "(" not in text:
        return text
    text = _INLINE.sub(" ", _FENCED.sub("\n", text))
    kept: list[str] = []
    for line in text.splitlines():
        if not (_CALL.search(line) and "=" in line):
            kept.append(line)
        elif _wordy(line):
            # A sentence with a formula in it ("sat at ln(1000)=6.9 for 3 epochs, grad norms
            # ..."): the sentence's numbers stay, the call's arguments go.
            kept.append(_CALL_WITH_ARGS.sub(" ", line))
    return "\n".join(kept)


#: A call with its arguments, as written inside a sentence.
_CALL_WITH_ARGS = _regex.compile(r"[\w.]+\s*\([^()\n]*\)")


def _indented_blocks(lines: list[str]) -> set[int]:
    """Line numbers of Markdown code blocks (a run of lines indented by 4+ spaces that starts
    the text or follows a blank line) that hold at least one line of code."""
    taken: set[int] = set()
    number = 0
    while number < len(lines):
        starts_block = number == 0 or not lines[number - 1].strip()
        if not (starts_block and lines[number].startswith("    ") and lines[number].strip()):
            number += 1
            continue
        end = number
        while end < len(lines) and (lines[end].startswith("    ") or not lines[end].strip()):
            end += 1
        block = range(number, end)
        if any(_CODE_LINE.match(lines[i].strip()) for i in block if lines[i].strip()):
            taken.update(block)
        number = end
    return taken


def _split_prose(
    text: str,
    code: list[str],
    prose: list[str],
    words: list[str],
    whole: list[bool] | None = None,
) -> None:
    """Sort the lines of ``text`` into code, prose and words; ``whole[0]`` is set when a line
    of code stands on its own (not named inside a sentence)."""
    lines = text.splitlines()
    block = _indented_blocks(lines)
    if whole is None:
        whole = [False]
    for number, line in enumerate(lines):
        if not line.strip():
            continue
        if number in block:
            code.append(line)
            whole[0] = True
            continue
        spans = _INLINE.findall(line)
        bare = _INLINE.sub(lambda m: m.group(1), line) if spans else line
        outside = _INLINE.sub(" ", line)
        if spans and not outside.strip(" \t:,.;-"):
            code.append(bare)
            whole[0] = True
        elif spans:
            code.extend(spans)
            # "my loop: `loss.backward(); if ...: opt.step()`": a span holding several
            # statements is the loop pasted, not a call named in a sentence.
            # (A bare header, "outside the `if step % 4 == 0:` block", is still named.)
            whole[0] = whole[0] or any(
                ";" in span or (_HEADER.match(span) and _INLINE_BODY.search(span)) for span in spans
            )
            # The rules read the sentence with its calls in place ("`clip_grad_norm_(...)` comes
            # before the forward"); the word score reads only the words around them.
            prose.append(bare)
            words.append(outside)
        elif _CODE_LINE.match(line) and not _PROSE_START.match(line) and not _header_prose(line):
            code_part, rest = _prose_tail(line)
            code.append(code_part)
            whole[0] = True
            if rest:
                # The sentence is about the call at its start: the rules read them together.
                prose.append(line)
                words.append(rest)
            elif _wordy(line):
                # "optimizer.zero_grad() is the first line inside my loop, but ...": a call
                # and then a sentence the statement trimmer could not cut off.
                prose.append(line)
                words.append(line)
        elif ";" in line and len(line) <= _MAX_LINE_CHARS and _CALL.search(line):
            statements = _statements_in_prose(line)
            code.extend(statements)
            # "acc loop -> loss.backward() ; if ...: opt.step()": a loop written out inline.
            whole[0] = whole[0] or bool(statements)
            prose.append(line)
            remainder = line
            for statement in statements:
                remainder = remainder.replace(statement, " ", 1)
            words.append(remainder)
        else:
            prose.append(line)
            words.append(line)


_HEADER = _regex.compile(r"^\s*(?:for|if|elif|else|with|while|try|except)\b")
#: A header with its body on the same line: "if i % 4 == 0: opt.step()".
_INLINE_BODY = _regex.compile(r":\s*\S")
_PLAIN_WORD = _regex.compile(r"(?<![\w.(\[=])[A-Za-z']{2,}(?![\w.(\[=])")
#: Plain words from which a line reads as a sentence, not a statement.
_WORDY_LINE = 7


def _wordy(line: str) -> bool:
    """Whether ``line`` holds as many plain words as a sentence (beside any code in it)."""
    return len(_PLAIN_WORD.findall(line)) >= _WORDY_LINE


def _header_prose(line: str) -> bool:
    """A sentence that starts with a keyword ("for the output layer the norm is ...", "with
    accum_steps=8 my norm ..."): no colon, as every Python header has, and many words."""
    return bool(_HEADER.match(line)) and ":" not in line and _wordy(line)


def _prose_tail(line: str) -> tuple[str, str]:
    """A code line split into its code and the prose after it ("torch.isfinite(loss) is
    already False on step 51": the call, then a sentence about it)."""
    stripped = line.strip()
    pieces = split_statements(stripped)
    last = pieces[-1][1] if pieces else stripped
    if last.endswith(":") or _parses(last):
        return line, ""
    statement = _trim_to_statement(last, allow_prefix=False)
    if statement is None or not last.startswith(statement):
        return line, ""
    start = stripped.rfind(last)
    indent = line[: len(line) - len(line.lstrip())]
    return indent + stripped[:start] + statement, last[len(statement) :].strip()


def _statements_in_prose(line: str) -> list[str]:
    """The ``;``-joined statements of a prose line, with the prose around them cut off."""
    found: list[str] = []
    for index, (_, piece) in enumerate(split_statements(line)):
        statement = _trim_to_statement(piece, allow_prefix=index == 0)
        if statement is not None:
            found.append(statement)
    # One call in a sentence is prose; two or more joined by ';' are a pasted loop body.
    return found if len(found) >= 2 else []


def _ast_parse(source: str) -> None:
    import ast  # imported on the first text with code in it

    ast.parse(source)


#: "f(a=1, ...)" in pseudo-code: an elided argument list, not an argument.
_ELIDED_ARGS = _regex.compile(r",\s*(?:\.\.\.|…)\s*(?=[)\]}])")


def _parses(statement: str) -> bool:
    statement = _ELIDED_ARGS.sub("", statement)
    source = statement + "\n    pass" if statement.endswith(":") else statement
    try:
        _ast_parse(source)
    except _UNPARSEABLE:
        return False
    return True


def _trim_to_statement(piece: str, *, allow_prefix: bool = True) -> str | None:
    """The longest statement in ``piece``, with the prose before or after it cut off."""
    # A dash set off by spaces ends the code and starts a remark ("opt.step()  -- then ...").
    piece = _REMARK.split(piece, maxsplit=1)[0].strip()
    starts = [0]
    if allow_prefix:
        starts += [m.start() for m in _STATEMENT_START.finditer(piece) if m.start() > 0][:5]
    for start in starts:
        words = piece[start:].split(" ")
        # Cut trailing prose a word at a time ("... ** 0.5 and it's always 0").
        for end in range(len(words), max(0, len(words) - 12), -1):
            statement = " ".join(words[:end]).rstrip(" ,.-")
            looks_like_code = bool(_CALL.search(statement)) or "=" in statement
            if statement and looks_like_code and _parses(statement):
                return statement
    return None


_COMPOUND = _regex.compile(
    r"(?:if|elif|else|for|while|with|try|except|finally|def|class|async\s+(?:def|for|with))\b"
)
_CONTINUATION = _regex.compile(r"(?:elif|else|except|finally)\b")


def _opens_string(line: str, index: int) -> bool:
    """Whether the quote at ``index`` starts a string (not the apostrophe of "it's")."""
    if line[index] == '"' or index == 0 or index + 1 >= len(line):
        return True
    before, after = line[index - 1], line[index + 1]
    # A string prefix (f'', r'', b'') is one letter after a non-word character.
    prefix = index >= 2 and not (line[index - 2].isalnum() or line[index - 2] == "_")
    return not (before.isalpha() and after.isalpha() and not prefix)


def split_statements(line: str) -> list[tuple[int, str]]:
    """A line of ``;``-joined statements and inline block bodies, as (depth, statement).

    ``if c: a; b`` puts both ``a`` and ``b`` in the block, as Python does, and a header after
    a header nests (``for x in y: a; if c: b`` puts ``b`` two levels in). Brackets and strings
    are respected; a ``#`` comment ends the line.
    """
    pieces: list[tuple[int, str]] = []
    level = depth = start = 0
    quote = ""
    header = bool(_COMPOUND.match(line.lstrip()))
    index = 0
    while index < len(line):
        char = line[index]
        if quote:
            if char == "\\":
                index += 2
                continue
            if char == quote:
                quote = ""
        elif char in "'\"" and _opens_string(line, index):
            quote = char
        elif char == "#":
            break
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            depth = max(0, depth - 1)
        elif depth == 0 and (
            char == ";" or (char == ":" and header and line[index + 1 : index + 2] != "=")
        ):
            text = line[start : index + (char == ":")].strip()
            if text:
                pieces.append((level, text))
            level += char == ":"
            start = index + 1
            header = bool(_COMPOUND.match(line[start:].lstrip()))
        index += 1
    tail = line[start:index].strip()
    if tail:
        pieces.append((level, tail))
    return pieces


def _indent_width(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _reindent(lines: list[str]) -> list[str]:
    """Consistent 4-space indentation for a fragment whose indentation was mangled.

    The line after a block header goes one level in; an unexpected indent stays at the
    current level; a dedent goes back to the innermost block it fits. When the fragment lost
    its indentation altogether (every line flush with the first), each header opens a block
    that runs on to the end, and ``else``/``elif`` go back to their ``if``: the likeliest
    reading of a pasted loop.
    """
    lines = [line for line in lines if line.strip()]
    if not lines:
        return []
    flat = len({_indent_width(line) for line in lines}) == 1
    out: list[str] = []
    stack: list[tuple[int, int]] = [(_indent_width(lines[0]), 0)]  # (raw width, level)
    current = 0
    opener = False
    for line in lines:
        width, text = _indent_width(line), line.strip()
        continuation = bool(_CONTINUATION.match(text))
        if flat:
            current += 1 if opener else 0
            if continuation and not opener:
                current = max(0, current - 1)
            level = current
        elif opener:
            level = stack[-1][1] + 1
            stack.append((max(width, stack[-1][0] + 1), level))
        else:
            while len(stack) > 1 and width < stack[-1][0]:
                stack.pop()
            level = stack[-1][1]
        out.append("    " * level + text)
        opener = text.endswith(":") and bool(_COMPOUND.match(text))
    if opener:
        out.append(" " * (_indent_width(out[-1]) + 4) + "...")
    return out


def _whole_parses(code: str) -> bool:
    try:
        _ast_parse(code)
    except _UNPARSEABLE:
        return False
    return True


def fragment_source(code: str) -> str | None:
    """A pasted fragment made into parseable Python, or None when nothing parseable is left.

    Handles a loop body without its loop (parsed as top-level statements), pseudo-code with
    ``...``, statements joined by ``;``, inline backticks and broken indentation: statements
    are split onto their own lines (inline block bodies nested as Python reads them), each is
    cut free of prose around it, the indentation is rebuilt, and lines Python still cannot
    parse are dropped one at a time.
    """
    code = _ELIDED_ARGS.sub("", code.replace("…", "...").replace("\t", "    ")[:FRAGMENT_CHARS])
    if ">>> " in code:
        code = re.sub(r"^(\s*)(?:>>>|\.\.\.) ", r"\1", code, flags=re.MULTILINE)
    if code.strip() and _whole_parses(code):
        # Already Python, as pasted: the line-by-line repair would only break what it cannot
        # see whole (a call continued over several lines, "nn.LSTM(a, b,\n  batch_first=True)").
        return code if code.endswith("\n") else code + "\n"
    lines: list[str] = []
    for raw in code.splitlines():
        if not raw.strip() or raw.lstrip().startswith("#") or len(raw) > _MAX_LINE_CHARS:
            continue
        indent = " " * _indent_width(raw)
        for level, piece in split_statements(raw.replace("`", " ")):
            statement = piece if _parses(piece) else (_trim_to_statement(piece) or piece)
            lines.append(indent + "    " * level + statement)
    lines = _reindent(lines)
    for _ in range(_MAX_REPAIRS):
        if not lines:
            return None
        source = "\n".join(lines) + "\n"
        try:
            _ast_parse(source)
        except _UNPARSEABLE as exc:
            number = getattr(exc, "lineno", None) or len(lines)
            del lines[min(max(number, 1), len(lines)) - 1]
            lines = _reindent(lines)
            continue
        return source
    return None


#: How sure a static-analyser finding makes the matcher (0–1): as sure as the analyser is,
#: whatever the severity (the matcher puts the most serious of several findings first).
_STATIC_STRENGTH = 1.0
#: Findings about what a whole script lacks: a fragment shows only part of the loop, so they
#: count only when the fragment holds a whole loop, and then weakly.
_WHOLE_SCRIPT_FINDINGS = {"no-grad-monitoring": 0.45, "accum-leftover-batches": 0.45}
_LOOP = _regex.compile(r"^\s*(?:for|while)\b", re.MULTILINE)


def static_hits(source: str) -> list[CodeHit]:
    """The static analyser's findings on a repaired fragment (see :func:`fragment_source`).

    Imports ``probes.static`` (libcst) on first use, so text without code never pays for it.
    A fragment of a single statement is left to the light rules: the analyser's rules are
    about the order and placement of several calls.
    """
    if sum(1 for line in source.splitlines() if line.strip()) < 2:
        return []
    from gradient_doctor.probes.static import lint_source

    report = lint_source(source, "<fragment>")
    if report.error:
        return []
    whole_loop = bool(_LOOP.search(source))
    hits: list[CodeHit] = []
    for finding in report.findings:
        strength = _STATIC_STRENGTH
        if finding.id in _WHOLE_SCRIPT_FINDINGS:
            if not whole_loop:
                continue
            strength = _WHOLE_SCRIPT_FINDINGS[finding.id]
        message = " ".join(finding.message.split())
        first_sentence = message.split(". ")[0].rstrip(".")
        where = f", line {finding.line} of the fragment" if finding.line else ""
        hits.append(
            CodeHit(finding.id, strength, f"code: {first_sentence} (static analyser{where})")
        )
    return hits


#: Findings about a call the code does not show: a loop that never zeroes, a loss never
#: divided, no norm measured, no update for the last micro-batches.
_ABSENCE_FINDINGS = frozenset(
    {
        "accum-missing-zero-grad",
        "accum-unscaled-loss",
        "no-grad-monitoring",
        "accum-leftover-batches",
    }
)
#: How sure such a finding is when the calls were only named in sentences ("`scheduler.step()`
#: sits after `loss.backward()`, outside the `if` where `optimizer.step()` is").
_TOLD_ABSENCE_STRENGTH = 0.3


_NORM_READ = dict(_EVENTS)["norm_read"]
_CLIP_NORM = dict(_EVENTS)["clip_norm"]


def measures_grad_norm(code: str) -> bool:
    """Whether the code computes the gradient norm itself: a norm read by hand (``total +=
    p.grad.norm() ** 2`` over the parameters, ``torch.norm(p.grad)``) or the total norm that
    ``clip_grad_norm_`` returns. Such code monitors the gradients, whatever else it lacks."""
    return any(
        _NORM_READ.search(line) or _CLIP_NORM.search(line)
        for line in (raw.split("#", 1)[0] for raw in code.splitlines())
    )


def code_hits(code: str, prose: str = "", *, told: bool = False) -> list[CodeHit]:
    """Evidence from pasted code: the static analyser on the repaired fragment, and the light
    order rules for what it does not report (fragments too broken to parse, or too partial
    for its rules). Where the analyser reports an entry, its severity sets the strength, so
    the most serious mistake in a fragment comes first.

    ``told``: the calls were named inside sentences, not pasted (see :class:`CodeSplit`); a
    call they leave out is one the writer did not mention, so findings about what is missing
    stay weak."""
    source = fragment_source(code)
    best = {hit.entry_id: hit for hit in (static_hits(source) if source is not None else [])}
    for hit in analyse(source if source is not None else code, prose):
        best.setdefault(hit.entry_id, hit)
    if told:
        for entry_id in best.keys() & _ABSENCE_FINDINGS:
            hit = best[entry_id]
            best[entry_id] = CodeHit(
                entry_id, min(hit.strength, _TOLD_ABSENCE_STRENGTH), hit.reason, hit.advice_id
            )
    if best.keys() & _MISPLACED_CLIP:
        # A clip in the wrong place does nothing: whether it would also have clipped scaled or
        # per-micro-batch gradients is moot until it moves.
        for moot in _MOOT_WHEN_MISPLACED:
            best.pop(moot, None)
    return list(best.values())


_MISPLACED_CLIP = frozenset({"clip-after-step", "clip-before-backward"})
_MOOT_WHEN_MISPLACED = ("amp-clip-without-unscale", "accum-clip-every-microstep")


#: "before or after", "wherever", "the order doesn't matter": the text says order is irrelevant.
_ORDER_FREE = (
    r"\b(?:before\s+or\s+after|after\s+or\s+before|either\s+before|same\s+(?:result|"
    r"thing|effect)|wherever|anywhere|any\s+point|order\s+(?:does\s+not|is\s+not|doesn't|"
    r"isn't)\s+(?:matter|important))"
)
_ORDER_FREE_RE = _regex.compile(_ORDER_FREE, re.IGNORECASE)
#: "unscale_ isn't called anywhere": a negated "anywhere" says nothing about the clip's place.
_NOT_ANYWHERE = _regex.compile(
    r"(?:n't|\bnot|\bnever|\bno)\b(?:\s+\w+){0,2}\s+anywhere\b", re.IGNORECASE
)


def _order_free(piece: str) -> bool:
    """Whether ``piece`` says the position of a call does not matter."""
    return _ORDER_FREE_RE.search(_NOT_ANYWHERE.sub(" ", piece)) is not None


# Order stated in words: "I clip after optimizer.step()", "the norm is read after zero_grad".
_CLIP = r"clip\w*"
#: Inside one clause: anything but a sentence end, where a dot followed by a letter or digit
#: ("optimizer.step()", "1.0"), another dot, a comma or a closing bracket ("(..., 1.0)") does
#: not end a sentence.
_CLAUSE = r"(?:[^.;\n]|\.(?=[\w.,)\]]))"


def _clause_bound(pattern: str) -> str:
    """``pattern`` with its clause gaps (``[^.;\n]``) letting code's dots through."""
    return pattern.replace("[^.;\\n]", _CLAUSE)


_SCHEDULER_WITH_BACKWARD = (
    "text: the scheduler steps with every backward() while gradients accumulate"
)
_WANTED_BATCH = "text: a batch size is wanted that memory does not hold"
_LOWER_LR_PLAN = "text: plans to lower the learning rate to cure a NaN"
_RECIPE_BATCH = "text: the recipe's batch size is wanted and memory does not hold it"
#: Rules (by reason) that need the whole text, not only their sentence, to say something.
_TEXT_REQUIRES: dict[str, re.Pattern[str]] = {
    _SCHEDULER_WITH_BACKWARD: _regex.compile(r"accum|micro[-\s]?(?:batch|step)", re.IGNORECASE),
    _LOWER_LR_PLAN: _regex.compile(r"\bnan|\binf\b|non-?finite", re.IGNORECASE),
    _RECIPE_BATCH: _regex.compile(
        r"^(?=[\s\S]*\b(?:bs|batch))[\s\S]*(?:\boom|out\s+of\s+memory|doesn't\s+fit|"
        r"does\s+not\s+fit)",
        re.IGNORECASE,
    ),
    _WANTED_BATCH: _regex.compile(
        r"\boom|out\s+of\s+memory|doesn't\s+fit|does\s+not\s+fit", re.IGNORECASE
    ),
}

_PROSE_RULES: tuple[tuple[str, str, float, str], ...] = tuple(
    (_clause_bound(pattern), entry_id, strength, reason)
    for pattern, entry_id, strength, reason in (
        (
            _ORDER_FREE,
            "clip-anywhere",
            0.5,
            "text: says the position of the clip call does not matter",
        ),
        # -- where a NaN was localised, as told by the check that found it (matcher6) -------
        (
            # "[gradcheck] non-finite grad: encoder.layers.5.attn.in_proj_weight (nan)": a
            # hook's line naming a parameter whose gradient is not finite.
            r"\bnon-?finite\s+grad(?:ient)?s?\s*(?:for|in|of|on|at)?\s*[:(`'\"]?\s*[a-z_][\w.]*\.\w"
            r"|\bnan\w*\s+(?:shows?\s+up|appears?|first\s+appears?|turns?\s+up)\s+in\s+(?:the\s+)?"
            r"grad(?:ient)?s?\b",
            "nan-gradients",
            0.6,
            "text: a check found the gradients non-finite",
        ),
        (
            # "assert torch.isfinite(loss) ... fires at step 4410": the loss was checked before
            # backward and is already non-finite.
            r"\bisfinite\s*\(\s*(?:the\s+)?loss\w*\s*\)[^\n]{0,120}?\b(?:fires|fired|trips|"
            r"tripped|fails|failed|triggers|triggered|raises|raised|goes\s+off|went\s+off)\b",
            "nan-loss-before-backward",
            0.9,
            "text: a finiteness check on the loss, before backward(), fails",
        ),
        (
            # "the loss is already nan right after criterion(...), i.e. before I call backward":
            # the loss was looked at before backward() and is non-finite there.
            r"\bloss\b[^.;\n]{0,40}?\b(?:is|was|comes\s+out|returns?|already)\s+(?:already\s+)?"
            r"(?:nan|inf|non-?finite)\b[^;\n]{0,60}?\bbefore\b[^.;\n]{0,20}?\bbackward"
            r"|\bbefore\b[^.;\n]{0,20}?\bbackward\w*(?:\(\))?[^.;\n]{0,20}?\bloss\b[^.;\n]{0,20}?"
            r"\b(?:is|was)\s+already\s+(?:nan|inf|non-?finite)\b",
            "nan-loss-before-backward",
            0.9,
            "text: the loss is already non-finite before backward() is called",
        ),
        (
            # "the grad norm after clipping is a flat line at 0.5, which is the max_norm I
            # chose": the logged norm sits at the threshold, so every update is clipped.
            r"\bnorms?\b[^.;\n]{0,60}?\b(?:flat|pinned|constant|capped|stuck|sits?|sitting|"
            r"pegged|saturat\w*)\b[^.;\n]{0,40}?\b(?:max_norm|max\s+norm|clip(?:ping)?\s+"
            r"(?:threshold|value|limit)|the\s+threshold)\b",
            "clipping-slow-convergence",
            0.7,
            "text: the logged grad norm sits at max_norm: every update is clipped",
        ),
        (
            # "batch['pixel_values'].isnan().sum() = 3072": the check on the inputs found some.
            # Or "torch.isinf(batch['x']).any() -> True", the function form.
            r"(?:\b(?:batch|inputs?|input_ids|x|xb|images?|imgs?|pixel\w*|features?|data|samples?|"
            r"targets?|labels?|y|yb)\b[^\s`]{0,30}\.is(?:nan|inf)\(\)(?:\.(?:sum|any)\(\))+"
            r"|\bis(?:nan|inf)\s*\(\s*(?:batch|inputs?|input_ids|x|xb|images?|imgs?|pixel\w*|"
            r"features?|feats?|data|samples?|targets?|labels?|y|yb)\b[^)\n]{0,30}\)"
            r"(?:\.(?:sum|any)\(\))+)`?"
            # "... .sum() on the batch fed to the model returns 12": where the check ran.
            r"(?:\s+(?:on|over|for|of|in)\s+[^.;:=\n]{0,40}?)?"
            r"\s*(?:(?:and\s+)?(?:it|that)\s+)?"
            r"(?:=|==|is|returns?|returned|gives?|gave|->|:|prints?|printed|shows?|showed)\s*"
            r"(?:[1-9]|true)",
            "nonfinite-inputs",
            0.7,
            "text: a non-finite check on the model's inputs counted NaN/Inf values",
        ),
        (
            # "torch.isnan(p).any() is True for ~40 tensors" on the loaded weights.
            r"\bis(?:nan|inf)\s*\(\s*(?:p|params?|parameters?|w|weights?|tensors?|v)\s*\)"
            r"(?:\.any\(\))?`?\s*(?:is|=|==|returns?|gives?|->|:)\s*true",
            "nan-parameters",
            0.7,
            "text: a NaN check on the weights themselves is true",
        ),
        (
            r"\b(?:divid\w*|averag\w*|scal\w*|rescal\w*|normali[sz]\w*)\s+(?:each\s+|the\s+|all\s+)?"
            r"(?:accumulated\s+|parameter\S*\s+)?\.?(?:grad\w*|p\.grad)[^.;\n]{0,50}\b(?:instead\s+of|"
            r"rather\s+than|than)\b[^.;\n]{0,30}\bloss"
            r"|\b(?:instead\s+of|rather\s+than)\s+(?:divid\w*|scal\w*)\s+(?:the\s+)?loss\b[^.;\n]{0,40}"
            r"\bgrad",
            "accum-manual-grad-scaling",
            0.6,
            "text: the gradients, not the loss, are divided by N",
        ),
        (
            rf"\b{_CLIP}\b[^.;\n]{{0,40}}\bafter\b[^.;\n]{{0,30}}(?:optimi[sz]\w*(?!\.zero_grad)|\.step\b|"
            rf"\bstep\(\)|weights?\s+(?:have\s+)?(?:changed|updated)|update\b)"
            rf"|\bafter\b[^.;\n]{{0,12}}(?:optimi[sz]\w*\.?\s*step|\.step\(\))[^.;\n]{{0,30}}"
            rf"\b{_CLIP}",
            "clip-after-step",
            0.6,
            "text: clipping is described as running after the optimizer step",
        ),
        (
            r"(?:optimi[sz]\w*\.step\(\)|\.step\(\))[^;\n]{0,20}\b(?:first|and\s+then|then|"
            r"followed\s+by|before)\b[^;\n]{0,40}clip",
            "clip-after-step",
            0.6,
            "text: optimizer.step() is described as coming before the clip",
        ),
        (
            rf"\b{_CLIP}\b[^.;\n]{{0,100}}\bbefore\b[^.;\n]{{0,25}}(?:backward|the\s+forward|forward\s+pass)"
            rf"|\bbefore\b[^.;\n]{{0,20}}backward[^.;\n]{{0,25}}\b{_CLIP}",
            "clip-before-backward",
            0.6,
            "text: clipping is described as running before backward()",
        ),
        (
            r"\b(?:without|no|never|not|forg[eo]t\w*(?:\s+to)?|missing|skip\w*)\s+(?:calling\s+|"
            r"an?\s+|the\s+)?(?:scaler\.)?unscal\w*"
            # "unscale_ isn't called anywhere"
            r"|\bunscal\w*(?:\(\w*\))?\s+(?:is\s+|was\s+)?(?:never|not|isn't|wasn't|is\s+not|was\s+not)"
            r"\s+(?:\w+\s+)?(?:called|used|invoked|there|present)",
            "amp-clip-without-unscale",
            0.5,
            "text: clipping with a GradScaler but no unscale_()",
        ),
        (
            r"\b(?:without|not|never|forg[eo]t\w*\s+to|no)\s+(?:divid\w*|scal\w*|normali[sz]\w*|"
            r"averag\w*)\s+(?:the\s+|my\s+)?(?:raw\s+)?loss|\braw\s+loss\b|\bloss\b[^.;\n]{0,20}"
            r"\b(?:not|never)\s+(?:divided|scaled|normali[sz]ed)"
            # "no division of the loss anywhere", "nothing is averaged", "sum the losses of 8
            # micro-batches and backprop the total"
            r"|\bno\s+(?:division|divid\w*|scaling|averaging|normali[sz]ation|mean)\s+(?:of\s+|on\s+)?"
            r"(?:the\s+|my\s+|their\s+)?loss"
            r"|\b(?:nothing|none\s+of\s+(?:it|them))\s+(?:is\s+|gets\s+|was\s+)?(?:averaged|divided|"
            r"normali[sz]ed|scaled)"
            r"|\bsum\w*\s+(?:up\s+)?(?:the\s+|all\s+)?loss\w*\b[^.;\n]{0,50}\b(?:backprop\w*|"
            r"backward|call\s+backward)\b[^.;\n]{0,20}\b(?:total|sum)\b",
            "accum-unscaled-loss",
            0.6,
            "text: with accumulation, the loss is not divided by the number of micro-batches",
        ),
        (
            r"zero_grad\w*(?:\(\))?[^.;\n]{0,40}\bevery\s+(?:single\s+)?(?:micro|iteration|"
            r"batch|step|forward|backward)",
            "accum-zero-grad-every-microstep",
            0.5,
            "text: zero_grad() on every micro-batch",
        ),
        (
            r"\b(?:never|don't|do\s+not|forg[eo]t\w*\s+to|without)\s+(?:call\w*\s+)?"
            r"(?:optimizer\.)?zero(?:_grad|ing|\s+the\s+grad)"
            r"|\bzero_grad\w*(?:\(\))?\s+(?:is\s+|was\s+|being\s+|gets?\s+|got\s+)?(?:skipped|missing|"
            r"never\s+called|not\s+called|removed|forgotten|omitted|left\s+out)",
            "accum-missing-zero-grad",
            0.7,
            "text: gradients are never zeroed between updates",
        ),
        (
            r"\bnorms?\b[^.;\n]{0,50}\bafter\b[^.;\n]{0,25}zero_grad|zero_grad[^.;\n]{0,30}"
            r"\bbefore\b[^.;\n]{0,30}\bnorms?\b",
            "monitor-after-zero-grad",
            0.6,
            "text: the gradient norm is read after zero_grad()",
        ),
        (
            r"\b(?:last|final|remaining|leftover|left-over|trailing)\s+(?:\d+\s+|few\s+)?"
            r"(?:micro-?)?batch\w*[^.;\n]{0,60}\b(?:thrown\s+away|dropped|ignored|lost|skipped|"
            r"wasted|discarded|never\s+(?:used|applied|make|count|stepped))"
            r"|\b(?:not|n't)\s+divisible\b|\bdoes\s*n[o']t\s+divide\s+(?:evenly|by)",
            "accum-leftover-batches",
            0.6,
            "text: the micro-batches left at the end of an epoch never reach an update",
        ),
        (
            r"\b(?:not|n't|never|no)\s+(?:\w+\s+)?(?:log|track|monitor|watch|plot|measur|record|"
            r"print|check)\w*\s+(?:the\s+|any\s+|my\s+)?grad\w*"
            r"|\b(?:only|just)\s+(?:log|print|track|monitor|watch|plot)\w*\s+(?:the\s+)?loss"
            r"|\bnever\s+(?:log|look\s+at|check|monitor|track|measure|print)\w*\s+(?:the\s+)?"
            r"grad\w*",
            "no-grad-monitoring",
            0.5,
            "text: only the loss is watched, never the gradient norms",
        ),
        (
            r"\bloss\b[^;\n]{0,30}\b(?:nan|inf|non-?finite|not\s+finite|false)\b[^;\n]{0,40}"
            r"\bbefore\b[^;\n]{0,25}backward",
            "nan-loss-before-backward",
            0.9,
            "text: the loss is non-finite before backward()",
        ),
        (
            # The other order: "printed the loss before backward(): it's already inf".
            r"\bloss\b[^;\n]{0,50}\b(?:before|prior\s+to)\b[^;\n]{0,30}backward[^\n]{0,70}?"
            r"\balready\s+(?:an?\s+)?(?:nan|inf|non-?finite)\b",
            "nan-loss-before-backward",
            0.9,
            "text: the loss is non-finite before backward()",
        ),
        (
            r"\b(?:never|don't|do\s+not|without|no|not|forg[eo]t\w*\s+to)\s+(?:use\s+|using\s+|"
            r"call\s+|calling\s+)?(?:model\.)?no_sync",
            "ddp-accum-without-no-sync",
            0.6,
            "text: DDP with accumulation and no no_sync()",
        ),
        (
            # Not when the sentence says no_sync is there (misplaced is another red flag).
            r"^(?!.*\bno_sync)(?!.*require_backward_grad_sync).*?(?:"
            r"\b(?:every|each)\s+(?:single\s+|one\s+)?(?:of\s+(?:the|our|my|its|their)\s+(?:\d+\s+)?)?"
            r"(?:micro[-\s]?batch(?:es)?|micro[-\s]?steps?|backward|"
            r"accumulation\s+steps?)\b[^.;\n]{0,40}\b(?:all[-\s]?reduc\w*|sync\w*|communicat\w*)"
            r"|\b(?:all[-\s]?reduc\w*|sync\w*|communicat\w*)\b[^.;\n]{0,40}\b(?:every|each)\s+"
            r"(?:single\s+)?(?:micro[-\s]?batch|micro[-\s]?step|backward|accumulation\s+step))",
            "ddp-accum-without-no-sync",
            0.6,
            "text: gradients are synchronised on every micro-batch of the accumulation",
        ),
        (
            r"\b(?:most|majority|more\s+than\s+half|over\s+half|half)\b[^.;\n]{0,40}\b(?:activations?|"
            r"outputs?|neurons?|units?)\b[^.;\n]{0,30}\b(?:0|zero|zeros|dead)\b",
            "many-zero-activations",
            0.5,
            "text: more than half of the activations are zero",
        ),
        (
            r"clip_grad_value_?|\b(?:clip|clamp)(?:ping|s|ed)?\s+(?:each|every|individual|all)\s+"
            r"(?:of\s+the\s+)?(?:gradient\s+|grad\s+)?(?:element|value|entr|component|coordinate)"
            r"|\.grad\w*(?:\.data)?\.clamp_?\("
            # Lightning's Trainer told to clip element by element.
            r"|gradient_clip_algorithm\s*[=:]\s*['\"]?value\b",
            "value-clipping",
            0.6,
            "text: clipping element by element (clip_grad_value_)",
        ),
        (
            r"\b(?:without|no|never|not)\s+(?:any\s+)?(?:gradient\s+)?clip",
            "no-clip-sequence-model",
            0.6,
            "text: a Transformer/RNN trained without clipping",
        ),
        (
            r"\b(?:fine|perfect|good|great|stable|stably|smooth\w*|normal\w*|healthy|beautiful\w*|"
            r"nicely)\b[^.;\n]{0,50}"
            r"\b(?:then|until|before|but|suddenly|abruptly|all\s+of\s+a\s+sudden)\b[^.;\n]{0,40}"
            r"\b(?:explod\w*|diverg\w*|skyrocket\w*|"
            r"blows?\s+up|blew\s+up|shoots?\s+up|shot\s+up|spikes?\s+up|jumps?\s+up|goes\s+to\s+"
            r"(?:nan|inf)"
            # "... then the loss climbs and keeps climbing": a climb that does not come back.
            r"|(?:climbs?|climbed|rises|rose|goes\s+up|went\s+up)\b[^.;\n]{0,40}\b(?:keeps?\s+"
            r"(?:climbing|rising|going)|never\s+(?:comes?|came)\s+back|(?:has\s+)?not\s+recovered|"
            r"stay(?:s|ed)?\s+up|since))",
            "diverges-after-stable-start",
            0.5,
            "text: stable at first, then it diverges",
        ),
        (
            r"\b(?:never|don't|do\s+not|not|without|skip\w*|instead\s+of)\s+(?:call\w*\s+|using\s+|"
            r"use\s+)?(?:the\s+)?scaler\.step\b",
            "amp-step-bypasses-scaler",
            0.7,
            "text: scaler.step(optimizer) is not what steps the optimizer",
        ),
        (
            r"\.scale\([^)]*\)\.backward\(\)[^;\n]{0,60}?(?<!scaler\.)\b(?:optimi[sz]er|optim|opt)"
            r"\w*\.step\(",
            "amp-step-bypasses-scaler",
            0.7,
            "text: scaler.scale(loss).backward() followed by a plain optimizer.step()",
        ),
        (
            # A log/exp/sqrt/division named in words, said to be unguarded or the culprit.
            r"(?:\btorch\.(?:log|exp|sqrt)\s*\(|\b(?:log|exp|sqrt)\s*\(\s*\w|\b(?:log|exp)\s+of\s+"
            r"(?:the\s+|a\s+)?(?:softmax|sigmoid|prob\w*|logits?|outputs?|predictions?)|\bdivi\w+\s+"
            r"by\s+(?:the\s+|a\s+)?(?:sum|count|number|norm|std|variance|mask))[^.;\n]{0,60}"
            r"\b(?:no\s+(?:clamp|eps\w*)|without\s+(?:a\s+|any\s+)?(?:clamp\w*|eps\w*)|not\s+clamped|"
            r"unclamped|unbounded|can\s+be\s+(?:exactly\s+)?(?:0|zero)|culprit|(?:was|is|were|became|"
            r"becomes|goes\s+to|went\s+to|hits?)\s+(?:exactly\s+)?(?:0|zero)\b)"
            # Named as the cause: "the NaNs came from torch.sqrt of an exact zero distance".
            r"|\b(?:culprit|caused\s+by|because\s+of|comes?\s+from|came\s+from|coming\s+from|"
            r"traced\s+(?:it\s+)?(?:back\s+)?to|due\s+to|originat\w*\s+(?:in|from))\b[^.;\n]{0,20}"
            r"(?:\btorch\.(?:log|exp|sqrt)\b|\b(?:log|exp|sqrt)\s*\(|\b(?:log|sqrt)\s+of\b|"
            r"\b(?:a\s+)?divi\w+\s+by\s+(?:an?\s+)?(?:exact\s+)?(?:0|zero)\b)",
            "unstable-loss-op",
            0.6,
            "text: a log/exp/sqrt or division in the loss with nothing keeping it finite",
        ),
        (
            # "sched.step() is called right after every loss.backward()", "scheduler.step() sits
            # next to backward() inside the micro-batch loop", in a text about accumulation.
            r"\b(?:lr[\s_]?)?sched\w*(?:\.step\(\))?[^.;\n]{0,40}\b(?:right\s+|directly\s+)?"
            r"(?:after|next\s+to|alongside|beside|together\s+with|with)\s+(?:every\s+|each\s+)?"
            r"(?:the\s+|a\s+)?(?:loss\.)?backward\b"
            r"|\b(?:lr[\s_]?)?sched\w*(?:\.step\(\))?[^.;\n]{0,40}\b(?:inside|in|within)\s+(?:the\s+)?"
            r"(?:inner\s+)?micro[-\s]?(?:batch|step)\s+loop",
            "accum-scheduler-per-microbatch",
            0.6,
            _SCHEDULER_WITH_BACKWARD,
        ),
        (
            # "optimizer.step() is inside the if step % 8 branch, scheduler.step() outside it"
            r"%[^.;\n]{0,80}\bsched\w*(?:\.step\(\))?[^.;\n]{0,30}\b(?:outside|not\s+inside|out\s+of)\b"
            r"|\bsched\w*(?:\.step\(\))?[^.;\n]{0,30}\b(?:outside|not\s+inside)\s+(?:of\s+)?(?:the\s+)?"
            r"(?:if|branch|condition|accumulation\s+(?:check|gate|branch))",
            "accum-scheduler-per-microbatch",
            0.6,
            "text: the scheduler steps outside the branch that steps the optimizer",
        ),
        (
            r"\b(?:lr[\s_]?)?sched\w*\b[^.;\n]{0,40}\b(?:every|each|per)\s+(?:single\s+)?(?:forward|"
            r"micro[-\s]?batch|micro[-\s]?step|backward|batch|iteration)\b[^.;\n]{0,60}\b(?:optimi[sz]"
            r"\w*|update\w*)\b[^.;\n]{0,25}\bevery\s+\d+",
            "accum-scheduler-per-microbatch",
            0.6,
            "text: the scheduler steps every micro-batch, the optimizer every N",
        ),
        (
            # Unstable under mixed precision only: the AMP symptom, not just any NaN.
            r"^(?=.*\b(?:fine|ok(?:ay)?|stable|works?|converges?|trains?)\b[^.;]{0,30}\b(?:without\s+"
            r"(?:it|amp|autocast|mixed)|in\s+(?:fp32|float32|full\s+precision)|with\s+(?:fp32|"
            r"float32)))(?=.*\b(?:mixed[\s-]precision|amp|autocast|fp16|float16|bf16|half[\s-]"
            r"precision)\b)(?=.*\b(?:nan|inf\w*|diverg\w*|blow\w*|blew|explod\w*|unstable|spik\w*))",
            "amp-diverges",
            0.6,
            "text: the run fails with mixed precision and trains in full precision",
        ),
        (
            # "NaN? lower the learning rate": the claim the rationalization answers.
            r"^(?=.*\bnan)(?=.*\b(?:lr|learning[\s_-]rate)\b)(?=.*\b(?:lower\w*|reduc\w*|drop\w*|"
            r"decreas\w*|cut\w*|smaller|halv\w*|divid\w*|shrink\w*|turn\s+down|dial\s+down)\b)",
            "lower-lr-for-nan",
            0.5,
            "text: a NaN answered by a smaller learning rate",
        ),
        (
            # A framework that already divides by the accumulation count, and a manual division.
            r"(?:accumulate_grad_batches|accelerator\.accumulate|\.accumulate\(|"
            r"gradient_accumulation_steps|engine\.backward|deepspeed)[^\n]{0,120}?(?:\bloss\w*\s*"
            r"(?:/|\*\s*1\s*/)|\bdivid\w*|\bscal\w*\s+(?:the\s+)?loss)"
            r"|(?:\bloss\w*\s*(?:/|\*\s*1\s*/)|\bdivid\w*\s+(?:the\s+)?loss)[^\n]{0,120}?"
            r"(?:accumulate_grad_batches|accelerator\.accumulate|\.accumulate\(|engine\.backward|"
            r"deepspeed)",
            "accum-double-scaling",
            0.7,
            "text: the loss is divided by hand while the framework already divides it",
        ),
        (
            # no_sync that does not do its job: the forward outside it, or the step's micro-batch
            # inside it.
            r"\bno_sync\b[^.;\n]{0,40}\b(?:wrap\w*|around|cover\w*|applied\s+to|used\s+(?:on|for)|"
            r"also\s+on|includ\w*)\b[^.;\n]{0,25}\b(?:last|final)\s+micro[-\s]?(?:batch|step)"
            r"|\b(?:forward|model\(\w*\))\b[^.;\n]{0,30}\b(?:outside|before)\s+(?:the\s+)?"
            r"(?:with\s+)?(?:block\s+of\s+)?(?:model\.)?no_sync"
            r"|\bno_sync\b[^.;\n]{0,30}\b(?:only|just)\s+(?:around|wraps?|covers?)\s+(?:the\s+)?"
            r"(?:loss\.)?backward"
            # "just the backward call in `with model.no_sync():`, the forward before entering it"
            r"|\b(?:only|just)\s+(?:the\s+)?(?:loss\.)?backward(?:\(\))?(?:\s+call)?\s+(?:is\s+|goes\s+)?"
            r"(?:in|inside|under|within)\b[^;\n]{0,40}no_sync"
            r"|\bno_sync\b[^;\n]{0,80}\bforward\b[^.;\n]{0,25}\b(?:outside|before\s+(?:entering|"
            r"the\s+with|it\b))",
            "ddp-no-sync-misplaced",
            0.7,
            "text: no_sync() does not cover the right part of the micro-batch loop",
        ),
        (
            # The grad norm pinned at one non-zero value: every step is clipped to max_norm.
            r"\bnorm\w*\b[^.;\n]{0,25}?\b(?:always|exactly|stuck\s+at|pinned\s+at|capped\s+at)\s+"
            r"(?:exactly\s+|at\s+)?(?!0(?:\.0+)?\b)\d[\d.]*[^.;\n]{0,25}\b(?:every|each|all)\s+"
            r"(?:single\s+)?(?:step|iteration|batch)"
            r"|\bnorm\w*\b[^.;\n]{0,30}\b(?:always|every\s+step)\b[^.;\n]{0,20}\b(?:equals?|"
            r"exactly|same\s+as|is)\s+(?:my\s+|the\s+)?max_norm",
            "clipping-slow-convergence",
            0.5,
            "text: the logged grad norm sits at one value on every step: every step is clipped",
        ),
        (
            # Clipping in place, and the NaN is still there.
            r"\bclip\w*\b[^.;\n]{0,60}\b(?:still|anyway|nonetheless|regardless|yet)\b[^.;\n]{0,40}"
            r"\b(?:nan|inf|infs|nans|non-?finite)\b"
            r"|\b(?:nan|inf|nans|non-?finite)\b[^.;\n]{0,60}\b(?:even\s+(?:with|after|though)|despite|"
            r"although|though)\b[^.;\n]{0,40}\bclip",
            "clipping-did-not-fix-nan",
            0.6,
            "text: clipping is in place and the loss still turns NaN",
        ),
        (
            # The loss jumps and comes back: a spike, told in words.
            r"\b(?:loss(?:es)?|perplexity|ppl)\b[^.;\n]{0,30}\b(?:jump\w*|spik\w*|shoot\w*|shot|"
            r"leap\w*|surg\w*|skyrocket\w*)\b[^.;\n]{0,50}\b(?:comes?\s+(?:right\s+)?back|came\s+back|"
            r"recover\w*|returns?|returned|drops?\s+back|dropped\s+back|goes\s+back|went\s+back|"
            r"settles?\s+back|back\s+down)\b",
            "loss-spikes",
            0.5,
            "text: the loss jumps, then comes back",
        ),
        (
            # Whether to clip at all, asked ("do I actually need clip_grad_norm_ here?", "is
            # clipping even necessary for me?", "would a clip be worth adding?").
            r"\b(?:do|does|would|will|should|must)\s+(?:i|we|you|it|they|one|(?:a|my|our|the|this)"
            r"(?:\s+[\w-]+){1,3})\s+(?:\w+\s+)?(?:actually\s+|really\s+|even\s+|ever\s+|still\s+|"
            r"also\s+)?(?:need|require|want|bother|benefit)\b[^.;\n?]{0,40}\bclip"
            r"|\b(?:is|are)\s+(?:gradient\s+|grad\s+|norm\s+)?clip\w*(?:\s+\w+){0,2}\s+(?:even\s+|"
            r"really\s+|actually\s+|ever\s+|strictly\s+|still\s+)?(?:necessary|needed|required|"
            r"worth\s+it|worthwhile|useful|a\s+must)\b"
            r"|\bclip\w*\b[^.;\n?]{0,30}\b(?:be\s+)?worth\s+(?:adding|it|using|having|turning\s+on)\b"
            r"|\b(?:worth|any\s+point\s+in|point\s+of)\s+(?:adding|using|having|turning\s+on|"
            r"enabling|putting|including|inserting|keeping|calling|doing)\s+(?:a\s+|any\s+|gradient\s+|"
            r"grad\s+|torch\.nn\.utils\.|nn\.utils\.|`)?clip"
            r"|\bshould\s+(?:i|we)\s+(?:even\s+|really\s+)?(?:bother\s+(?:with|adding|using)|add|use|"
            r"enable|turn\s+on|be\s+using|be\s+clipping)\b[^.;\n?]{0,25}\bclip"
            # "is gradient clipping something I actually have to add", "do I have to use clipping"
            r"|\b(?:is|are)\s+(?:gradient\s+|grad\s+|norm\s+)?clip\w*\s+(?:something|a\s+thing)\s+"
            r"(?:that\s+)?(?:i|we|you)\s+(?:\w+\s+)?(?:have\s+to|need\s+to|must|should)\b"
            r"|\b(?:do|does)\s+(?:i|we)\s+(?:actually\s+|really\s+)?have\s+to\s+(?:add|use|do|"
            r"turn\s+on)\s+(?:gradient\s+|grad\s+)?clip",
            "is-clipping-needed",
            0.8,
            "text: asks whether clipping is needed at all",
        ),
        (
            # Needing clipping taken as proof of a bug, or a fix offered instead of clipping.
            r"\b(?:need\w*|requir\w*|rely\w*\s+on|using)\s+(?:gradient\s+)?clip\w*\s+(?:at\s+all\s+)?"
            r"(?:means|is\s+a\s+sign|shows|signals|indicates|implies|proves)\b[^.;\n]{0,40}\b(?:wrong|"
            r"broken|bug\w*|bad\w*|flaw\w*|poor\w*|problem\w*|mistake\w*)"
            r"|\b(?:fix|repair|redesign|change|correct)\b[^.;\n]{0,40}\binstead\s+of\s+clip",
            "clipping-is-a-hack",
            0.6,
            "text: needing clipping is taken as a sign of a bug to fix instead",
        ),
        (
            # Activation checkpointing said to break clipping (it recomputes activations, the
            # gradients and their norm are the same).
            r"\bcheckpoint\w*\b[^.;\n]{0,60}\b(?:wrong|won't\s+work|doesn't\s+work|does\s+not\s+work|"
            r"break\w*|incompatible|conflict\w*|interfer\w*|mess\w*|can't|cannot|invalid)\b"
            r"[^.;\n]{0,40}\bclip|\bclip\w*\b[^.;\n]{0,40}\b(?:wrong|won't\s+work|doesn't\s+work|"
            r"break\w*|incompatible|conflict\w*|interfer\w*|mess\w*|can't|cannot|invalid)\b"
            r"[^.;\n]{0,40}\bcheckpoint",
            "checkpointing-breaks-clipping",
            0.6,
            "text: activation checkpointing said to break clipping",
        ),
        (
            # A paper silent about clipping (not one that says it trained without it).
            r"\b(?:paper|authors?|publication|article|appendix|hyper-?parameter\s+table|table)\b"
            r"[^.;\n]{0,50}\b(?:no\s+(?:mention|word|entry|row|line|detail)|(?:doesn't|does\s+not|"
            r"don't|do\s+not|never|didn't|did\s+not)\s+(?:\w+\s+)?(?:mention|say|list|report|"
            r"specify|state|document|talk\s+about)|(?:says|said|is|are)\s+(?:nothing|silent)|"
            r"nothing\s+(?:about|on))\b[^.;\n]{0,30}\bclip"
            r"|\b(?:paper|authors?|publication|appendix|table)\b[^.;\n]{0,50}\bno\s+(?:gradient\s+)?"
            r"clip\w*\s+(?:entry|row|line|setting|value|field|column|mention|detail)"
            r"|\bclip\w*\b[^.;\n]{0,30}\b(?:not|never|isn't|wasn't)\s+(?:mentioned|listed|reported|"
            r"specified|documented)\b[^.;\n]{0,30}\b(?:paper|authors?|publication|table|appendix)",
            "paper-does-not-mention-clipping",
            0.5,
            "text: the paper says nothing about clipping (silence is not a decision not to clip)",
        ),
        (
            # Non-finite values in what goes into the model: the data is the origin.
            r"\b(?:inputs?|input\s+(?:features|tensors?)|features?|images?|pixels?|batch(?:es)?|"
            r"samples?|targets?|labels?|examples?|records?|rows?|columns?|fields?|entries|"
            r"(?:csv|parquet|jsonl?|data\s*set|dataset)\s+(?:files?|rows?|columns?|values?))\b"
            r"[^.;\n]{0,30}\b(?:had|have|has|"
            r"contain\w*|with|includ\w*|are|were|is|was)\b[^.;\n]{0,20}\b(?:nan|inf)\w*",
            "nonfinite-inputs",
            0.6,
            "text: the inputs themselves hold NaN or Inf",
        ),
        (
            r"\w+Backward\d*'?\s+returned\s+(?:nan|inf)",
            "nan-gradients",
            0.6,
            "text: autograd's anomaly mode saw a non-finite value produced during backward()",
        ),
        (
            r"\b(?:improv\w*|decreas\w*|goes\s+down|went\s+down|drops?|dropped|falls?|fell|"
            r"better)\b[^.;\n]{0,50}\b(?:then|afterwards|later|after\s+that)\b[^.;\n]{0,40}"
            r"\b(?:worse|increas\w*|rises?|rising|rose|climb\w*|goes\s+up|went\s+up)"
            # "my loss goes up after epoch 20 when I accumulate" (the fall before is implied)
            r"|\bloss\w*\s+(?:\w+\s+){0,2}?(?:go(?:es)?|going|went|start(?:s|ed)?\s+(?:to\s+)?"
            r"go(?:ing)?)\s+up\b|\bloss\w*\s+(?:\w+\s+){0,2}?(?:increas\w*|ris(?:es|ing)|rose|"
            r"climb\w*|gets?\s+worse|getting\s+worse)",
            "loss-down-then-up-with-accumulation",
            0.5,
            "text: the loss first improves, then gets worse, with accumulation",
        ),
        (
            # "sits at 0.35 for the last 20 epochs after a fast initial drop" (flat part first)
            r"\b(?:sits?|sat|stays?|stayed|stuck|flat\w*|plateau\w*|hover\w*|stall\w*)\b[^.;\n]{0,60}"
            r"\bafter\s+(?:a|an|the|its)\s+(?:\w+\s+){0,2}(?:drop|fall|decrease|decline|improvement|"
            r"descent|progress)\b|"
            r"\b(?:after\s+(?:a\s+)?(?:good|great|nice|promising|decent|fast|quick)\s+start|"
            r"(?:drop\w*|decreas\w*|fell|falls?|improv\w*|went\s+down|goes\s+down)\s+(?:nicely|quickly|"
            r"fast|well)?)[^.;\n]{0,60}\b(?:flat\w*|plateau\w*|stall\w*|stuck|stopped|levels?\s+off|"
            r"(?:has\s+|have\s+)?(?:sat|sits?|sitting|stayed|stays?|hovered|hovers?)\s+(?:at|around|"
            r"near)\b|"
            r"levell?ed\s+off|won't\s+improve|not\s+improv\w*)",
            "plateau",
            0.4,
            "text: progress first, then the loss stops improving",
        ),
        # -- how users tell what their own loop does, or what they measured (issue 15) --------
        (
            # "I call backward on each micro-batch loss as is": nothing divides it.
            r"\bloss\w*\s+(?:just\s+)?(?:as\s+is|as-is|unchanged|undivided|unscaled|untouched)\b"
            r"|\b(?:backward|backprop\w*)\b[^.;\n]{0,50}\b(?:as\s+is|as-is|undivided|unscaled)\b",
            "accum-unscaled-loss",
            0.6,
            "text: with accumulation, each micro-batch loss goes into backward undivided",
        ),
        (
            # "zero_grad() is the first line of my loop, but step() only runs every 4th batch"
            r"^(?=.*\b(?:only|once\s+(?:per|every|in)|every\s+\d+\w*|every\s+(?:other|few|\w+th)\b))"
            r".*?(?:zero_grad\w*(?:\(\))?|\b(?:clear|zero|reset|wipe)\w*\s+(?:the\s+|all\s+|my\s+)?"
            r"grad\w*)[^.;\n]{0,60}\b(?:every|each|first\s+(?:line|thing|statement|call)|top\s+of|"
            r"start\s+of|beginning\s+of)\b",
            "accum-zero-grad-every-microstep",
            0.5,
            "text: gradients are cleared on every batch while the optimizer steps only every N",
        ),
        (
            # "each batch starts with optimizer.zero_grad(), and the update happens only when
            # step % 4 == 0": the clearing told first, the gate after.
            r"^(?=.*(?:\bonly\b|\bonce\s+(?:per|every|in)\b|\bevery\s+\d+|%\s*\w+\s*==\s*0))"
            r".*?\b(?:each|every)\s+(?:single\s+)?(?:micro[-\s]?)?(?:batch|iteration|step|loop|"
            r"forward)\w*\s+(?:starts|begins|opens)\s+with\s+(?:an?\s+|the\s+)?(?:\w+\.)?(?:zero_grad|"
            r"clear\w*|reset\w*|zero\w*)",
            "accum-zero-grad-every-microstep",
            0.5,
            "text: gradients are cleared on every batch while the optimizer steps only every N",
        ),
        (
            # "I loop over the parameters and do p.grad /= 4", "divide each .grad by the count"
            r"(?:\.grad\w*|\bgrads?|\bgradients?)\s*(?:\.data\s*)?/=\s*\w+|\.grad\w*\.div_\s*\("
            r"|\b(?:divid\w*|rescal\w*)\s+(?:each|every|all|the)\s+(?:of\s+the\s+)?(?:\w+(?:'s)?\s+)?"
            r"\.?(?:p\.)?grad\w*\b[^.;\n]{0,30}\bby\s+(?:the\s+)?(?:accum\w*|number|count|n\b|\d+|"
            r"micro|steps?)",
            "accum-manual-grad-scaling",
            0.6,
            "text: each parameter's gradient is divided by N by hand",
        ),
        (
            # "NaN in the gradient of layer 5 while the loss itself is still finite"
            r"^(?=.*(?:\bloss\w*\s+(?:itself\s+|value\s+)?(?:is|was|stays?|remains?|looks?|prints?|"
            r"seems?)\s+(?:still\s+)?(?:perfectly\s+)?(?:finite|fine|ok|okay|normal|not\s+nan)\b|"
            r"\bfinite\s+loss))"
            r"(?=.*\b(?:nan|inf)).*?\bgrad",
            "nan-gradients",
            0.6,
            "text: the gradients hold NaN/Inf while the loss is finite",
        ),
        (
            # "torch.isnan(batch['pixel_values']).any() is True": a check on the inputs.
            # Not when the check's own result says finite ("isfinite(batch).all() is True").
            r"\bis(?:nan|inf)\s*\(\s*(?:batch|inputs?|input_ids|x|xb|images?|imgs?|pixel\w*|"
            r"features?|data|samples?|targets?|labels?|y|yb)\b(?![^\n;]{0,50}?\b(?:false|0)\b)"
            r"|\bisfinite\s*\(\s*(?:batch|inputs?|input_ids|x|xb|images?|imgs?|pixel\w*|"
            r"features?|data|samples?|targets?|labels?|y|yb)\b(?![^\n;]{0,50}?\btrue\b)",
            "nonfinite-inputs",
            0.6,
            "text: a non-finite check on the model's inputs",
        ),
        (
            # "35% of the ReLU units never activate on any input", "dead neurons"
            r"\b(?:neurons?|units?|channels?|filters?|relus?)\b[^.;\n]{0,60}\b(?:never\s+(?:fire|"
            r"fires|activate|activates|turn\s+on|light\s+up|respond|>\s*0|above\s+(?:0|zero)|"
            r"positive|non-?zero|(?:become\s+|get\s+)?active)|(?:are|is|have\s+been|has\s+been|"
            r"went|gone|go|became|become)\s+dead|(?:output|produce|give|return|emit)\w*\s+"
            r"(?:exactly\s+|always\s+|only\s+)?(?:0|zero)"
            r"\w*\s+(?:for|on)\s+(?:every|all|any|each))|\bdead\s+(?:relu\s+)?(?:neurons?|units?|"
            r"channels?|filters?)\b",
            "dead-neurons",
            0.7,
            "text: units that never fire on any input",
        ),
        (
            # "most values coming out of the ReLU are exactly zero"
            r"\b(?:most|majority|more\s+than\s+half|over\s+half|\d{2,3}\s*%)\b[^.;\n]{0,60}"
            r"\b(?:relu|activation|hidden)\w*\b[^.;\n]{0,40}\b(?:are|is|were|come\s+out)\s+"
            r"(?:exactly\s+|all\s+)?(?:0|zero|zeros)\b",
            "many-zero-activations",
            0.5,
            "text: most activation values are zero",
        ),
        (
            # "the NaN is almost certainly the learning rate": the LR blamed for a NaN.
            r"\bnan\w*\b[^.;\n]{0,40}\b(?:is|comes?\s+from|caused\s+by|due\s+to|because\s+of|from)\s+"
            r"(?:\w+\s+){0,3}(?:lr|learning[\s_-]rate)\b",
            "lower-lr-for-nan",
            0.5,
            "text: the learning rate is blamed for the NaN",
        ),
        (
            # "clip_grad_norm_ straight after scaler.scale(loss).backward()" with no unscale_.
            r"^(?![^\n]*unscal)(?=[^\n]*scaler)[^\n]*?\bclip\w*[^.;\n]{0,40}\bafter\b[^.;\n]{0,30}"
            r"(?:scaler\.scale\(|scaled\s+(?:loss|backward)|backward)"
            r"|^(?![^\n]*unscal)[^\n]*?scaler\.scale\([^)]*\)\.backward\(\)[^.;\n]{0,30}"
            r"\b(?:then|followed\s+by|before)\b[^.;\n]{0,30}clip",
            "amp-clip-without-unscale",
            0.5,
            "text: clipping straight after the scaled backward, no unscale_() in between",
        ),
        (
            # "the gradient norm is 50 times the weight norm"
            r"\bgrad\w*(?:\s+norms?)?\b[^.;\n]{0,25}\b\d+(?:\.\d+)?\s*(?:x|×|times)\s+"
            r"(?:(?:the|its|their)\s+)?(?:weight|param\w*)",
            "grad-param-ratio",
            0.6,
            "text: the gradient norm is a multiple of the weight norm",
        ),
        (
            # "the paper use 128 so I need it" in a text about a batch size that runs out of
            # memory: the number the recipe trains with is the batch wanted.
            r"\b(?:paper|recipe|reference|authors?|original\s+(?:run|setup|code|repo))\b[^.;\n]{0,15}"
            r"\b(?:uses?|used|has|had|trains?\s+with|trained\s+with|ran\s+with)\s+(?:a\s+)?"
            r"(?:bs\s*|batch(?:[_\s-]?size)?\s*(?:of\s*)?)?\d{2,}\b(?!\s*(?:epochs?|steps?|k\b|"
            r"layers?|gpus?|heads?|%|gb|hours?|dims?|tokens?))",
            "oom-wants-larger-batch",
            0.6,
            _RECIPE_BATCH,
        ),
        (
            # "Paper recipe wants bs 64; anything above 12 OOMs": a batch size wanted (a recipe's,
            # a target) in a text that says memory runs out.
            r"\b(?:wants?|wanted|needs?|needed|requires?|required|calls?\s+for|reach|get\s+to|"
            r"train\s+with)\b[^.;\n]{0,30}\b(?:bs|batch(?:[_\s-]?size)?|batch(?:es)?\s+of)\s*[:=]?\s*"
            r"\d{2,}\b"
            r"|\b(?:the\s+)?(?:recipe|paper's|target|original|intended|full)\s+batch(?:[_\s-]?size)?\b",
            "oom-wants-larger-batch",
            0.6,
            _WANTED_BATCH,
        ),
        # -- proposals that are the rationalization itself (matcher6) --------------------------
        (
            # "My plan is to tell them to cut the learning rate from 3e-4 to 3e-5": lowering the
            # LR as the plan, in a text about a NaN (the belief that a smaller LR cures it).
            r"^(?=.*\b(?:plan\w*|going\s+to|gonna|will|\w+'ll|want\s+to|tell\s+(?:them|him|her|the\s+"
            r"user)\s+to|recommend\w*|suggest\w*|advise\w*)\b).*?\b(?:cut|lower|drop|reduc|decreas|"
            r"halv|divid)\w*\s+(?:the\s+|their\s+|its\s+)?(?:learning[\s_-]*rate|lr)\b",
            "lower-lr-for-nan",
            0.8,
            _LOWER_LR_PLAN,
        ),
        (
            # "so im just gonna crank it to 0.01": a max_norm below 0.1 as the plan.
            r"^(?=.*(?:clip|norm)).*?\b(?:crank|drop|lower|set|cut|reduc|tighten|bring|turn|decreas|"
            r"dial|take)\w*\s+"
            r"(?:it|that|this|the\s+(?:clip\w*|max[_\s]norm|threshold|limit)|max_(?:grad_)?norm)"
            r"\s+(?:all\s+the\s+way\s+)?(?:down\s+)?to\s+(?:0?\.0\d*|\d(?:\.\d+)?e-\d+)\b"
            # "Plan is to set max_norm=0.01": the value written as the assignment it will be,
            # said as a plan ("I set max_norm=0.01 and ..." reports what was done).
            r"|^(?=.*\b(?:plan\w*|going\s+to|gonna|will|\w+'ll|want\s+to|thinking\s+(?:of|about)|"
            r"about\s+to|idea\s+is|next)\b).*?\b(?:set|lower|drop|cut|reduc|tighten|decreas)\w*\s+"
            r"(?:the\s+)?max_(?:grad_)?norm\s*[=:]\s*(?:0?\.0\d*|\d(?:\.\d+)?e-\d+)\b",
            "clip-harder",
            0.9,
            "text: plans to tighten the clip threshold below 0.1",
        ),
    )
)


#: Rules that also need a second pattern somewhere in the same sentence.
_PROSE_REQUIRES: dict[str, re.Pattern[str]] = {
    "loss-down-then-up-with-accumulation": _regex.compile(r"accum|micro-?batch", re.IGNORECASE),
    "accum-leftover-batches": _regex.compile(
        r"accum|micro-?batch|every\s+\d+|epoch", re.IGNORECASE
    ),
    "clip-anywhere": _regex.compile(r"\bclip", re.IGNORECASE),
    "no-clip-sequence-model": _regex.compile(
        r"\b(?:lstm|gru|rnn|transformer|seq2seq|gpt|bert|t5|llm|language\s+model|"
        r"policy\s+gradient)",
        re.IGNORECASE,
    ),
}
#: "i.e." and "e.g." end no sentence: what follows them explains the same clause.
_SENTENCE_END = _regex.compile(r"(?<=[.;!?])(?<!\bi\.e\.)(?<!\be\.g\.)\s+|\n", re.IGNORECASE)
#: Longest piece of text one rule looks at; bounds the regex work on pathological input.
SEGMENT_CHARS = 400


def segments(text: str) -> list[str]:
    """``text`` cut into sentences (and lines), none longer than ``SEGMENT_CHARS``."""
    out: list[str] = []
    for piece in _SENTENCE_END.split(text):
        while len(piece) > SEGMENT_CHARS:
            out.append(piece[:SEGMENT_CHARS])
            piece = piece[SEGMENT_CHARS:]
        if piece.strip():
            out.append(piece)
    return out


#: A rule's hit dropped when a narrower rule also read the text: units that never fire on
#: any input are dead neurons, not merely many zero activations at one moment.
SUPERSEDED_BY: dict[str, set[str]] = {"many-zero-activations": {"dead-neurons"}}
#: Rules that stay silent when the same sentence also says the order does not matter.
_ORDER_RULES = frozenset({"clip-after-step", "clip-before-backward"})
#: Reasons of rules that read the result of a check the user ran: what they found (a
#: measurement), never advice to blame it.
MEASURED_CHECKS = frozenset(
    {"text: a non-finite check on the model's inputs counted NaN/Inf values"}
)
#: Red flag → the rationalization that recommends it (credited when the text is advice).
ADVICE_FOR: dict[str, str] = {
    "nonfinite-inputs": "nan-means-bad-data",
    "accum-manual-grad-scaling": "scale-grads-not-loss",
    "clip-too-aggressive": "clip-harder",
    "clip-after-step": "clip-anywhere",
}


_DEPTH = _regex.compile(
    r"\b(?P<n>\d{2,4})\s*[- ]?(?:layers?|deep|linear\b)[^.;\n]{0,50}\b(?:sigmoid|tanh)"
    r"|\b(?:sigmoid|tanh)\b[^.;\n]{0,50}\b(?P<m>\d{2,4})\s*[- ]?layers?",
    re.IGNORECASE,
)
_DEEP_SATURATING = _regex.compile(
    r"\b(?:very\s+)?deep\s+(?:\w+\s+)?(?:sigmoid|tanh|logistic)\s*(?:-\s*)?(?:activated\s+)?"
    r"(?:net\w*|mlp|model|stack|classifier|autoencoder)"
    r"|\b(?:sigmoid|tanh)\s+(?:activations?\s+)?(?:in|throughout|after\s+every\s+layer\s+of)\s+"
    r"(?:a|my|our|the)\s+(?:very\s+)?deep\b",
    re.IGNORECASE,
)


#: Words without which a rule cannot match (lower case): the rule is skipped, and compiled
#: only the first time a text has one (start-up compiles none; a test checks each trigger).
_PROSE_TRIGGERS: dict[str, tuple[str, ...]] = {
    "clip-anywhere": ("clip",),
    "accum-manual-grad-scaling": ("grad",),
    "clip-after-step": ("clip",),
    "clip-before-backward": ("clip",),
    "amp-clip-without-unscale": ("unscal", "scaler"),
    "accum-unscaled-loss": ("loss",),
    "accum-zero-grad-every-microstep": ("zero", "clear", "reset", "wipe"),
    "accum-missing-zero-grad": ("zero",),
    "monitor-after-zero-grad": ("zero",),
    "no-grad-monitoring": ("grad", "loss"),
    "nan-loss-before-backward": ("backward", "isfinite"),
    "ddp-accum-without-no-sync": ("sync", "reduc", "communicat"),
    "many-zero-activations": ("0", "zero", "dead"),
    "value-clipping": ("clip", "clamp"),
    "no-clip-sequence-model": ("clip",),
    "amp-step-bypasses-scaler": ("scale",),
    "nan-gradients": ("backward", "grad"),
    "loss-down-then-up-with-accumulation": ("accum", "micro"),
    "accum-double-scaling": ("accum", "deepspeed", "engine"),
    "ddp-no-sync-misplaced": ("no_sync",),
    "clipping-slow-convergence": ("norm",),
    "nonfinite-inputs": ("nan", "inf", "finite"),
    "paper-does-not-mention-clipping": ("clip",),
    "clipping-is-a-hack": ("clip",),
    "is-clipping-needed": ("clip",),
    "loss-spikes": ("loss", "perplexity", "ppl"),
    "clipping-did-not-fix-nan": ("clip",),
    "checkpointing-breaks-clipping": ("checkpoint",),
    "amp-diverges": ("fp16", "float16", "bf16", "amp", "autocast", "mixed", "half"),
    "lower-lr-for-nan": ("nan",),
    "clip-harder": ("clip", "norm"),
    "nan-parameters": ("isnan", "isinf"),
    "dead-neurons": ("dead", "never", "zero", "output"),
    "grad-param-ratio": ("times", "x", "×"),
    "accum-scheduler-per-microbatch": ("sched",),
    "oom-wants-larger-batch": ("batch", "bs"),
    "accum-leftover-batches": ("batch", "divisib", "divide"),
    "unstable-loss-op": ("log", "exp", "sqrt", "divi"),
}


@cache
def _prose_rule(index: int) -> re.Pattern[str]:
    return _regex.compile(_PROSE_RULES[index][0], re.IGNORECASE)


_BATCH_COUNT = _regex.compile(
    r"\b(?P<n>\d+)\s+(?:micro[-\s]?)?batch(?:es)?\b[^.;\n?]{0,60}?\b(?:every|each)\s+(?P<k>\d+)\b"
    r"|\b(?:every|each)\s+(?P<k2>\d+)\s+(?:micro[-\s]?)?(?:batch(?:es)?|steps?)\b[^.;\n?]{0,60}?"
    r"\b(?P<n2>\d+)\s+(?:micro[-\s]?)?batch(?:es)?\b",
    re.IGNORECASE,
)


def _leftover_counts(pieces: list[str]) -> CodeHit | None:
    """ "1003 batches, a step every 8": the 3 batches after the last update are never applied."""
    for piece in pieces:
        if "batch" not in piece.lower():
            continue
        for m in _BATCH_COUNT.finditer(piece):
            n = int(m.group("n") or m.group("n2"))
            k = int(m.group("k") or m.group("k2"))
            if 2 <= k < n and n % k:
                return CodeHit(
                    "accum-leftover-batches",
                    0.6,
                    f"text: {n} batches with an update every {k}: the last {n % k} never reach "
                    "an optimizer step unless the epoch's end is handled",
                )
    return None


def prose_hits(text: str) -> list[CodeHit]:
    """Evidence from the order of events as stated in words (sentence by sentence)."""
    hits: list[CodeHit] = []
    pieces = segments(text)
    for piece in pieces:
        depth = _DEPTH.search(piece)
        if depth and int(depth.group("n") or depth.group("m")) > 20:
            hits.append(
                CodeHit("saturating-deep-net", 0.6, "text: more than 20 sigmoid/tanh layers")
            )
            break
        if _DEEP_SATURATING.search(piece):
            # "my deep sigmoid net": the depth is not given, so weaker than a layer count.
            hits.append(
                CodeHit("saturating-deep-net", 0.4, "text: a deep network of sigmoid/tanh layers")
            )
            break
    leftover = _leftover_counts(pieces)
    if leftover is not None:
        hits.append(leftover)
    lowered = text.lower()
    # (A set and plain loops: this runs over every prose rule for every query.)
    hit_ids = {h.entry_id for h in hits}
    for index, (_, entry_id, strength, reason) in enumerate(_PROSE_RULES):
        if entry_id in hit_ids:
            continue
        triggers = _PROSE_TRIGGERS.get(entry_id)
        if triggers is not None:
            for trigger in triggers:
                if trigger in lowered:
                    break
            else:
                continue
        pattern = _prose_rule(index)
        needs = _PROSE_REQUIRES.get(entry_id)
        for piece in pieces:
            if not pattern.search(piece) or (needs is not None and not needs.search(piece)):
                continue
            if entry_id in _ORDER_RULES and _order_free(piece):
                continue
            if entry_id == "clip-anywhere" and not _order_free(piece):
                continue
            text_needs = _TEXT_REQUIRES.get(reason)
            if text_needs is not None and not text_needs.search(text):
                continue
            # A check's result is a measurement, never advice to blame the data.
            advice = None if reason in MEASURED_CHECKS else ADVICE_FOR.get(entry_id)
            hits.append(CodeHit(entry_id, strength, reason, advice))
            hit_ids.add(entry_id)
            break
    found = {h.entry_id for h in hits}
    return [h for h in hits if not (SUPERSEDED_BY.get(h.entry_id, set()) & found)]
