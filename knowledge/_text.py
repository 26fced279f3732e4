"""Text normalisation for the matcher: synonyms, tokens, a light stemmer and typo repair.

Private to ``knowledge.matcher``. Everything here is pure Python and deterministic; the same
pipeline runs over the knowledge entries (to build the index) and over a question.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, NamedTuple

from gradient_doctor.knowledge import _regex

SYNONYMS_FILE = "synonyms.yaml"

_WORD = _regex.compile(r"[a-z0-9]+(?:_[a-z0-9]+)*_?|[a-z0-9]+")
_SPLIT_PARTS = _regex.compile(r"[a-z0-9]+")
# Bare numbers ("1", "0", the "1e" of "1e-4") say nothing lexically; the number rules read them.
_NUMERIC = _regex.compile(r"^\d+e?$")


#: A negation and the few words it governs, up to a clause boundary ("NOT exploding", "no
#: upward drift", "never above 3", "isn't vanishing"); "not only" and "no longer" are left out
#: (the first adds, the second reports a change).
NEGATION = _regex.compile(
    r"(?:\b(?:not(?!\s+only\b)|no(?!\s+longer\b)|never|without|none|nor|zero)\b|n't\b)"
    r"(?P<scope>(?:\s+(?!(?:but|yet|though|although|however|except)\b)[\w'./-]+){1,3})",
    re.IGNORECASE,
)
#: Failure words: a failure named under a negation is denied, not reported ("it is NOT
#: exploding", "no NaN anywhere", "no upward drift").
FAILURE_WORD = _regex.compile(
    r"^(?:explod\w*|blow\w*|vanish\w*|nans?|infs?|inf/nan|nan/inf|non-?finite|diverg\w*|spik\w*|"
    r"jump\w*|overflow\w*|dead|dying|die\w*|collaps\w*|unstable|instabilit\w*|oscillat\w*|"
    r"stuck|plateau\w*|stall\w*|saturat\w*|overfit\w*|drift\w*|trend\w*|upward|skipped|"
    r"spikes?|problems?|issues?|errors?|warnings?|signs?|red)$"
)


_LAST_NEGATED: list[tuple[str, tuple[tuple[int, int], ...]]] = []


def negated_spans(text: str) -> tuple[tuple[int, int], ...]:
    """Where in ``text`` the words governed by a negation are (start, end of each scope).

    Remembered for the last text read: the matcher and then its re-ranker read the same one.
    """
    last = _LAST_NEGATED[0] if _LAST_NEGATED else None  # one read: threads may share it
    if last is not None and last[0] is text:
        return last[1]
    found = tuple(m.span("scope") for m in NEGATION.finditer(text) if m.group("scope"))
    _LAST_NEGATED[:] = [(text, found)]
    return found


def _keep(word: str) -> bool:
    return len(word) > 1 and word not in STOPWORDS and not _NUMERIC.match(word)


# Words that carry no meaning for matching. Kept short on purpose: "not", "no", "never",
# "still", "just" and "too" change what a sentence claims, so they stay.
STOPWORDS: frozenset[str] = frozenset(
    word
    for line in (
        "a an the and or of to in on at for with by from as is are was were be been being it its",
        "this that these those i me my we our you your he she they them their there here what",
        "which",
        "who whom when where how why do does did doing done have has had having can could would",
        "should will shall may might must am if then than so such into onto over under about after",
        "before while during also very really quite some any all each every other more most",
        "much many out up down off again further once only own same s t d ll m re ve y get gets",
        "got getting let lets one ones thing things way use used using like torch nn utils util",
        "functional self few couple hundred hundreds thousand thousands several lot lots bit",
        "times",
    )
    for word in line.split()
)

_SUFFIXES: tuple[str, ...] = (
    "izations",
    "ization",
    "isations",
    "isation",
    "ational",
    "ations",
    "ation",
    "ingly",
    "ously",
    "ively",
    "fully",
    "ments",
    "ment",
    "ness",
    "ences",
    "ence",
    "ances",
    "ance",
    "ities",
    "ity",
    "ings",
    "ing",
    "ions",
    "ion",
    "edly",
    "ied",
    "ies",
    "ers",
    "er",
    "ed",
    "es",
    "ly",
    "ive",
    "ous",
    "able",
    "ible",
    "ize",
    "ise",
    "ate",
    "al",
    "s",
)
_VOWELS = frozenset("aeiouy")
# Families the suffix rules would fold into another word: "normalize" must not become "norm"
# (the gradient norm), nor "normal" (the normal range).
_PROTECTED: tuple[tuple[str, str], ...] = (
    ("normaliz", "normaliz"),
    ("normalis", "normaliz"),
    ("normal", "normal"),
    # Running a model ("inference") is not an infinite value ("inf").
    ("inferenc", "inferenc"),
)
_NO_UNDOUBLE = frozenset("lsz")


_CONTRACTIONS: tuple[tuple[re.Pattern[str], str], ...] = (
    (_regex.compile(r"\bcan['’]t\b"), "can not"),
    (_regex.compile(r"\bwon['’]t\b"), "will not"),
    (_regex.compile(r"n['’]t\b"), " not"),
    (_regex.compile(r"['’](?:s|re|ve|ll|d|m)\b"), ""),
)


def normalise(text: str) -> str:
    """Lower-case ``text`` and spell out negations ("doesn't" → "does not")."""
    lowered = text.lower()
    if "'" not in lowered and "’" not in lowered:
        return lowered
    for pattern, replacement in _CONTRACTIONS:
        lowered = pattern.sub(replacement, lowered)
    return lowered


@lru_cache(maxsize=65536)
def stem(word: str) -> str:
    """A light suffix-stripping stemmer (clipping → clip, accumulation → accumul).

    Cruder than Porter but symmetric, which is all a lexical ranker needs: the same word
    family lands on the same stem in the entries and in the question.
    """
    if len(word) <= 3 or not word.isalpha():
        return word
    for prefix, protected in _PROTECTED:
        if word.startswith(prefix):
            return protected
    current = word
    for _ in range(2):
        for suffix in _SUFFIXES:
            if not current.endswith(suffix):
                continue
            if suffix == "s" and current[-2:-1] in ("s", "u", "i"):
                break
            rest = current[: -len(suffix)]
            if len(rest) < 3 or not (_VOWELS & set(rest)):
                continue
            if suffix in ("ies", "ied"):
                rest += "y"
            current = rest
            break
        else:
            break
    if current.endswith("at") and len(current) > 6:
        current = current[:-2]
    if current.endswith("e") and len(current) > 3:
        current = current[:-1]
    if (
        len(current) > 3
        and current[-1] == current[-2]
        and current[-1] not in _VOWELS
        and current[-1] not in _NO_UNDOUBLE
    ):
        current = current[:-1]
    return current


@dataclass(frozen=True)
class Synonyms:
    """Variant → canonical rewrites (phrases and single words) plus soft related expansions."""

    phrase_pattern: re.Pattern[str] | None
    phrase_to_canonical: Mapping[str, str]
    word_to_canonical: Mapping[str, str]
    related: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any]) -> Synonyms:
        """Build from the parsed ``synonyms.yaml`` document."""
        groups = raw.get("synonyms") or {}
        phrases: dict[str, str] = {}
        words: dict[str, str] = {}
        for canonical, variants in groups.items():
            canon = str(canonical).lower()
            for variant in [canon, *(normalise(str(v)) for v in variants or [])]:
                parts = _SPLIT_PARTS.findall(variant)
                if len(parts) == 1 and parts[0] == variant:
                    words[variant] = canon
                elif variant != canon:
                    phrases[variant] = canon
        pattern = _phrase_pattern(phrases)
        related_raw = raw.get("related") or {}
        related = {
            stem(str(k).lower()): tuple(stem(str(v).lower()) for v in vs or [])
            for k, vs in related_raw.items()
        }
        stemmed_words = {stem(w): stem(c) for w, c in words.items()}
        stemmed_words.update({w: stem(c) for w, c in words.items()})
        return cls(pattern, phrases, stemmed_words, related)

    @classmethod
    def from_tables(
        cls,
        phrases: Mapping[str, str],
        words: Mapping[str, str],
        related: Mapping[str, Iterable[str]],
    ) -> Synonyms:
        """Rebuild from the tables of an existing instance (the matcher's index snapshot)."""
        return cls(
            _phrase_pattern(phrases),
            dict(phrases),
            dict(words),
            {k: tuple(v) for k, v in related.items()},
        )

    def rewrite_phrases(self, text: str) -> str:
        """Replace multi-word variants in lower-cased ``text`` by their canonical token."""
        if self.phrase_pattern is None:
            return text
        return self.phrase_pattern.sub(lambda m: f" {self.phrase_to_canonical[m.group(0)]} ", text)

    def canonical(self, token: str) -> str:
        """The canonical stem for a (stemmed or raw) token; the token itself when none."""
        return self.word_to_canonical.get(token, token)


def _phrase_pattern(phrases: Iterable[str]) -> re.Pattern[str] | None:
    ordered = sorted(phrases, key=len, reverse=True)
    if not ordered:
        return None
    body = "|".join(re.escape(p) for p in ordered)
    # Whole words only: the variant must not be glued to letters on either side.
    return _regex.compile(rf"(?<![a-z0-9])(?:{body})(?![a-z0-9])")


@lru_cache(maxsize=1)
def load_synonyms() -> Synonyms:
    """The packaged synonym table (cached)."""
    import importlib.resources

    import yaml  # only when the index is built: a snapshot holds the parsed table

    text = (
        importlib.resources.files("gradient_doctor.knowledge") / "data" / SYNONYMS_FILE
    ).read_text("utf-8")
    raw = yaml.safe_load(text) or {}
    return Synonyms.from_mapping(raw)


class Token(NamedTuple):
    """One normalised token; ``raw`` is the surface word before stemming (for typo repair)."""

    term: str
    raw: str


class Analyzer:
    """Turns text into normalised terms: lower-case, synonyms, stop words, stems."""

    def __init__(self, synonyms: Synonyms) -> None:
        self.synonyms = synonyms

    def tokens(self, text: str) -> list[Token]:
        """Normalised tokens of ``text`` in order (stop words and bare numbers dropped)."""
        lowered = self.synonyms.rewrite_phrases(normalise(text))
        canonical = self.synonyms.word_to_canonical
        out: list[Token] = []
        for word in _WORD.findall(lowered):
            if "_" in word:
                bare = word.strip("_")
                whole = canonical.get(bare) or canonical.get(word)
                if whole is not None:
                    out.append(Token(whole, word))
                    continue
                # An API name is a strong, exact clue: keep it whole as well as in parts.
                out.append(Token(bare, word))
                out.extend(self._word(part) for part in _SPLIT_PARTS.findall(word) if _keep(part))
            elif _keep(word):
                out.append(self._word(word))
        return out

    def _word(self, word: str) -> Token:
        canonical = self.synonyms.word_to_canonical
        direct = canonical.get(word)
        if direct is not None:
            return Token(direct, word)
        stemmed = stem(word)
        return Token(canonical.get(stemmed, stemmed), word)

    def terms(self, text: str) -> list[str]:
        """Just the terms of :meth:`tokens`."""
        return [t.term for t in self.tokens(text)]

    def related(self, term: str) -> tuple[str, ...]:
        """Soft expansions of ``term`` (half weight in the ranker)."""
        return self.synonyms.related.get(term, ())


def _deletes(word: str) -> set[str]:
    return {word[:i] + word[i + 1 :] for i in range(len(word))}


def damerau_levenshtein(a: str, b: str, limit: int) -> int:
    """Optimal-string-alignment distance, giving up (returning ``limit + 1``) past ``limit``."""
    if abs(len(a) - len(b)) > limit:
        return limit + 1
    prev_prev: list[int] = []
    prev = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        cur = [i] + [0] * len(b)
        row_min = cur[0]
        for j in range(1, len(b) + 1):
            cost = 0 if a[i - 1] == b[j - 1] else 1
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost)
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                cur[j] = min(cur[j], prev_prev[j - 2] + 1)
            row_min = min(row_min, cur[j])
        if row_min > limit:
            return limit + 1
        prev_prev, prev = prev, cur
    return prev[-1]


