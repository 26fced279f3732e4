"""How the probed script's process is launched: checks, staging and the supervisor's start.

Standard library only, on purpose: the CLI starts the run with this module alone and imports
the rest of the tool (pydantic models, the knowledge base, the diagnosis) while the script's
interpreter starts and imports torch, instead of before it. Building the server (which stores
a :class:`Launch`) imports nothing heavy either. The runner (``probes.runtime.runner``) watches
the :class:`StartedRun` this module returns and diagnoses it.

The process tree (``probes.runtime.supervisor`` says why each piece is there)::

    caller ── supervisor ── shim ── child: INTERPRETER -m _gradient_doctor_probe SCRIPT ARGS...
"""

from __future__ import annotations

import contextlib
import json
import marshal
import math
import os
import select
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import IO, Any, NamedTuple

from gradient_doctor.probes.runtime import interpreter as interpreters
from gradient_doctor.probes.runtime.child import STAGED_PACKAGE
from gradient_doctor.probes.runtime.child.channel import CHANNEL_ENV, SETTINGS_ENV
from gradient_doctor.probes.runtime.child.rankenv import LAUNCHER_GD
from gradient_doctor.probes.runtime.prestart import SECRET_ENV, take_prestarted
from gradient_doctor.probes.runtime.prestart import supervisor_command as _supervisor_command

DEVICES = ("auto", "cpu", "cuda")
TERM_GRACE_S = 1.0
KILL_WAIT_S = 0.8
OUTPUT_TAIL_BYTES = 16_384
MAX_SCRIPT_BYTES = 10_000_000
#: Ranks ``--nproc`` may start on one machine.
MAX_NPROC = 64
#: The smallest ``max_memory`` accepted: below it no Python interpreter starts.
MIN_MEMORY_BYTES = 64 * 2**20
#: How long the supervisor may take to stop everything after ``stop`` (its grace + sweeps).
SUPERVISOR_STOP_S = TERM_GRACE_S + 3.0
#: How often a drain thread looks whether the run is over while its pipe is silent.
_DRAIN_POLL_S = 0.25

#: The child package's folder; a module attribute so that tests can stage another copy.
CHILD_SOURCE = Path(__file__).resolve().parent / "child"
#: The supervisor's file: never imported here (see :func:`supervisor_command`).
SUPERVISOR_FILE = Path(__file__).resolve().parent / "supervisor.py"


def supervisor_command(config_hex: str) -> list[str]:
    """``python -I -S -c CODE CONFIG``: CODE imports :data:`SUPERVISOR_FILE` as a module from its
    folder (appended to the path, after the standard library) and runs it. Imported, not run by
    path: a script given by path is compiled on every run (some 2.5 ms of the time before the
    script's interpreter can start), a module loads its cached bytecode."""
    return _supervisor_command(config_hex, str(SUPERVISOR_FILE))


class Launch(NamedTuple):
    """Where and how the script's process runs (the same for the CLI, ``check`` and the server).

    ``python``: the interpreter (path, command or virtualenv folder); None picks one
    (``probes.runtime.interpreter``): the project's virtualenv found from the script's folder
    up to ``venv_boundary`` (default: the filesystem root), ``$VIRTUAL_ENV``,
    ``$CONDA_PREFIX``, the tool's own. ``max_memory``: address-space cap of the script's
    process, bytes (status ``out-of-memory`` when it runs out). ``scrub_env``: environment
    variables kept from the script besides ``GRADIENT_DOCTOR_TOKEN`` (the server's secrets).

    A named tuple rather than a dataclass: immutable and comparable all the same, and
    ``dataclasses`` (with the ``inspect`` it imports, some 9 ms) stays off the path to the
    script's start (:func:`start_probe`).
    """

    python: str | None = None
    venv_boundary: Path | None = None
    max_memory: int | None = None
    scrub_env: frozenset[str] = frozenset()


class ProbeInputError(ValueError):
    """The probe's input is unusable (missing script, bad option): one line, no traceback."""


