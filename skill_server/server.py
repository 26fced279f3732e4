"""The Gradient Doctor MCP server (official ``mcp`` SDK, v2 ``MCPServer`` API).

``build_server()`` returns a configured server: seven tools over the knowledge base, the
matcher, the fix snippets, the two probes and training logs; resources for the catalogue,
entries, guides, thresholds and the two checklists; three prompts that clients show as slash
commands.

The server process never imports torch: the runtime probe runs the user's script in a child
process. Every failure reaches the model as one readable line (``ToolError``) and the server
keeps serving; paths are confined to the allowed roots; the user's files are never written.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import anyio
from mcp.server import MCPServer
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ResourceNotFoundError, ToolError
from mcp.shared.exceptions import MCPError
from mcp.types import INVALID_PARAMS, CallToolResult, TextContent, ToolAnnotations
from pydantic import BaseModel, Field

from gradient_doctor.skill_server import diagnosis as diag
from gradient_doctor.skill_server import images
from gradient_doctor.skill_server.results import (
    Diagnosis,
    ExplainResult,
    FixResult,
    LintResult,
    MatchSymptomsResult,
    ProbeReport,
)
from gradient_doctor.skill_server.safety import (
    DEVICE_PATTERN,
    MAX_NAME_ENTRIES,
    MAX_PROBE_STEPS,
    MAX_PROBE_TIMEOUT_S,
    MAX_TEXT_CHARS,
    MAX_TOP_K,
    InputError,
    PathPolicy,
    check_rule_ids,
    check_script_args,
    check_source_text,
    check_text,
    one_line,
    read_source,
)

T = TypeVar("T")
SERVER_NAME = "gradient-doctor"
URI_PREFIX = "gradient-doctor://"
log = logging.getLogger("gradient_doctor.server")

INSTRUCTIONS = """\
Gradient Doctor diagnoses gradient problems in PyTorch training: exploding or vanishing \
gradients, NaN/Inf, dead units, and training-loop mistakes (clipping after the step, \
accumulation without dividing the loss, clipping scaled AMP gradients, DDP accumulation \
without no_sync). Use `diagnose` for a whole check of a script, `lint_script` to read code \
without running it, `probe_script` to measure real gradients, `match_symptoms` for a \
described symptom, `get_fix` for fix code written with the user's names, `explain` for one \
catalogue entry, and `diagnose_logs` for the log a run already wrote. Quote the ids the tools \
return; do not replace a tool's diagnosis with generic advice such as "lower the learning \
rate" or "try another optimizer"."""

READ_ONLY = ToolAnnotations(
    read_only_hint=True, destructive_hint=False, idempotent_hint=True, open_world_hint=False
)
# Running the user's script does whatever the script does (it may write checkpoints or read
# data from anywhere), so these tools are not read-only and not closed-world.
RUNS_SCRIPT = ToolAnnotations(
    read_only_hint=False, destructive_hint=True, idempotent_hint=False, open_world_hint=True
)


def _version() -> str:
    try:
        return metadata.version("gradient-doctor")
    except metadata.PackageNotFoundError:
        return "0.0.0"


def count_gpus() -> int:
    """Visible NVIDIA GPUs, read from the driver's /proc entries (no torch, no subprocess)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return 0
    gpu_dir = Path("/proc/driver/nvidia/gpus")
    try:
        found = sum(1 for _ in gpu_dir.iterdir()) if gpu_dir.is_dir() else 0
    except OSError:
        found = 0
    if visible is not None and found:
        return min(found, len([v for v in visible.split(",") if v.strip()]))
    return found


