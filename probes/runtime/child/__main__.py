"""Entry point of the probe's child process: ``python -m _gradient_doctor_probe SCRIPT [ARGS...]``.

Installs the hooks, runs SCRIPT unmodified as ``__main__`` with its own argv, stops it after the
requested number of optimizer steps, and reports over the side channel named in the environment
(``probes.runtime.child.channel``). Stdout and stderr stay the script's. The parent sets the working
directory and the process group.

For ``check --verify`` the settings may also name ``source_file``: a patched text of SCRIPT (kept
in the run's temporary folder, never next to the user's files) that runs *in place of* SCRIPT's
own text, compiled under SCRIPT's path, so ``__file__``, ``sys.argv[0]``, ``sys.path[0]``,
tracebacks and ``inspect`` all see the original script; and ``seed``: the number both runs
seed ``random``, torch and numpy with before the script starts (``seeding``).
"""

from __future__ import annotations

import builtins
import contextlib
import json
import linecache
import os
import runpy
import sys
import time
import traceback
import types
from typing import Any, NoReturn

from .channel import CHANNEL_ENV, SETTINGS_ENV, ChannelWriter
from .rankenv import RankEnv, channel_for_rank, exit_code, record_pid

TRACEBACK_LINES = 25


def _traceback_tail(exc: BaseException) -> str:
    """The script's part of the traceback (the probe's own frames removed), last lines only."""
    frames = traceback.extract_tb(exc.__traceback__)
    here = os.path.dirname(os.path.abspath(__file__))
    kept = [f for f in frames if not os.path.abspath(f.filename).startswith(here)]
    kept = [f for f in kept if "runpy" not in os.path.basename(f.filename)]
    lines = ["Traceback (most recent call last):\n", *traceback.format_list(kept)]
    lines += traceback.format_exception_only(type(exc), exc)
    text = "".join(lines).splitlines()
    return "\n".join(text[-TRACEBACK_LINES:])


def _raised_in_probe(exc: BaseException) -> bool:
    """Whether the innermost Python frame of ``exc`` is the probe's own code (a hook)."""
    frames = traceback.extract_tb(exc.__traceback__)
    here = os.path.dirname(os.path.abspath(__file__))
    return bool(frames) and os.path.abspath(frames[-1].filename).startswith(here + os.sep)


def _run_source_as_main(source: str, path: str) -> None:
    """Run ``source`` as the ``__main__`` module of the script at ``path``, as
    ``runpy.run_path(path, run_name="__main__")`` runs the file's own text.

    The code is compiled under ``path`` and ``linecache`` holds ``source`` for it, so tracebacks
    and ``inspect.getsource`` show the lines that ran. ``dont_inherit``: this module's
    ``from __future__`` imports must not leak into the script.
    """
    code = compile(source, path, "exec", dont_inherit=True)
    # mtime None: linecache.checkcache keeps the entry instead of rereading the file on disk.
    linecache.cache[path] = (len(source), None, source.splitlines(keepends=True), path)
    module = types.ModuleType("__main__")
    module.__dict__.update(
        __file__=path,
        __cached__=None,
        __loader__=None,
        __package__=None,
        __spec__=None,
        __builtins__=builtins,
    )
    saved = sys.modules.get("__main__")
    sys.modules["__main__"] = module
    try:
        exec(code, module.__dict__)
    finally:
        if saved is not None:
            sys.modules["__main__"] = saved


def _read_source_file(writer: ChannelWriter, settings: dict[str, Any]) -> str | None:
    """The patched text to run instead of the script's own (``settings["source_file"]``)."""
    name = settings.get("source_file")
    if not name:
        return None
    try:
        with open(name, encoding="utf-8") as handle:
            return handle.read()
    except OSError as exc:
        _refuse(writer, f"cannot read the patched copy {name}: {exc}")


def _python_version() -> str:
    """What ``platform.python_version()`` says, without its regular expression over
    ``sys.version`` (compiling it costs a few milliseconds before the script starts): the
    version's first word, with the patch level added where it is missing."""
    parts = (sys.version.split() or [".".join(map(str, sys.version_info[:3]))])[0].split(".")
    if len(parts) == 2:
        parts.append("0")
    return ".".join(parts)


def _one_line(exc: BaseException) -> str:
    text = "".join(traceback.format_exception_only(type(exc), exc)).strip().splitlines()
    first = text[-1] if text else type(exc).__name__
    if isinstance(exc, SyntaxError) and exc.lineno:
        first = f"SyntaxError: {exc.msg} (line {exc.lineno})"
    return first[:300]