def check_script(script: str | os.PathLike[str]) -> Path:
    """The script's absolute path, or :class:`ProbeInputError` when it is missing, not a
    file, unreadable, binary or too large."""
    path = Path(script).expanduser()
    if not path.exists():
        raise ProbeInputError(f"no such script: {path}")
    if not path.is_file():
        raise ProbeInputError(f"not a file: {path}")
    try:
        with path.open("rb") as handle:
            head = handle.read(8192)
    except OSError as exc:
        raise ProbeInputError(f"cannot read {path}: {exc.strerror or exc}") from None
    if b"\x00" in head:
        raise ProbeInputError(f"{path} is a binary file, not a Python script")
    if path.stat().st_size > MAX_SCRIPT_BYTES:
        raise ProbeInputError(f"{path} is larger than {MAX_SCRIPT_BYTES // 1_000_000} MB")
    return path.resolve()


def check_options(
    steps: int,
    timeout_s: float,
    device: str,
    sample_every: int,
    nproc: int | None = None,
    max_memory: int | None = None,
) -> None:
    """:class:`ProbeInputError` for an option out of range."""
    if steps < 1:
        raise ProbeInputError(f"steps must be at least 1 (got {steps})")
    if not (timeout_s > 0 and math.isfinite(timeout_s)):
        raise ProbeInputError(f"timeout must be a positive number of seconds (got {timeout_s})")
    if device not in DEVICES:
        raise ProbeInputError(f"device must be one of {', '.join(DEVICES)} (got {device!r})")
    if sample_every < 1:
        raise ProbeInputError(f"sample_every must be at least 1 (got {sample_every})")
    if nproc is not None and not 1 <= nproc <= MAX_NPROC:
        raise ProbeInputError(f"nproc must be between 1 and {MAX_NPROC} (got {nproc})")
    if max_memory is not None and max_memory < MIN_MEMORY_BYTES:
        raise ProbeInputError(
            f"max_memory must be at least {MIN_MEMORY_BYTES // 2**20} MiB (got {max_memory} bytes)"
        )


def stage_child(folder: Path) -> Path:
    """Copy the child package into ``folder/STAGED_PACKAGE``; returns the folder to put on
    ``PYTHONPATH``. Only these few stdlib-and-torch modules enter the user's interpreter.

    The per-run copy, used where :func:`cached_child` finds no safe place to keep one. The
    bytecode compiled at install time comes along: the sources keep their modification times
    (``copy2``), so a child interpreter of the same version loads the cached bytecode instead of
    compiling the package on every run; another version ignores it (its tag differs)."""
    target = folder / STAGED_PACKAGE
    target.mkdir()
    source = CHILD_SOURCE
    for module in source.glob("*.py"):
        shutil.copy2(module, target / module.name)
    cached = [
        compiled
        for compiled in (source / "__pycache__").glob("*.pyc")
        if (source / f"{compiled.name.split('.', 1)[0]}.py").is_file()
    ]
    if cached:
        (target / "__pycache__").mkdir()
        for compiled in cached:
            shutil.copy2(compiled, target / "__pycache__" / compiled.name)
    return folder


#: Where :func:`cached_child` keeps its copies; None: ``gradient-doctor-UID`` in the temporary
#: directory. A module attribute so that tests can point it elsewhere.
CHILD_CACHE_ROOT: Path | None = None
#: Copies of other versions of the package unused for this long are removed when a new one is
#: made (a run keeps its copy's folder fresh; no run lasts this long).
CHILD_CACHE_MAX_AGE_S = 30 * 86_400


def _private_folder(path: Path) -> bool:
    """Whether ``path`` is a real folder (not a link) of this user that nobody else can write."""
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return (
        stat.S_ISDIR(info.st_mode)
        and info.st_uid == os.getuid()
        and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    )


def _child_sources() -> dict[str, bytes]:
    """The child package's modules: file name → content."""
    return {module.name: module.read_bytes() for module in sorted(CHILD_SOURCE.glob("*.py"))}