@dataclass
class ProbeQueue:
    """How many probes run at once: ``gpu_slots`` on GPUs, ``cpu_slots`` on the CPU.

    Waiting callers queue in arrival order. Limiters are created on first use because anyio
    ties them to the running event loop.
    """

    gpu_slots: int
    cpu_slots: int
    _limiters: dict[str, anyio.CapacityLimiter] = field(default_factory=dict, repr=False)

    @classmethod
    def default(cls, gpu_count: int | None = None, cpu_slots: int = 2) -> ProbeQueue:
        """One probe per GPU, ``cpu_slots`` on the CPU."""
        gpus = count_gpus() if gpu_count is None else gpu_count
        return cls(gpu_slots=gpus, cpu_slots=cpu_slots)

    def kind_for(self, device: str) -> Literal["gpu", "cpu"]:
        """Which queue a probe on ``device`` waits in."""
        if device == "cpu" or self.gpu_slots == 0:
            return "cpu"
        return "gpu"

    def limiter(self, device: str) -> anyio.CapacityLimiter:
        """The limiter for ``device``."""
        kind = self.kind_for(device)
        if kind not in self._limiters:
            slots = self.gpu_slots if kind == "gpu" else self.cpu_slots
            self._limiters[kind] = anyio.CapacityLimiter(max(1, slots))
        return self._limiters[kind]


@dataclass
class ServerConfig:
    """What a server instance allows."""

    policy: PathPolicy
    allow_exec: bool = True
    queue: ProbeQueue = field(default_factory=ProbeQueue.default)
    #: Interpreter, memory cap and secrets for every probe (``probes.runtime.Launch``).
    launch: Any = None


@contextmanager
def tool_errors(tool: str) -> Iterator[None]:
    """Turn any failure inside a tool into one readable ``ToolError`` line."""
    try:
        yield
    except ToolError:
        raise
    except InputError as exc:
        raise ToolError(str(exc)) from None
    except KeyError as exc:
        message = exc.args[0] if exc.args else str(exc)
        raise ToolError(one_line(str(message))) from None
    except ValueError as exc:
        raise ToolError(one_line(str(exc))) from None
    except Exception as exc:
        log.exception("%s failed", tool)
        raise ToolError(f"{tool} failed: {type(exc).__name__}: {one_line(str(exc), 300)}") from None


#: Ranks a probe may launch (probe_script / diagnose ``nproc``).
MAX_PROBE_NPROC = 8
NPROC_HELP = (
    "Launch the script like `torchrun --nproc-per-node N` (DDP/FSDP): every rank is probed, "
    "rank 0 merges them (sharded global norms, diverging ranks, all-reduces per step)."
)
CWD_HELP = (
    "Working folder for the script, inside the allowed roots (default: the script's own "
    "folder, where its relative paths usually point)."
)
VERIFY_HELP = (
    "Prove the patch by running it: apply it to a scratch copy (never the user's file), probe "
    "the original and the copy with the same steps, folder, arguments and seed, and compare "
    "(status fixed, improved, unchanged, worse, broken or no-patch; a before/after picture). "
    "About twice the time of one probe."
)
PLOTS_HELP = (
    "Return pictures of the run as PNG images: gradient flow per layer, total norm over "
    "steps, dead units per layer, ranks."
)


def _result(
    model: BaseModel, markdown: str, pictures: Sequence[tuple[str, bytes]] = ()
) -> CallToolResult:
    from gradient_doctor.skill_server.images import image_content

    return CallToolResult(
        content=[TextContent(type="text", text=markdown), *image_content(list(pictures))],
        structured_content=model.model_dump(mode="json"),
    )


def _render(template: str, **context: Any) -> str:
    from gradient_doctor.templates import render

    return render(template, **context)


def _display_path(real: Path, policy: PathPolicy) -> str:
    for root in policy.roots:
        if real.is_relative_to(root):
            return str(real.relative_to(root))
    return str(real)


def _root_of(real: Path, policy: PathPolicy) -> Path:
    for root in policy.roots:
        if real.is_relative_to(root):
            return root
    return real.parent


