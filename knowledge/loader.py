"""Load and validate the knowledge base shipped in ``knowledge/data/``.

Every YAML file with a top-level ``entries:`` list holds catalogue entries; ``thresholds.yaml``,
``nan_tree.yaml``, ``corrections.yaml`` and ``guides.yaml`` hold the other parts. The loader
fails loudly: a bad entry names its file, its id (or index) and the pydantic error; duplicate
ids, references to unknown ids and unknown snippet ids are collected and reported together in
one :class:`KnowledgeError`, so one run shows every problem.

The packaged knowledge base, once validated, is kept in a pickle under the cache folder
(``knowledge.cache_dir``): validating it costs a process some 35 ms of CPU (YAML, pydantic's
validators and their construction), reading the pickle some 4 ms, and the runtime probe pays it
in every run. The file's name is a hash of everything the validated objects depend on (the data
files' bytes, the sources of the modules that define them, the Python and pydantic versions),
so an edited entry or another release never reads an old one; anything unexpected in it (a
file that does not unpickle, a wrong type, a file another user could have written) falls back
to validating the data, which then rewrites it (atomically: a temporary file renamed).
"""

from __future__ import annotations

import contextlib
import difflib
import hashlib
import os
import pickle
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import ValidationError

from gradient_doctor.knowledge.cache_dir import cache_root
from gradient_doctor.knowledge.models import (
    SNIPPET_IDS,
    Entry,
    EntryKind,
    Guide,
    NanTree,
    SeedCorrection,
    ThresholdSet,
)

if TYPE_CHECKING:
    from pydantic import TypeAdapter

#: The packaged data, by path (``importlib.resources`` would import tempfile, zipfile and more
#: for a folder that is always a plain directory of the installed package).
PACKAGE_DIR = Path(__file__).resolve().parent
DATA_DIR = PACKAGE_DIR / "data"

THRESHOLDS_FILE = "thresholds.yaml"
NAN_TREE_FILE = "nan_tree.yaml"
CORRECTIONS_FILE = "corrections.yaml"
GUIDES_FILE = "guides.yaml"

#: The kind of the entries of a file that does not say (neither a top-level ``kind:`` nor a
#: ``kind`` on each entry).
_KIND_BY_FILE: dict[str, str] = {
    "red_flags.yaml": "red-flag",
    "signals.yaml": "signal",
    "rationalizations.yaml": "rationalization",
    "symptoms.yaml": "symptom",
}

_KIND_ORDER = ("red-flag", "signal", "rationalization", "symptom")

#: Entry fields that hold ids of other entries.
_REFERENCE_FIELDS = ("related", "causes", "rationalizations", "red_flags")


class KnowledgeError(Exception):
    """The knowledge data is invalid; the message lists every problem found."""


class _DataFile(Protocol):
    """What the loader needs of a data file: a name and its text."""

    @property
    def name(self) -> str: ...

    def read_text(self, encoding: str = "utf-8") -> str: ...


@dataclass
class KnowledgeBase:
    """Every catalogue entry plus thresholds, guides, the NaN tree and the seed corrections."""

    entries: dict[str, Entry]
    thresholds: ThresholdSet
    nan_tree: NanTree
    corrections: list[SeedCorrection]
    guides: dict[str, Guide] = field(default_factory=dict)
    entry_files: dict[str, str] = field(default_factory=dict, repr=False)

    def get(self, entry_id: str) -> Entry:
        """The entry called ``entry_id``; ``KeyError`` naming the closest ids when unknown."""
        try:
            return self.entries[entry_id]
        except KeyError:
            near = self.closest(entry_id)
            hint = f" (closest: {', '.join(near)})" if near else ""
            raise KeyError(f"unknown id {entry_id!r}{hint}") from None

    def closest(self, entry_id: str, n: int = 3) -> list[str]:
        """Up to ``n`` known ids most similar to ``entry_id``, best first."""
        ids = list(self.entries)
        found = difflib.get_close_matches(entry_id, ids, n=n, cutoff=0.5)
        if len(found) < n:
            # Fragments ("unscale", "nan") rarely reach difflib's cutoff; a substring still helps.
            found += [i for i in ids if entry_id and entry_id in i and i not in found]
        return found[:n]

    def by_kind(self, kind: EntryKind) -> list[Entry]:
        """All entries of one kind, in file order."""
        return [e for e in self.entries.values() if e.kind == kind]

    def __iter__(self) -> Iterator[Entry]:
        return iter(self.entries.values())

    def __len__(self) -> int:
        return len(self.entries)