def _holds(package: Path, sources: dict[str, bytes]) -> bool:
    """Whether ``package`` is a real folder whose modules are exactly ``sources``' texts."""
    if not _private_folder(package):
        return False
    try:
        return all((package / name).read_bytes() == text for name, text in sources.items())
    except OSError:
        return False


def _write_package(package: Path, sources: dict[str, bytes]) -> None:
    """Write ``sources`` into the new folder ``package`` with their bytecode for this Python,
    checked against the source's hash at every import (never stale, whatever the file times);
    an interpreter of another version compiles its own (and caches it there if it may)."""
    import py_compile  # only when a copy is made: once per version of the package

    package.mkdir(mode=0o700)
    for name, text in sources.items():
        (package / name).write_bytes(text)
    for name in sources:
        with contextlib.suppress(py_compile.PyCompileError, OSError):
            py_compile.compile(
                str(package / name),
                doraise=True,
                invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH,
            )


def _prune_cache(root: Path, keep: Path) -> None:
    """Remove the copies of other versions of the package unused for a long time."""
    cutoff = time.time() - CHILD_CACHE_MAX_AGE_S
    with contextlib.suppress(OSError):
        for entry in root.iterdir():
            if entry != keep and entry.name.startswith("child-"):
                with contextlib.suppress(OSError):
                    if os.lstat(entry).st_mtime < cutoff:
                        shutil.rmtree(entry, ignore_errors=True)


def cached_child() -> Path | None:
    """The folder to put on ``PYTHONPATH``: a copy of the child package kept between runs, or
    None where no safe place exists (the run then stages its own copy, :func:`stage_child`).

    One copy per content of the package (checksums of its modules name it), in
    ``gradient-doctor-UID`` of the temporary directory: a folder of this user's that nobody
    else may write (checked at every run; a link, another owner or a writable-by-others folder
    is refused). Every run compares the copy's modules with the package's, byte for byte, and
    replaces a copy that differs; its bytecode is checked against the sources' hashes at import.
    Per run, the copy's modules were compiled again wherever the package's own bytecode is
    stale or missing (an editable install, a checkout: 10-15 ms of the child's CPU before the
    script's first line), and the copy was removed after the run (about 10 ms of file
    removals beside the report); this costs a read of the package's few files (under 1 ms).
    The user's files are not touched."""
    if not hasattr(os, "getuid"):
        return None
    root = CHILD_CACHE_ROOT or Path(tempfile.gettempdir()) / f"gradient-doctor-{os.getuid()}"
    try:
        sources = _child_sources()
        # The name tells versions apart; the byte comparison below decides. (zlib is loaded
        # already; hashlib would load OpenSSL, some 2 ms before the script can start.)
        joined = b"\0".join(name.encode() + b"\0" + text for name, text in sources.items())
        digest = f"{zlib.crc32(joined):08x}{zlib.adler32(joined):08x}{len(joined):x}"
        with contextlib.suppress(FileExistsError):
            root.mkdir(mode=0o700)
        if not _private_folder(root):
            return None
        entry = root / f"child-{digest}"
        package = entry / STAGED_PACKAGE
        if _private_folder(entry) and _holds(package, sources):
            with contextlib.suppress(OSError):
                os.utime(entry)  # in use: not pruned
            return entry
        building = Path(tempfile.mkdtemp(prefix="building-", dir=root))
        try:
            _write_package(building / STAGED_PACKAGE, sources)
            try:
                os.rename(building, entry)  # atomic: a run sees a whole copy or none
            except OSError:
                # Another run made it meanwhile (then it is whole), or a damaged one is there.
                if not (_private_folder(entry) and _holds(package, sources)):
                    shutil.rmtree(entry, ignore_errors=True)
                    os.rename(building, entry)
        finally:
            shutil.rmtree(building, ignore_errors=True)  # gone already when renamed
        _prune_cache(root, entry)
        return entry if _private_folder(entry) and _holds(package, sources) else None
    except OSError:
        return None