def build_server(
    roots: Sequence[str | os.PathLike[str]] | None = None,
    *,
    allow_exec: bool = True,
    max_probes: int | None = None,
    token_verifier: Any = None,
    auth: Any = None,
    python: str | None = None,
    max_memory: int | None = None,
    scrub_env: Sequence[str] = (),
) -> MCPServer:
    """A configured Gradient Doctor server.

    ``roots``: directories whose files the tools may read (default: the working directory).
    ``allow_exec``: False refuses to run scripts (``probe_script``, the probe of ``diagnose``).
    ``max_probes``: concurrent probes per device kind (default 1 per GPU, 2 on CPU).
    ``token_verifier`` / ``auth``: bearer-token checking for the HTTP transport.
    ``python``: the interpreter for probed scripts (default: found per script, see
    ``probes.runtime.interpreter``, with the project venv search stopping at its root).
    ``max_memory``: address-space cap of a probed script, bytes. ``scrub_env``: environment
    variables (the token's) never passed to a probed script.
    """
    queue = ProbeQueue.default()
    if max_probes is not None:
        queue = ProbeQueue(gpu_slots=max_probes if queue.gpu_slots else 0, cpu_slots=max_probes)
    from gradient_doctor.probes.runtime.launch import Launch

    config = ServerConfig(
        policy=PathPolicy.from_roots(roots),
        allow_exec=allow_exec,
        queue=queue,
        launch=Launch(python=python, max_memory=max_memory, scrub_env=frozenset(scrub_env)),
    )
    server = GradientDoctorServer(
        SERVER_NAME,
        title="Gradient Doctor",
        description="Diagnose and fix gradient problems in PyTorch training scripts.",
        instructions=INSTRUCTIONS,
        version=_version(),
        token_verifier=token_verifier,
        auth=auth,
    )
    _add_tools(server, config)
    _add_resources(server)
    _add_prompts(server)
    return server


#: "Resource not found" before protocol 2026-07-28; from then on the spec says -32602.
RESOURCE_NOT_FOUND = -32002
#: The first protocol version whose resources/read answers a missing resource with -32602.
_STATELESS_PROTOCOL = "2026-07-28"


def _problems(error: Any) -> str:
    """A pydantic ``ValidationError`` as ``argument: what is wrong (got X)``, joined by "; "."""
    parts = []
    for item in error.errors():
        where = ".".join(map(str, item["loc"])) or "arguments"
        got = item.get("input")
        shown = "" if isinstance(got, dict) else f" (got {one_line(repr(got), 40)})"
        parts.append(f"{where}: {item['msg']}{shown}")
    return "; ".join(parts)


class GradientDoctorServer(MCPServer):
    """``MCPServer`` with the JSON-RPC error codes of the MCP specification.

    - ``prompts/get`` with an unknown prompt name, a missing required argument or an argument
      its schema refuses: -32602 (invalid params), one line, no traceback.
    - ``resources/read`` of a resource that does not exist: -32002 (resource not found) for
      protocols up to 2025-11-25, -32602 from 2026-07-28 on, with the URI in ``data``.
    """

    async def get_prompt(
        self, name: str, arguments: dict[str, Any] | None = None, context: Any = None
    ) -> Any:
        """Render a prompt; bad names and arguments are the caller's error (-32602)."""
        known = {prompt.name: prompt for prompt in await self.list_prompts()}
        prompt = known.get(name)
        if prompt is None:
            raise MCPError(
                code=INVALID_PARAMS,
                message=f"unknown prompt {name!r} (prompts: {', '.join(sorted(known))})",
            )
        given = arguments or {}
        missing = [a.name for a in prompt.arguments or [] if a.required and a.name not in given]
        if missing:
            raise MCPError(
                code=INVALID_PARAMS,
                message=f"prompt {name!r} needs the argument(s): {', '.join(missing)}",
            )
        try:
            return await super().get_prompt(name, arguments, context)
        except ValueError as exc:
            from pydantic import ValidationError

            if isinstance(exc.__cause__, ValidationError):
                raise MCPError(
                    code=INVALID_PARAMS,
                    message=one_line(
                        f"invalid arguments for prompt {name!r}: {_problems(exc.__cause__)}"
                    ),
                ) from None
            raise

    async def call_tool(self, name: str, arguments: dict[str, Any], context: Any = None) -> Any:
        """Call a tool; arguments its schema refuses are named in one line, no pydantic dump.

        The SDK reports them as ``ToolError`` with pydantic's multi-line text and a link to
        its error pages; the model needs only which argument is wrong and why.
        """
        from pydantic import ValidationError

        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as exc:
            if isinstance(exc.__cause__, ValidationError):
                raise ToolError(
                    one_line(f"invalid arguments for {name}: {_problems(exc.__cause__)}", 500)
                ) from None
            raise

    async def read_resource(self, uri: Any, context: Any = None) -> Any:
        """Read a resource; a missing one is "resource not found" in the client's protocol."""
        try:
            return await super().read_resource(uri, context)
        except ResourceNotFoundError as exc:
            version = getattr(context, "protocol_version", None)
            code = (
                INVALID_PARAMS
                if version is not None and version >= _STATELESS_PROTOCOL
                else RESOURCE_NOT_FOUND
            )
            raise MCPError(code=code, message=str(exc), data={"uri": str(uri)}) from None


