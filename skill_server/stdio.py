"""MCP over stdio, with ``initialize`` answered before the SDK has loaded.

Importing the ``mcp`` SDK (its pydantic models for two protocol versions) takes most of a
second on a busy machine, and a client waits for the ``initialize`` answer before anything
else. The answer depends only on the installed server, so it is cached:

1. stdin and stdout are claimed the way the SDK's own stdio transport claims them (the wire moves
   to private descriptors; fd 0 reads the null device and fd 1 writes to stderr, so stray
   output of a library or a child process never corrupts the protocol);
2. the first line is read; when it is a well-formed ``initialize`` request whose protocol
   version has an answer in the cache (:class:`InitializeCache`), that answer goes out at once;
3. the server is built (the SDK imported) and served over the same wire, with the first line
   replayed to it, so the SDK negotiates exactly as it would have;
4. the SDK's own answer to that ``initialize`` is compared with the cached one and not sent
   again; a difference (a new SDK, a changed server) replaces the cache entry and is logged.
   With no cache entry the SDK's answer goes out as usual and fills the cache.

Anything else as the first line (a 2026-07-28 request without a handshake, a malformed one)
is simply replayed to the SDK, which answers it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import json
import logging
import os
import sys
import tempfile
from collections.abc import AsyncIterator, Callable, Iterable
from pathlib import Path
from typing import Any

from gradient_doctor.knowledge.cache_dir import cache_root

log = logging.getLogger("gradient_doctor.server")

#: The server's own files whose change can change the ``initialize`` answer.
_SERVER_FILES = ("server.py", "prompts.py", "resources.py", "stdio.py")


def _stamp(path: str | None) -> str:
    if not path:
        return "-"
    try:
        info = os.stat(path)
    except OSError:
        return f"{path}:missing"
    return f"{path}:{info.st_mtime_ns}:{info.st_size}"


def installation_key() -> str:
    """What the ``initialize`` answer depends on: this interpreter, the SDK as installed, and
    the server's own files (path, modification time, size), hashed."""
    from importlib.util import find_spec

    here = Path(__file__).resolve().parent
    parts = [sys.version, sys.executable]
    for package in ("mcp", "mcp_types"):
        spec = find_spec(package)
        parts.append(_stamp(spec.origin if spec is not None else None))
    parts += [_stamp(str(here / name)) for name in _SERVER_FILES]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]


class InitializeCache:
    """``initialize`` results by requested protocol version, for one installation key."""

    def __init__(self, folder: Path | None, key: str) -> None:
        # No folder (caching switched off): nothing is read or written.
        self.path = folder / f"initialize-{key}.json" if folder is not None else None
        self.answers: dict[str, Any] = {}
        if self.path is None:
            return
        with contextlib.suppress(OSError, ValueError):
            loaded = json.loads(self.path.read_text(encoding="utf-8"))
            if isinstance(loaded, dict):
                self.answers = loaded

    def get(self, version: str) -> dict[str, Any] | None:
        """The cached result for a client that asked for ``version``."""
        found = self.answers.get(version)
        return found if isinstance(found, dict) else None

    def put(self, version: str, result: dict[str, Any]) -> None:
        """Remember ``result``; a cache that cannot be written is only a slower start."""
        self.answers[version] = result
        if self.path is None:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(
                "w", dir=self.path.parent, delete=False, suffix=".tmp", encoding="utf-8"
            ) as handle:
                json.dump(self.answers, handle)
            os.replace(handle.name, self.path)
        except OSError as exc:
            log.debug("initialize cache not written: %s", exc)


def _initialize_request(line: bytes) -> dict[str, Any] | None:
    """``line`` as an ``initialize`` request the SDK will accept, else None."""
    try:
        message = json.loads(line)
    except ValueError:
        return None
    if not isinstance(message, dict) or message.get("method") != "initialize":
        return None
    params = message.get("params")
    if message.get("jsonrpc") != "2.0" or not isinstance(message.get("id"), int | str):
        return None
    if not isinstance(params, dict) or not isinstance(params.get("protocolVersion"), str):
        return None
    info = params.get("clientInfo")
    if not isinstance(params.get("capabilities"), dict) or not isinstance(info, dict):
        return None
    if not all(isinstance(info.get(key), str) for key in ("name", "version")):
        return None
    return message


