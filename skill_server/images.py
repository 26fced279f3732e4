"""Pictures of a probe run as MCP image content (``probe_script``, ``diagnose``), and of a
verification (the before/after overlay of ``diagnose(verify=true)`` / ``check --verify``).

The probe's pictures (``probes.runtime.plots``: gradient flow per layer, total norm over steps,
dead units, ranks) are drawn where the probe result is at hand, deep inside the diagnosis
(:func:`skill_server.diagnosis.probe`), while the tool result is built by the tool function. A
tool opens :func:`collecting` around its work; :func:`collect` (called by the diagnosis after a
probe run) adds the pictures to that list, and does nothing when no tool asked for pictures. So
neither the report models nor the probe runner's signature carry image bytes.

matplotlib is imported only when a picture is drawn, in a worker thread, never at server start.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING

import anyio
from mcp.types import ImageContent, TextContent

if TYPE_CHECKING:
    from gradient_doctor.probes.runtime.result import ProbeResult
    from gradient_doctor.probes.verify.model import Verification

log = logging.getLogger(__name__)

PNG_MIME = "image/png"
_active: ContextVar[list[tuple[str, bytes]] | None] = ContextVar("probe_pictures", default=None)


@contextmanager
def collecting(enabled: bool = True) -> Iterator[list[tuple[str, bytes]]]:
    """Collect the pictures of the probe runs made inside this block: ``[(name, png)]``."""
    pictures: list[tuple[str, bytes]] = []
    token = _active.set(pictures if enabled else None)
    try:
        yield pictures
    finally:
        _active.reset(token)


async def collect(result: ProbeResult) -> None:
    """Draw ``result``'s pictures into the open :func:`collecting` block, if there is one.

    A picture that cannot be drawn is logged and left out: the report still stands.
    """
    target = _active.get()
    if target is None:
        return

    def draw() -> list[tuple[str, bytes]]:
        from gradient_doctor.probes.runtime.plots import plot_pngs

        return plot_pngs(result)

    try:
        target.extend(await anyio.to_thread.run_sync(draw, abandon_on_cancel=True))
    except Exception:  # matplotlib missing or a drawing bug: keep the text report
        log.exception("could not draw the probe's pictures")


async def collect_verification(verification: Verification, script: str | None) -> None:
    """Draw the before/after picture of ``verification`` into the open :func:`collecting`
    block, if there is one (logged and left out if it cannot be drawn)."""
    target = _active.get()
    if target is None:
        return

    def draw() -> list[tuple[str, bytes]]:
        from gradient_doctor.probes.verify.plots import verification_pngs

        return verification_pngs(verification, script)

    try:
        target.extend(await anyio.to_thread.run_sync(draw, abandon_on_cancel=True))
    except Exception:  # matplotlib missing or a drawing bug: keep the text report
        log.exception("could not draw the verification picture")


def image_content(pictures: list[tuple[str, bytes]]) -> list[TextContent | ImageContent]:
    """One caption line and one PNG image block per picture."""
    blocks: list[TextContent | ImageContent] = []
    for name, png in pictures:
        blocks.append(TextContent(type="text", text=f"Figure: {name}"))
        blocks.append(
            ImageContent(
                type="image", data=base64.b64encode(png).decode("ascii"), mime_type=PNG_MIME
            )
        )
    return blocks