def _add_tools(server: MCPServer, config: ServerConfig) -> None:
    policy = config.policy

    @_tool(server, title="Match a symptom to the guidance", annotations=READ_ONLY)
    def match_symptoms(
        text: Annotated[
            str,
            Field(
                description="What the user sees or claims, in their words "
                "(e.g. 'loss goes NaN after 2k steps with AMP').",
                min_length=1,
                max_length=MAX_TEXT_CHARS,
            ),
        ],
        code: Annotated[
            str | None,
            Field(description="Optional training-loop code to sharpen the match."),
        ] = None,
        top_k: Annotated[
            int, Field(description="How many matches to return.", ge=1, le=MAX_TOP_K)
        ] = 5,
    ) -> Annotated[CallToolResult, MatchSymptomsResult]:
        """Rank catalogue entries (symptoms, red flags, runtime signals, tempting-but-wrong
        claims) against a described symptom. Each match says what to say instead, which red
        flags to look for, what to check next and which fix snippets apply (see get_fix)."""
        with tool_errors("match_symptoms"):
            check_text(text, "text")
            if code is not None:
                check_source_text(code)
            matches, out_of_scope, pointer = diag.match_text(text, code=code, top_k=top_k)
            result = MatchSymptomsResult(
                matches=matches, out_of_scope=out_of_scope, pointer=pointer
            )
            return _result(result, _render("server/match.md.j2", r=result, text=text))

    @_tool(server, title="Read a training script for red flags", annotations=READ_ONLY)
    async def lint_script(
        path: Annotated[
            str | None,
            Field(description="Script to read, relative to the server's root or absolute."),
        ] = None,
        source: Annotated[
            str | None,
            Field(description="Script text to read instead of a file (≤ 2 MB)."),
        ] = None,
        select: Annotated[
            list[str] | None,
            Field(description="Only these rule ids (e.g. ['clip-after-step'])."),
        ] = None,
        ignore: Annotated[list[str] | None, Field(description="Skip these rule ids.")] = None,
    ) -> Annotated[CallToolResult, LintResult]:
        """Statically analyse a PyTorch training script (it is not run) and report each red
        flag at its line with a unified diff that fixes it, plus all fixes as one diff. The
        file is never modified."""
        with tool_errors("lint_script"):
            if (path is None) == (source is None):
                raise InputError("give exactly one of path or source")
            chosen_select = check_rule_ids(select, "select")
            chosen_ignore = check_rule_ids(ignore, "ignore")
            if path is not None:
                real = policy.resolve_file(path)
                display = _display_path(real, policy)
                text = read_source(real, display)
            else:
                assert source is not None
                display, text = "<source>", check_source_text(source)
            result = await anyio.to_thread.run_sync(
                lambda: diag.lint_text(text, display, select=chosen_select, ignore=chosen_ignore),
                abandon_on_cancel=True,
            )
            return _result(result, _render("server/lint.md.j2", r=result))

    @_tool(server, title="Run a script under the gradient probe", annotations=RUNS_SCRIPT)
    async def probe_script(
        path: Annotated[str, Field(description="Training script to run (inside the root).")],
        ctx: Context,
        args: Annotated[
            list[str] | None, Field(description="Command-line arguments for the script.")
        ] = None,
        steps: Annotated[
            int, Field(description="Optimizer steps to observe.", ge=1, le=MAX_PROBE_STEPS)
        ] = 30,
        timeout_s: Annotated[
            float,
            Field(description="Wall-clock limit in seconds.", gt=0, le=MAX_PROBE_TIMEOUT_S),
        ] = 120.0,
        device: Annotated[
            str,
            Field(description="auto, cpu, cuda, cuda:N or mps.", pattern=DEVICE_PATTERN),
        ] = "auto",
        nproc: Annotated[
            int | None, Field(description=NPROC_HELP, ge=1, le=MAX_PROBE_NPROC)
        ] = None,
        plots: Annotated[bool, Field(description=PLOTS_HELP)] = True,
        cwd: Annotated[str | None, Field(description=CWD_HELP)] = None,
    ) -> Annotated[CallToolResult, ProbeReport]:
        """Run the script in a child process for a few optimizer steps under gradient hooks
        and report what the gradients do (norms per step and layer, NaN/Inf, zero and dead
        units, clipping and AMP behaviour). Reports progress; cancelling stops the script.
        Probes wait in a queue (1 per GPU, 2 on CPU by default)."""
        with tool_errors("probe_script"):
            if not config.allow_exec:
                raise InputError(
                    "script execution is disabled on this server (--no-exec); "
                    "lint_script reads the script without running it"
                )
            real = policy.resolve_file(path)
            display = _display_path(real, policy)
            script_args = check_script_args(args or [])
            workdir = policy.resolve_dir(cwd) if cwd is not None else None
            launch = _launch_for(config, real)

            async def work(progress: Any) -> ProbeReport:
                return await diag.probe(
                    real,
                    display,
                    script_args,
                    steps=steps,
                    timeout_s=timeout_s,
                    device=device,
                    cwd=workdir,
                    on_progress=progress,
                    nproc=nproc,
                    launch=launch,
                )

            with images.collecting(plots) as pictures:
                report = await _queued(config, ctx, display, device, steps, work)
            return _result(report, _render("server/probe.md.j2", r=report), pictures)

    @_tool(server, title="Diagnose a training script", annotations=RUNS_SCRIPT)
    async def diagnose(
        ctx: Context,
        path: Annotated[
            str | None, Field(description="Training script to check (inside the root).")
        ] = None,
        args: Annotated[
            list[str] | None,
            Field(
                description="Command-line arguments for the script (its required options, a "
                "data path), as for probe_script; also given to the patched copy with verify."
            ),
        ] = None,
        description: Annotated[
            str | None,
            Field(description="What the user observes, in their words.", max_length=MAX_TEXT_CHARS),
        ] = None,
        run_probe: Annotated[
            bool,
            Field(description="Also run the script for a few steps under the gradient probe."),
        ] = True,
        steps: Annotated[
            int, Field(description="Optimizer steps to observe.", ge=1, le=MAX_PROBE_STEPS)
        ] = 30,
        timeout_s: Annotated[
            float,
            Field(
                description="Wall-clock limit for the probe, seconds.", gt=0, le=MAX_PROBE_TIMEOUT_S
            ),
        ] = 120.0,
        nproc: Annotated[
            int | None, Field(description=NPROC_HELP, ge=1, le=MAX_PROBE_NPROC)
        ] = None,
        plots: Annotated[bool, Field(description=PLOTS_HELP)] = True,
        cwd: Annotated[str | None, Field(description=CWD_HELP)] = None,
        verify: Annotated[bool, Field(description=VERIFY_HELP)] = False,
        verify_ids: Annotated[
            list[str] | None,
            Field(
                description="With verify: prove only the patches of these finding ids "
                "(default: the combined patch)."
            ),
        ] = None,
    ) -> Annotated[CallToolResult, Diagnosis]:
        """The one-shot check: static analysis + a short run under the gradient probe +
        matching the described symptom, merged into one issue per catalogue id with the
        evidence of each, rendered as a Gradient Health Report (summary table, issues with
        lines and layers, recommendations, a patch and fix code). With verify=true it also
        proves the patch: a patched scratch copy (never the user's file) runs alike and the
        two runs are compared (fixed, improved, unchanged, worse, broken or no-patch), with a
        before/after picture."""
        with tool_errors("diagnose"):
            request = diag.DiagnoseRequest(
                description=description,
                run_probe=run_probe,
                exec_allowed=config.allow_exec,
                steps=steps,
                timeout_s=timeout_s,
                args=check_script_args(args or []),
                nproc=nproc,
                verify=verify or verify_ids is not None,
                verify_ids=check_rule_ids(verify_ids, "verify_ids") if verify_ids else None,
            )
            if path is not None:
                real = policy.resolve_file(path)
                request.script = real
                request.display_path = _display_path(real, policy)
                request.patch_dir = str(_root_of(real, policy))
                request.cwd = policy.resolve_dir(cwd) if cwd is not None else None
                request.launch = _launch_for(config, real)
            display = request.display_path or "the description"

            async def progress(done: int, total: int) -> None:
                what = "steps, original and patched copy" if request.verify else "steps"
                await ctx.report_progress(done, total, f"{done} of {total} {what}")

            async def queued(script: Path, args: Sequence[str], **options: Any) -> Any:
                async def work(_: Any) -> Any:
                    return await diag.run_probe(script, args, **options)

                return await _queued(config, ctx, display, options["device"], steps, work)

            with images.collecting(plots) as pictures:
                result = await diag.diagnose(request, on_progress=progress, probe_runner=queued)
            return _result(result, diag.render_report(result), pictures)

    @_tool(server, title="Fix code with your names", annotations=READ_ONLY)
    def get_fix(
        id: Annotated[
            str,
            Field(
                description="A fix snippet id (e.g. 'accumulation-clip') or a catalogue id "
                "whose first fix snippet is wanted."
            ),
        ],
        names: Annotated[
            dict[str, str] | None,
            Field(
                description="Your variable names, e.g. {'model': 'net', 'optimizer': 'opt', "
                "'loss': 'loss', 'accumulation_steps': 'ACCUM'}. Keys: model, optimizer, loss, "
                "criterion, scaler, scheduler, loader, accumulation_steps, max_norm, inputs, "
                "targets, device_type, dtype (plus a snippet's own; errors name them)."
            ),
        ] = None,
    ) -> Annotated[CallToolResult, FixResult]:
        """Render a fix snippet (correct loop order, accumulation, AMP + clipping, DDP no_sync,
        monitoring, stable loss ops, ...) written with the user's own variable names."""
        with tool_errors("get_fix"):
            from gradient_doctor.templates.snippets import list_snippets, render_snippet

            if names is not None and len(names) > MAX_NAME_ENTRIES:
                raise InputError(f"{len(names)} names; the limit is {MAX_NAME_ENTRIES}")
            snippet_id = _snippet_for(id, list_snippets())
            code = render_snippet(snippet_id, names or None)
            result = FixResult(snippet_id=snippet_id, code=code, names=dict(names or {}))
            return _result(
                result, f"Fix snippet `{snippet_id}`:\n\n```python\n{code.rstrip()}\n```\n"
            )

    @_tool(server, title="Explain a catalogue entry", annotations=READ_ONLY)
    def explain(
        id: Annotated[
            str,
            Field(
                description="A catalogue id: red flag, runtime signal, rationalization or symptom."
            ),
        ],
    ) -> Annotated[CallToolResult, ExplainResult]:
        """The knowledge entry for one id: what it is, why it happens, how it shows up, how to
        confirm it, the fix, related entries and sources."""
        with tool_errors("explain"):
            from gradient_doctor.knowledge import load_knowledge
            from gradient_doctor.skill_server import views

            kb = load_knowledge()
            wanted = id.strip()
            if wanted not in kb.entries:
                _not_an_entry(wanted, kb.guides)
            entry = kb.get(wanted)
            markdown = views.entry_markdown(entry)
            result = ExplainResult(
                id=entry.id,
                kind=entry.kind,
                title=entry.title,
                severity=entry.severity_or_none,
                markdown=markdown,
                entry=entry.model_dump(mode="json"),
            )
            return _result(result, markdown)

    from gradient_doctor.skill_server.logs_tool import add_diagnose_logs

    add_diagnose_logs(server, policy, _tool, READ_ONLY)


