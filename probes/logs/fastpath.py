"""Reading the common line formats fast: one regex per block of lines, numbers as columns.

A training log repeats one line shape millions of times (``iter 1234: loss 2.31, time 12ms``).
:func:`blocks` reads the file in blocks of a few megabytes and learns the shape of a record line
once: its *template*, the line with each number replaced by a slot. The format's own one-line
parser (:meth:`~probes.logs.formats.base.LogFormat.line_parser`) then says which slot holds which
field, by parsing the line with distinct sentinel numbers in the slots. Every line of the block
that matches the template (one ``re.finditer`` over the whole block) gives its fields straight
from its slots, as columns of numbers (:class:`Columns`); every other line goes through the
format's parser as before, so the records come out in file order and are the same records the
line-by-line reader yields (``tests/logs/test_fastpath.py`` compares the two on every fixture).

A template is used only when the sentinel test is unambiguous: each field the parser returns
comes from exactly one slot, holds a plain number, and the step (when there is one) is an integer
slot. Anything else (a line with nested values, flags, a value the parser would transform) keeps
the line-by-line path.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gradient_doctor.probes.logs.formats.base import ReadStats, open_text

#: Bytes read per block (lines are never split between blocks).
BLOCK_BYTES = 1 << 20
#: A number as a template slot: a run of digits with its sign, point and exponent, or a
#: non-finite spelling, not glued to a name (``fc1``) or to another number.
TOKEN = re.compile(
    r"(?<![\w.])(?:[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?)"
    r"|[-+]?(?:nan|NaN|inf|Inf|Infinity))(?![\w.])"
)
#: Slot grammars: what a slot may hold so that ``float`` reads it as the format's parser does.
PLAIN_VALUE = r"[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?|nan|NaN|inf|Inf)"
PLAIN_STEP = r"\d+"
JSON_VALUE = r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][-+]?\d+)?|NaN|-?Infinity"
JSON_STEP = r"0|[1-9]\d*"
_SENTINEL_BASE = 100_003

LineParser = Callable[[str], "dict[str, Any] | None"]


@dataclass
class Columns:
    """Records of consecutive template lines: the same fields on every one of them."""

    steps: list[int] | None
    """Step numbers (None: the lines carry none)."""
    values: dict[str, list[float]] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(next(iter(self.values.values()), self.steps or []))

    def record(self, row: int) -> dict[str, Any]:
        """Row ``row`` as the record the line parser would have returned."""
        out: dict[str, Any] = {name: column[row] for name, column in self.values.items()}
        if self.steps is not None:
            out["step"] = self.steps[row]
        return out


@dataclass
class _Template:
    pattern: re.Pattern[str]
    fields: list[tuple[str, int]]
    """(field, group number) of each numeric field."""
    step_group: int | None


def _learn(line: str, parse: LineParser, json_values: bool) -> _Template | None:
    """The template of ``line`` with its slots mapped onto the parser's fields, or None."""
    text = line.rstrip("\r\n")
    tokens = list(TOKEN.finditer(text))
    if not tokens or len(tokens) > 64:
        return None
    literals: list[str] = []
    position = 0
    for token in tokens:
        literals.append(text[position : token.start()])
        position = token.end()
    tail = text[position:]
    sentinels = [str(_SENTINEL_BASE + 7 * index) for index in range(len(tokens))]
    probe = "".join(lit + s for lit, s in zip(literals, sentinels, strict=True)) + tail
    expected = parse(probe + "\n")
    actual = parse(line if line.endswith("\n") else line + "\n")
    if expected is None or actual is None or expected.keys() != actual.keys():
        return None
    by_value = {float(s): index for index, s in enumerate(sentinels)}
    fields: list[tuple[str, int]] = []
    step_slot: int | None = None
    for name, value in expected.items():
        if type(value) not in (int, float) or value not in by_value:
            return None
        slot = by_value[value]
        if name == "step":
            if type(value) is not int:
                return None
            step_slot = slot
        else:
            fields.append((name, slot))
    if not fields:
        return None
    value_grammar, step_grammar = (
        (JSON_VALUE, JSON_STEP) if json_values else (PLAIN_VALUE, PLAIN_STEP)
    )
    parts = ["^"]
    for index, literal in enumerate(literals):
        parts.append(_literal(literal))
        parts.append(f"({step_grammar if index == step_slot else value_grammar})")
    parts.append(_literal(tail) + r"\r?$")
    pattern = re.compile("".join(parts), re.MULTILINE)
    slots = {slot: slot + 1 for slot in range(len(tokens))}
    template = _Template(
        pattern=pattern,
        fields=[(name, slots[slot]) for name, slot in fields],
        step_group=None if step_slot is None else slots[step_slot],
    )
    # The template must read its own line as the parser does.
    match = pattern.fullmatch(text)
    if match is None or _fields(template, match.groups()) != actual:
        return None
    return template


