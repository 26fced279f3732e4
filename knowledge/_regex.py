"""Regular expressions that skip their scan when a text cannot match.

Most of the matcher's patterns are long alternations of words searched in every query, and
most queries contain none of those words. :func:`compile` reads from the pattern itself a set
of literal strings one of which every match must contain (its "required literals"); a search
in a text that holds none of them returns no match without running the regular expression.
The answer is exactly the pattern's: the gate only ever skips scans that would find nothing.

A pattern that ignores case is slow to scan: each of its letters is compared case-folded. When
its letters are all lower-case (see :func:`lower_case_twin`), its case-sensitive twin scanning
the lower-cased text finds a match at exactly the same places, two to three times faster; for
ASCII text (nearly every query) :meth:`Gated.search` lets the twin find where the first match
starts and runs the pattern itself only from there, so the match it returns is the pattern's own.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from re import _parser  # type: ignore[attr-defined]
from typing import Any, cast

#: A literal shorter than this is in nearly every text: the gate would cost and skip nothing.
MIN_LITERAL = 3
#: Gates with more literals than this cost more to test than most scans they would save.
MAX_LITERALS = 40

# Characters that match an ASCII letter under re.IGNORECASE but do not lower-case to it
# (dotless i, long s): a text holding one is always scanned.
_FOLDS_TO_ASCII = ("\u0131", "\u017f")

_Literals = frozenset[str] | None


def _best(options: list[frozenset[str]]) -> _Literals:
    """The most selective of several sets each of which is required: the longest shortest
    literal, then the fewest literals."""
    if not options:
        return None
    return max(options, key=lambda s: (min(map(len, s)), -len(s)))


def _required(items: Any, ignore_case: bool) -> _Literals:
    """Literals one of which every match of the parsed sequence ``items`` contains."""
    options: list[frozenset[str]] = []
    run: list[str] = []

    def close_run() -> None:
        if run:
            options.append(frozenset(["".join(run)]))
            run.clear()

    for op, av in items:
        name = str(op)
        if name == "LITERAL":
            char = chr(av)
            if not char.isascii():
                close_run()
                continue
            run.append(char.lower() if ignore_case else char)
            continue
        close_run()
        if name == "SUBPATTERN":
            _group, add_flags, del_flags, sub = av
            if (add_flags | del_flags) & re.IGNORECASE:
                continue
            found = _required(sub, ignore_case)
        elif name == "BRANCH":
            found = _branch(av[1], ignore_case)
        elif name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
            low, _high, sub = av
            found = _required(sub, ignore_case) if low >= 1 else None
        elif name == "ATOMIC_GROUP":
            found = _required(av, ignore_case)
        else:
            found = None
        if found:
            options.append(found)
    close_run()
    return _best(options)


def _branch(alternatives: Any, ignore_case: bool) -> _Literals:
    union: set[str] = set()
    for alternative in alternatives:
        found = _required(alternative, ignore_case)
        if found is None:
            return None
        union |= found
    return frozenset(union)


#: Characters outside ASCII that match an ASCII letter under re.IGNORECASE (capital I with dot,
#: dotless i, long s, Kelvin sign).
_FOLD_INTO_ASCII = (0x130, 0x131, 0x17F, 0x212A)
_UPPER = (ord("A"), ord("Z"))


def _plain_char(code: int) -> bool:
    """A character that matches under re.IGNORECASE in lower-cased ASCII text exactly what it
    matches without it: no upper-case ASCII letter, no character folding into ASCII."""
    return not (_UPPER[0] <= code <= _UPPER[1]) and code not in _FOLD_INTO_ASCII


def _case_free(items: Any) -> bool:
    """Whether the parsed sequence ``items`` matches ASCII text under re.IGNORECASE exactly
    where it matches that text lower-cased without the flag (see :func:`lower_case_twin`)."""
    for op, av in items:
        name = str(op)
        if name in ("LITERAL", "NOT_LITERAL"):
            if not _plain_char(av):
                return False
        elif name == "IN":
            for set_op, set_av in av:
                set_name = str(set_op)
                if set_name == "LITERAL":
                    if not _plain_char(set_av):
                        return False
                elif set_name == "RANGE":
                    low, high = set_av
                    if low <= _UPPER[1] and high >= _UPPER[0]:
                        return False
                    if any(low <= code <= high for code in _FOLD_INTO_ASCII):
                        return False
                elif set_name not in ("NEGATE", "CATEGORY"):
                    return False
        elif name == "SUBPATTERN":
            _group, add_flags, del_flags, sub = av
            if (add_flags | del_flags) & re.IGNORECASE or not _case_free(sub):
                return False
        elif name == "BRANCH":
            if not all(_case_free(alternative) for alternative in av[1]):
                return False
        elif name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
            if not _case_free(av[2]):
                return False
        elif name in ("ASSERT", "ASSERT_NOT"):
            if not _case_free(av[1]):
                return False
        elif name == "ATOMIC_GROUP":
            if not _case_free(av):
                return False
        elif name not in ("AT", "ANY", "CATEGORY", "GROUPREF"):
            return False
    return True


def lower_case_twin(pattern: re.Pattern[str]) -> re.Pattern[str] | None:
    """``pattern`` without re.IGNORECASE, when that matches lower-cased ASCII text at exactly
    the places where ``pattern`` matches the text itself (its letters and letter ranges are
    lower-case, no inline case flags); None otherwise, or when it does not ignore case.

    Under re.IGNORECASE a lower-case letter matches both cases of an ASCII letter, which
    lower-casing the text turns into that letter; every other character of ASCII text is
    unchanged by lower-casing and matched the same with or without the flag.
    """
    if not pattern.flags & re.IGNORECASE:
        return None
    try:
        parsed = _parser.parse(pattern.pattern, pattern.flags)
    except Exception:  # a pattern the private parser reads differently: no twin
        return None
    if not _case_free(parsed):
        return None
    return re.compile(pattern.pattern, pattern.flags & ~re.IGNORECASE)


def required_literals(pattern: re.Pattern[str]) -> frozenset[str] | None:
    """Strings one of which every match of ``pattern`` contains (lower-cased when the pattern
    ignores case), or None when the pattern has no such useful set."""
    ignore_case = bool(pattern.flags & re.IGNORECASE)
    try:
        parsed = _parser.parse(pattern.pattern, pattern.flags & ~re.IGNORECASE)
    except Exception:  # a pattern the private parser reads differently: never gate it
        return None
    found = _required(parsed, ignore_case)
    if not found or min(map(len, found)) < MIN_LITERAL or len(found) > MAX_LITERALS:
        return None
    # Shortest first: when one literal is inside another, the shorter settles the test.
    return frozenset(s for s in found if not any(t != s and t in s for t in found))


class _Lowered:
    """The last text lower-cased (the matcher searches one text with many patterns)."""

    text: str | None = None
    lowered = ""


def _lower(text: str) -> str:
    if text is not _Lowered.text:
        _Lowered.text = text
        lowered = text.lower()
        if not lowered.isascii() and any(c in lowered for c in _FOLDS_TO_ASCII):
            lowered = ""  # marker: test nothing, scan
        _Lowered.lowered = lowered
    return _Lowered.lowered


#: The methods of a pattern that an ungated :class:`Gated` hands straight to it.
_METHODS = ("search", "match", "fullmatch", "finditer", "findall", "sub", "split")
#: Those that the twin cannot speed up (they match at one place only).
_ANCHORED = ("match", "fullmatch")
#: Calls of a pattern before its literals are read: reading them parses the pattern again
#: (about 0.15 ms), which a one-off query (the CLI's ``match``) would not earn back.
LEARN_AFTER = 3


def _always(text: str) -> bool:
    return True


class Gated:
    """A compiled pattern with a cheap test before each scan (see the module docstring).

    Offers every method of :class:`re.Pattern`; each answers exactly as the pattern would.
    The required literals are read on the :data:`LEARN_AFTER`-th call (or by
    :meth:`prepare`); a pattern without useful ones then hands its methods straight to the
    compiled pattern.
    """

    def __init__(self, regex: re.Pattern[str]) -> None:
        self.regex = regex
        self.pattern = regex.pattern
        self.flags = regex.flags
        self.literals: tuple[str, ...] | None = None
        #: The case-sensitive twin scanned over lower-cased ASCII text (see the module docs).
        self.twin: re.Pattern[str] | None = None
        self._calls = 0
        self._prepared = False
        # (A plain bool: int & re.IGNORECASE runs the flag enum's Python code.)
        self._folded = bool(regex.flags & re.IGNORECASE)
        self._may_match: Callable[[str], bool] = self._learn

    def prepare(self) -> None:
        """Read the pattern's required literals now (idempotent)."""
        if self._prepared:
            return
        self._prepared = True
        literals = required_literals(self.regex)
        self.twin = lower_case_twin(self.regex)
        if literals is None:
            # Instance attributes come before the class's methods: no test, no wrapper (but
            # for the scans that the twin starts).
            for name in _METHODS if self.twin is None else _ANCHORED:
                setattr(self, name, getattr(self.regex, name))
            self._may_match = _always
            return
        self.literals = tuple(sorted(literals, key=len))
        self._may_match = (
            self._may_match_folded if self.flags & re.IGNORECASE else self._may_match_exact
        )

    def _learn(self, text: str) -> bool:
        self._calls += 1
        if self._calls >= LEARN_AFTER:
            self.prepare()
        return True

    # (Loops rather than any() over a generator: a third cheaper, and these run ~150 times a
    # query.)
    def _may_match_exact(self, text: str) -> bool:
        for literal in self.literals or ():  # noqa: SIM110 (see above)
            if literal in text:
                return True
        return False

    def _may_match_folded(self, text: str) -> bool:
        lowered = _Lowered.lowered if text is _Lowered.text else _lower(text)
        if not lowered and text:
            return True
        for literal in self.literals or ():  # noqa: SIM110 (see above)
            if literal in lowered:
                return True
        return False

    def _first(self, text: str) -> int:
        """Where the first match in ``text`` starts, as the twin finds it; 0 when there is
        no twin to ask or the text is not ASCII, -1 when there is no match."""
        # (The literal test written out here rather than calling _may_match: this runs ~200
        # times a query.)
        if not self._prepared:
            self._learn(text)
            return 0
        literals = self.literals
        if self._folded:
            lowered = _Lowered.lowered if text is _Lowered.text else _lower(text)
            if literals is not None and (lowered or not text):
                for literal in literals:
                    if literal in lowered:
                        break
                else:
                    return -1
            twin = self.twin
            if twin is None or not text.isascii():
                return 0
            found = twin.search(lowered)
            return -1 if found is None else found.start()
        if literals is not None:
            for literal in literals:
                if literal in text:
                    break
            else:
                return -1
        return 0

    # With a twin, each scan starts where the twin found the first match: the pattern itself
    # searching from there (lookbehinds and anchors still see the whole text) finds it again,
    # so every answer is the pattern's own.
    def search(self, text: str, *args: int) -> re.Match[str] | None:
        if args:
            return self.regex.search(text, *args) if self._may_match(text) else None
        start = self._first(text)
        return None if start < 0 else self.regex.search(text, start)

    def match(self, text: str, *args: int) -> re.Match[str] | None:
        return self.regex.match(text, *args) if self._may_match(text) else None

    def fullmatch(self, text: str, *args: int) -> re.Match[str] | None:
        return self.regex.fullmatch(text, *args) if self._may_match(text) else None

    def finditer(self, text: str, *args: int) -> Iterator[re.Match[str]]:
        if args:
            return self.regex.finditer(text, *args) if self._may_match(text) else iter(())
        start = self._first(text)
        return iter(()) if start < 0 else self.regex.finditer(text, start)

    def findall(self, text: str, *args: int) -> list[Any]:
        if args:
            return self.regex.findall(text, *args) if self._may_match(text) else []
        start = self._first(text)
        return [] if start < 0 else self.regex.findall(text, start)

    def sub(self, repl: Any, text: str, count: int = 0) -> str:
        return self.regex.sub(repl, text, count) if self._first(text) >= 0 else text

    def split(self, text: str, maxsplit: int = 0) -> list[str | Any]:
        return self.regex.split(text, maxsplit) if self._first(text) >= 0 else [text]

    def __getattr__(self, name: str) -> Any:
        # Everything else (groupindex, groups, scanner ...) is the pattern's own.
        return getattr(self.regex, name)

    def __repr__(self) -> str:
        return f"Gated({self.regex!r}, literals={self.literals!r})"


def compile(pattern: str, flags: int = 0) -> re.Pattern[str]:
    """:func:`re.compile`, gated once the pattern shows a useful set of required literals.

    Typed as the pattern it stands for: a :class:`Gated` answers every method of it.
    """
    return cast("re.Pattern[str]", Gated(re.compile(pattern, flags)))