#: Ordinary English words one or two edits away from a word of the entries ("throughout" and
#: "throughput", "stall" and "small", "scalar" and "scaler"): a user writing them meant them.
#: Found by running the corrector over common words and the evaluation texts.
_REAL_WORDS_TEXT = """
    agent agents aided based blank brown calms cheek clone coats codes coder crush death device
    devices draft drafts fever files grass latter liner lines lasts maxed mates modes newer
    older paint pasted pasts plane sages sated scalar scalars score shared smell stale stall
    stick stock taken thorough throughout tough trail valve white wrote chance chances
"""
REAL_WORDS: frozenset[str] = frozenset(_REAL_WORDS_TEXT.split())


class TypoCorrector:
    """Repairs misspelt words (length ≥ 5) against the index vocabulary.

    Symmetric-delete lookup (one deletion on each side) finds candidates within edit
    distance 2 in microseconds; each candidate is then checked with a real distance
    (1 for words of 5–7 letters, 2 from 8 letters on). Ties go to the more common word.
    """

    MIN_LENGTH = 5

    def __init__(self, vocabulary: Mapping[str, int]) -> None:
        self.counts = dict(vocabulary)
        self._index: dict[str, list[str]] | None = None
        self._cache: dict[str, str | None] = {}

    @property
    def _by_delete(self) -> dict[str, list[str]]:
        # Built on the first misspelling, not at load: most questions have none.
        if self._index is None:
            index: dict[str, list[str]] = {}
            for word in self.counts:
                if len(word) < self.MIN_LENGTH - 1:
                    continue
                for key in _deletes(word) | {word}:
                    index.setdefault(key, []).append(word)
            self._index = index
        return self._index

    def correct(self, word: str, *, rare: bool = False) -> str | None:
        """The vocabulary word ``word`` was probably meant to be, or None.

        With ``rare``, ``word`` is itself in the vocabulary but rare; only a much more common
        word (ten times as frequent) counts as its correction.
        """
        if len(word) < self.MIN_LENGTH or not word.isalpha() or word in REAL_WORDS:
            return None
        if word in self.counts and not rare:
            return None
        key = f"{word}\0{rare}"
        if key in self._cache:
            return self._cache[key]
        floor = 10 * max(self.counts.get(word, 0), 1) if rare else 0
        limit = 1 if len(word) < 8 else 2
        candidates: set[str] = set()
        for key in _deletes(word) | {word}:
            candidates.update(self._by_delete.get(key, ()))
        best: tuple[int, int, str] | None = None
        for cand in candidates:
            if len(cand) < self.MIN_LENGTH or cand in STOPWORDS or cand == word:
                continue
            if self.counts[cand] < floor:
                continue
            # Misspellings keep the first letter (or swap the first two): "fight" is not a
            # typo of "right", nor "hovers" of "covers".
            if cand[0] != word[0] and cand[:2] != word[1::-1]:
                continue
            # Nor do they change only the ending: "thrown" is another form of a word, not a
            # misspelt "throws".
            if cand[:-1] == word[:-1] or cand.startswith(word) or word.startswith(cand):
                continue
            dist = damerau_levenshtein(word, cand, limit)
            if dist > limit:
                continue
            rank = (dist, -self.counts[cand], cand)
            if best is None or rank < best:
                best = rank
        result = best[2] if best else None
        self._cache[key] = result
        return result


