"""The static analyser on real code: false alarms, real bugs found, and whether its patches hold.

Reads a corpus built from pinned public commits (``manifest.json`` plus the materialised
files; see ``benchmarks/corpus/static_manifest.json`` for the committed, content-free copy of
the manifest) and runs the analyser through its public API only
(``gradient_doctor.probes.static.lint_paths``) on each item's folder, so that an analyser
which indexes a whole project sees helpers in other modules. It prints, per corpus:

* (a) correct training code: false warnings/criticals per 100 files, each with file, id,
  line and message (findings the manifest accepts as legitimate advisories are listed apart);
* (b) real reported bugs: found at the expected line, found with the right id in the right
  file but at another line, and missed;
* patches: offered, checked and broken. A patch is *checked* when it applies to the exact text,
  the result parses with libcst, every name on an added line is bound at its use (libcst
  ``ScopeProvider``: a binding in the same scope must come before the use), every guard and
  branch header of the original is still there, a statement the patch moves keeps its guards
  and is not moved into only one branch of an ``if``/``else``, and an added ``unscale_`` is
  neither a second one on the same path nor less guarded than the ``step`` it precedes.
  Items with a ``run`` entry in the manifest are also run, original and patched, in scratch
  copies; a patched copy that fails where the original ran is broken.

A JSON file with every number and every finding is written with ``--out`` so that two runs
(before and after a change to the analyser) can be compared with ``--compare``.

    .venv/bin/python benchmarks/static_corpus.py /work/corpus/static --split seen \\
        [--corpus a|b|all] [--out results.json] [--per-file] [--no-run] [--compare OLD.json]

To rebuild the corpus folder elsewhere from the committed manifest (needs the git mirrors of
the listed repositories, e.g. from the ``fetch`` tool, under MIRRORS/<owner>+<name>/repo):

    .venv/bin/python benchmarks/static_corpus.py NEW_DIR --materialise \\
        benchmarks/corpus/static_manifest.json /work/.mirror --split seen
"""

from __future__ import annotations

import argparse
import builtins
import contextlib
import inspect
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import libcst as cst
from libcst.metadata import ComprehensionScope, MetadataWrapper, PositionProvider, ScopeProvider

SEVERE = ("warning", "critical")
RUN_TIMEOUT_S = 300


# --------------------------------------------------------------------------- manifest


@dataclass
class Item:
    """One corpus entry as the manifest describes it."""

    id: str
    corpus: str
    split: str
    repo: str
    root: Path
    paths: list[str]
    record: dict[str, Any]

    @property
    def expected(self) -> list[dict[str, Any]]:
        return list(self.record.get("expected", []))

    @property
    def accepted(self) -> set[str]:
        return {entry["id"] for entry in self.record.get("accepted", [])}


def load_items(corpus_dir: Path, split: str, corpus: str) -> list[Item]:
    """Items of the manifest in ``corpus_dir`` for one split (or all) and corpus (or all)."""
    manifest = json.loads((corpus_dir / "manifest.json").read_text(encoding="utf-8"))
    items = []
    for record in manifest["items"]:
        if split != "all" and record["split"] != split:
            continue
        if corpus != "all" and record["corpus"] != corpus:
            continue
        items.append(
            Item(
                id=record["id"],
                corpus=record["corpus"],
                split=record["split"],
                repo=record["repo"],
                root=corpus_dir / record["local_root"],
                paths=list(record["paths"]),
                record=record,
            )
        )
    return items


def local_root(record: dict[str, Any]) -> str:
    """The folder an item lives in, relative to the corpus folder (the builder's layout)."""
    if record["corpus"] == "a":
        owner_name = record["repo"].replace("/", "+")
        return f"{record['split']}/a/{owner_name}@{record['commit'][:12]}"
    return f"{record['split']}/b/{record['id'].split(':', 1)[1]}"


def materialise(public_manifest: Path, mirrors: Path, out_dir: Path) -> int:
    """Rebuild a corpus folder from the committed manifest and local git mirrors.

    ``mirrors/<owner>+<name>/repo`` must be a git directory holding each pinned commit (the
    layout the ``fetch`` tool produces). Writes ``out_dir/manifest.json`` with local paths
    and every file at its pinned commit; returns the number of files written.
    """
    manifest = json.loads(public_manifest.read_text(encoding="utf-8"))
    written = 0
    for record in manifest["items"]:
        git_dir = mirrors / record["repo"].replace("/", "+") / "repo"
        if (git_dir / ".git").is_dir():
            git_dir = git_dir / ".git"
        root = local_root(record)
        files = record.get("package_paths") or [
            *record["paths"],
            *record.get("context_paths", []),
        ]
        for rel in files:
            dest = out_dir / root / rel
            if dest.exists():
                continue
            blob = subprocess.run(
                ["git", "--git-dir", str(git_dir), "show", f"{record['commit']}:{rel}"],
                capture_output=True,
                check=True,
            ).stdout
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(blob)
            written += 1
        record["local_root"] = root
        record["local_paths"] = [f"{root}/{rel}" for rel in record["paths"]]
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n", "utf-8")
    return written


# --------------------------------------------------------------------------- linting