@cache
def _entry_adapter() -> TypeAdapter[Entry]:
    """The validator of one entry, built on first use (a cached knowledge base needs none)."""
    from pydantic import TypeAdapter

    return TypeAdapter(Entry)


def _data_files(data_dir: Path | None) -> list[_DataFile]:
    if data_dir is not None:
        if not data_dir.is_dir():
            raise KnowledgeError(f"knowledge data directory not found: {data_dir}")
        return sorted(data_dir.glob("*.yaml"), key=lambda p: p.name)
    return sorted(DATA_DIR.glob("*.yaml"), key=lambda p: p.name)


def _parse(file: _DataFile) -> Any:
    import yaml  # only when the data is validated, not when the cached base is read

    loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        return yaml.load(file.read_text(encoding="utf-8"), Loader=loader)
    except yaml.YAMLError as exc:
        raise KnowledgeError(f"{file.name}: not valid YAML: {exc}") from None


def _short(exc: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(p) for p in err['loc']) or '<root>'}: {err['msg']}" for err in exc.errors()
    )


def _validate_entries(
    name: str, raw: Any, default_kind: str | None, problems: list[str]
) -> list[Entry]:
    if not isinstance(raw, list):
        problems.append(f"{name}: 'entries' must be a list")
        return []
    entries: list[Entry] = []
    for index, item in enumerate(raw):
        label = item.get("id") if isinstance(item, dict) else None
        if isinstance(item, dict) and "kind" not in item and default_kind:
            item = {"kind": default_kind, **item}
        where = f"entry {label!r}" if label else f"entry #{index}"
        try:
            entries.append(_entry_adapter().validate_python(item))
        except ValidationError as exc:
            problems.append(f"{name}: {where}: {_short(exc)}")
    return entries


def _validate_one(name: str, raw: Any, model: type[Any], problems: list[str]) -> Any:
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        problems.append(f"{name}: {_short(exc)}")
        return None


def _guides(name: str, raw: Any, problems: list[str]) -> dict[str, Guide]:
    items = raw.get("guides", raw) if isinstance(raw, dict) else raw
    if isinstance(items, dict):
        # A mapping topic → guide is accepted as well as a list of guides with a topic each.
        items = [{"topic": k, **v} if isinstance(v, dict) else v for k, v in items.items()]
    if not isinstance(items, list):
        problems.append(f"{name}: expected a list of guides")
        return {}
    guides: dict[str, Guide] = {}
    for index, item in enumerate(items):
        label = item.get("topic") if isinstance(item, dict) else None
        try:
            guide = Guide.model_validate(item)
        except ValidationError as exc:
            where = f"guide {label!r}" if label else f"guide #{index}"
            problems.append(f"{name}: {where}: {_short(exc)}")
            continue
        if guide.topic in guides:
            problems.append(f"{name}: duplicate guide topic {guide.topic!r}")
        guides[guide.topic] = guide
    return guides


def _check_references(
    kb_ids: set[str],
    owners: Iterable[tuple[str, str, str, Iterable[str]]],
    problems: list[str],
) -> None:
    for file_name, owner, field_name, refs in owners:
        for ref in refs:
            if ref not in kb_ids:
                problems.append(f"{file_name}: {owner}: {field_name} refers to unknown id {ref!r}")


def _check_snippets(owners: Iterable[tuple[str, str, Iterable[str]]], problems: list[str]) -> None:
    for file_name, owner, snippets in owners:
        for snippet in snippets:
            if snippet not in SNIPPET_IDS:
                problems.append(f"{file_name}: {owner}: unknown snippet id {snippet!r}")


def _check_unique(file_name: str, what: str, ids: list[str], problems: list[str]) -> None:
    for dup in sorted({i for i in ids if ids.count(i) > 1}):
        problems.append(f"{file_name}: duplicate {what} id {dup!r}")