def vocabulary(texts: Iterable[str]) -> dict[str, int]:
    """Surface words (lower-case) of ``texts`` with their counts."""
    counts: dict[str, int] = {}
    for text in texts:
        for word in _SPLIT_PARTS.findall(text.lower()):
            if word.isalpha():
                counts[word] = counts.get(word, 0) + 1
    return counts


# -- paragraphs wrapped at a fixed width ------------------------------------------------------

#: A wrapped paragraph's lines are long: a short line ended where its writer ended it.
_WRAPPED_WIDTH = 60
_PROSE_WORD = _regex.compile(r"[A-Za-z]{2,}")
#: A next line that starts something of its own: a bullet or number mark, a log or table row, a
#: traceback frame, a prompt, a comment, a quotation.
_OWN_LINE_START = _regex.compile(
    r"^\s*(?:[-*•>|#\[]|\d+[.)]\s|(?:step|iter(?:ation)?|epoch|it)\s*[:=]?\s*\d|File\s\"|"
    r"Traceback\b|[A-Z]\w*(?:Error|Exception|Warning)\b|>>>|\.\.\.\s|\{)",
    re.IGNORECASE,
)
#: A line of code (a statement, a block header, an assignment) is never part of a paragraph.
_CODE_LIKE = _regex.compile(
    r"^\s*(?:for|if|elif|while|with|def|class|try|except|finally|else)\b[^\n]*:\s*$"
    r"|^\s*(?:import\s+[\w.]+|from\s+[\w.]+\s+import\b|return\b|lambda\b)"
    r"|^\s*[\w.\[\]'\"]+\s*(?:[-+*/]?=)(?!=)\s*\S|[{(\[\\]\s*$|^\s*[\w.]+\([^\n]*\)\s*$"
)
_NUMBER_ROW = _regex.compile(r"^[\s\d.eE+\-−,:/|%x×]*$")