@dataclass
class Finding:
    """The public fields of one analyser finding, keyed by its file relative to the root."""

    path: str
    id: str
    severity: str
    line: int | None
    message: str
    diff: str | None
    safe: bool | None

    def brief(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "id": self.id,
            "severity": self.severity,
            "line": self.line,
            "message": self.message,
            "patch": self.diff is not None,
            "safe": self.safe,
        }


@dataclass
class RootReport:
    """Everything the analyser said about the files under one root."""

    findings: dict[str, list[Finding]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    combined: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0


def _relative(path: str, root: Path) -> str:
    try:
        return Path(os.path.relpath(Path(path).resolve(), root.resolve())).as_posix()
    except ValueError:
        return Path(path).as_posix()


def _lint(targets: list[Path]) -> Any:
    """Call the public ``lint_paths``; pass a project root when the analyser accepts one."""
    from gradient_doctor.probes.static import lint_paths

    parameters = inspect.signature(lint_paths).parameters
    kwargs: dict[str, Any] = {}
    for name in ("project_root", "project"):
        if name in parameters and len(targets) == 1 and targets[0].is_dir():
            kwargs[name] = targets[0] if name == "project_root" else True
            break
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return lint_paths([str(t) for t in targets], **kwargs)


def lint_root(root: Path, files: Sequence[str] | None = None) -> RootReport:
    """Lint a whole item folder (project-level), or only ``files`` in it one by one."""
    report = RootReport()
    started = time.perf_counter()
    if files is None:
        batches: list[list[Path]] = [[root]]
    else:
        batches = [[root / f] for f in files]
    for targets in batches:
        result = _lint(targets)
        for file_report in result.files:
            rel = _relative(file_report.path, root)
            if file_report.error:
                report.errors[rel] = file_report.error
            combined = getattr(file_report, "combined_diff", None)
            if combined:
                report.combined[rel] = combined
            found = report.findings.setdefault(rel, [])
            for finding in file_report.findings:
                fix = getattr(finding, "fix", None)
                found.append(
                    Finding(
                        path=rel,
                        id=finding.id,
                        severity=finding.severity,
                        line=finding.line,
                        message=" ".join(str(finding.message).split()),
                        diff=getattr(fix, "diff", None) if fix is not None else None,
                        safe=getattr(fix, "safe", None) if fix is not None else None,
                    )
                )
    report.seconds = time.perf_counter() - started
    return report


# --------------------------------------------------------------------------- diffs

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
_NO_NEWLINE = "\\ No newline at end of file"


class PatchError(ValueError):
    """A patch that does not apply to the exact text it was made for."""


@dataclass
class Applied:
    """A patched text and the 1-based lines the patch touched on each side."""

    text: str
    added: set[int]
    removed: set[int]
    insert_points: set[int]


def diff_targets(diff: str) -> list[str]:
    """The file names a unified diff changes (``+++ b/...`` headers)."""
    names = []
    for line in diff.splitlines():
        if line.startswith("+++ "):
            name = line[4:].strip().split("\t")[0]
            names.append(name[2:] if name.startswith("b/") else name)
    return names


def split_diff(diff: str) -> dict[str, str]:
    """One diff per target file."""
    parts: dict[str, list[str]] = {}
    current: list[str] | None = None
    pending: list[str] = []
    for line in diff.splitlines(keepends=True):
        if line.startswith("--- "):
            pending = [line]
            continue
        if line.startswith("+++ "):
            name = line[4:].strip().split("\t")[0]
            name = name[2:] if name.startswith("b/") else name
            current = parts.setdefault(name, [])
            current.extend(pending)
            current.append(line)
            pending = []
            continue
        if current is not None:
            current.append(line)
    return {name: "".join(lines) for name, lines in parts.items()}


def apply_diff(text: str, diff: str) -> Applied:
    """Apply a one-file unified diff strictly: every context and removed line must match the
    text exactly at the position the hunk header gives (no fuzz, no offset search)."""
    source = text.splitlines(keepends=True)
    newline = "\r\n" if text.count("\r\n") > text.count("\n") / 2 else "\n"
    out: list[str] = []
    added: set[int] = set()
    removed: set[int] = set()
    insert_points: set[int] = set()
    cursor = 0
    lines = diff.splitlines(keepends=True)
    index = 0
    while index < len(lines) and not lines[index].startswith("@@"):
        index += 1
    if index == len(lines):
        raise PatchError("no hunk in the diff")
    while index < len(lines):
        header = _HUNK.match(lines[index])
        if header is None:
            raise PatchError(f"bad hunk header {lines[index].strip()!r}")
        old_start, old_len = int(header.group(1)), int(header.group(2) or 1)
        start = old_start - 1 if old_len else old_start
        if start < cursor:
            raise PatchError("hunks overlap or are out of order")
        if start > len(source):
            raise PatchError(f"hunk starts at line {old_start}, past the end of the text")
        out.extend(source[cursor:start])
        cursor = start
        index += 1
        while index < len(lines) and not lines[index].startswith("@@"):
            raw = lines[index]
            tag, body = raw[:1], raw[1:]
            no_newline = index + 1 < len(lines) and lines[index + 1].rstrip("\r\n") == _NO_NEWLINE
            if no_newline:
                body = body.rstrip("\r\n")
                index += 1
            if tag in (" ", "-"):
                if cursor >= len(source) or source[cursor].rstrip("\r\n") != body.rstrip("\r\n"):
                    raise PatchError(f"the text differs from the diff at line {cursor + 1}")
                if tag == " ":
                    out.append(source[cursor])
                else:
                    removed.add(cursor + 1)
                    insert_points.add(len(out) + 1)
                cursor += 1
            elif tag == "+":
                if not no_newline and not body.endswith(("\n", "\r")):
                    body += newline
                elif not no_newline:
                    body = body.rstrip("\r\n") + newline
                out.append(body)
                added.add(len(out))
            elif raw.strip() == "":
                raise PatchError("blank line inside a hunk")
            else:
                raise PatchError(f"unexpected diff line {raw.strip()!r}")
            index += 1
    out.extend(source[cursor:])
    return Applied("".join(out), added, removed, insert_points)


# --------------------------------------------------------------------------- statement map

_COMPOUND = (
    cst.If,
    cst.For,
    cst.While,
    cst.With,
    cst.Try,
    cst.FunctionDef,
    cst.ClassDef,
)


@dataclass(frozen=True)
class Guard:
    """One enclosing compound statement: its kind, header text and which branch we are in."""

    kind: str
    header: str
    branch: str
    node_key: int
    has_alternative: bool

    def label(self) -> str:
        return f"{self.kind} {self.header} [{self.branch}]"


@dataclass
class Stmt:
    code: str
    first: int
    last: int
    guards: tuple[Guard, ...]
    function: str


def _norm(code: str) -> str:
    return " ".join(code.split())


def _header(module: cst.Module, node: cst.CSTNode) -> tuple[str, str]:
    if isinstance(node, cst.If):
        return "if", _norm(module.code_for_node(node.test))
    if isinstance(node, cst.For):
        return "for", _norm(
            f"{module.code_for_node(node.target)} in {module.code_for_node(node.iter)}"
        )
    if isinstance(node, cst.While):
        return "while", _norm(module.code_for_node(node.test))
    if isinstance(node, cst.With):
        items = ", ".join(module.code_for_node(item) for item in node.items)
        return "with", _norm(items)
    if isinstance(node, cst.Try):
        return "try", ""
    if isinstance(node, cst.FunctionDef):
        return "def", node.name.value
    if isinstance(node, cst.ClassDef):
        return "class", node.name.value
    return type(node).__name__, ""


class _StatementMap(cst.CSTVisitor):
    """Every simple statement with its guard chain, and every compound header."""

    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self, module: cst.Module) -> None:
        super().__init__()
        self.module = module
        self.chain: list[Guard] = []
        self.functions: list[str] = []
        self.statements: list[Stmt] = []
        self.headers: Counter[tuple[str, str]] = Counter()

    def on_visit(self, node: cst.CSTNode) -> bool:
        if isinstance(node, (cst.SimpleStatementLine, cst.SimpleStatementSuite)):
            pos = self.get_metadata(PositionProvider, node)
            code = "; ".join(self.module.code_for_node(small) for small in node.body)
            self.statements.append(
                Stmt(
                    code=_norm(code),
                    first=pos.start.line,
                    last=pos.end.line,
                    guards=tuple(self.chain),
                    function=".".join(self.functions),
                )
            )
            return False
        if isinstance(node, _COMPOUND):
            kind, header = _header(self.module, node)
            self.headers[(kind, header)] += 1
            if isinstance(node, (cst.FunctionDef, cst.ClassDef)):
                self.functions.append(header)
                saved = self.chain
                self.chain = []
                node.body.visit(self)
                self.chain = saved
                self.functions.pop()
                return False
            key = id(node)
            has_alternative = bool(getattr(node, "orelse", None)) or isinstance(node, cst.Try)
            self.chain.append(Guard(kind, header, "body", key, has_alternative))
            node.body.visit(self)
            self.chain.pop()
            if isinstance(node, cst.If) and node.orelse is not None:
                self.chain.append(Guard(kind, header, "else", key, True))
                node.orelse.visit(self)
                self.chain.pop()
            elif isinstance(node, (cst.For, cst.While)) and node.orelse is not None:
                self.chain.append(Guard(kind, header, "loop-else", key, True))
                node.orelse.visit(self)
                self.chain.pop()
            elif isinstance(node, cst.Try):
                for handler in node.handlers:
                    label = "except " + (
                        _norm(self.module.code_for_node(handler.type)) if handler.type else ""
                    )
                    self.headers[("except", label)] += 1
                    self.chain.append(Guard(kind, header, label, key, True))
                    handler.body.visit(self)
                    self.chain.pop()
                for name, part in (("else", node.orelse), ("finally", node.finalbody)):
                    if part is not None:
                        self.chain.append(Guard(kind, header, name, key, True))
                        part.body.visit(self)
                        self.chain.pop()
            return False
        return True