def build_knowledge(data_dir: Path | None = None) -> KnowledgeBase:
    """Read and validate every data file (uncached; see :func:`load_knowledge`)."""
    problems: list[str] = []
    entries: dict[str, Entry] = {}
    entry_files: dict[str, str] = {}
    thresholds: ThresholdSet | None = None
    nan_tree: NanTree | None = None
    corrections: list[SeedCorrection] = []
    guides: dict[str, Guide] = {}
    files_read: set[str] = set()

    for file in _data_files(data_dir):
        name = file.name
        raw = _parse(file)
        if name == THRESHOLDS_FILE:
            thresholds = _validate_one(name, raw, ThresholdSet, problems)
        elif name == NAN_TREE_FILE:
            nan_tree = _validate_one(name, raw, NanTree, problems)
        elif name == CORRECTIONS_FILE:
            items = raw.get("corrections") if isinstance(raw, dict) else None
            for index, item in enumerate(items or []):
                label = item.get("id") if isinstance(item, dict) else None
                where = f"correction {label!r}" if label else f"correction #{index}"
                parsed = _validate_one(f"{name}: {where}", item, SeedCorrection, problems)
                if parsed is not None:
                    corrections.append(parsed)
            if not items:
                problems.append(f"{name}: expected a non-empty 'corrections' list")
        elif name == GUIDES_FILE:
            guides = _guides(name, raw, problems)
        elif isinstance(raw, dict) and "entries" in raw:
            default_kind = raw.get("kind") or _KIND_BY_FILE.get(name)
            for entry in _validate_entries(name, raw["entries"], default_kind, problems):
                if entry.id in entries:
                    problems.append(
                        f"{name}: duplicate id {entry.id!r} (also in {entry_files[entry.id]})"
                    )
                    continue
                entries[entry.id] = entry
                entry_files[entry.id] = name
        else:
            continue
        files_read.add(name)

    for required in (THRESHOLDS_FILE, NAN_TREE_FILE, CORRECTIONS_FILE):
        if required not in files_read:
            problems.append(f"{required}: missing")

    ids = set(entries)
    refs: list[tuple[str, str, str, Iterable[str]]] = []
    snippet_owners: list[tuple[str, str, Iterable[str]]] = []
    for entry in entries.values():
        file_name = entry_files[entry.id]
        for field_name in _REFERENCE_FIELDS:
            values = getattr(entry, field_name, None)
            if values:
                refs.append((file_name, f"entry {entry.id!r}", field_name, values))
        snippet_owners.append((file_name, f"entry {entry.id!r}", entry.snippets))
    _check_unique(CORRECTIONS_FILE, "correction", [c.id for c in corrections], problems)
    if nan_tree is not None:
        _check_unique(NAN_TREE_FILE, "node", [n.id for n in nan_tree.nodes], problems)
        node_ids = {n.id for n in nan_tree.nodes}
        if nan_tree.root not in node_ids:
            problems.append(f"{NAN_TREE_FILE}: root {nan_tree.root!r} is not a node")
        for node in nan_tree.nodes:
            owner = f"node {node.id!r}"
            for nxt in node.next_nodes:
                if nxt not in node_ids:
                    problems.append(f"{NAN_TREE_FILE}: {owner}: next node {nxt!r} is unknown")
            refs.append((NAN_TREE_FILE, owner, "related", node.related))
            snippet_owners.append((NAN_TREE_FILE, owner, node.snippets))
    for correction in corrections:
        refs.append(
            (CORRECTIONS_FILE, f"correction {correction.id!r}", "related", correction.related)
        )
    for guide in guides.values():
        refs.append((GUIDES_FILE, f"guide {guide.topic!r}", "related", guide.related))
    if thresholds is not None:
        names = [p.name for p in thresholds.profiles]
        if thresholds.default_profile not in names:
            wanted = thresholds.default_profile
            problems.append(f"{THRESHOLDS_FILE}: default_profile {wanted!r} is not a profile")
        if len(set(names)) != len(names):
            problems.append(f"{THRESHOLDS_FILE}: duplicate profile names")
    _check_references(ids, refs, problems)
    _check_snippets(snippet_owners, problems)

    if problems or thresholds is None or nan_tree is None:
        listing = "\n  - ".join(problems)
        raise KnowledgeError(f"invalid knowledge data ({len(problems)} problems):\n  - {listing}")
    # Catalogue order (red flags, signals, rationalizations, symptoms), file order within a kind.
    rank = {kind: i for i, kind in enumerate(_KIND_ORDER)}
    ordered = dict(sorted(entries.items(), key=lambda item: rank[item[1].kind]))
    return KnowledgeBase(
        entries=ordered,
        thresholds=thresholds,
        nan_tree=nan_tree,
        corrections=corrections,
        guides=guides,
        entry_files=entry_files,
    )


#: Bumped when what the cache file holds changes shape (the key also covers the sources).
_CACHE_FORMAT = 1
#: The modules whose classes the cached objects are instances of.
_CACHE_SOURCES = ("loader.py", "models.py", "findings.py")
#: Other versions' cache files untouched this long are removed when a new one is written.
_STALE_CACHE_SECONDS = 7 * 24 * 3600