def _literal(text: str) -> str:
    """Regex for the text between two slots: runs of spaces next to a number may vary in
    length (padding such as ``step {:9d}``); everything else is literal."""
    if not text:
        return ""
    if not text.strip(" "):
        return " +"
    lead = " +" if text.startswith(" ") else ""
    trail = " +" if text.endswith(" ") else ""
    return lead + re.escape(text.strip(" ")) + trail


def _fields(template: _Template, groups: tuple[str | Any, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {name: float(groups[index - 1]) for name, index in template.fields}
    if template.step_group is not None:
        out["step"] = int(groups[template.step_group - 1])
    return out


def _columns(template: _Template, rows: list[tuple[str, ...]]) -> Columns:
    steps = None
    if template.step_group is not None:
        at = template.step_group - 1
        steps = [int(row[at]) for row in rows]
    values = {}
    for name, index in template.fields:
        values[name] = list(map(float, [row[index - 1] for row in rows]))
    return Columns(steps=steps, values=values)


def blocks(
    path: Path, stats: ReadStats, parse: LineParser, *, json_values: bool = False
) -> Iterator[dict[str, Any] | Columns]:
    """The records of ``path`` in file order: :class:`Columns` for runs of template lines,
    the parser's dicts for the other lines (lines without a record give nothing)."""
    stats.files.append(str(path))
    reader = _BlockReader(parse, json_values)
    with open_text(path) as handle:
        rest = b""
        while True:
            data = handle.read(BLOCK_BYTES)
            if not data:
                break
            data = rest + data
            cut = data.rfind(b"\n") + 1
            if cut == 0:
                rest = data
                continue
            rest = data[cut:]
            chunk = data[:cut]
            stats.bytes += len(chunk)
            stats.lines += chunk.count(b"\n")
            yield from reader.block(chunk.decode("utf-8", "replace"))
    if rest:
        stats.lines += 1
        stats.bytes += len(rest)
        found = parse(rest.decode("utf-8", "replace"))
        if found is not None:
            yield found


class _BlockReader:
    """The template learnt so far, and the line shapes that taught none."""

    def __init__(self, parse: LineParser, json_values: bool) -> None:
        self.parse = parse
        self.json_values = json_values
        self.template: _Template | None = None
        self.rejected: set[str] = set()

    def _slow(self, text: str, learn: bool) -> Iterator[dict[str, Any]]:
        """The parser's records of ``text``'s lines; the first record line whose shape was
        not tried yet may teach the template (when ``learn``)."""
        for line in text.splitlines(keepends=True):
            found = self.parse(line)
            if found is None:
                continue
            if learn and self.template is None:
                shape = TOKEN.sub("#", line)
                if shape not in self.rejected:
                    self.template = _learn(line, self.parse, self.json_values)
                    if self.template is None:
                        self.rejected.add(shape)
            yield found

    def block(self, text: str) -> Iterator[dict[str, Any] | Columns]:
        position = 0
        if self.template is None:
            # Read line by line until a line teaches a template, then go on with it.
            while position < len(text) and self.template is None:
                newline = text.find("\n", position)
                yield from self._slow(text[position : newline + 1], learn=True)
                position = newline + 1
            if self.template is None:
                return
        template = self.template
        rows: list[tuple[str, ...]] = []
        others = matched = 0
        for match in template.pattern.finditer(text, position):
            start = match.start()
            if start > position:
                if rows:
                    yield _columns(template, rows)
                    rows = []
                for found in self._slow(text[position:start], learn=False):
                    others += 1
                    yield found
            rows.append(match.groups())
            matched += 1
            position = match.end() + 1
        if rows:
            yield _columns(template, rows)
        if position < len(text):
            for found in self._slow(text[position:], learn=False):
                others += 1
                yield found
        if others > matched:
            self.template = None  # the log changed shape: learn again on the next block