def statement_map(module: cst.Module) -> _StatementMap:
    visitor = _StatementMap(module)
    MetadataWrapper(module, unsafe_skip_copy=True).visit(visitor)
    return visitor


#: An optimizer update: ``optimizer.step()``, ``scaler.step(opt)``, ``engine.step()``; not a
#: scheduler's (its receiver names a schedule).
_UPDATE_CALL = re.compile(
    r"(?<![\w.])(?![\w.]*(?:sched|lr_|warmup)[\w.]*\.step\()[\w.\[\]]+\.step\("
)


def _accumulation_gate(statements: list[Stmt], code: str, guard: Guard) -> bool:
    """True when ``guard``'s branch is the update of an accumulation window: it holds an
    optimizer step (other than the moved statement) and its alternative holds none. Moving
    ``zero_grad``, the clip or the scheduler there is the accumulation fix (the other branch is
    the micro-batches that only backpropagate), not a path the patch lost."""

    def branch_of(stmt: Stmt) -> str | None:
        return next((g.branch for g in stmt.guards if g.node_key == guard.node_key), None)

    inside = [s for s in statements if branch_of(s) == guard.branch and s.code != code]
    other = [s for s in statements if branch_of(s) not in (None, guard.branch)]
    return any(_UPDATE_CALL.search(s.code) for s in inside) and not any(
        _UPDATE_CALL.search(s.code) for s in other
    )