def _paragraph_line(line: str) -> bool:
    return len(_PROSE_WORD.findall(line)) >= 3 and not _CODE_LIKE.search(line)


def wrapped_breaks(text: str) -> list[int]:
    """The offsets of the line breaks inside wrapped paragraphs of ``text``.

    Text pasted from a forum, an email or a YAML file is often wrapped at a fixed width, so a
    quantity's name can end one line and its value start the next ("the total grad norm is\n
    3e-9 from step 0 on"). Readers that go line by line (log lines, tables, tracebacks, code)
    lose it. A break is a wrap only between two prose lines with the same indent, the first one
    long and not ended by a colon, the next one starting no bullet, log or table row, traceback
    frame or code.
    """
    breaks: list[int] = []
    if "\n" not in text:
        return breaks
    offset = 0
    lines = text.split("\n")
    for prev, line in itertools.pairwise(lines):
        offset += len(prev) + 1
        stripped = prev.rstrip()
        indent = len(prev) - len(prev.lstrip())
        if (
            len(stripped) >= _WRAPPED_WIDTH
            and line.strip()
            and len(line) - len(line.lstrip()) == indent
            and not stripped.endswith(":")
            # (A line ended by a comma goes on: "step 200: 4300,\nstep 300: 2750.")
            and (stripped.endswith(",") or not _OWN_LINE_START.match(line))
            and not _NUMBER_ROW.match(line)
            and _paragraph_line(stripped)
            and (_paragraph_line(line) or line.rstrip()[-1:] in ".?!")
        ):
            breaks.append(offset - 1)
    return breaks


def unwrap_prose(text: str) -> str:
    """``text`` with the line breaks inside wrapped paragraphs (``wrapped_breaks``) as spaces."""
    chars = list(text)
    for at in wrapped_breaks(text):
        chars[at] = " "
    return "".join(chars)
