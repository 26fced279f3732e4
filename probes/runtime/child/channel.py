"""The side channel between the probed script's process and the parent (no torch).

The script owns stdout and stderr, so measurements travel through a file of JSON lines that
the parent creates in a private temporary folder and names in the child's environment. Each
line is one message: ``{"kind": "step", ...}`` for every optimizer step (so a run that is
killed still leaves its series behind) and one ``{"kind": "summary", ...}`` at the end. The
writer appends and flushes whole lines; the reader consumes whole lines only, so it can poll
while the child is still writing.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

#: Environment variable holding the channel path for the child.
CHANNEL_ENV = "GRADIENT_DOCTOR_CHANNEL"
#: Environment variable holding the probe settings (JSON) for the child.
SETTINGS_ENV = "GRADIENT_DOCTOR_PROBE"


#: One encoder for every message (``json.dumps`` with options builds a new one per call);
#: allow_nan keeps NaN/Infinity as bare tokens, which json.loads reads back.
_ENCODER = json.JSONEncoder(allow_nan=True, separators=(",", ":"))


class ChannelWriter:
    """Appends JSON-line messages; only the process that opened it may write.

    Forked children of the script (``DataLoader`` workers, ``multiprocessing``) inherit the open
    descriptor; the pid check keeps their copies silent. The script may close every descriptor
    it did not open (``os.closerange(3, ...)``, daemon libraries do) and then open files of its
    own that get the same number: before each write the descriptor is checked to still be the
    channel file (same device and inode) and reopened by path if not, so a message never lands
    in the script's file and the channel survives.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._pid = os.getpid()
        self._path = os.fspath(path)
        self._fd = -1
        self._identity: tuple[int, int] | None = None
        self._open()

    def _open(self) -> None:
        self._fd = os.open(self._path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        info = os.fstat(self._fd)
        self._identity = (info.st_dev, info.st_ino)

    def _still_ours(self) -> bool:
        try:
            info = os.fstat(self._fd)
        except OSError:
            return False
        return (info.st_dev, info.st_ino) == self._identity

    def send(self, kind: str, payload: dict[str, Any]) -> None:
        """Write one message, so the parent sees it even if we die next."""
        if os.getpid() != self._pid or self._identity is None:
            return
        data = (_ENCODER.encode({"kind": kind, **payload}) + "\n").encode("utf-8")
        if not self._still_ours():
            # Closed (or its number reused) by the script: do not touch that number again.
            self._open()
        view = memoryview(data)
        while view:
            written = os.write(self._fd, view)
            view = view[written:]

    def close(self) -> None:
        """Close the descriptor (idempotent)."""
        if os.getpid() == self._pid and self._identity is not None:
            if self._still_ours():
                os.close(self._fd)
            self._identity = None


class ChannelReader:
    """Reads the messages written so far, whole lines only, from where it last stopped."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._path = Path(path)
        self._offset = 0
        self._partial = b""

    def read_new(self) -> list[dict[str, Any]]:
        """Messages completed since the previous call (an unreadable line is skipped)."""
        try:
            with self._path.open("rb") as handle:
                handle.seek(self._offset)
                chunk = handle.read()
        except FileNotFoundError:
            return []
        self._offset += len(chunk)
        data = self._partial + chunk
        *lines, self._partial = data.split(b"\n")
        messages: list[dict[str, Any]] = []
        for line in lines:
            if not line.strip():
                continue
            try:
                decoded = json.loads(line)
            except ValueError:
                continue
            if isinstance(decoded, dict):
                messages.append(decoded)
        return messages