def _is_cpu_oom(exc: BaseException) -> bool:
    """The CPU allocator reports exhaustion as a plain RuntimeError, not OutOfMemoryError."""
    text = str(exc)
    return isinstance(exc, RuntimeError) and (
        "can't allocate memory" in text or "out of memory" in text.lower()
    )


#: The oldest Python the child package runs in (it uses ``zip(..., strict=True)``, 3.10); this
#: module itself still parses in 3.7+, so that an older interpreter gets a clear line.
MIN_PYTHON = (3, 10)
#: The oldest torch the probe supports, from the newest API the child uses: global optimizer
#: step hooks (``torch.optim.optimizer.register_optimizer_step_pre_hook``, 2.0), the
#: device-generic ``torch.amp.grad_scaler`` that the hooks wrap (2.3) and
#: ``torch._foreach_norm(..., dtype=...)`` in the measurements (2.4). Checked by running the
#: probe under torch 2.1.2, 2.3.1 (refused / failing there) and 2.4.1 (same findings as 2.13).
MIN_TORCH = (2, 4)


def _version_tuple(version: str) -> tuple[int, ...]:
    parts: list[int] = []
    for piece in version.split("+")[0].split(".")[:2]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def _refuse(writer: ChannelWriter, message: str, **extra: Any) -> NoReturn:
    """End now with an input error: the probe cannot run here (one line for the caller)."""
    writer.send(
        "summary",
        {
            "status": "script-error",
            "input_error": True,
            "message": message,
            "parameters": [],
            "shapes": [],
            "layers": [],
            **extra,
        },
    )
    writer.close()
    os._exit(0)


def _looks_like_memory(exc: BaseException) -> bool:
    text = str(exc).lower()
    return isinstance(exc, MemoryError) or any(
        needle in text for needle in ("cannot allocate memory", "failed to map segment")
    )


def _import_torch_side(writer: ChannelWriter, settings: dict[str, Any]) -> tuple[Any, Any, Any]:
    """torch and the modules that hook it, or a one-line reason why this interpreter cannot."""
    where = sys.executable or "this interpreter"
    try:
        import torch
    except BaseException as exc:
        if settings.get("max_memory") and _looks_like_memory(exc):
            writer.send(
                "summary",
                {
                    "status": "out-of-memory",
                    "message": "torch could not be imported under the memory cap: "
                    + _one_line(exc),
                    "parameters": [],
                    "shapes": [],
                    "layers": [],
                },
            )
            writer.close()
            os._exit(0)
        _refuse(writer, f"cannot import torch with {where}: {_one_line(exc)}")
    version = str(getattr(torch, "__version__", "0"))
    if _version_tuple(version) < MIN_TORCH:
        oldest = ".".join(map(str, MIN_TORCH))
        _refuse(
            writer,
            f"torch {version} ({where}) is older than {oldest}, the oldest the probe supports",
            torch_version=version,
        )
    try:
        from . import collector, hooks
    except (ImportError, AttributeError) as exc:
        _refuse(
            writer,
            f"the probe does not support torch {version} ({where}): {_one_line(exc)}",
            torch_version=version,
        )
    return torch, hooks, collector


def _prepare_seeding(torch: Any, settings: dict[str, Any]) -> Any:
    """Seed the generators, set the thread count and start recording (``settings["seed"]``);
    returns the function that writes the ``seeding`` report, or None when no seed was asked."""
    threads = settings.get("threads")
    if isinstance(threads, int) and 0 < threads < torch.get_num_threads():
        # Both runs of a verification get the same count (same reductions, same numbers).
        torch.set_num_threads(threads)
    seed = settings.get("seed")
    if not isinstance(seed, int):
        return None
    from . import seeding

    seeded = seeding.seed_generators(torch, seed)
    recorder = seeding.SeedRecorder()
    recorder.install(torch)
    fingerprint = seeding.StartFingerprint()
    fingerprint.install(torch)
    used_threads = int(torch.get_num_threads())
    return lambda: seeding.report(seed, seeded, recorder, fingerprint, used_threads)


