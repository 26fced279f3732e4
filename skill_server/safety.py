"""What the server and ``check`` accept: confined paths, capped sizes, readable text only.

Every rejection is an :class:`InputError` whose message is one readable line; the MCP layer
turns it into a ``ToolError`` and the CLI into a usage error (exit 2). Nothing here writes.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

MAX_SOURCE_BYTES = 2_000_000
MAX_TEXT_CHARS = 20_000
MAX_SCRIPT_ARGS = 64
MAX_SCRIPT_ARG_CHARS = 4_096
MAX_NAME_ENTRIES = 50
MAX_RULE_IDS = 100
MAX_PROBE_STEPS = 10_000
MAX_PROBE_TIMEOUT_S = 3_600.0
MAX_TOP_K = 50
OUTPUT_TAIL_CHARS = 4_000
#: Devices a probe may be asked to use.
DEVICE_PATTERN = r"^(auto|cpu|cuda(:[0-9]{1,2})?|mps)$"


class InputError(ValueError):
    """A request the server refuses; ``str(error)`` is the one-line reason shown to the caller."""


def one_line(message: str, limit: int = 500) -> str:
    """Collapse ``message`` to one line of at most ``limit`` characters."""
    flat = " ".join(str(message).split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def tail(text: str | None, limit: int = OUTPUT_TAIL_CHARS) -> str | None:
    """The last ``limit`` characters of ``text`` (a child's output), marked when cut."""
    if text is None or len(text) <= limit:
        return text
    return "…" + text[-(limit - 1) :]


@dataclass(frozen=True)
class PathPolicy:
    """Paths callers may name: files under one of ``roots`` once symlinks are resolved.

    Relative paths are taken relative to the first root, so a client that sends the path it
    sees in its workspace gets the file it means.
    """

    roots: tuple[Path, ...]

    @classmethod
    def from_roots(cls, roots: Iterable[str | os.PathLike[str]] | None = None) -> PathPolicy:
        """A policy over ``roots`` (default: the current working directory)."""
        chosen = [Path(r) for r in (roots or [])] or [Path.cwd()]
        resolved: list[Path] = []
        for root in chosen:
            real = root.expanduser().resolve()
            if not real.is_dir():
                raise InputError(f"allowed root is not a directory: {root}")
            resolved.append(real)
        return cls(tuple(resolved))

    def describe(self) -> str:
        """The roots, for messages."""
        return ", ".join(str(r) for r in self.roots)

    def _outside(self, path: str) -> InputError:
        # One answer for every path outside the roots, whether it exists or not, is a file or
        # a folder, resolves or loops: anything more would tell the caller what exists there.
        return InputError(
            f"{path} is outside the allowed roots ({self.describe()}); "
            "start the server with --root to allow another directory"
        )

    def _inside(self, real: Path) -> bool:
        return any(real == root or real.is_relative_to(root) for root in self.roots)

    def _resolve(self, path: str) -> Path:
        """The real path of ``path`` once it is known to lie inside a root (may not exist)."""
        if not isinstance(path, str) or not path.strip():
            raise InputError("path is empty")
        if "\x00" in path:
            raise InputError("path contains a NUL character")
        candidate = Path(path).expanduser()
        if not candidate.is_absolute():
            candidate = self.roots[0] / candidate
        try:
            real = candidate.resolve(strict=False)
        except (OSError, RuntimeError) as exc:
            if not self._inside(Path(os.path.normpath(candidate))):
                raise self._outside(path) from None
            raise InputError(f"cannot resolve {path}: {one_line(str(exc))}") from None
        if not self._inside(real):
            raise self._outside(path)
        return real

    def resolve_file(self, path: str) -> Path:
        """The real path of ``path`` if it is a regular file inside an allowed root."""
        real = self._resolve(path)
        if not real.exists():
            raise InputError(f"no such file: {path}")
        if real.is_dir():
            raise InputError(f"{path} is a directory, not a file")
        if not real.is_file():
            raise InputError(f"{path} is not a regular file")
        return real

    def resolve_dir(self, path: str) -> Path:
        """The real path of ``path`` if it is a folder inside an allowed root."""
        real = self._resolve(path)
        if not real.is_dir():
            raise InputError(f"no such folder: {path}")
        return real


_SIZE_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def parse_memory_size(text: str) -> int:
    """``"8G"``, ``"512M"``, ``"1.5GiB"`` or a plain number of bytes, as bytes (binary units)."""
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGT]?)(?:i?B)?\s*", text, re.IGNORECASE)
    if match is None:
        raise InputError(f"not a memory size: {text!r} (write it like 8G or 512M)")
    number, unit = match.groups()
    return int(float(number) * _SIZE_UNITS[unit.upper()])


def decode_source(data: bytes, name: str) -> str:
    """``data`` as text, refusing binary and oversized input."""
    if len(data) > MAX_SOURCE_BYTES:
        raise InputError(f"{name} is {len(data):,} bytes; the limit is {MAX_SOURCE_BYTES:,} bytes")
    if b"\x00" in data:
        raise InputError(f"{name} looks binary (it contains NUL bytes), not a Python script")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputError(f"{name} is not UTF-8 text (byte {exc.start})") from None


def read_source(path: Path, display: str | None = None) -> str:
    """Read a script (already confined) as text within the size cap."""
    name = display or str(path)
    try:
        size = path.stat().st_size
        if size > MAX_SOURCE_BYTES:
            raise InputError(f"{name} is {size:,} bytes; the limit is {MAX_SOURCE_BYTES:,} bytes")
        with path.open("rb") as handle:
            data = handle.read(MAX_SOURCE_BYTES + 1)
    except OSError as exc:
        raise InputError(f"cannot read {name}: {one_line(exc.strerror or str(exc))}") from None
    return decode_source(data, name)


def check_source_text(source: str) -> str:
    """Pasted source within the size cap."""
    if len(source.encode("utf-8", "surrogatepass")) > MAX_SOURCE_BYTES:
        raise InputError(f"source is larger than {MAX_SOURCE_BYTES:,} bytes")
    if "\x00" in source:
        raise InputError("source contains NUL characters, not a Python script")
    return source


def check_text(text: str, what: str, limit: int = MAX_TEXT_CHARS) -> str:
    """Free text (a symptom description, pasted code) within ``limit`` characters."""
    if len(text) > limit:
        raise InputError(f"{what} is {len(text):,} characters; the limit is {limit:,}")
    return text


def check_script_args(args: Sequence[str]) -> list[str]:
    """Arguments for the user's script: a bounded list of bounded strings."""
    if len(args) > MAX_SCRIPT_ARGS:
        raise InputError(f"{len(args)} script arguments; the limit is {MAX_SCRIPT_ARGS}")
    for arg in args:
        if len(arg) > MAX_SCRIPT_ARG_CHARS:
            raise InputError(f"a script argument is longer than {MAX_SCRIPT_ARG_CHARS} characters")
        if "\x00" in arg:
            raise InputError("a script argument contains a NUL character")
    return list(args)


def check_rule_ids(ids: Sequence[str] | None, what: str) -> list[str] | None:
    """A bounded list of rule ids (``select`` / ``ignore``), or None."""
    if ids is None:
        return None
    if len(ids) > MAX_RULE_IDS:
        raise InputError(f"{what} lists {len(ids)} ids; the limit is {MAX_RULE_IDS}")
    return [i.strip() for i in ids if i.strip()]
