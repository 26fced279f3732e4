"""The static analyser's engine: parse once, build the training-loop model, run the rules.

``lint_source`` never raises on any source text: a file that cannot be parsed gives a
:class:`FileReport` with a one-line ``error``. Every patch a rule proposes is verified before
it is returned: the diff applies to the exact text read, the patched text parses, and
re-analysing it no longer reports that finding (and reports nothing new at warning level or
above); otherwise the finding keeps ``fix=None``.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
import warnings
from collections import Counter
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from functools import lru_cache

import libcst as cst

from probes.findings import Finding, Fix, severity_at_least
from probes.static import rules as rules_package
from probes.static.base import RawFinding, Rule
from probes.static.model import FileModel
from probes.static.patches import (
    DiffError,
    Patch,
    apply_patch,
    apply_unified_diff,
    combine,
    unified_diff,
)
from probes.static.positions import Span, spans_of
from probes.static.report import FileReport

__all__ = ["all_rules", "lint_source", "rule_ids"]


@lru_cache(maxsize=1)
def _discover() -> tuple[Rule, ...]:
    found: list[Rule] = []
    for info in pkgutil.iter_modules(rules_package.__path__):
        module = importlib.import_module(f"{rules_package.__name__}.{info.name}")
        for value in vars(module).values():
            if (
                isinstance(value, type)
                and issubclass(value, Rule)
                and value is not Rule
                and value.__module__ == module.__name__
            ):
                found.append(value())
    return tuple(sorted(found, key=lambda rule: rule.id))


def all_rules() -> list[Rule]:
    """Every static rule, discovered from ``probes/static/rules/``, sorted by id."""
    return list(_discover())


def rule_ids() -> list[str]:
    """The ids of every static rule."""
    return [rule.id for rule in _discover()]


def _selected(select: Collection[str] | None, ignore: Collection[str] | None) -> list[Rule]:
    known = set(rule_ids())
    unknown = sorted({*(select or ()), *(ignore or ())} - known)
    if unknown:
        raise ValueError(
            f"unknown rule id(s): {', '.join(unknown)}; known ids: {', '.join(sorted(known))}"
        )
    chosen = [r for r in _discover() if select is None or r.id in set(select)]
    return [r for r in chosen if r.id not in set(ignore or ())]


def _syntax_error(source: str) -> str | None:
    """A one-line reason when CPython cannot parse ``source`` (checked before libcst, whose
    native parser can crash on pathological nesting)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ast.parse(source)
    except SyntaxError as exc:
        line = exc.lineno or 0
        col = exc.offset or 0
        return f"syntax error at line {line}:{col}: {exc.msg}"
    except (RecursionError, MemoryError):
        return "syntax error at line 1:1: the file is too deeply nested to analyse"
    except ValueError as exc:  # e.g. NUL bytes
        return f"syntax error at line 1:1: {str(exc).splitlines()[0] if str(exc) else 'invalid'}"
    return None


def _parse(source: str) -> cst.Module | str:
    error = _syntax_error(source)
    if error is not None:
        return error
    try:
        return cst.parse_module(source)
    except cst.ParserSyntaxError as exc:
        return f"syntax error at line {exc.raw_line}:{exc.raw_column + 1}: {exc.message}"
    except (RecursionError, MemoryError):
        return "the file is too deeply nested to analyse"
    except Exception as exc:  # libcst raises a few other types on odd input
        return f"could not parse the file: {type(exc).__name__}"


@dataclass
class _Raw:
    rule: Rule
    raw: RawFinding


def _check(module: cst.Module, path: str, rules: Sequence[Rule]) -> list[_Raw]:
    model = FileModel(module, path)
    found: list[_Raw] = []
    for rule in rules:
        for raw in rule.check(model):
            found.append(_Raw(rule, raw))
    return found


class _Verifier:
    """Re-analyses patched text, with a cache, to check that a patch does what it claims."""

    def __init__(self, source: str, module: cst.Module, path: str, baseline: list[_Raw]) -> None:
        self.source = source
        self.module = module
        self.path = path
        self.baseline = _counts(baseline)
        self.cache: dict[str, Counter[str] | None] = {}

    def counts(self, code: str) -> Counter[str] | None:
        if code not in self.cache:
            parsed = _parse(code)
            if isinstance(parsed, str):
                self.cache[code] = None
            else:
                try:
                    self.cache[code] = _counts(_check(parsed, self.path, all_rules()))
                except RecursionError:
                    self.cache[code] = None
        return self.cache[code]

    def diff_for(self, patch: Patch, fixes: Collection[str]) -> str | None:
        """The verified diff of ``patch``, which must remove one finding of each id in
        ``fixes`` and add no new warning or critical finding; None when it does not."""
        try:
            code = apply_patch(self.module, patch)
        except Exception:
            return None
        if code == self.source:
            return None
        diff = unified_diff(self.path, self.source, code)
        try:
            if apply_unified_diff(self.source, diff) != code:
                return None
        except DiffError:
            return None
        after = self.counts(code)
        if after is None:
            return None
        for rule_id in fixes:
            if after[rule_id] >= self.baseline[rule_id]:
                return None
        for rule_id, count in after.items():
            if rule_id not in fixes and count > self.baseline[rule_id]:
                return None
        return diff


