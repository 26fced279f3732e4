"""The probe's supervisor: the process between the caller (server or CLI) and the probed script.

Standard library only, Linux first (other POSIX systems lose the subreaper and the parent-death
signal, nothing else). The runner starts it in the tool's own interpreter as
``python -I -S -c "...; import supervisor; supervisor.run()" CONFIG`` (imported from this file's
folder, so that its cached bytecode is used; CONFIG: the settings as :mod:`marshal` bytes in
hex) with the child's environment; the process tree is::

    caller ── supervisor ── shim ── child (the user's interpreter: python -m PROBE SCRIPT ...)
              (subreaper)   (a fork of the supervisor; the script's parent)

Why each piece:

- **The script's parent is the shim, not the caller.** Whatever the script does to
  ``os.getppid()`` stays below the caller: the shim blocks every catchable signal and records who
  sent it (SIGTERM, SIGINT, SIGHUP, ... are ignored); SIGKILL ends the shim, which takes the
  child with it (the child's parent-death signal) and nothing above it.
- **Descendants are collected.** The supervisor is a child subreaper
  (``PR_SET_CHILD_SUBREAPER``): processes that the script starts and then orphans (a double
  fork, a ``setsid`` daemon) are re-parented to it rather than to init, so at the end every one
  of them is in its own subtree, where it stops them (SIGTERM, a grace period, SIGKILL).
- **The probe dies with the caller.** The supervisor's stdin is a pipe from the caller (its
  lifeline): end of file means the caller is gone (even after SIGKILL), ``stop`` means stop now;
  its parent changing means the same. The shim and the child carry ``PR_SET_PDEATHSIG``
  (SIGKILL), so they die with their own parent too.
- **Memory cap.** ``max_memory`` (bytes) becomes the child's ``RLIMIT_AS``.

The supervisor writes what it saw as JSON to ``report`` (see :func:`main`) and exits 0; the
caller reads the script's own results from the probe's side channel.

Start-up is on the critical path (every millisecond before the script's interpreter is started
adds to the probe's wall time): before the shim has started the child, only the modules the
start needs are imported (``ctypes`` for ``prctl``, the C module ``_signal`` rather than
``signal`` and its enums, ``resource``; no ``typing``; the configuration is :mod:`marshal`,
built in, rather than JSON, and the shim starts the child with ``fork`` and ``exec`` rather
than :mod:`subprocess`). ``json`` and the rest come after, beside the script. The end is on the
critical path too: ``json`` is imported at the first quiet poll rather than for the final
report, and the process ends with ``os._exit`` (no interpreter teardown).
"""

from __future__ import annotations

import ctypes
import marshal
import os
import resource
import select
import sys
import time

# Not ``typing.TYPE_CHECKING``: importing ``typing`` (and the ``re`` it imports) costs some 6 ms
# before the script's interpreter can start. Type checkers treat any TYPE_CHECKING as true.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import signal
    from typing import Any
