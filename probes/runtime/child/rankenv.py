"""Where this process stands in a distributed run, child side (stdlib only).

Shared with the parent (``probes.runtime.ranks``), which imports it from here: this package
is what enters the user's interpreter, so it may not import anything outside itself.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final, NamedTuple

#: Who started the ranks: ``gradient-doctor probe --nproc`` or the user's own torchrun.
LAUNCHER_GD: Final = "gradient-doctor"
LAUNCHER_USER: Final = "user"

#: Relative difference of a replicated gradient's norm between two ranks that counts as
#: divergence. Synchronised gradients are bit-identical after an all-reduce; 1e-4 leaves room for
#: reductions that are not (hierarchical or compressed all-reduce) without missing a real bug.
DIVERGENCE_RTOL = 1e-4


class RankEnv(NamedTuple):
    """Where this process stands in a distributed run (read from torchrun's variables).

    A named tuple (immutable) rather than a frozen dataclass, whose generated methods cost
    milliseconds before the probed script's first line."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    #: True when ``gradient-doctor probe --nproc`` launched the ranks (they share a channel).
    launched_here: bool = False

    @property
    def distributed(self) -> bool:
        """More than one rank takes part."""
        return self.world_size > 1

    @classmethod
    def from_environ(
        cls, environ: Mapping[str, str], settings: Mapping[str, Any] | None = None
    ) -> RankEnv:
        """Read ``RANK``, ``LOCAL_RANK`` and ``WORLD_SIZE`` (absent or malformed → one process)."""

        def number(name: str, default: int) -> int:
            try:
                return int(environ.get(name, default))
            except ValueError:
                return default

        world = max(1, number("WORLD_SIZE", 1))
        rank = min(max(0, number("RANK", 0)), world - 1)
        launched = bool(settings and settings.get("launcher") == LAUNCHER_GD)
        return cls(rank, number("LOCAL_RANK", rank), world, launched and world > 1)


def channel_for_rank(channel: str, env: RankEnv) -> str:
    """The channel file this rank writes: the shared one for rank 0, a sibling for the others."""
    if env.launched_here and env.rank > 0:
        return f"{channel}.rank{env.rank}"
    return channel


def pid_file(channel: str, rank: int) -> Path:
    """Where a rank launched by ``--nproc`` records its process id."""
    return Path(f"{channel}.pid{rank}")


def record_pid(channel: str, env: RankEnv) -> None:
    """Leave this rank's pid where the parent finds it (ranks launched by ``--nproc`` only)."""
    if env.launched_here:
        # Without the file the parent relies on torchrun alone to stop this rank.
        with contextlib.suppress(OSError):
            pid_file(channel, env.rank).write_text(str(os.getpid()))


def exit_code(env: RankEnv, status: str) -> int:
    """The child's exit code: non-zero for a failed rank, so torchrun stops the other ranks
    instead of leaving them blocked in a collective that the failed rank never joins."""
    if env.distributed and status in ("script-error", "out-of-memory"):
        return 1
    return 0