def _not_an_entry(wanted: str, guides: Mapping[str, object]) -> None:
    """Name the right door for an id that is a guide topic or a fix snippet, not an entry."""
    from gradient_doctor.templates.snippets import list_snippets

    if wanted in guides:
        raise InputError(
            f"{wanted!r} is a guide topic, not a catalogue id: read the resource "
            f"gradient-doctor://guide/{wanted}"
        )
    if wanted in {spec.id for spec in list_snippets()}:
        raise InputError(
            f"{wanted!r} is a fix snippet id, not a catalogue id: call get_fix with id={wanted!r}"
        )


def _tool(server: MCPServer, *, title: str, annotations: ToolAnnotations) -> Any:
    """Register a tool whose description is its docstring as one paragraph."""

    def decorator(fn: Any) -> Any:
        description = " ".join((fn.__doc__ or "").split())
        server.add_tool(fn, title=title, description=description, annotations=annotations)
        return fn

    return decorator


def _snippet_for(requested: str, known: Any) -> str:
    """``requested`` if it is a snippet id, else the first snippet of the catalogue entry."""
    known_ids = {getattr(s, "id", s) for s in known}
    wanted = requested.strip()
    if wanted in known_ids:
        return wanted
    from gradient_doctor.knowledge import load_knowledge

    kb = load_knowledge()
    if wanted in kb.entries:
        entry = kb.entries[wanted]
        if entry.snippets:
            return str(entry.snippets[0])
        raise InputError(f"{wanted!r} has no fix snippet; see explain({wanted!r})")
    near = kb.closest(wanted)
    hint = f"; closest ids: {', '.join(near)}" if near else ""
    raise InputError(f"unknown fix id {wanted!r}{hint}")


def _launch_for(config: ServerConfig, script: Path) -> Any:
    """The server's launch settings, with the project venv search bounded by the script's
    root."""
    return config.launch._replace(venv_boundary=_root_of(script, config.policy))


async def _queued(
    config: ServerConfig,
    ctx: Context,
    display: str,
    device: str,
    steps: int,
    work: Callable[[Any], Awaitable[T]],
) -> T:
    """Run one probe (``work(progress)``) when a slot of ``device``'s queue is free; progress
    goes to the client."""

    async def progress(done: int, total: int) -> None:
        await ctx.report_progress(done, total, f"{done} of {total} steps")

    limiter = config.queue.limiter(device)
    if limiter.available_tokens == 0:
        kind = config.queue.kind_for(device)
        log.info("probe of %s waits for a free %s slot", display, kind)
        await ctx.report_progress(0, steps, f"queued: waiting for a free {kind} probe slot")
    async with limiter:
        return await work(progress)


def _add_resources(server: MCPServer) -> None:
    from gradient_doctor.skill_server import resources

    resources.register(server, URI_PREFIX, ResourceNotFoundError)


def _add_prompts(server: MCPServer) -> None:
    from gradient_doctor.skill_server import prompts

    prompts.register(server)