def main() -> None:
    """Run the script under the probe and report; always ends with ``os._exit``."""
    settings: dict[str, Any] = json.loads(os.environ.get(SETTINGS_ENV, "{}"))
    # Under torchrun every rank runs this; ranks launched by --nproc share one channel folder.
    rank_env = RankEnv.from_environ(os.environ, settings)
    record_pid(os.environ[CHANNEL_ENV], rank_env)
    writer = ChannelWriter(channel_for_rank(os.environ[CHANNEL_ENV], rank_env))
    script = sys.argv[1]
    script_args = sys.argv[2:]
    summary: dict[str, Any] = {"status": "script-error", "message": None}
    # First message: the parent knows from it that this interpreter runs the probe at all.
    writer.send(
        "hello",
        {"python": _python_version(), "executable": sys.executable, "pid": os.getpid()},
    )
    if sys.version_info < MIN_PYTHON:
        oldest = ".".join(map(str, MIN_PYTHON))
        _refuse(
            writer,
            f"Python {_python_version()} ({sys.executable}) is older than {oldest}, "
            "the oldest the probe runs in",
        )

    torch, hooks, collector_module = _import_torch_side(writer, settings)
    Collector, ProbeStop = collector_module.Collector, collector_module.ProbeStop

    device = settings.get("device", "auto")
    if device == "cuda" and not torch.cuda.is_available():
        _refuse(
            writer,
            "--device cuda was asked for but no CUDA device is available",
            torch_version=torch.__version__,
        )

    patched_source = _read_source_file(writer, settings)
    seeding_report = _prepare_seeding(torch, settings)

    def progress(done: int) -> None:
        writer.send("progress", {"step": done})

    collector = Collector(
        lambda record: writer.send("step", record),
        max_steps=int(settings.get("steps", 30)),
        sample_every=int(settings.get("sample_every", 10)),
        on_progress=progress,
    )
    hooks.install(collector)
    rank_probe = None
    if rank_env.distributed:
        from . import distributed

        rank_probe = distributed.install(collector, writer, rank_env, settings)

    def finish() -> NoReturn:
        """Send the summary and end the process (also called from inside a hook)."""
        script_s = time.perf_counter() - start
        try:
            collector.flush()
        except Exception as exc:  # the device may be unusable after an error in the script
            summary["message"] = summary["message"] or f"could not read the last step: {exc}"
        if collector.steps_done == 0 and summary["status"] in ("ok", "stopped"):
            summary["status"] = "no-training-loop"
            why = summary["message"] or "the script finished"
            summary["message"] = (
                f"{why} without any optimizer step ({collector.backward_calls} backward() calls)"
            )
        summary.update(collector.summary())
        summary["torch_version"] = torch.__version__
        if seeding_report is not None:
            writer.send("seeding", seeding_report())
        summary["script_s"] = script_s
        if rank_probe is not None:
            writer.send("distributed", rank_probe.report())
        writer.send("summary", summary)
        writer.close()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        # os._exit: the script's non-daemon threads or atexit handlers must not keep us alive.
        os._exit(exit_code(rank_env, summary["status"]))

    def stop_ignored() -> None:
        # The script swallowed ProbeStop (a bare ``except:``) and kept training: end it here.
        summary["status"] = "stopped"
        summary["message"] = (
            "the script caught the probe's stop request (a bare except?) and was ended "
            "after the requested steps"
        )
        finish()

    collector.on_stop_ignored = stop_ignored
    sys.argv = [script, *script_args]
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    start = time.perf_counter()
    try:
        if patched_source is None:
            runpy.run_path(script, run_name="__main__")
        else:
            _run_source_as_main(patched_source, script)
        summary["status"] = "ok"
    except ProbeStop:
        summary["status"] = "stopped"
    except SystemExit as exc:
        code = exc.code
        if code in (None, 0):
            summary["status"] = "ok"
            summary["message"] = "the script called sys.exit(0)"
        else:
            summary["status"] = "script-error"
            summary["message"] = f"the script exited with code {code!r}"
    except (getattr(torch, "OutOfMemoryError", MemoryError), MemoryError) as exc:
        summary["status"] = "out-of-memory"
        summary["message"] = _one_line(exc)
        summary["traceback_tail"] = _traceback_tail(exc)
    except BaseException as exc:
        summary["status"] = "out-of-memory" if _is_cpu_oom(exc) else "script-error"
        summary["message"] = _one_line(exc)
        summary["traceback_tail"] = _traceback_tail(exc)
        compiled_here = isinstance(exc, SyntaxError) and exc.filename == script
        if summary["status"] == "script-error" and _raised_in_probe(exc) and not compiled_here:
            # Not the script's fault: say so rather than blame the user's code.
            summary["message"] = (
                f"the probe failed in its own code with torch {torch.__version__} (a bug in "
                f"gradient-doctor; the script itself did not fail there): {summary['message']}"
            )
            lines = traceback.format_exception(type(exc), exc, exc.__traceback__)
            summary["traceback_tail"] = "".join(lines)[-4000:]
    finish()


if __name__ == "__main__":
    main()