def _guard_key(guard: Guard) -> tuple[str, str, str]:
    return (guard.kind, guard.header, guard.branch)


def _exclusive(a: Stmt, b: Stmt) -> bool:
    """True when the two statements sit in different branches of one compound statement."""
    for ga, gb in zip(a.guards, b.guards, strict=False):
        if ga.node_key != gb.node_key:
            return False
        if ga.branch != gb.branch:
            return True
    return False


# --------------------------------------------------------------------------- patch checks

_BUILTINS = set(dir(builtins)) | {"__file__", "__name__", "__doc__", "__spec__", "__builtins__"}


def free_names(module: cst.Module) -> set[str]:
    """Names the module reads but never binds anywhere (other than builtins).

    A pasted fragment (a loop lifted out of a method, a forum snippet) reads ``self``,
    ``optimizer`` or ``dataloader`` that the user's real program binds; a patch that reads them
    too is no less runnable than the code it patches.
    """
    scopes = MetadataWrapper(module, unsafe_skip_copy=True).resolve(ScopeProvider)
    free: set[str] = set()
    for scope in {scope for scope in scopes.values() if scope is not None}:
        for access in scope.accesses:
            if isinstance(access.node, cst.Name) and not access.referents:
                free.add(access.node.value)
    return free - _BUILTINS


def unbound_names(
    module: cst.Module, lines: set[int], already_free: frozenset[str] = frozenset()
) -> list[str]:
    """Names used on ``lines`` that have no binding that reaches them.

    A binding in the same scope counts only when it starts on an earlier line; a binding in an
    enclosing scope (a global used in a function, a closure) counts wherever it is. Names in
    ``already_free`` (read and never bound by the original text: a fragment's context) are
    not reported as never bound.
    """
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    scopes = wrapper.resolve(ScopeProvider)
    positions = wrapper.resolve(PositionProvider)
    problems: list[str] = []
    seen_scopes = {scope for scope in scopes.values() if scope is not None}
    for scope in seen_scopes:
        for access in scope.accesses:
            node = access.node
            if not isinstance(node, cst.Name):
                continue
            position = positions.get(node)
            if position is None or position.start.line not in lines:
                continue
            name = node.value
            referents = list(access.referents)
            if not referents:
                if name not in _BUILTINS and name not in already_free:
                    problems.append(f"{name} (line {position.start.line}) is never bound")
                continue
            reached = False
            for referent in referents:
                if referent.scope is not scope or _binds_whole_scope(referent):
                    reached = True
                    break
                ref_node = getattr(referent, "node", None)
                ref_pos = positions.get(ref_node) if isinstance(ref_node, cst.CSTNode) else None
                if ref_pos is None or ref_pos.start.line < position.start.line:
                    reached = True
                    break
            if not reached:
                problems.append(
                    f"{name} (line {position.start.line}) is used before it is bound in its scope"
                )
    return sorted(set(problems))


def _binds_whole_scope(referent: Any) -> bool:
    """A binding that reaches every use in its scope whatever their order in the text: a
    comprehension's target (``[p for p in ps if p.grad is not None]`` reads ``p`` left of its
    ``for``) and a parameter (of a lambda written on one line, say)."""
    if isinstance(referent.scope, ComprehensionScope):
        return True
    return isinstance(getattr(referent, "node", None), cst.Param)


def _touched(stmts: Iterable[Stmt], lines: set[int]) -> list[Stmt]:
    return [s for s in stmts if any(s.first <= n <= s.last for n in lines)]


#: Statements whose accumulation fix is "once per window, after the micro-batches": a clip or a
#: scheduler step (a ``zero_grad`` placed after the micro-batches would wipe them, so it is not
#: excused here).
_ONCE_PER_WINDOW = re.compile(r"clip|sched|lr_|warmup")


def _leaves_only_a_micro_batch_loop(
    statements: Sequence[Stmt], old: Stmt, new: Stmt, lost: Sequence[Guard]
) -> bool:
    """A clip or scheduler step taken out of the loop over micro-batches (a loop
    whose body runs a backward) and put after it, every other guard kept: the once-per-window
    fixes of the accumulation rules. Leaving such a loop changes how often the statement runs,
    which is the fix, not a dropped guard; a name bound by the loop is caught by the name check.
    """
    if not lost or any(g.kind not in ("for", "while") or g.branch != "body" for g in lost):
        return False
    lost_keys = {g.node_key for g in lost}
    kept = [g for g in old.guards if g.node_key not in lost_keys]
    if [_guard_key(g) for g in kept] != [_guard_key(g) for g in new.guards]:
        return False
    if new.function != old.function or not _ONCE_PER_WINDOW.search(old.code):
        return False
    for guard in lost:
        in_loop = [s for s in statements if any(g.node_key == guard.node_key for g in s.guards)]
        if not any("backward(" in s.code for s in in_loop):
            return False
    return True