else:
    try:
        # The C module under ``signal``: the same functions and numbers without the enum
        # wrappers, whose import (``enum``) costs some 5 ms before the script's interpreter can
        # start. Signal names come from ``signal`` itself, imported once the script runs.
        import _signal as signal
    except ImportError:  # another implementation than CPython
        import signal

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
#: How long processes the script left behind get between SIGTERM and SIGKILL once it has ended.
LEFTOVER_GRACE_S = 0.3
#: Bound on the final sweeps (a process forking as fast as we kill still ends the sweep).
SWEEP_LIMIT_S = 5.0
POLL_S = 0.5
#: ``argv[1]`` of a supervisor started ahead of its run (the same text as
#: ``prestart.CONFIG_ON_STDIN``; not imported: this file imports nothing of the tool's).
CONFIG_ON_STDIN = "-"
_DEADLY = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def _prctl() -> Any:
    """libc's ``prctl``, or None where there is none (not Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    # The process's own symbols include libc's: no ``find_library``, which runs
    # ``ldconfig -p`` in a subprocess (in the caller, which imports this module, and here).
    for name in (None, "libc.so.6"):
        try:
            return ctypes.CDLL(name, use_errno=True).prctl
        except (OSError, AttributeError):
            continue
    from ctypes.util import find_library  # rarely needed; its imports delay the script's start

    try:
        return ctypes.CDLL(find_library("c"), use_errno=True).prctl
    except (OSError, AttributeError, TypeError):
        return None


PRCTL = _prctl()


def _set_parent_death_signal(expected_parent: int) -> None:
    """SIGKILL this process when its parent dies; exit now if the parent is already gone."""
    if PRCTL is not None:
        PRCTL(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != expected_parent:
        os._exit(1)


def _read_line(fd: int) -> tuple[bytes, bytes]:
    """Read ``fd`` up to the first newline: (the line without it, what came after it). End of
    file before a newline gives an empty line."""
    data = b""
    while b"\n" not in data:
        try:
            chunk = os.read(fd, 1 << 16)
        except InterruptedError:  # pragma: no cover - retried by Python itself (PEP 475)
            continue
        except OSError:
            return b"", b""
        if not chunk:
            return b"", b""
        data += chunk
    line, _, rest = data.partition(b"\n")
    return line, rest


def _catchable() -> set[int]:
    return {int(s) for s in signal.valid_signals() if s not in (signal.SIGKILL, signal.SIGSTOP)}


def _signal_name(number: int) -> str:
    """``SIGTERM`` for 15 (``signal`` is imported here, after the script has started)."""
    import signal as named

    try:
        return named.Signals(number).name
    except ValueError:
        return str(number)


def _preload_json() -> None:
    """Import ``json`` (and ``re``, some 10 ms) while the script runs: the final report needs
    it, and importing it only then would delay the end of every run."""
    import json  # noqa: F401


def _write_json(path: str, payload: dict[str, Any]) -> None:
    import json  # after the child has started: not on the critical path

    temporary = f"{path}.tmp{os.getpid()}"
    with open(temporary, "w", encoding="utf-8") as handle:
        json.dump(payload, handle)
    os.replace(temporary, path)


# -- the shim: the script's parent --------------------------------------------------------------


def _run_shim(config: dict[str, Any], supervisor: int) -> None:
    """Start the child and wait for it; never returns (``os._exit``)."""
    _set_parent_death_signal(supervisor)
    # A group of its own: ``killpg`` of the script's parent's group reaches the shim only.
    with _suppress(OSError):
        os.setpgid(0, 0)
    report = f"{config['report']}.parent"
    blocked = _catchable()
    signal.pthread_sigmask(signal.SIG_BLOCK, blocked)
    shim = os.getpid()
    max_memory = config.get("max_memory")

    def prepare_child() -> None:
        # Runs in the forked child before exec: it dies with the shim, gets the memory cap,
        # and receives signals normally again.
        _set_parent_death_signal(shim)
        if max_memory:
            resource.setrlimit(resource.RLIMIT_AS, (int(max_memory), int(max_memory)))
        signal.pthread_sigmask(signal.SIG_SETMASK, set())

    state: dict[str, Any] = {"signals": []}
    if not hasattr(signal, "sigtimedwait"):
        # No sigtimedwait (macOS): handlers note the signal (not its sender) and are reset to
        # the default in the child by exec itself.
        signal.pthread_sigmask(signal.SIG_UNBLOCK, blocked)

        def note(signum: int, _frame: Any) -> None:
            state["signals"].append({"signal": _signal_name(signum), "from_pid": None})
            _write_json(report, state)

        for sig in blocked - {signal.SIGCHLD}:
            with _suppress(OSError, ValueError, RuntimeError):
                signal.signal(sig, note)
    child = _start_child(config, prepare_child, state, report)
    state["child_pid"] = child
    _write_json(report, state)
    if not hasattr(signal, "sigtimedwait"):
        _, status = os.waitpid(child, 0)  # retried across the handlers (PEP 475)
        state["returncode"] = os.waitstatus_to_exitcode(status)
        _write_json(report, state)
        os._exit(0)
    while True:
        info = signal.sigtimedwait(blocked, POLL_S)
        if info is not None and info.si_signo != signal.SIGCHLD:
            if info.si_pid not in (supervisor, 0):
                # Someone below us (the script, in practice) signalled its parent: ignored.
                state["signals"].append(
                    {"signal": _signal_name(info.si_signo), "from_pid": info.si_pid}
                )
                _write_json(report, state)
            continue
        try:
            pid, status = os.waitpid(child, os.WNOHANG)
        except ChildProcessError:
            pid, status = child, 0
        if pid == child:
            state["returncode"] = os.waitstatus_to_exitcode(status)
            _write_json(report, state)
            os._exit(0)


def _start_child(config: dict[str, Any], prepare: Any, state: dict[str, Any], report: str) -> int:
    """Fork and exec the child as ``subprocess.Popen(command, cwd=..., stdin=DEVNULL,
    start_new_session=True, preexec_fn=prepare)`` would, without importing ``subprocess``
    (some 8 ms before the script's interpreter could start). An exec failure comes back over a
    close-on-exec pipe: the report names it and the shim exits 127. Returns the child's pid."""
    command = [str(part) for part in config["command"]]
    errors_read, errors_write = os.pipe()  # both close-on-exec (PEP 446)
    child = os.fork()
    if child == 0:
        try:
            os.close(errors_read)
            prepare()
            # What ``Popen(restore_signals=True)`` does: Python ignores these two, and an
            # ignored signal would stay ignored across exec (in the script's own subprocesses).
            for name in ("SIGPIPE", "SIGXFSZ"):
                if hasattr(signal, name):
                    signal.signal(getattr(signal, name), signal.SIG_DFL)
            os.setsid()
            os.chdir(config["cwd"])
            devnull = os.open(os.devnull, os.O_RDONLY)
            os.dup2(devnull, 0)
            if devnull != 0:
                os.close(devnull)
            env = config.get("env")
            if env is None:
                os.execvp(command[0], command)
            os.execvpe(command[0], command, env)
        except OSError as exc:
            message = f"{exc.strerror or exc}: {command[0]}"
        except BaseException as exc:  # whatever fails before exec must reach the shim
            message = f"{type(exc).__name__}: {command[0]}"
        try:
            os.write(errors_write, message.encode("utf-8", "replace"))
        finally:
            os._exit(127)
    os.close(errors_write)
    failure = b""
    while True:
        try:
            chunk = os.read(errors_read, 4096)
        except InterruptedError:  # pragma: no cover - retried by Python itself (PEP 475)
            continue
        if not chunk:
            break
        failure += chunk
    os.close(errors_read)
    if failure:
        with _suppress(ChildProcessError):
            os.waitpid(child, 0)
        state["exec_error"] = failure.decode("utf-8", "replace")
        _write_json(report, state)
        os._exit(127)
    return child


class _suppress:
    """``contextlib.suppress`` without importing ``contextlib`` (and ``functools``, ``re``...)
    before the child has started."""

    def __init__(self, *exceptions: type[BaseException]) -> None:
        self._exceptions = exceptions

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: object, value: object, trace: object) -> bool:
        return isinstance(value, self._exceptions)


