"""Quantities read from free text and log lines: ``loss: nan``, ``grad norm 3.4e+04``, ``dead 63%``.

Private to ``knowledge.matcher``. Reading is deliberately forgiving (log lines, prose, pasted
tables); comparing the numbers with thresholds is the matcher's job.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

# A number as people and loggers write it: 1523.2, 1,523.2, 3.4e+04, .5, 2e-7, nan, inf, 10^-7.
_NUM = (
    r"(?P<num>[-+]?(?:nan|inf(?:inity)?"
    r"|10\s*\^\s*[-+−]?\d+"
    r"|(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d*)?(?:\s*[eE]\s*[-+−]?\d+|\s*[x×\*]\s*10\s*\^\s*[-+−]?\d+)?"
    r"|\.\d+(?:[eE][-+−]?\d+)?))(?![a-z0-9])"
)
# Words allowed between a quantity's name and its value ("grad norm is around 3e4").
_FILLER = (
    r"(?:\s|[:=~≈><()\[\],'\"]|\bis\b|\bwas\b|\bare\b|\bwere\b|\bof\b|\bat\b|\baround\b|\babout\b"
    r"|\breaches\b|\breached\b|\bhits?\b|\bgoes\s+to\b|\bwent\s+to\b|\bgo\s+to\b|\bjumps?\s+to\b"
    r"|\bjumped\s+to\b|\bbecomes?\b|\bbecame\b|\bturns?\s+(?:into|to)?\b|\bturned\s+(?:into|to)?\b"
    r"|\bto\b|\bsuddenly\b|\bstill\b|\bnow\b|\bthen\b|\bonly\b|\bjust\b|\balways\b|\blike\b"
    r"|\bapprox(?:imately)?\b|\broughly\b|\bover\b|\babove\b|\bbelow\b|\bunder\b|\bless\s+than\b"
    r"|\bmore\s+than\b|\bshows?\b|\bprints?\b|\bsays\b|\bequals?\b|\bvalues?\b|\btiny\b|\bhuge\b"
    r"|\bvery\b|\bsmall\b|\blarge\b|\bimmediately\b|\bsometimes\b|\bspikes?\s+to\b|->|→|=>)*?"
)

_LOSS = re.compile(
    rf"\b(?P<name>(?:train(?:ing)?|val(?:idation)?|eval)?[_ ]?loss(?:es)?)\b{_FILLER}{_NUM}",
    re.IGNORECASE,
)
_NAN_LOSS = re.compile(
    r"\b(?P<num>nan|inf(?:inity)?)\s+(?:(?:train(?:ing)?|validation|val)\s+)?loss(?:es)?\b",
    re.IGNORECASE,
)
_GRAD_NORM = re.compile(
    r"\b(?:total[_ ]norm|global[_ ]norm|grad(?:ient)?s?[_ \-]?(?:l2[_ ])?norms?|gnorm|"
    r"norm\s+of\s+(?:the\s+)?(?:grad(?:ient)?s?)|grad(?:ient)?s?(?=\s+(?:are|is|were|was)\b))\b"
    rf"{_FILLER}{_NUM}",
    re.IGNORECASE,
)
_NAN_GRADS = re.compile(
    r"\b(?:nan|inf(?:inity)?)\s+(?:in\s+(?:the\s+|my\s+)?)?grad(?:ient)?s?\b"
    r"|\bgrad(?:ient)?s?\b[^.\n]{0,30}?\b(?:are|become|became|turn|turned|go|went|contain)"
    r"\b[^.\n]{0,12}?\b(?:nan|inf)\b",
    re.IGNORECASE,
)
_NAN_PARAMS = re.compile(
    r"\b(?:weights?|param(?:eter)?s?|biases?)\b[^.\n]{0,40}?\b(?:are|is|were|was|became|become|"
    r"turn(?:ed)?|went|contain|have|has)\b[^.\n]{0,12}?\b(?:nan|inf)\b"
    r"|\b(?:nan|inf)\s+(?:in\s+(?:the\s+|my\s+)?)?(?:weights?|param(?:eter)?s?)\b",
    re.IGNORECASE,
)
_SCALE = re.compile(
    rf"\b(?:loss[_ ])?scale\b{_FILLER}{_NUM}\s*(?:→|->|=>|to|down\s+to|drops?\s+to|dropped\s+to|"
    r"fell\s+to|falls\s+to|falling\s+to|goes\s+to|went\s+to)\s*(?P<num2>[-+]?\d+(?:\.\d*)?"
    r"(?:[eE][-+−]?\d+)?)",
    re.IGNORECASE,
)
_PERCENT_BEFORE = re.compile(
    r"(?P<num>\d+(?:\.\d+)?)\s*(?:%|percent\b|per\s+cent\b|pct\b)\s*"
    r"(?:of\s+(?:the\s+|my\s+|all\s+)?)?(?P<subject>[a-z_\- ]{0,30}?)"
    r"\b(?:are\s+|is\s+)?(?P<what>dead|zeros?|inactive|never\s+fire)\b",
    re.IGNORECASE,
)
_PERCENT_AFTER = re.compile(
    r"\b(?P<what>dead|zeros?|inactive)\b(?P<subject>[a-z_\- ]{0,30}?)[:=]?\s*"
    r"(?P<num>\d+(?:\.\d+)?)\s*(?:%|percent\b|per\s+cent\b|pct\b)",
    re.IGNORECASE,
)
_MAX_NORM = re.compile(
    r"\b(?:max_norm|gradient_clip_val|clip(?:_value|_norm|ping)?(?:\s+(?:value|threshold|norm))?"
    rf"(?:\s+(?:at|to|of))?)\s*[:=]?\s*{_NUM}",
    re.IGNORECASE,
)
_RATIO = re.compile(
    r"\b(?:grad(?:ient)?[_ /-]*(?:to[_ -])?param(?:eter)?s?|update)[_ -]ratio\b"
    rf"{_FILLER}{_NUM}",
    re.IGNORECASE,
)
_LAYER_RATIO = re.compile(
    r"(?P<num>\d+(?:,\d{3})*(?:\.\d+)?(?:e[-+]?\d+)?)\s*(?:x|×|times)\s+"
    r"(?:smaller|larger|bigger|lower|higher)\b",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class Quantity:
    """One number read from the text.

    ``name`` is one of: loss, grad_norm, grad_nan (NaN/Inf said of gradients), param_nan (of
    weights), amp_scale_from,
    amp_scale_to, dead_fraction, zero_grad_fraction, zero_activation_fraction, max_norm,
    grad_param_ratio, layer_ratio. Fractions are in [0, 1].
    """

    name: str
    value: float
    text: str
    logged: bool = False


def parse_number(raw: str) -> float | None:
    """``raw`` as a float (NaN and Inf included), or None when it is not a number."""
    s = raw.strip().lower().replace("−", "-").replace(" ", "")
    if s.lstrip("+-") in ("nan",):
        return math.nan
    if s.lstrip("+-").startswith("inf"):
        return -math.inf if s.startswith("-") else math.inf
    s = s.replace(",", "")
    power = re.fullmatch(r"([-+]?)10\^([-+]?\d+)", s)
    if power:
        value = 10.0 ** int(power.group(2))
        return -value if power.group(1) == "-" else value
    times = re.fullmatch(r"([-+]?[\d.]+)[x×*]10\^([-+]?\d+)", s)
    if times:
        try:
            return float(times.group(1)) * 10.0 ** int(times.group(2))
        except ValueError:
            return None
    try:
        return float(s)
    except ValueError:
        return None


def _is_logged(snippet: str, raw: str) -> bool:
    """Whether the quantity reads like a log line (``loss: nan``, ``norm=3e4``) or a number."""
    return bool(re.search(r"[:=|]", snippet)) or any(ch.isdigit() for ch in raw)


def _fraction_subject(subject: str, context: str, what: str) -> str:
    words = f"{subject} {context}".lower()
    if re.search(r"activation|neuron|unit|relu|feature", words):
        return (
            "dead_fraction"
            if "dead" in what or "inactive" in what
            else ("zero_activation_fraction")
        )
    if re.search(r"grad|param|weight", words):
        return "zero_grad_fraction"
    return "dead_fraction" if "dead" in what.lower() else "zero_activation_fraction"


#: Longest stretch of one line the patterns look at; bounds regex work on pathological input.
_PIECE_CHARS = 400


def read_quantities(text: str) -> list[Quantity]:
    """Every quantity found in ``text``, in order of appearance (line by line)."""
    found: list[tuple[int, Quantity]] = []
    offset = 0
    for line in text.split("\n"):
        for start in range(0, max(len(line), 1), _PIECE_CHARS):
            found.extend(
                (offset + start + pos, q)
                for pos, q in _read_piece(line[start : start + _PIECE_CHARS])
            )
        offset += len(line) + 1
    found.sort(key=lambda item: item[0])
    unique: list[Quantity] = []
    seen: set[tuple[str, str]] = set()
    for _, q in found:
        key = (q.name, q.text)
        if key not in seen:
            seen.add(key)
            unique.append(q)
    return unique


def _read_piece(text: str) -> list[tuple[int, Quantity]]:
    found: list[tuple[int, Quantity]] = []

    def add(pos: int, name: str, raw: str, snippet: str) -> None:
        value = parse_number(raw)
        if value is not None:
            found.append((pos, Quantity(name, value, snippet.strip(), _is_logged(snippet, raw))))

    for m in _LOSS.finditer(text):
        add(m.start(), "loss", m.group("num"), m.group(0))
    for m in _NAN_LOSS.finditer(text):
        add(m.start(), "loss", m.group("num"), m.group(0))
    for m in _GRAD_NORM.finditer(text):
        add(m.start(), "grad_norm", m.group("num"), m.group(0))
    for m in _NAN_GRADS.finditer(text):
        found.append((m.start(), Quantity("grad_nan", math.nan, m.group(0).strip())))
    for m in _NAN_PARAMS.finditer(text):
        found.append((m.start(), Quantity("param_nan", math.nan, m.group(0).strip())))
    for m in _SCALE.finditer(text):
        add(m.start(), "amp_scale_from", m.group("num"), m.group(0))
        add(m.start(), "amp_scale_to", m.group("num2"), m.group(0))
    for pattern in (_PERCENT_BEFORE, _PERCENT_AFTER):
        for m in pattern.finditer(text):
            window = text[max(0, m.start() - 60) : m.end() + 60]
            name = _fraction_subject(m.group("subject"), window, m.group("what"))
            value = parse_number(m.group("num"))
            if value is not None:
                found.append((m.start(), Quantity(name, value / 100.0, m.group(0).strip(), True)))
    for m in _MAX_NORM.finditer(text):
        add(m.start(), "max_norm", m.group("num"), m.group(0))
    for m in _RATIO.finditer(text):
        add(m.start(), "grad_param_ratio", m.group("num"), m.group(0))
    for m in _LAYER_RATIO.finditer(text):
        add(m.start(), "layer_ratio", m.group("num"), m.group(0))
    return found


def fmt(value: float) -> str:
    """A compact human form of ``value`` (3.4e+04, 0.5, 1e-07, nan)."""
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if value != 0 and (abs(value) >= 1e4 or abs(value) < 1e-3):
        return f"{value:.2g}"
    return f"{value:g}"