def _move_problems(
    statements: Sequence[Stmt], patched_statements: Sequence[Stmt], old: Stmt, new: Stmt
) -> list[str]:
    """Guards that statement ``old`` loses by becoming ``new``, and branches it enters alone."""
    problems: list[str] = []
    old_guards = {_guard_key(g) for g in old.guards}
    new_guards = {_guard_key(g) for g in new.guards}
    lost = old_guards - new_guards
    lost_guards = [g for g in old.guards if _guard_key(g) in lost]
    if _leaves_only_a_micro_batch_loop(statements, old, new, lost_guards):
        return problems
    for kind, header, branch in sorted(lost):
        problems.append(f"`{old.code}` moved out of `{kind} {header}` ({branch} branch)")
    for guard in new.guards:
        if _guard_key(guard) in old_guards or not guard.has_alternative:
            continue
        siblings = [
            s
            for s in patched_statements
            if s.code == old.code
            and any(g.node_key == guard.node_key and g.branch != guard.branch for g in s.guards)
        ]
        if not siblings and not _accumulation_gate(patched_statements, old.code, guard):
            problems.append(
                f"`{old.code}` moved into only the {guard.branch} branch of "
                f"`{guard.kind} {guard.header}`"
            )
    return problems


def guard_problems(original: cst.Module, patched: cst.Module, applied: Applied) -> list[str]:
    """Guards or branches the patch drops, and unsafe ``unscale_`` insertions."""
    before = statement_map(original)
    after = statement_map(patched)
    problems: list[str] = []
    for (kind, header), count in before.headers.items():
        if after.headers[(kind, header)] < count:
            problems.append(f"the patch removes `{kind} {header}`".rstrip())
    removed = _touched(before.statements, applied.removed)
    added = _touched(after.statements, applied.added)
    added_codes = Counter(s.code for s in added)
    for old in removed:
        if added_codes[old.code] == 0:
            continue  # deleted, not moved
        copies = [s for s in added if s.code == old.code]
        # The same statement moved in several places (one clip per branch, each moved before
        # its own step): each removed copy is judged against the added copy that fits it
        # best, not against the copies of the other branches.
        verdicts = [_move_problems(before.statements, after.statements, old, new) for new in copies]
        problems.extend(min(verdicts, key=len))
    for new in added:
        match = re.search(r"([\w.\[\]]+)\.unscale_\(", new.code)
        if not match:
            continue
        receiver = match.group(1)
        same_function = [s for s in after.statements if s.function == new.function]
        unscales = [s for s in same_function if f"{receiver}.unscale_(" in s.code and s is not new]
        for other in unscales:
            if not _exclusive(new, other):
                problems.append(
                    f"a second `{receiver}.unscale_` on the same path (lines {other.first} "
                    f"and {new.first})"
                )
        steps = [s for s in same_function if f"{receiver}.step(" in s.code]
        for step in steps:
            missing = {_guard_key(g) for g in step.guards} - {_guard_key(g) for g in new.guards}
            if missing and not _exclusive(new, step):
                labels = ", ".join(f"{k} {h}" for k, h, _ in sorted(missing))
                problems.append(
                    f"`{receiver}.unscale_` at line {new.first} runs where "
                    f"`{receiver}.step` (line {step.first}) does not: missing `{labels}`"
                )
    return sorted(set(problems))


@dataclass
class PatchVerdict:
    """The outcome of checking one offered patch."""

    item: str
    path: str
    finding: str
    line: int | None
    safe: bool | None
    kind: str  # "finding" or "combined"
    problems: list[str]
    ran: str | None = None  # None: not run; "ok"; "broken: ..."; "original fails too"

    @property
    def broken(self) -> bool:
        return bool(self.problems) or (self.ran is not None and self.ran.startswith("broken"))

    def brief(self) -> dict[str, Any]:
        return {
            "item": self.item,
            "path": self.path,
            "finding": self.finding,
            "line": self.line,
            "safe": self.safe,
            "kind": self.kind,
            "problems": self.problems,
            "ran": self.ran,
            "broken": self.broken,
        }


def check_patch(text: str, diff: str, path: str) -> tuple[list[str], dict[str, str]]:
    """Static checks of one patch against the exact text of ``path``.

    Returns the problems found and the patched texts (by file) for running.
    """
    targets = split_diff(diff)
    if not targets:
        return ["the diff names no file"], {}
    problems: list[str] = []
    patched: dict[str, str] = {}
    for target, one in targets.items():
        if Path(target).name != Path(path).name and not path.endswith(target):
            problems.append(f"the diff targets {target}, not {path}")
            continue
        try:
            applied = apply_diff(text, one)
        except PatchError as exc:
            problems.append(f"does not apply: {exc}")
            continue
        patched[path] = applied.text
        try:
            original_module = cst.parse_module(text)
        except cst.ParserSyntaxError:
            original_module = None
        try:
            new_module = cst.parse_module(applied.text)
        except cst.ParserSyntaxError as exc:
            problems.append(f"does not parse: {' '.join(str(exc).split())[:160]}")
            continue
        context = frozenset(free_names(original_module)) if original_module else frozenset()
        problems.extend(unbound_names(new_module, applied.added, context))
        if original_module is not None:
            problems.extend(guard_problems(original_module, new_module, applied))
    return problems, patched