# -- the supervisor ------------------------------------------------------------------------------


def _children_map() -> dict[int, list[int]]:
    """Parent pid → child pids of every process we can see (from /proc, else from ``ps``)."""
    tree: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return _children_map_from_ps()
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                stat = handle.read()
        except OSError:
            continue
        # The command name may hold spaces and parentheses: fields start after the last ")".
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) < 2 or fields[0] in (b"Z", b"X"):
            continue
        tree.setdefault(int(fields[1]), []).append(int(entry))
    return tree


def _children_map_from_ps() -> dict[int, list[int]]:
    """The same map where there is no /proc (macOS): ``ps -A -o pid= -o ppid= -o stat=``."""
    tree: dict[int, list[int]] = {}
    import subprocess  # no /proc: not Linux, where the start's cost matters less

    try:
        listing = subprocess.run(
            ["ps", "-A", "-o", "pid=", "-o", "ppid=", "-o", "stat="],
            capture_output=True, text=True, check=True, timeout=10,
        ).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return tree
    for line in listing.splitlines():
        fields = line.split()
        if len(fields) >= 3 and fields[0].isdigit() and not fields[2].startswith("Z"):
            tree.setdefault(int(fields[1]), []).append(int(fields[0]))
    return tree


def _descendants(root: int) -> list[int]:
    """Live (non-zombie) processes below ``root``, parents before children."""
    tree = _children_map()
    found: list[int] = []
    frontier = list(tree.get(root, []))
    while frontier:
        pid = frontier.pop(0)
        found.append(pid)
        frontier.extend(tree.get(pid, []))
    return found


def _name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm", encoding="utf-8", errors="replace") as handle:
            return handle.read().strip() or "?"
    except OSError:
        return "?"


