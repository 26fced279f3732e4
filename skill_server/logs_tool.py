"""The ``diagnose_logs`` MCP tool: ``gradient-doctor logs`` for a log inside the server's roots.

Registered by ``server._add_tools``; kept in its own module so the server file only gains one
call. The log is read in a worker thread (a long log takes seconds), never written, and nothing
is run, so the tool is read-only. A log that cannot be read is one ``ToolError`` line.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import anyio
from mcp.server import MCPServer
from mcp.types import CallToolResult, ToolAnnotations
from pydantic import Field

from gradient_doctor.probes.logs.report import LogReport
from gradient_doctor.skill_server.safety import InputError, PathPolicy, one_line

LOG_FORMATS = (
    "nanogpt, hf-trainer, hf-trainer-state, console, csv, jsonl, gradient-monitor, tensorboard"
)


def resolve_log(policy: PathPolicy, path: str) -> Path:
    """The real path of a log file or TensorBoard folder inside the allowed roots."""
    if not isinstance(path, str) or not path.strip():
        raise InputError("path is empty")
    if "\x00" in path:
        raise InputError("path contains a NUL character")
    candidate = Path(path).expanduser()
    if not candidate.is_absolute():
        candidate = policy.roots[0] / candidate
    try:
        real = candidate.resolve(strict=True)
    except FileNotFoundError:
        raise InputError(f"no such file or folder: {path}") from None
    except (OSError, RuntimeError) as exc:
        raise InputError(f"cannot resolve {path}: {one_line(str(exc))}") from None
    if not any(real == root or real.is_relative_to(root) for root in policy.roots):
        raise InputError(
            f"{path} is outside the allowed roots ({policy.describe()}); "
            "start the server with --root to allow another directory"
        )
    if not (real.is_file() or real.is_dir()):
        raise InputError(f"{path} is not a regular file or folder")
    return real


def add_diagnose_logs(
    server: MCPServer,
    policy: PathPolicy,
    tool: Callable[..., Any],
    annotations: ToolAnnotations,
) -> None:
    """Register ``diagnose_logs`` on ``server`` with the server's ``_tool`` decorator."""

    @tool(server, title="Diagnose a training log", annotations=annotations)
    async def diagnose_logs(
        path: Annotated[
            str,
            Field(
                description="A training log inside the root: console output, CSV "
                "(Lightning metrics.csv), JSONL, trainer_state.json, GradientMonitor JSONL, or "
                "a TensorBoard event file or folder."
            ),
        ],
        log_format: Annotated[
            str | None,
            Field(description=f"Read it as this format instead of detecting it: {LOG_FORMATS}."),
        ] = None,
        max_norm: Annotated[
            float | None,
            Field(
                description="The max_norm the run clipped at, when the log does not record it "
                "(the logged norm is then read as the norm before clipping).",
                gt=0,
            ),
        ] = None,
        plots: Annotated[
            bool, Field(description="Return a picture of loss, norm and LR over steps.")
        ] = True,
    ) -> Annotated[CallToolResult, LogReport]:
        """Diagnose a training run from the log it already wrote, without running anything:
        the first NaN step, loss and gradient-norm spikes, rising or decaying norms, exploding
        or vanishing gradients, clipping activity, GradScaler scale drops. The log is read as a
        stream in bounded memory (first/last steps and anomalies exact) and judged by the same
        checks and thresholds as probe_script; the report says which series the log had and
        which checks it could not feed."""
        from gradient_doctor.probes.logs import LogReadError, diagnose_log
        from gradient_doctor.skill_server.server import _result, tool_errors
        from gradient_doctor.skill_server.views_logs import logs_markdown

        with tool_errors("diagnose_logs"):
            real = resolve_log(policy, path)

            def work() -> tuple[LogReport, list[tuple[str, bytes]]]:
                try:
                    report = diagnose_log(
                        str(real), log_format=log_format, max_norm=max_norm, with_series=plots
                    )
                except LogReadError as exc:
                    raise InputError(one_line(str(exc))) from None
                pictures: list[tuple[str, bytes]] = []
                if plots:
                    try:
                        from gradient_doctor.probes.logs.plots import plot_pngs

                        pictures = plot_pngs(report)
                    except Exception:  # a picture must not cost the report
                        pictures = []
                return report.model_copy(update={"series": None}), pictures

            report, pictures = await anyio.to_thread.run_sync(work, abandon_on_cancel=True)
            return _result(report, logs_markdown(report, code=False), pictures)
