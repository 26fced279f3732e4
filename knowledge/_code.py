"""Light, order-based rules over code fragments pasted into a question.

Private to ``knowledge.matcher``. This is not the static analyser (``probes.static`` reads
whole scripts with libcst; ``knowledge`` must not depend on ``probes``): fragments here are
partial, elided with ``...``, badly indented or embedded in prose, so the rules look at the
order of a handful of call events and, where indentation survives, at which ones sit under an
``if step % N`` gate.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Call events, in the order they appear in the fragment.
_EVENTS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("scaled_backward", re.compile(r"\.scale\s*\([^\n]*?\)\s*\.\s*backward\s*\(")),
    ("backward", re.compile(r"(?<![\w.])(?:[\w\]\)]+\s*\)?\s*\.\s*)?backward\s*\(")),
    ("unscale", re.compile(r"\.\s*unscale_\s*\(")),
    ("clip_norm", re.compile(r"clip_grad_norm_?\s*\(|clip_grad_norm\b|clip_gradients?\s*\(")),
    ("clip_value", re.compile(r"clip_grad_value_?\s*\(")),
    ("scaler_step", re.compile(r"\bscaler\w*\s*\.\s*step\s*\(")),
    ("sched_step", re.compile(r"\b\w*(?:sched|lr_sched|scheduler|warmup)\w*\s*\.\s*step\s*\(")),
    ("opt_step", re.compile(r"\b\w*(?:optim|opt)\w*\s*\.\s*step\s*\(")),
    ("zero_grad", re.compile(r"zero_grad\s*\(|\.grad\s*=\s*None|\.grad\.zero_\s*\(")),
    ("norm_read", re.compile(r"\.grad\w*\s*\.\s*norm\s*\(|\.grad\.data\.norm\s*\(|\bgrad_norm\b")),
    ("grad_div", re.compile(r"\.grad\s*(?:/=|\*=|\.div_\s*\(|\.mul_\s*\(|=\s*[\w.]+\.grad\s*/)")),
    ("accum_gate", re.compile(r"\bif\b[^\n]*%[^\n]*")),
)
_BACKWARD_LINE_SKIP = re.compile(r"\.scale\s*\(")
_SCALER = re.compile(r"GradScaler\s*\(|\bscaler\s*\.\s*scale\s*\(|\bscaler\b")
_DDP = re.compile(r"DistributedDataParallel|\bDDP\s*\(|torchrun|init_process_group")
_NO_SYNC = re.compile(r"no_sync\s*\(")
_LOSS_DIVIDED = re.compile(
    r"loss\w*\s*(?:/|\*\s*\(?\s*1(?:\.0)?\s*/|\.div)|loss\w*\s*/=|/\s*\w*(?:accum|grad_acc|gas|"
    r"n_micro|micro)\w*|\bloss\w*\s*=\s*[^\n]*/\s*[\w.()]+|\*\s*\(?\s*1\s*/\s*\w+"
)
_MAX_NORM = re.compile(
    r"clip_grad_norm_?\s*\([^,()]*(?:\([^()]*\))?[^,()]*,\s*(?:max_norm\s*=\s*)?"
    r"(?P<num>\d*\.?\d+(?:e[-+]?\d+)?)|max_norm\s*=\s*(?P<kw>\d*\.?\d+(?:e[-+]?\d+)?)"
)
_SEQUENCE_MODEL = re.compile(
    r"nn\.(?:LSTM|GRU|RNN|Transformer\w*|MultiheadAttention)\b|GPT|Bert|T5|policy_gradient|"
    r"log_prob",
)
_SATURATING = re.compile(r"nn\.(?:Sigmoid|Tanh)\s*\(|torch\.(?:sigmoid|tanh)\s*\(")
_DEEP_RANGE = re.compile(r"range\s*\(\s*(?P<n>\d+)\s*\)|\]\s*\*\s*(?P<m>\d+)")
_UNSTABLE_OP = re.compile(
    r"torch\.log\s*\((?P<a>[^()\n]*(?:\([^()\n]*\))?[^()\n]*)\)|\.log\s*\(\s*\)|"
    r"torch\.sqrt\s*\((?P<b>[^()\n]*)\)|torch\.exp\s*\("
)
_EPS = re.compile(r"eps|1e-|clamp|\+\s*\d")
_TOKEN_MEAN = re.compile(r"ignore_index|attention_mask|padding|pad_token|num_tokens|n_tokens")
_LEFTOVER_HANDLED = re.compile(r"len\s*\(\s*\w*loader\w*\s*\)|is_last|last_batch|remainder")
_LIGHTNING = re.compile(r"pl\.Trainer|Trainer\s*\(|LightningModule|on_after_backward")

_CODE_HINT = re.compile(
    r"```|\.backward\s*\(|\.step\s*\(|zero_grad|clip_grad_|GradScaler|unscale_|no_sync|"
    r"^\s*(?:for|if|def|import|from)\b[^\n]*:?\s*$",
    re.MULTILINE,
)


@dataclass(frozen=True)
class Event:
    """One call event: its kind, line number (0-based), indentation and text of its line."""

    kind: str
    line: int
    indent: int
    text: str


@dataclass(frozen=True)
class CodeHit:
    """A rule that fired: the entry id it points to, how sure (0–1) and why."""

    entry_id: str
    strength: float
    reason: str


def looks_like_code(text: str) -> bool:
    """Whether ``text`` contains pasted code worth running the rules over."""
    return bool(_CODE_HINT.search(text))


def _events(code: str) -> list[Event]:
    events: list[Event] = []
    for number, raw_line in enumerate(code.splitlines()):
        line = raw_line.split("#", 1)[0] if "#" in raw_line else raw_line
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip(" \t"))
        hits: list[tuple[int, str]] = []
        taken: list[tuple[int, int]] = []
        for kind, pattern in _EVENTS:
            for m in pattern.finditer(line):
                span = (m.start(), m.end())
                if any(s < span[1] and span[0] < e for s, e in taken):
                    continue
                taken.append(span)
                hits.append((m.start(), kind))
        for _, kind in sorted(hits):
            events.append(Event(kind, number, indent, line.strip()))
    return events


def _under_gate(event: Event, gates: list[Event]) -> bool:
    """Whether ``event`` sits in the block of an ``if … % N`` gate (needs indentation)."""
    for gate in gates:
        if gate.line == event.line and ":" in gate.text and gate.text.rstrip().endswith(")"):
            return True
        if gate.line < event.line and event.indent > gate.indent:
            return True
        if gate.line == event.line and not gate.text.rstrip().endswith(":"):
            # One-line form: ``if (i + 1) % n == 0: optimizer.step()``.
            return True
    return False


def analyse(code: str) -> list[CodeHit]:
    """The rules that fire on ``code`` (a fragment, possibly embedded in prose)."""
    code = code.replace("…", "...")
    events = _events(code)
    kinds = [e.kind for e in events]
    hits: list[CodeHit] = []

    def add(entry_id: str, strength: float, reason: str) -> None:
        if all(h.entry_id != entry_id for h in hits):
            hits.append(CodeHit(entry_id, strength, reason))

    scaler_in_use = bool(_SCALER.search(code)) or "scaled_backward" in kinds
    steps = [i for i, k in enumerate(kinds) if k in ("opt_step", "scaler_step")]
    backwards = [i for i, k in enumerate(kinds) if k in ("backward", "scaled_backward")]
    gates = [e for e in events if e.kind == "accum_gate"]
    accumulating = bool(gates) and bool(backwards) and bool(steps)

    for i, kind in enumerate(kinds):
        if kind not in ("clip_norm", "clip_value"):
            continue
        before = [k for k in kinds[:i] if k in ("backward", "scaled_backward", "opt_step",
                                                  "scaler_step", "zero_grad")]
        last = before[-1] if before else None
        if last in ("opt_step", "scaler_step"):
            add("clip-after-step", 1.0, "code: the clip call comes after optimizer.step()")
        elif (last in (None, "zero_grad")) and any(b > i for b in backwards):
            add("clip-before-backward", 1.0, "code: the clip call comes before backward()")
        if scaler_in_use and kind == "clip_norm" and "unscale" not in kinds[:i]:
            add(
                "amp-clip-without-unscale",
                1.0,
                "code: GradScaler in use and the clip runs without scaler.unscale_() before it",
            )
        if kind == "clip_value":
            add("value-clipping", 0.9, "code: clip_grad_value_ clips each element, not the norm")

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
        add("amp-step-bypasses-scaler", 0.8, "code: a GradScaler exists but optimizer.step() "
            "is called directly")
    if kinds.count("unscale") >= 2:
        add("amp-double-unscale", 0.9, "code: scaler.unscale_() is called twice")

    if accumulating:
        gated_steps = [e for e in events if e.kind in ("opt_step", "scaler_step")
                       and _under_gate(e, gates)]
        zero_events = [e for e in events if e.kind == "zero_grad"]
        if not zero_events:
            add("accum-missing-zero-grad", 0.9, "code: steps every N micro-batches but never "
                "calls zero_grad()")
        else:
            first_back = events[backwards[0]]
            outside = [z for z in zero_events if not _under_gate(z, gates)]
            before_back = [z for z in outside if z.line < first_back.line]
            if outside and (before_back or (gated_steps and gates[0].indent > 0)):
                add(
                    "accum-zero-grad-every-microstep",
                    1.0,
                    "code: zero_grad() runs on every micro-batch while the step is gated by % N",
                )
        divided = bool(_LOSS_DIVIDED.search(code))
        if "grad_div" in kinds:
            add("accum-manual-grad-scaling", 1.0, "code: .grad is divided by hand")
        elif not divided:
            add(
                "accum-unscaled-loss",
                1.0,
                "code: backward() every micro-batch, step every N (% gate), loss never divided",
            )
        for e in events:
            if e.kind in ("clip_norm", "clip_value") and not _under_gate(e, gates):
                first_gate = gates[0]
                if e.line < first_gate.line or (e.indent <= first_gate.indent and e.indent > 0):
                    add("accum-clip-every-microstep", 0.8, "code: clipping runs on every "
                        "micro-batch, outside the % N gate")
            if e.kind == "sched_step" and not _under_gate(e, gates) and gated_steps:
                add("accum-scheduler-per-microbatch", 0.8, "code: scheduler.step() runs on every "
                    "micro-batch while the optimizer steps every N")
        if _DDP.search(code) and not _NO_SYNC.search(code):
            add("ddp-accum-without-no-sync", 0.9, "code: DDP with accumulation and no no_sync()")
        if divided and _TOKEN_MEAN.search(code):
            add("accum-token-mean-bias", 0.5, "code: a token-level mean loss divided by N per "
                "micro-batch")
        if not _LEFTOVER_HANDLED.search(code):
            add("accum-leftover-batches", 0.2, "code: the % N gate ignores the last partial "
                "window")
    elif _DDP.search(code) and gates and not _NO_SYNC.search(code):
        add("ddp-accum-without-no-sync", 0.6, "code: DDP with a % N gate and no no_sync()")

    zero_idx = [i for i, k in enumerate(kinds) if k == "zero_grad"]
    for i, kind in enumerate(kinds):
        if kind == "norm_read" and zero_idx and zero_idx[0] < i:
            between = kinds[zero_idx[-1] if zero_idx[-1] < i else zero_idx[0] : i]
            if "backward" not in between and "scaled_backward" not in between:
                add("monitor-after-zero-grad", 0.8, "code: the gradient norm is read after "
                    "zero_grad()")

    has_clip = "clip_norm" in kinds or "clip_value" in kinds or "gradient_clip" in code
    if _SEQUENCE_MODEL.search(code) and not has_clip and (backwards or _LIGHTNING.search(code)):
        add("no-clip-sequence-model", 0.7, "code: a Transformer/RNN is trained with no clipping")
    saturating = len(_SATURATING.findall(code))
    deep = any(int(m.group("n") or m.group("m") or 0) > 20 for m in _DEEP_RANGE.finditer(code))
    if saturating and (deep or saturating > 20):
        add("saturating-deep-net", 0.8, "code: a deep stack (> 20) of sigmoid/tanh layers")
    for m in _UNSTABLE_OP.finditer(code):
        arg = m.group("a") or m.group("b") or ""
        if not _EPS.search(arg):
            add("unstable-loss-op", 0.6, f"code: {m.group(0).strip()[:40]} without eps or clamp")
            break
    if backwards and steps and "norm_read" not in kinds and "clip_norm" not in kinds:
        add("no-grad-monitoring", 0.15, "code: the loop never measures the gradient norm")
    return hits


_FENCED = re.compile(r"```[a-zA-Z0-9_+-]*\n?(.*?)(?:```|\Z)", re.DOTALL)
_INLINE = re.compile(r"`([^`\n]+)`")
_CODE_LINE = re.compile(
    r"^\s*(?:(?:for|if|elif|else|with|def|return|while|import|from|try|except)\b[^\n]*"
    r"|[\w.\[\]()'\"]+\s*(?:[-+*/]?=)\s*[^\s=][^\n]*"
    r"|[\w.\[\]()]+\.\w+\s*\([^\n]*\)[^\n]*"
    r"|\w+\s*\([^\n]*\)\s*"
    r"|\.\.\.|…)\s*$"
)
# Prose lines start with a pronoun or article far more often than code does.
_PROSE_START = re.compile(r"^\s*(?:i|we|you|my|our|the|it|this|that|is|are|why|how|what|when)\b",
                          re.IGNORECASE)


def extract_code(text: str) -> str:
    """The code parts of a question: fenced blocks, inline `spans` and code-looking lines."""
    parts: list[str] = [m.group(1) for m in _FENCED.finditer(text)]
    rest = _FENCED.sub("\n", text)
    inline = [m.group(1) for m in _INLINE.finditer(rest)]
    rest = _INLINE.sub(" ", rest)
    lines = [
        line
        for line in rest.splitlines()
        if _CODE_LINE.match(line) and not _PROSE_START.match(line) and line.strip()
    ]
    if lines:
        parts.append("\n".join(lines))
    # Inline spans are single calls; keep them in order, one per line.
    if inline:
        parts.append("\n".join(inline))
    return "\n".join(p for p in parts if p.strip())


# Order stated in words: "I clip after optimizer.step()", "the norm is read after zero_grad".
_CLIP = r"clip\w*"
_PROSE_RULES: tuple[tuple[re.Pattern[str], str, float, str], ...] = tuple(
    (re.compile(pattern, re.IGNORECASE), entry_id, strength, reason)
    for pattern, entry_id, strength, reason in (
        (
            rf"\b{_CLIP}\b[^.;\n]{{0,40}}\bafter\b[^.;\n]{{0,30}}(?:optimi[sz]\w*|\.step\b|"
            rf"\bstep\(\)|weights?\s+(?:have\s+)?(?:changed|updated)|update\b)"
            rf"|\bafter\b[^.;\n]{{0,12}}(?:optimi[sz]\w*\.?\s*step|\.step\(\))[^.;\n]{{0,30}}"
            rf"\b{_CLIP}",
            "clip-after-step",
            0.6,
            "text: clipping is described as running after the optimizer step",
        ),
        (
            rf"\b{_CLIP}\b[^.;\n]{{0,40}}\bbefore\b[^.;\n]{{0,25}}backward"
            rf"|\bbefore\b[^.;\n]{{0,20}}backward[^.;\n]{{0,25}}\b{_CLIP}",
            "clip-before-backward",
            0.6,
            "text: clipping is described as running before backward()",
        ),
        (
            r"\b(?:without|no|never|not|forg[eo]t\w*(?:\s+to)?|missing|skip\w*)\s+(?:calling\s+|"
            r"an?\s+|the\s+)?(?:scaler\.)?unscal\w*",
            "amp-clip-without-unscale",
            0.5,
            "text: clipping with a GradScaler but no unscale_()",
        ),
        (
            r"\b(?:without|not|never|forg[eo]t\w*\s+to|no)\s+(?:divid\w*|scal\w*|normali[sz]\w*|"
            r"averag\w*)\s+(?:the\s+|my\s+)?(?:raw\s+)?loss|\braw\s+loss\b|\bloss\b[^.;\n]{0,20}"
            r"\b(?:not|never)\s+(?:divided|scaled|normali[sz]ed)",
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
            r"(?:optimizer\.)?zero(?:_grad|ing|\s+the\s+grad)",
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
            r"\b(?:only|just)\s+(?:log|print|track|monitor|watch|plot)\w*\s+(?:the\s+)?loss"
            r"|\bnever\s+(?:log|look\s+at|check|monitor|track|measure|print)\w*\s+(?:the\s+)?"
            r"grad\w*",
            "no-grad-monitoring",
            0.5,
            "text: only the loss is watched, never the gradient norms",
        ),
        (
            r"\bloss\b[^.;\n]{0,30}\b(?:nan|inf)\b[^.;\n]{0,30}\bbefore\b[^.;\n]{0,25}backward",
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
            r"\b(?:most|majority|more\s+than\s+half|over\s+half|half)\b[^.;\n]{0,40}\b(?:activations?|"
            r"outputs?|neurons?|units?)\b[^.;\n]{0,30}\b(?:0|zero|zeros|dead)\b",
            "many-zero-activations",
            0.5,
            "text: more than half of the activations are zero",
        ),
        (
            r"clip_grad_value_?|\bclip(?:ping|s)?\s+(?:each|every|individual)\s+(?:gradient\s+)?"
            r"(?:element|value|entr)",
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
            r"\b(?:after\s+(?:a\s+)?(?:good|great|nice|promising|decent|fast|quick)\s+start|"
            r"(?:dropped|decreased|fell|improved|went\s+down)\s+(?:nicely|quickly|fast|well)?)"
            r"[^.;\n]{0,60}\b(?:flat|plateau\w*|stall\w*|stuck|stopped|levels?\s+off|"
            r"levell?ed\s+off|won't\s+improve|not\s+improv\w*)",
            "plateau",
            0.4,
            "text: progress first, then the loss stops improving",
        ),
    )
)


#: Rules that also need a second pattern somewhere in the same sentence.
_PROSE_REQUIRES: dict[str, re.Pattern[str]] = {
    "no-clip-sequence-model": re.compile(
        r"\b(?:lstm|gru|rnn|transformer|seq2seq|gpt|bert|t5|llm|language\s+model|"
        r"policy\s+gradient)",
        re.IGNORECASE,
    ),
}
_SENTENCE_END = re.compile(r"(?<=[.;!?])\s+|\n")
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


def prose_hits(text: str) -> list[CodeHit]:
    """Evidence from the order of events as stated in words (sentence by sentence)."""
    hits: list[CodeHit] = []
    pieces = segments(text)
    for pattern, entry_id, strength, reason in _PROSE_RULES:
        if any(h.entry_id == entry_id for h in hits):
            continue
        needs = _PROSE_REQUIRES.get(entry_id)
        for piece in pieces:
            if pattern.search(piece) and (needs is None or needs.search(piece)):
                hits.append(CodeHit(entry_id, strength, reason))
                break
    return hits