def _reap(statuses: dict[int, int]) -> None:
    """Collect every exited child (our own and the orphans we adopted)."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        statuses[pid] = status


def _signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        with _suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def _stop_subtree(grace_s: float, statuses: dict[int, int], skip: int | None) -> list[int]:
    """SIGTERM every descendant (but ``skip``, which blocks it), wait up to ``grace_s``, then
    SIGKILL what is left until nothing is. Returns the pids found running at the start."""
    me = os.getpid()
    first = _descendants(me)
    if not first:
        _reap(statuses)
        return first
    _signal_all([p for p in first if p != skip], signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        _reap(statuses)
        if not [p for p in _descendants(me) if p != skip]:
            break
        time.sleep(0.02)
    deadline = time.monotonic() + SWEEP_LIMIT_S
    while time.monotonic() < deadline:
        left = _descendants(me)
        if not left:
            break
        _signal_all(left, signal.SIGKILL)
        time.sleep(0.01)
        _reap(statuses)
    _reap(statuses)
    return first


def _read_shim_report(config: dict[str, Any]) -> dict[str, Any]:
    import json

    with (
        _suppress(OSError, ValueError),
        open(f"{config['report']}.parent", encoding="utf-8") as handle,
    ):
        loaded = json.load(handle)
        return loaded if isinstance(loaded, dict) else {}
    return {}


def _describe_status(status: int | None) -> dict[str, Any]:
    if status is None:
        return {}
    if os.WIFSIGNALED(status):
        return {"signal": _signal_name(os.WTERMSIG(status))}
    return {"exit_code": os.waitstatus_to_exitcode(status)}


def main() -> int:
    """Supervise one probe run (see the module docstring); the report says what happened."""
    pending = b""
    if sys.argv[1] == CONFIG_ON_STDIN:
        # Started ahead of the run (``probes.runtime.prestart``): the configuration comes as
        # one line on the lifeline, and the process works in the run's folder as it would
        # have been started there. No line (end of file): no run came, nothing to do.
        line, pending = _read_line(0)
        if not line:
            return 0
        config: dict[str, Any] = marshal.loads(bytes.fromhex(line.decode("ascii")))
        with _suppress(OSError, KeyError):
            os.chdir(config["run_folder"])
    else:
        config = marshal.loads(bytes.fromhex(sys.argv[1]))
    caller = int(config["caller_pid"])
    if PRCTL is not None:
        PRCTL(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    if os.getppid() != caller:
        return 1
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    os.set_blocking(wake_read, False)
    signal.set_wakeup_fd(wake_write)
    stop: dict[str, str] = {"reason": "stop"} if b"stop" in pending else {}

    def on_deadly(signum: int, _frame: Any) -> None:
        stop.setdefault("reason", _signal_name(signum))

    for sig in _DEADLY:
        signal.signal(sig, on_deadly)
    signal.signal(signal.SIGCHLD, lambda *_: None)

    me = os.getpid()
    shim = os.fork()
    if shim == 0:
        signal.set_wakeup_fd(-1)
        os.close(wake_read)
        os.close(wake_write)
        for sig in (*_DEADLY, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        try:
            _run_shim(config, me)
        finally:
            os._exit(70)

    statuses: dict[int, int] = {}
    lifeline_open = True
    while "reason" not in stop:
        watched = [wake_read, 0] if lifeline_open else [wake_read]
        ready, _, _ = select.select(watched, [], [], POLL_S)
        if not ready and "json" not in sys.modules:
            # The first quiet moment (the script's interpreter is importing torch by now).
            _preload_json()
        if wake_read in ready:
            with _suppress(OSError):
                os.read(wake_read, 512)
        if 0 in ready:
            data = os.read(0, 64)
            if not data:
                lifeline_open = False
                stop["reason"] = "caller-gone"
            elif b"stop" in data:
                stop["reason"] = "stop"
        _reap(statuses)
        if shim in statuses:
            break
        if os.getppid() != caller:
            stop["reason"] = "caller-gone"

    shim_report: dict[str, Any] = {}
    left_behind: list[str] = []
    if "reason" in stop:
        _stop_subtree(float(config.get("grace_s", 1.0)), statuses, skip=shim)
    else:
        # The child has ended (or is ending: its parent, the shim, is gone): whatever else
        # still runs below us was left behind by the script (a daemon, a double fork, a worker).
        shim_report = _read_shim_report(config)
        names = {pid: _name(pid) for pid in _descendants(me)}
        names.pop(shim_report.get("child_pid", -1), None)
        stopped = _stop_subtree(LEFTOVER_GRACE_S, statuses, None)
        left_behind = [names[p] for p in stopped if p in names]
    if stop.get("reason") == "caller-gone":
        # Nobody will read the report: leave nothing behind either.
        import shutil  # only here: the imports at the top delay the script's start

        shutil.rmtree(config["run_folder"], ignore_errors=True)
        return 0
    shim_report = _read_shim_report(config)
    _write_json(
        config["report"],
        {
            **shim_report,
            "stopped": stop.get("reason"),
            "shim": _describe_status(statuses.get(shim)),
            "left_behind": left_behind,
        },
    )
    return 0


def run() -> None:
    """The process: :func:`main`, then ``os._exit`` with its status. Not ``sys.exit``: the
    interpreter's teardown takes some 15 ms, all of it between the script's end and the
    caller's report, and nothing is left to finalise (the reports are written and closed, no
    thread or atexit handler runs here)."""
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    run()