# --------------------------------------------------------------------------- running


def run_item(item: Item, patched: dict[str, str] | None) -> tuple[int, str]:
    """Run an item's ``run`` command in a scratch copy of its root, patched or not."""
    spec = item.record["run"]
    with tempfile.TemporaryDirectory(prefix="static-corpus-run-") as scratch:
        work = Path(scratch) / "root"
        shutil.copytree(item.root, work)
        for rel, text in (patched or {}).items():
            (work / rel).write_text(text, encoding="utf-8", newline="")
        env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", CUDA_VISIBLE_DEVICES="")
        env.update(spec.get("env", {}))
        cwd = work / spec.get("cwd", ".")
        for step in [*spec.get("setup", []), spec["argv"]]:
            try:
                done = subprocess.run(
                    [sys.executable, *step],
                    cwd=cwd,
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=spec.get("timeout", RUN_TIMEOUT_S),
                )
            except subprocess.TimeoutExpired:
                return 124, "timed out"
            if done.returncode != 0:
                tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or [""]
                return done.returncode, tail[0][:200]
    return 0, ""


# --------------------------------------------------------------------------- evaluation


@dataclass
class Results:
    """Everything one run measured, ready for printing and JSON."""

    split: str
    mode: str
    corpus_a: dict[str, Any] = field(default_factory=dict)
    corpus_b: dict[str, Any] = field(default_factory=dict)
    patches: dict[str, Any] = field(default_factory=dict)
    errors: list[dict[str, str]] = field(default_factory=list)
    seconds: float = 0.0


def _reports(items: list[Item], per_file: bool) -> dict[Path, RootReport]:
    roots: dict[Path, list[str]] = {}
    for item in items:
        paths = roots.setdefault(item.root, [])
        paths.extend(p for p in item.paths if p not in paths)
    return {root: lint_root(root, files if per_file else None) for root, files in roots.items()}


def evaluate(corpus_dir: Path, split: str, corpus: str, per_file: bool, run: bool) -> Results:
    started = time.perf_counter()
    items = load_items(corpus_dir, split, corpus)
    results = Results(split=split, mode="per-file" if per_file else "project")
    reports = _reports(items, per_file)
    verdicts: list[PatchVerdict] = []
    a_items = [i for i in items if i.corpus == "a"]
    b_items = [i for i in items if i.corpus == "b"]

    false: list[dict[str, Any]] = []
    accepted: list[dict[str, Any]] = []
    info_counts: Counter[str] = Counter()
    for item in a_items:
        report = reports[item.root]
        for path in item.paths:
            if path in report.errors:
                results.errors.append({"item": item.id, "path": path, "error": report.errors[path]})
            for finding in report.findings.get(path, []):
                entry = {"item": item.id, "repo": item.repo, **finding.brief()}
                if finding.severity not in SEVERE:
                    info_counts[finding.id] += 1
                elif finding.id in item.accepted:
                    accepted.append(entry)
                else:
                    false.append(entry)
    n_files = sum(len(i.paths) for i in a_items)
    results.corpus_a = {
        "items": len(a_items),
        "files": n_files,
        "repos": len({i.repo for i in a_items}),
        "false_warnings_and_criticals": len(false),
        "false_per_100_files": round(100 * len(false) / n_files, 2) if n_files else None,
        "files_with_false": len({(f["item"], f["path"]) for f in false}),
        "false_by_id": dict(Counter(f["id"] for f in false).most_common()),
        "false": false,
        "accepted_advisories": accepted,
        "info_by_id": dict(info_counts.most_common()),
    }

    outcomes: list[dict[str, Any]] = []
    location_total = location_found = 0
    for item in b_items:
        report = reports[item.root]
        for path in {e["path"] for e in item.expected}:
            if path in report.errors:
                results.errors.append({"item": item.id, "path": path, "error": report.errors[path]})
        exact = []
        wrong_line = []
        for expected in item.expected:
            location_total += 1
            got = report.findings.get(expected["path"], [])
            hits = [f for f in got if f.id == expected["id"] and f.line == expected["line"]]
            if hits:
                location_found += 1
                exact.append(expected)
            else:
                wrong_line.extend(f.brief() for f in got if f.id == expected["id"])
        status = "found" if exact else ("wrong-line" if wrong_line else "missed")
        others = [
            f.brief()
            for path in item.paths
            for f in report.findings.get(path, [])
            if f.severity in SEVERE
            and not any(f.id == e["id"] and f.line == e["line"] for e in item.expected)
        ]
        outcomes.append(
            {
                "item": item.id,
                "repo": item.repo,
                "status": status,
                "expected": item.expected,
                "matched": exact,
                "same_id_elsewhere": wrong_line,
                "other_findings": others,
                "bug_url": item.record.get("bug_url"),
                "tags": item.record.get("tags", []),
            }
        )
    counts = Counter(o["status"] for o in outcomes)
    results.corpus_b = {
        "items": len(b_items),
        "found": counts["found"],
        "found_wrong_line": counts["wrong-line"],
        "missed": counts["missed"],
        "recall": round(counts["found"] / len(b_items), 3) if b_items else None,
        "locations": location_total,
        "locations_found": location_found,
        "by_expected_id": _by_expected_id(outcomes),
        "outcomes": outcomes,
    }

    checked: set[tuple[Path, str]] = set()
    for item in items:
        report = reports[item.root]
        paths = item.paths if item.corpus == "a" else sorted(set(report.findings) | set(item.paths))
        for path in paths:
            if (item.root, path) in checked:
                continue
            checked.add((item.root, path))
            file_path = item.root / path
            if not file_path.is_file():
                continue
            text = file_path.read_bytes().decode("utf-8", "replace")
            offered = [(f, "finding") for f in report.findings.get(path, []) if f.diff]
            combined = report.combined.get(path)
            entries: list[tuple[Finding | None, str, str]] = [
                (f, kind, f.diff or "") for f, kind in offered
            ]
            if combined:
                entries.append((None, "combined", combined))
            for finding, kind, diff in entries:
                problems, patched = check_patch(text, diff, path)
                verdict = PatchVerdict(
                    item=item.id,
                    path=path,
                    finding=finding.id if finding else "(combined)",
                    line=finding.line if finding else None,
                    safe=finding.safe if finding else None,
                    kind=kind,
                    problems=problems,
                )
                if run and "run" in item.record and patched and not problems:
                    verdict.ran = _run_verdict(item, patched)
                verdicts.append(verdict)
    results.patches = _patch_summary(verdicts, items)
    results.seconds = round(time.perf_counter() - started, 2)
    return results


