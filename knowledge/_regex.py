"""Regular expressions that skip their scan when a text cannot match.

Most of the matcher's patterns are long alternations of words searched in every query, and
most queries contain none of those words. :func:`compile` reads from the pattern itself a set
of literal strings one of which every match must contain (its "required literals"); a search
in a text that holds none of them returns no match without running the regular expression.
The answer is exactly the pattern's: the gate only ever skips scans that would find nothing.
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
        self._calls = 0
        self._prepared = False
        self._may_match: Callable[[str], bool] = self._learn

    def prepare(self) -> None:
        """Read the pattern's required literals now (idempotent)."""
        if self._prepared:
            return
        self._prepared = True
        literals = required_literals(self.regex)
        if literals is None:
            # Instance attributes come before the class's methods: no test, no wrapper.
            for name in _METHODS:
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

    def search(self, text: str, *args: int) -> re.Match[str] | None:
        return self.regex.search(text, *args) if self._may_match(text) else None

    def match(self, text: str, *args: int) -> re.Match[str] | None:
        return self.regex.match(text, *args) if self._may_match(text) else None

    def fullmatch(self, text: str, *args: int) -> re.Match[str] | None:
        return self.regex.fullmatch(text, *args) if self._may_match(text) else None

    def finditer(self, text: str, *args: int) -> Iterator[re.Match[str]]:
        return self.regex.finditer(text, *args) if self._may_match(text) else iter(())

    def findall(self, text: str, *args: int) -> list[Any]:
        return self.regex.findall(text, *args) if self._may_match(text) else []

    def sub(self, repl: Any, text: str, count: int = 0) -> str:
        return self.regex.sub(repl, text, count) if self._may_match(text) else text

    def split(self, text: str, maxsplit: int = 0) -> list[str | Any]:
        return self.regex.split(text, maxsplit) if self._may_match(text) else [text]

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