class OutputTail:
    """The last bytes of a stream the script writes (which may be megabytes), drained by a
    thread of its own from the moment the process starts: a pipe nobody reads fills up and
    blocks the script."""

    def __init__(self, stream: IO[bytes] | None, closing: threading.Event) -> None:
        self.data = bytearray()
        self._stream = stream
        self._closing = closing
        self._thread = threading.Thread(target=self._drain, name="gd-drain", daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        stream = self._stream
        if stream is None:
            return
        descriptor = stream.fileno()
        try:
            while True:
                # A process that escaped the supervisor may keep the pipe open: once the run
                # is over, a silent pipe ends the drain instead of blocking forever.
                ready, _, _ = select.select([descriptor], [], [], _DRAIN_POLL_S)
                if not ready:
                    if self._closing.is_set():
                        return
                    continue
                chunk = os.read(descriptor, 65_536)
                if not chunk:
                    return
                self.data += chunk
                if len(self.data) > 2 * OUTPUT_TAIL_BYTES:
                    del self.data[: len(self.data) - OUTPUT_TAIL_BYTES]
        except (OSError, ValueError):
            return
        finally:
            with contextlib.suppress(OSError):
                stream.close()

    def join(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for the end of the stream."""
        self._thread.join(timeout)

    def text(self) -> str:
        return bytes(self.data[-OUTPUT_TAIL_BYTES:]).decode("utf-8", "replace")


#: How much lower than its caller's the priority of the tool's own preparation is (nice steps).
PREPARATION_NICE = 10


def lower_thread_priority(steps: int = PREPARATION_NICE) -> bool:
    """Lower the calling thread's scheduling priority by ``steps`` nice levels; True if done.

    Linux only, where a nice value belongs to one thread (and the threads it starts later),
    not to the process: the caller's other threads (the output drains, the watcher) keep theirs.
    Elsewhere ``setpriority`` would slow the whole process, so nothing is done. The kernel caps
    the value at 19; an unprivileged process can never raise it back, which is why only a
    short-lived preparation thread calls this."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        thread = threading.get_native_id()
        current = os.getpriority(os.PRIO_PROCESS, thread)
        os.setpriority(os.PRIO_PROCESS, thread, min(19, current + steps))
    except (OSError, AttributeError):
        return False
    return True


def _read_json(path: Path) -> dict[str, Any]:
    try:
        loaded = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


class StartedRun:
    """A probe run whose supervisor has been started: what the runner needs to watch it.

    ``folder`` is the run's private temporary folder (channel, reports, the staged child);
    :meth:`close` removes it (or starts removing it). ``started`` is the
    ``time.perf_counter()`` just before launch. A plain class, not a dataclass: see
    :class:`Launch`.
    """

    def __init__(
        self,
        *,
        process: subprocess.Popen[bytes],
        folder: Path,
        channel: Path,
        report: Path,
        script: Path,
        args: list[str],
        workdir: Path,
        interpreter: interpreters.Interpreter,
        scrubbed: list[str],
        steps: int,
        timeout_s: float,
        sample_every: int,
        max_memory: int | None,
        nproc: int | None,
        patched: bool,
        started: float,
        stdout: OutputTail,
        stderr: OutputTail,
        closing: threading.Event,
    ) -> None:
        self.process = process
        self.folder = folder
        self.channel = channel
        self.report = report
        self.script = script
        self.args = args
        self.workdir = workdir
        self.interpreter = interpreter
        self.scrubbed = scrubbed
        self.steps = steps
        self.timeout_s = timeout_s
        self.sample_every = sample_every
        self.max_memory = max_memory
        self.nproc = nproc
        self.patched = patched
        self.started = started
        self.stdout = stdout
        self.stderr = stderr
        self.closing = closing
        self.closed = False
        #: The thread removing the run's folder after ``close(wait=False)``.
        self.removal: threading.Thread | None = None

    def child_pid(self) -> int | None:
        """The script process's pid, as the shim recorded it (for the last-resort group kill)."""
        pid = _read_json(self.folder / f"{self.report.name}.parent").get("child_pid")
        return int(pid) if isinstance(pid, int) else None

    def wait_exit(self) -> int:
        """Block until the supervisor exits; its exit status."""
        return self.process.wait()

    def stop(self) -> None:
        """Ask the supervisor to stop the run (SIGTERM to the script's tree, a grace, SIGKILL)
        and wait for it; SIGKILL it and the script's group only if it does not answer in time.
        Blocks up to :data:`SUPERVISOR_STOP_S` + :data:`KILL_WAIT_S` seconds."""
        process = self.process
        if process.poll() is None and process.stdin is not None:
            with contextlib.suppress(OSError, ValueError):
                process.stdin.write(b"stop\n")
                process.stdin.flush()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(SUPERVISOR_STOP_S)
        if process.poll() is None:
            child_pid = self.child_pid()
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            if child_pid is not None:
                _signal_group(child_pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(KILL_WAIT_S)

    def finish_output(self, timeout: float = 0.5) -> None:
        """After the supervisor exited: let the drains read what is left (every process below
        it has stopped, so the pipes close with them), then end them."""
        deadline = time.perf_counter() + timeout
        for tail in (self.stdout, self.stderr):
            tail.join(max(0.0, deadline - time.perf_counter()))
        self.closing.set()

    def close(self, wait: bool = True) -> None:
        """Stop the run if it still runs, end the lifeline and remove the run's folder
        (idempotent). Nothing is left behind.

        ``wait=False``: the folder is removed by a thread of its own (on some disks removing
        its two dozen files takes 10 ms, which the caller can spend on its report instead);
        a later ``close()`` waits for it. The thread is not a daemon, so an interpreter that
        exits normally also waits for it."""
        if self.closed:
            if wait and self.removal is not None:
                self.removal.join()
            return
        self.closed = True
        if self.process.poll() is None:
            self.stop()
        self.closing.set()
        if self.process.stdin is not None:
            with contextlib.suppress(OSError, ValueError):
                self.process.stdin.close()
        if wait:
            shutil.rmtree(self.folder, ignore_errors=True)
            return
        self.removal = threading.Thread(
            target=shutil.rmtree,
            args=(self.folder,),
            kwargs={"ignore_errors": True},
            name="gd-remove-run-folder",
        )
        self.removal.start()


def _hand_over(supervision: dict[str, Any], env: dict[str, str]) -> subprocess.Popen[bytes] | None:
    """Give the run to the supervisor started ahead of it (``prestart``), if there is one: its
    configuration, with the script's environment, as one line on its stdin. None: there is
    none, or it could not take the run (it is then ended, and the caller starts one)."""
    process = take_prestarted()
    if process is None:
        return None
    line = marshal.dumps({**supervision, "env": env}).hex().encode("ascii") + b"\n"
    try:
        if process.stdin is None:
            raise ValueError("no pipe to the supervisor")
        process.stdin.write(line)
        process.stdin.flush()
    except (OSError, ValueError):
        with contextlib.suppress(OSError):
            process.kill()
        process.wait()
        return None
    return process


def _child_environment(
    chosen: interpreters.Interpreter, scrub_env: Collection[str]
) -> tuple[dict[str, str], list[str]]:
    """The caller's environment for the script: secrets removed, the environment activated."""
    secret = SECRET_ENV | {name for name in scrub_env if name}
    env = {k: v for k, v in os.environ.items() if k not in secret}
    removed = sorted(k for k in os.environ if k in secret)
    return interpreters.activation(chosen, env), removed


def start_probe(
    script: str | os.PathLike[str],
    args: Sequence[str] = (),
    *,
    steps: int = 30,
    timeout_s: float = 120.0,
    device: str = "auto",
    sample_every: int = 10,
    cwd: str | os.PathLike[str] | None = None,
    nproc: int | None = None,
    launch: Launch | None = None,
    seed: int | None = None,
    source: str | None = None,
    threads: int | None = None,
) -> StartedRun:
    """Check the input, stage the child package and start the supervisor (which starts the
    script); returns at once. The options are those of ``runner.run_probe_async``. Raises
    :class:`ProbeInputError` for unusable input (missing, binary or oversized script, option
    out of range, missing working folder, unusable ``--python``). The caller owns the result:
    it watches it (``runner.complete_probe_async``) or closes it (:meth:`StartedRun.close`).
    """
    path = check_script(script)
    launch = launch or Launch()
    max_memory = launch.max_memory
    check_options(steps, timeout_s, device, sample_every, nproc, max_memory)
    workdir = Path(cwd).expanduser().absolute() if cwd is not None else path.parent
    if not workdir.is_dir():
        raise ProbeInputError(f"working directory does not exist: {workdir}")
    try:
        chosen = interpreters.choose(path, launch.python, boundary=launch.venv_boundary)
    except interpreters.InterpreterError as exc:
        raise ProbeInputError(str(exc)) from None

    tmp = Path(tempfile.mkdtemp(prefix="gradient-doctor-probe-"))
    try:
        channel = tmp / "channel.jsonl"
        channel.touch()
        report_path = tmp / "supervisor.json"
        env, scrubbed = _child_environment(chosen, launch.scrub_env)
        env[CHANNEL_ENV] = str(channel)
        settings: dict[str, Any] = {"steps": steps, "sample_every": sample_every, "device": device}
        if max_memory is not None:
            settings["max_memory"] = max_memory
        if seed is not None:
            settings["seed"] = int(seed)
        if threads is not None:
            settings["threads"] = max(1, int(threads))
        if source is not None:
            patched = tmp / "patched_source.py"
            patched.write_text(source, encoding="utf-8")
            settings["source_file"] = str(patched)
        if device == "cpu":
            env["CUDA_VISIBLE_DEVICES"] = ""
        env.setdefault("PYTHONUNBUFFERED", "1")
        staged = cached_child() or stage_child(tmp)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(staged), env.get("PYTHONPATH", "")) if p
        )
        command = [chosen.path, "-m", STAGED_PACKAGE, str(path), *map(str, args)]
        if nproc is not None and nproc > 1:
            # Distributed runs only: the ranks module brings the result models with it.
            from gradient_doctor.probes.runtime.ranks import torchrun_command

            settings.update(launcher=LAUNCHER_GD, timeout_s=timeout_s)
            env.setdefault("OMP_NUM_THREADS", "1")
            command = torchrun_command(chosen.path, nproc, command[2:])
        env[SETTINGS_ENV] = json.dumps(settings)
        supervision = {
            "command": command,
            "cwd": str(workdir),
            "max_memory": max_memory,
            "report": str(report_path),
            "run_folder": str(tmp),
            "caller_pid": os.getpid(),
            "grace_s": TERM_GRACE_S,
        }
        started = time.perf_counter()
        process = _hand_over(supervision, env) or subprocess.Popen(
            # marshal, not JSON: the supervisor reads it without importing json (built in).
            supervisor_command(marshal.dumps(supervision).hex()),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=str(tmp),
            env=env,
            start_new_session=True,
        )
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    closing = threading.Event()
    return StartedRun(
        process=process,
        folder=tmp,
        channel=channel,
        report=report_path,
        script=path,
        args=[str(a) for a in args],
        workdir=workdir,
        interpreter=chosen,
        scrubbed=scrubbed,
        steps=steps,
        timeout_s=timeout_s,
        sample_every=sample_every,
        max_memory=max_memory,
        nproc=nproc,
        patched=source is not None,
        started=started,
        stdout=OutputTail(process.stdout, closing),
        stderr=OutputTail(process.stderr, closing),
        closing=closing,
    )