def _by_expected_id(outcomes: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    table: dict[str, Counter[str]] = {}
    for outcome in outcomes:
        key = outcome["expected"][0]["id"] if outcome["expected"] else "?"
        table.setdefault(key, Counter())[outcome["status"]] += 1
    return {key: dict(value) for key, value in sorted(table.items())}


_RUN_CACHE: dict[str, tuple[int, str]] = {}


def _run_verdict(item: Item, patched: dict[str, str]) -> str:
    if item.id not in _RUN_CACHE:
        _RUN_CACHE[item.id] = run_item(item, None)
    original_rc, original_tail = _RUN_CACHE[item.id]
    if original_rc != 0:
        return f"original fails too ({original_tail})"
    rc, tail = run_item(item, patched)
    return "ok" if rc == 0 else f"broken: exit {rc}: {tail}"


def _patch_summary(verdicts: list[PatchVerdict], items: list[Item]) -> dict[str, Any]:
    def block(selected: list[PatchVerdict]) -> dict[str, Any]:
        return {
            "offered": len(selected),
            "offered_safe": sum(1 for v in selected if v.safe),
            "checked": sum(1 for v in selected if not v.problems),
            "broken": sum(1 for v in selected if v.broken),
            "run": sum(1 for v in selected if v.ran is not None),
            "run_ok": sum(1 for v in selected if v.ran == "ok"),
        }

    corpus_of = {i.id: i.corpus for i in items}
    findings = [v for v in verdicts if v.kind == "finding"]
    return {
        "a": block([v for v in findings if corpus_of[v.item] == "a"]),
        "b": block([v for v in findings if corpus_of[v.item] == "b"]),
        "combined": block([v for v in verdicts if v.kind == "combined"]),
        "runnable_items": sum(1 for i in items if "run" in i.record),
        "verdicts": [v.brief() for v in verdicts],
    }


# --------------------------------------------------------------------------- output


def _analyser_version() -> dict[str, str]:
    import gradient_doctor

    info = {"package": str(Path(next(iter(gradient_doctor.__path__))).resolve())}
    with contextlib.suppress(Exception):
        from gradient_doctor.probes import static

        source = Path(static.__file__).resolve().parent
        info["source"] = str(source)
        head = subprocess.run(
            ["git", "-C", str(source), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(source), "status", "--porcelain", "--", "."],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
        info["commit"] = head + ("+dirty" if dirty else "")
    return info


def render(results: Results) -> str:
    out: list[str] = []
    a, b, p = results.corpus_a, results.corpus_b, results.patches
    out.append(f"split: {results.split}   mode: {results.mode}   {results.seconds}s")
    if a:
        out.append("")
        out.append(
            f"corpus (a) correct code: {a['files']} files, {a['repos']} repos; "
            f"false warnings/criticals: {a['false_warnings_and_criticals']} "
            f"= {a['false_per_100_files']} per 100 files "
            f"(in {a['files_with_false']} files)"
        )
        for rule, count in a["false_by_id"].items():
            out.append(f"  {count:4}  {rule}")
        for f in a["false"]:
            out.append(
                f"  FALSE {f['severity']:8} {f['id']:28} {f['item'][2:]}:{f['line']}  "
                f"{f['message'][:150]}"
            )
        if a["accepted_advisories"]:
            out.append(f"  accepted advisories (not counted): {len(a['accepted_advisories'])}")
            for f in a["accepted_advisories"]:
                out.append(f"  ok    {f['id']:28} {f['item'][2:]}:{f['line']}")
        if a["info_by_id"]:
            infos = ", ".join(f"{k} {v}" for k, v in a["info_by_id"].items())
            out.append(f"  info findings (not counted): {infos}")
    if b:
        out.append("")
        out.append(
            f"corpus (b) real bugs: {b['items']}; found at the right line {b['found']} "
            f"({b['recall']}), found with a wrong line {b['found_wrong_line']}, "
            f"missed {b['missed']}; locations {b['locations_found']}/{b['locations']}"
        )
        for rule, counts in b["by_expected_id"].items():
            cells = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
            out.append(f"  {rule:32} {cells}")
        for o in b["outcomes"]:
            first = o["expected"][0]
            where = f"{first['path']}:{first['line']}"
            line = f"  {o['status'].upper():10} {first['id']:30} {o['item'][2:]}  {where}"
            if o["same_id_elsewhere"]:
                got = ", ".join(str(f["line"]) for f in o["same_id_elsewhere"])
                line += f"  (reported at {got})"
            out.append(line)
    out.append("")
    for key in ("a", "b", "combined"):
        blk = p[key]
        out.append(
            f"patches ({key}): offered {blk['offered']} (safe {blk['offered_safe']}), "
            f"checked {blk['checked']}, broken {blk['broken']}, "
            f"run {blk['run']} (ok {blk['run_ok']})"
        )
    out.append(f"runnable items in this selection: {p['runnable_items']}")
    for v in p["verdicts"]:
        if v["broken"]:
            reason = "; ".join(v["problems"]) or v["ran"]
            out.append(
                f"  BROKEN {v['finding']:28} {v['item'][2:]} {v['path']}:{v['line']}  "
                f"{reason[:200]}"
            )
    if results.errors:
        out.append("")
        out.append(f"files the analyser could not read: {len(results.errors)}")
        for e in results.errors:
            out.append(f"  {e['item'][2:]} {e['path']}: {e['error'][:150]}")
    return "\n".join(out)


def compare(old: dict[str, Any], new: dict[str, Any]) -> str:
    """A before/after table of the headline numbers of two JSON results."""
    rows = [
        ("(a) false per 100 files", ("corpus_a", "false_per_100_files")),
        ("(a) false warnings/criticals", ("corpus_a", "false_warnings_and_criticals")),
        ("(b) found at the right line", ("corpus_b", "found")),
        ("(b) found, wrong line", ("corpus_b", "found_wrong_line")),
        ("(b) missed", ("corpus_b", "missed")),
        ("(b) recall", ("corpus_b", "recall")),
        ("patches offered (b)", ("patches", "b", "offered")),
        ("patches broken (b)", ("patches", "b", "broken")),
        ("patches offered (a)", ("patches", "a", "offered")),
        ("patches broken (a)", ("patches", "a", "broken")),
    ]

    def get(data: dict[str, Any], keys: tuple[str, ...]) -> Any:
        for key in keys:
            data = data.get(key, {}) if isinstance(data, dict) else {}
        return data if data != {} else None

    lines = [f"{'':32} {'before':>10} {'after':>10}"]
    for label, keys in rows:
        lines.append(f"{label:32} {get(old, keys)!s:>10} {get(new, keys)!s:>10}")
    old_status = {o["item"]: o["status"] for o in get(old, ("corpus_b", "outcomes")) or []}
    for outcome in get(new, ("corpus_b", "outcomes")) or []:
        before = old_status.get(outcome["item"])
        if before and before != outcome["status"]:
            lines.append(f"  {outcome['item'][2:]}: {before} -> {outcome['status']}")
    return "\n".join(lines)


def as_json(results: Results) -> dict[str, Any]:
    return {
        "analyser": _analyser_version(),
        "split": results.split,
        "mode": results.mode,
        "seconds": results.seconds,
        "corpus_a": results.corpus_a,
        "corpus_b": results.corpus_b,
        "patches": results.patches,
        "errors": results.errors,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("corpus_dir", type=Path, help="folder holding manifest.json")
    parser.add_argument("--split", choices=("seen", "unseen", "all"), default="seen")
    parser.add_argument("--corpus", choices=("a", "b", "all"), default="all")
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    parser.add_argument(
        "--per-file", action="store_true", help="lint item files one by one, not the folder"
    )
    parser.add_argument("--no-run", action="store_true", help="do not run runnable items")
    parser.add_argument("--compare", type=Path, help="print before/after against this JSON")
    parser.add_argument(
        "--materialise",
        nargs=2,
        metavar=("PUBLIC_MANIFEST", "MIRRORS"),
        type=Path,
        help="first rebuild corpus_dir from the committed manifest and git mirrors",
    )
    args = parser.parse_args(argv)
    if args.materialise:
        count = materialise(args.materialise[0], args.materialise[1], args.corpus_dir)
        print(f"materialised {count} files into {args.corpus_dir}")
    if not (args.corpus_dir / "manifest.json").is_file():
        print(f"error: no manifest.json in {args.corpus_dir}", file=sys.stderr)
        return 2
    results = evaluate(args.corpus_dir, args.split, args.corpus, args.per_file, not args.no_run)
    print(render(results))
    data = as_json(results)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    if args.compare:
        print("")
        print(compare(json.loads(args.compare.read_text(encoding="utf-8")), data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