def _claim_wire() -> tuple[int, int]:
    """Move the protocol to private descriptors; fd 0 reads /dev/null, fd 1 writes to stderr."""
    wire_in = fcntl.fcntl(0, fcntl.F_DUPFD_CLOEXEC, 3)
    wire_out = fcntl.fcntl(1, fcntl.F_DUPFD_CLOEXEC, 3)
    sys.stdout.flush()
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(2, 1)
    return wire_in, wire_out


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


class _Lines:
    """The SDK's stdin: the first line (already read), then the rest of the wire."""

    def __init__(self, first: bytes, reader: io.BufferedReader[io.FileIO]) -> None:
        self._first = first
        self._reader = reader

    async def __aiter__(self) -> AsyncIterator[str]:
        import anyio

        if self._first:
            yield self._first.decode("utf-8", "replace")
        while True:
            line = await anyio.to_thread.run_sync(self._reader.readline, abandon_on_cancel=True)
            if not line:
                return
            yield line.decode("utf-8", "replace")


class _Wire:
    """The SDK's stdout: writes whole messages to the wire, except the SDK's answer to an
    ``initialize`` that was already answered from the cache (compared, then dropped)."""

    def __init__(
        self,
        fd: int,
        request: dict[str, Any] | None,
        sent: dict[str, Any] | None,
        cache: InitializeCache,
    ) -> None:
        self._fd = fd
        self._request = request
        self._sent = sent
        self._cache = cache
        self._pending = ""

    async def write(self, text: str) -> None:
        self._pending += text
        *lines, self._pending = self._pending.split("\n")
        for line in lines:
            if self._request is not None and self._is_initialize_answer(line):
                continue
            _write_all(self._fd, (line + "\n").encode("utf-8"))

    async def flush(self) -> None:
        return None

    def _is_initialize_answer(self, line: str) -> bool:
        """Whether ``line`` is the SDK's answer to the first ``initialize`` and was sent already
        (it always updates the cache)."""
        assert self._request is not None
        try:
            message = json.loads(line)
        except ValueError:
            return False
        if not isinstance(message, dict) or message.get("id") != self._request["id"]:
            return False
        if "result" not in message and "error" not in message:
            return False
        version = self._request["params"]["protocolVersion"]
        self._request = None
        result = message.get("result")
        if isinstance(result, dict) and result != self._sent:
            if self._sent is not None:
                log.warning("the cached initialize answer was stale; the cache is updated")
            self._cache.put(version, result)
        return self._sent is not None


def serve_stdio(build: Callable[[], Any], before_answer: Iterable[Callable[[], None]] = ()) -> None:
    """Serve the server that ``build()`` returns over stdio (see the module docstring).

    ``before_answer``: checks to run before anything is answered (they may raise).
    """
    for check in before_answer:
        check()
    wire_in, wire_out = _claim_wire()
    reader = io.BufferedReader(io.FileIO(wire_in, "rb", closefd=False))
    first = reader.readline()
    request = _initialize_request(first)
    cache = InitializeCache(cache_root(), installation_key())
    sent: dict[str, Any] | None = None
    if request is not None:
        sent = cache.get(request["params"]["protocolVersion"])
        if sent is not None:
            answer = {"jsonrpc": "2.0", "id": request["id"], "result": sent}
            _write_all(wire_out, (json.dumps(answer, separators=(",", ":")) + "\n").encode())
    server = build()

    import anyio

    async def serve() -> None:
        from mcp.server.stdio import stdio_server

        lowlevel = server._lowlevel_server
        streams: Any = (_Lines(first, reader), _Wire(wire_out, request, sent, cache))
        async with stdio_server(stdin=streams[0], stdout=streams[1]) as (read, write):
            await lowlevel.run(read, write, lowlevel.create_initialization_options())

    anyio.run(serve)