def knowledge_cache_path() -> Path | None:
    """Where the validated packaged knowledge base is cached, or None when caching is off
    (``$GRADIENT_DOCTOR_CACHE_DIR`` set but empty).

    The name carries a hash of the data files' bytes, the sources of the modules that define
    the cached objects, the Python and pydantic versions and the pickle protocol: any change
    gives another file, so a cache file is never stale."""
    root = cache_root()
    if root is None:
        return None
    import pydantic_core
    from pydantic.version import VERSION

    header = f"{_CACHE_FORMAT}|{sys.version}|{VERSION}|{pydantic_core.__version__}"
    digest = hashlib.sha256(f"{header}|{pickle.HIGHEST_PROTOCOL}".encode())
    for item in sorted(DATA_DIR.glob("*.yaml"), key=lambda p: p.name):
        digest.update(item.name.encode() + b"\0" + item.read_bytes() + b"\0")
    for name in _CACHE_SOURCES:
        digest.update(name.encode() + b"\0" + (PACKAGE_DIR / name).read_bytes() + b"\0")
    return root / f"knowledge-{digest.hexdigest()[:24]}.pickle"


def _read_cache(path: Path) -> KnowledgeBase | None:
    """The knowledge base pickled at ``path``; None when there is none or it is not usable.

    Only a file of this user's that nobody else may write is unpickled (unpickling runs code)."""
    try:
        with path.open("rb") as handle:
            status = os.fstat(handle.fileno())
            if status.st_uid != os.getuid() or status.st_mode & 0o022:
                return None
            loaded = pickle.load(handle)
    except Exception:  # a truncated, foreign or incompatible file: validate instead
        return None
    if not isinstance(loaded, KnowledgeBase) or not loaded.entries:
        return None
    return loaded


def _write_cache(path: Path, kb: KnowledgeBase) -> None:
    """Pickle ``kb`` to ``path`` atomically (a temporary file in the same folder renamed into
    place, so concurrent writers and readers only ever see whole files); a cache folder that
    cannot be written is only a slower start."""
    import tempfile

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=".knowledge-", suffix=".tmp")
        try:
            with os.fdopen(handle, "wb") as out:
                pickle.dump(kb, out, protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(temporary, path)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
    except (OSError, pickle.PicklingError, TypeError, AttributeError):
        return
    _prune_cache(path)


def _prune_cache(keep: Path) -> None:
    """Remove other versions' cache files nobody has written for a week."""
    import time

    now = time.time()
    for old in keep.parent.glob("knowledge-*.pickle"):
        with contextlib.suppress(OSError):
            if old != keep and now - old.stat().st_mtime > _STALE_CACHE_SECONDS:
                old.unlink()


@cache
def _packaged_from_cache() -> KnowledgeBase | None:
    """The packaged knowledge base from the cache file, read once per process (None: none)."""
    try:
        path = knowledge_cache_path()
    except OSError:
        return None
    return _read_cache(path) if path is not None else None


def _load_packaged() -> KnowledgeBase:
    """The packaged knowledge base: the cached one when there is one, else validated (and
    then cached)."""
    cached = _packaged_from_cache()
    if cached is not None:
        return cached
    kb = build_knowledge(None)
    try:
        path = knowledge_cache_path()
    except OSError:
        path = None
    if path is not None:
        _write_cache(path, kb)
    return kb


@cache
def load_thresholds() -> ThresholdSet:
    """The packaged threshold profiles alone (``thresholds.yaml``), validated.

    The runtime probe needs them before it starts the script; reading and validating the whole
    catalogue is several times slower and can wait (see :func:`load_knowledge`), unless it is
    cached, which is faster still."""
    if _load_cached.cache_info().currsize:
        return _load_cached(None).thresholds
    cached = _packaged_from_cache()
    if cached is not None:
        return cached.thresholds
    return ThresholdSet.model_validate(_parse(DATA_DIR / THRESHOLDS_FILE))


@cache
def _load_cached(data_dir: Path | None) -> KnowledgeBase:
    return build_knowledge(data_dir) if data_dir is not None else _load_packaged()


def load_knowledge(data_dir: Path | str | None = None) -> KnowledgeBase:
    """The validated knowledge base (cached per directory; the packaged one also on disk, see
    the module's docstring).

    ``data_dir`` reads another directory instead of the packaged data (tests of failure
    modes); raises :class:`KnowledgeError` listing every problem when the data is invalid.
    """
    return _load_cached(Path(data_dir).resolve() if data_dir is not None else None)