def _counts(raws: list[_Raw]) -> Counter[str]:
    counter: Counter[str] = Counter()
    for item in raws:
        severity = item.raw.severity or item.rule.severity
        if severity_at_least(severity, "warning") or item.raw.patch is not None:
            counter[item.rule.id] += 1
    return counter


def lint_source(
    source: str,
    path: str = "<string>",
    *,
    select: Collection[str] | None = None,
    ignore: Collection[str] | None = None,
) -> FileReport:
    """Analyse one script's text; findings sorted by (line, col, id), fixes verified.

    ``select`` keeps only those rule ids, ``ignore`` drops them (ValueError on an unknown
    id). Never raises on bad source text: it returns a report with ``error`` set instead.
    """
    rules = _selected(select, ignore)
    if not isinstance(source, str):
        return FileReport(path=path, error="not text")
    parsed = _parse(source)
    if isinstance(parsed, str):
        return FileReport(path=path, error=parsed)
    module = parsed
    try:
        raws = _check(module, path, all_rules())
        if not raws:
            return FileReport(path=path)
        wanted = {rule.id for rule in rules}
        nodes: list[cst.CSTNode] = []
        for item in raws:
            if item.rule.id in wanted:
                nodes.append(item.raw.node)
                nodes.extend(_nodes_in(item.raw.evidence))
        positions = spans_of(module, nodes)
        return _report(source, module, path, raws, rules, positions)
    except RecursionError:
        return FileReport(path=path, error="the file is too deeply nested to analyse")


def _report(
    source: str,
    module: cst.Module,
    path: str,
    raws: list[_Raw],
    rules: Sequence[Rule],
    positions: dict[int, Span],
) -> FileReport:
    wanted = {r.id for r in rules}
    verifier = _Verifier(source, module, path, raws)
    findings: list[Finding] = []
    patches: list[tuple[Finding, Patch]] = []
    seen: set[tuple[str, int, int]] = set()
    for item in raws:
        rule, raw = item.rule, item.raw
        if rule.id not in wanted:
            continue
        where = positions.get(id(raw.node))
        if where is None:
            continue
        key = (rule.id, where.line, where.column)
        if key in seen:
            continue
        seen.add(key)
        fix = None
        if raw.patch is not None:
            diff = verifier.diff_for(raw.patch, {rule.id})
            if diff is not None:
                fix = Fix(
                    description=raw.fix_description or "Apply the suggested change.",
                    diff=diff,
                    safe=raw.fix_safe,
                    snippet_id=rule.snippet_id,
                )
        evidence = _evidence(raw.evidence, positions)
        try:
            message = raw.message.format(**evidence)
        except (KeyError, IndexError, ValueError):
            message = raw.message
        if rule.snippet_id is not None:
            evidence.setdefault("snippet_id", rule.snippet_id)
        finding = Finding(
            id=rule.id,
            severity=raw.severity or rule.severity,
            message=message,
            origin="static",
            path=path,
            line=where.line,
            col=where.column + 1,
            end_line=where.end_line,
            end_col=where.end_column + 1,
            evidence=evidence,
            fix=fix,
        )
        findings.append(finding)
        if fix is not None and raw.patch is not None:
            patches.append((finding, raw.patch))
    findings.sort(key=lambda f: (f.line or 0, f.col or 0, f.id))
    return FileReport(
        path=path, findings=findings, combined_diff=_combined(verifier, patches, source)
    )


def _nodes_in(evidence: dict[str, object]) -> list[cst.CSTNode]:
    nodes: list[cst.CSTNode] = []
    for value in evidence.values():
        if isinstance(value, cst.CSTNode):
            nodes.append(value)
        elif isinstance(value, list | tuple):
            nodes.extend(v for v in value if isinstance(v, cst.CSTNode))
    return nodes


def _evidence(evidence: dict[str, object], positions: dict[int, Span]) -> dict[str, object]:
    """Evidence with every syntax node replaced by its 1-based line number."""
    out: dict[str, object] = {}
    for key, value in evidence.items():
        if isinstance(value, cst.CSTNode):
            where = positions.get(id(value))
            out[key] = where.line if where is not None else None
        elif isinstance(value, list | tuple) and value and isinstance(value[0], cst.CSTNode):
            spans = [positions.get(id(v)) for v in value]
            out[key] = [w.line for w in spans if w is not None]
        else:
            out[key] = value
    return out


def _combined(verifier: _Verifier, patches: list[tuple[Finding, Patch]], source: str) -> str | None:
    if not patches:
        return None
    if len(patches) == 1:
        return patches[0][0].fix.diff if patches[0][0].fix else None
    chosen: list[Patch] = []
    for _, patch in patches:
        if not any(patch.conflicts_with(other) for other in chosen):
            chosen.append(patch)
    try:
        code = apply_patch(verifier.module, combine(chosen))
    except Exception:
        return None
    if _syntax_error(code) is not None:
        return None
    diff = unified_diff(verifier.path, source, code)
    try:
        if apply_unified_diff(source, diff) != code:
            return None
    except DiffError:
        return None
    return diff
