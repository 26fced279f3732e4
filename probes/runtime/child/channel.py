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
from typing import IO, Any

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
    file; the pid check keeps their copies silent.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._pid = os.getpid()
        self._file: IO[str] = open(path, "a", encoding="utf-8")  # noqa: SIM115 - lives for the run

    def send(self, kind: str, payload: dict[str, Any]) -> None:
        """Write one message and flush it, so the parent sees it even if we die next."""
        if os.getpid() != self._pid:
            return
        message = {"kind": kind, **payload}
        self._file.write(_ENCODER.encode(message) + "\n")
        self._file.flush()

    def close(self) -> None:
        """Close the file (idempotent)."""
        if os.getpid() == self._pid and not self._file.closed:
            self._file.close()


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
