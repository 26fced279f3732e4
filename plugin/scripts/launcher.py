"""Start Gradient Doctor from the plugin folder, setting it up on first use (stdlib only).

The shell shims in ``bin/`` find a Python 3.10+ and run this file:

    launcher.py mcp [--project DIR] [SERVE OPTIONS...]   the MCP server, rooted at DIR
    launcher.py cli [ARGS...]                            the gradient-doctor CLI
    launcher.py setup                                    set up only; print the executable

Where ``gradient-doctor`` comes from, first match wins:

1. ``GRADIENT_DOCTOR_EXECUTABLE`` (an explicit path);
2. the repository's own ``.venv`` when this plugin folder sits in a clone (development);
3. ``gradient-doctor`` on PATH, when its installed version is this plugin's version (or cannot
   be read);
4. a virtual environment this launcher made before, in the data folder
   (``CLAUDE_PLUGIN_DATA``, else ``$XDG_CACHE_HOME/gradient-doctor``, else
   ``~/.cache/gradient-doctor``), keyed by the package version and a hash of its source;
5. otherwise it makes that environment now: ``uv`` when it is on PATH, else ``venv`` + pip,
   installing the package from ``package/`` inside this plugin folder. Those are links to the
   repository's folders, which Claude Code copies as real files when it installs the plugin,
   so the source travels with the plugin; the dependencies come from the package index.

The install runs in its own process (log: ``<data>/setup.log``), so it finishes even when the
host gives up waiting. An MCP host waits about 30 s for a server; when the first install takes
longer, the MCP mode answers the handshake itself with no tools yet, then starts the real server
when the install is done, replays the handshake to it, tells the host that the tool, prompt and
resource lists changed, and relays messages from then on.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import queue
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, BinaryIO

PLUGIN_ROOT = Path(__file__).resolve().parent.parent
PACKAGE_DIR = PLUGIN_ROOT / "package"
BIN_DIR = PLUGIN_ROOT / "bin"
SERVER_NAME = "gradient-doctor"
EXE_NAME = "gradient-doctor.exe" if os.name == "nt" else "gradient-doctor"
#: Files and folders of ``package/`` that a build needs (the repository's layout).
PACKAGE_PARTS = (
    "pyproject.toml",
    "setup.py",
    "README.md",
    "knowledge",
    "probes",
    "templates",
    "skill_server",
)
SKIPPED_PARTS = {"__pycache__", ".mypy_cache", ".pytest_cache", "build", "dist"}
READY_MARKER = ".gradient-doctor-ready"
#: How long the MCP mode waits for a first install before answering the handshake itself.
#: Claude Code gives a server ``MCP_TIMEOUT`` ms (default 30 000) to answer ``initialize``.
DEFAULT_SETUP_WAIT_S = 20.0
#: Environments not used for this long are removed after a new one is made.
STALE_ENV_DAYS = 14


class LaunchError(Exception):
    """A reason the tool cannot start, shown as one line on stderr."""


def say(message: str) -> None:
    """One line on stderr (stdout belongs to the MCP protocol)."""
    print(f"gradient-doctor: {message}", file=sys.stderr, flush=True)


# --- where things are ------------------------------------------------------------------------


def _given(value: str | None) -> str | None:
    """``value`` unless it is empty or a ``${...}`` the host did not expand."""
    if value is None or not value.strip() or "${" in value:
        return None
    return value


def data_dir() -> Path:
    """Where environments and the setup log live (survives plugin updates under Claude Code)."""
    plugin_data = _given(os.environ.get("CLAUDE_PLUGIN_DATA"))
    if plugin_data:
        return Path(plugin_data)
    cache = _given(os.environ.get("XDG_CACHE_HOME"))
    if os.name == "nt" and _given(os.environ.get("LOCALAPPDATA")):
        return Path(os.environ["LOCALAPPDATA"]) / "gradient-doctor"
    return (Path(cache) if cache else Path.home() / ".cache") / "gradient-doctor"


def plugin_version() -> str:
    """The version in ``.claude-plugin/plugin.json`` (generated from the package's)."""
    try:
        manifest = json.loads(
            (PLUGIN_ROOT / ".claude-plugin" / "plugin.json").read_text(encoding="utf-8")
        )
        return str(manifest["version"])
    except (OSError, ValueError, KeyError):
        return "0"


def _venv_executable(venv: Path, name: str = EXE_NAME) -> Path:
    return venv / ("Scripts" if os.name == "nt" else "bin") / name


def _is_executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def installed_version(executable: Path) -> str | None:
    """The version of the ``gradient-doctor`` distribution next to ``executable``, if found."""
    prefix = executable.resolve().parent.parent
    patterns = (
        "lib/python3*/site-packages/gradient_doctor-*.dist-info",
        "lib/python3*/dist-packages/gradient_doctor-*.dist-info",
        "Lib/site-packages/gradient_doctor-*.dist-info",
    )
    for pattern in patterns:
        for info in sorted(prefix.glob(pattern)):
            match = re.match(r"gradient_doctor-(.+)\.dist-info$", info.name)
            if match:
                return match.group(1)
    return None


def _on_path_outside_plugin() -> Path | None:
    """``gradient-doctor`` on PATH, skipping this plugin's own ``bin/`` shim."""
    own = BIN_DIR.resolve()
    for entry in os.environ.get("PATH", "").split(os.pathsep):
        if not entry:
            continue
        candidate = Path(entry) / EXE_NAME
        try:
            if candidate.resolve().parent == own or Path(entry).resolve() == own:
                continue
        except OSError:
            continue
        if _is_executable(candidate):
            return candidate
    return None


def _dev_checkout_executable() -> Path | None:
    """The clone's ``.venv`` when this plugin folder is the one inside the repository."""
    repo = PLUGIN_ROOT.parent
    try:
        pyproject = (repo / "pyproject.toml").read_text(encoding="utf-8")
    except OSError:
        return None
    if not re.search(r'^name\s*=\s*"gradient-doctor"', pyproject, flags=re.MULTILINE):
        return None
    candidate = _venv_executable(repo / ".venv")
    return candidate if _is_executable(candidate) else None


def find_installed() -> tuple[Path, str] | None:
    """An existing ``gradient-doctor`` and why it was chosen, or None (steps 1-3)."""
    explicit = _given(os.environ.get("GRADIENT_DOCTOR_EXECUTABLE"))
    if explicit:
        path = Path(explicit).expanduser()
        if not _is_executable(path):
            raise LaunchError(f"GRADIENT_DOCTOR_EXECUTABLE={explicit} is not an executable file")
        return path, "GRADIENT_DOCTOR_EXECUTABLE"
    dev = _dev_checkout_executable()
    if dev is not None:
        return dev, "the repository's .venv"
    on_path = _on_path_outside_plugin()
    if on_path is not None:
        found = installed_version(on_path)
        wanted = plugin_version()
        if found is None or found == wanted:
            return on_path, "PATH"
        say(f"{on_path} is version {found}, the plugin is {wanted}; using the plugin's own copy")
    return None


# --- the cached environment ------------------------------------------------------------------


def _package_files() -> Iterator[tuple[str, Path]]:
    for part in PACKAGE_PARTS:
        top = PACKAGE_DIR / part
        if top.is_file():
            yield part, top
            continue
        for folder, dirs, files in os.walk(top, followlinks=True):
            dirs[:] = sorted(d for d in dirs if d not in SKIPPED_PARTS and "egg-info" not in d)
            for name in sorted(files):
                if name.endswith((".pyc", ".pyo")):
                    continue
                path = Path(folder) / name
                yield path.relative_to(PACKAGE_DIR).as_posix(), path


def check_package_source() -> None:
    """Fail with one line when ``package/`` is not a buildable copy of the source."""
    missing = [p for p in PACKAGE_PARTS if not (PACKAGE_DIR / p).exists()]
    if missing or not (PACKAGE_DIR / "pyproject.toml").is_file():
        raise LaunchError(
            f"the package source in {PACKAGE_DIR} is incomplete (missing: "
            f"{', '.join(missing) or 'pyproject.toml'}); reinstall the plugin, or install "
            "gradient-doctor yourself (pipx install / uv tool install) so it is on PATH"
        )


def environment_key() -> str:
    """``<version>-<hash>``: a new source (a plugin update) gets a new environment."""
    digest = hashlib.sha256()
    for name, path in _package_files():
        digest.update(name.encode())
        digest.update(b"\0")
        digest.update(path.read_bytes())
        digest.update(b"\0")
    return f"{plugin_version()}-{digest.hexdigest()[:12]}"


def environment_dir(key: str) -> Path:
    return data_dir() / "envs" / key


def ready_executable(key: str) -> Path | None:
    """The environment's ``gradient-doctor`` when its install finished."""
    venv = environment_dir(key)
    executable = _venv_executable(venv)
    if (venv / READY_MARKER).is_file() and _is_executable(executable):
        with contextlib.suppress(OSError):
            os.utime(venv / READY_MARKER)
        return executable
    return None


def log_path() -> Path:
    return data_dir() / "setup.log"


@contextlib.contextmanager
def _setup_lock() -> Iterator[None]:
    """One install at a time across sessions (POSIX advisory lock)."""
    data_dir().mkdir(parents=True, exist_ok=True)
    with open(data_dir() / "setup.lock", "a+b") as handle:
        try:
            import fcntl
        except ImportError:  # Windows: the shims are POSIX-only, so no second installer.
            yield
            return
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _run(command: Sequence[str | os.PathLike[str]], log: BinaryIO, what: str) -> None:
    log.write(("$ " + " ".join(str(c) for c in command) + "\n").encode())
    log.flush()
    completed = subprocess.run(
        [str(c) for c in command], stdout=log, stderr=subprocess.STDOUT, check=False
    )
    if completed.returncode != 0:
        raise LaunchError(f"{what} exited with {completed.returncode}")


def _copy_source(target: Path) -> None:
    """A plain copy of ``package/`` (links followed) to build from, so the plugin stays clean."""
    for name, path in _package_files():
        destination = target / name
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, destination)


def install(key: str) -> Path:
    """Make the environment for ``key`` (under the lock); its ``gradient-doctor``."""
    with _setup_lock():
        ready = ready_executable(key)
        if ready is not None:
            return ready
        final = environment_dir(key)
        final.parent.mkdir(parents=True, exist_ok=True)
        # Built in place: a venv's scripts name its interpreter by absolute path, so it cannot
        # be moved after the install. Readiness is the marker written last; a folder without
        # it is what an interrupted install left, and is rebuilt.
        if final.exists():
            shutil.rmtree(final)
        source = Path(tempfile.mkdtemp(prefix=".source-", dir=final.parent))
        started = time.monotonic()
        try:
            with open(log_path(), "ab") as log:
                log.write(f"\n== {time.strftime('%Y-%m-%d %H:%M:%S')} setting up {key}\n".encode())
                _copy_source(source)
                uv = shutil.which("uv")
                if uv:
                    _run([uv, "venv", "--quiet", "--python", sys.executable, final], log, "uv venv")
                    python = _venv_executable(final, "python")
                    _run(
                        [uv, "pip", "install", "--quiet", "--python", python, source],
                        log,
                        "uv pip install",
                    )
                else:
                    _run([sys.executable, "-m", "venv", final], log, "python -m venv")
                    python = _venv_executable(final, "python.exe" if os.name == "nt" else "python")
                    quiet_pip = ["-m", "pip", "--disable-pip-version-check", "--quiet"]
                    _run([python, *quiet_pip, "install", source], log, "pip install")
                (final / READY_MARKER).write_text(
                    json.dumps({"key": key, "python": sys.executable, "uv": bool(uv)}) + "\n",
                    encoding="utf-8",
                )
                log.write(f"== ready in {time.monotonic() - started:.1f} s: {final}\n".encode())
        except BaseException:
            shutil.rmtree(final, ignore_errors=True)
            raise
        finally:
            shutil.rmtree(source, ignore_errors=True)
        _remove_stale_environments(keep=final)
        ready = ready_executable(key)
        if ready is None:
            raise LaunchError(f"the environment {final} was made but has no {EXE_NAME}")
        return ready


def _remove_stale_environments(keep: Path) -> None:
    cutoff = time.time() - STALE_ENV_DAYS * 86400
    for env in keep.parent.iterdir():
        if env == keep or env.name.startswith("."):
            continue
        marker = env / READY_MARKER
        with contextlib.suppress(OSError):
            if marker.stat().st_mtime < cutoff:
                shutil.rmtree(env, ignore_errors=True)


def failure_line() -> str:
    """Why the last install failed, from the log's last error lines."""
    try:
        lines = log_path().read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        lines = []
    reason = ""
    for line in reversed(lines[-200:]):
        text = line.strip()
        if text.startswith("== failed:"):
            reason = text.removeprefix("== failed:").strip()
            break
    recent = [line.strip() for line in lines[-200:]]
    # pip's own message ("ERROR: No matching distribution found for ...") says the most.
    detail = next((line for line in reversed(recent) if line.startswith("ERROR:")), "") or next(
        (line for line in reversed(recent) if line.lower().startswith("error")), ""
    )
    if any("ensurepip is not available" in line for line in recent):
        detail = "this Python has no venv/ensurepip: install python3-venv (Debian, Ubuntu) or uv"
    parts = [p for p in (reason, detail) if p]
    return f"setting up failed ({'; '.join(parts) or 'see the log'}); log: {log_path()}"


class Setup:
    """The environment for this plugin's source: ready now, or being installed in the background."""

    def __init__(self) -> None:
        check_package_source()
        self.key = environment_key()
        self.installer: subprocess.Popen[bytes] | None = None

    def ready(self) -> Path | None:
        return ready_executable(self.key)

    def start(self) -> None:
        """Start the install in its own session, so it outlives a host that stops waiting."""
        data_dir().mkdir(parents=True, exist_ok=True)
        say(
            f"first run: installing gradient-doctor into {environment_dir(self.key)} "
            f"(once per version; log: {log_path()})"
        )
        with open(log_path(), "ab") as log:
            self.installer = subprocess.Popen(
                [sys.executable, str(Path(__file__).resolve()), "_install", self.key],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def failed(self) -> str | None:
        """The failure line once the installer has exited without a ready environment."""
        if self.installer is None or self.installer.poll() is None or self.ready():
            return None
        return failure_line()

    def wait(self, seconds: float | None) -> Path | None:
        """The executable once ready; None when ``seconds`` pass first (None: wait on)."""
        deadline = None if seconds is None else time.monotonic() + seconds
        if self.ready() is None and self.installer is None:
            self.start()
        while True:
            ready = self.ready()
            if ready is not None:
                return ready
            failure = self.failed()
            if failure is not None:
                raise LaunchError(failure)
            if deadline is not None and time.monotonic() >= deadline:
                return None
            time.sleep(0.2)


def setup_wait_seconds() -> float:
    """How long the MCP mode waits for a first install before answering by itself."""
    explicit = os.environ.get("GRADIENT_DOCTOR_SETUP_WAIT_S")
    if explicit:
        with contextlib.suppress(ValueError):
            return max(0.0, float(explicit))
    host_timeout = os.environ.get("MCP_TIMEOUT")
    if host_timeout:
        with contextlib.suppress(ValueError):
            return max(0.0, min(DEFAULT_SETUP_WAIT_S, float(host_timeout) / 1000 - 10))
    return DEFAULT_SETUP_WAIT_S


# --- the MCP stand-in while a first install runs ---------------------------------------------

REPLAYED_INIT_ID = "gradient-doctor-launcher-initialize"
STAND_IN_INSTRUCTIONS = (
    "Gradient Doctor is installing its Python environment (first run; about a minute). Its "
    "tools, prompts and resources appear when that finishes; the host is told when they do. "
    "Until then, the `gradient-doctor` command (the plugin puts it on PATH) waits for the "
    "install and then runs."
)
EMPTY_LISTS: dict[str, dict[str, list[Any]]] = {
    "tools/list": {"tools": []},
    "prompts/list": {"prompts": []},
    "resources/list": {"resources": []},
    "resources/templates/list": {"resourceTemplates": []},
}


class StandIn:
    """Answers the MCP handshake until the real server can start, then relays to it."""

    def __init__(self, setup: Setup, serve_args: Sequence[str]) -> None:
        self.setup = setup
        self.serve_args = list(serve_args)
        self.handshake: list[dict[str, Any]] = []
        self.inbox: queue.Queue[bytes | None] = queue.Queue()
        self.out_lock = threading.Lock()
        self.out = sys.stdout.buffer

    def send(self, message: dict[str, Any]) -> None:
        self.send_raw(json.dumps(message, separators=(",", ":")).encode() + b"\n")

    def send_raw(self, line: bytes) -> None:
        with self.out_lock:
            self.out.write(line if line.endswith(b"\n") else line + b"\n")
            self.out.flush()

    def _read_client(self) -> None:
        for line in sys.stdin.buffer:
            if line.strip():
                self.inbox.put(line)
        self.inbox.put(None)

    def run(self) -> int:
        threading.Thread(target=self._read_client, daemon=True).start()
        while True:
            executable = self.setup.ready()
            if executable is not None:
                return self.relay(executable)
            try:
                line = self.inbox.get(timeout=0.25)
            except queue.Empty:
                continue
            if line is None:
                return 0  # The host went away; the install goes on in its own process.
            self.answer(line)

    def answer(self, line: bytes) -> None:
        try:
            message = json.loads(line)
        except ValueError:
            return
        if not isinstance(message, dict) or "method" not in message:
            return
        method, request_id = message["method"], message.get("id")
        if method in ("initialize", "notifications/initialized"):
            self.handshake.append(message)
        if request_id is None:
            return
        if method == "initialize":
            params = message.get("params") or {}
            result: dict[str, Any] = {
                "protocolVersion": params.get("protocolVersion", "2025-06-18"),
                "capabilities": {
                    "tools": {"listChanged": True},
                    "prompts": {"listChanged": True},
                    "resources": {"listChanged": True},
                },
                "serverInfo": {"name": SERVER_NAME, "version": plugin_version()},
                "instructions": STAND_IN_INSTRUCTIONS,
            }
            self.send({"jsonrpc": "2.0", "id": request_id, "result": result})
        elif method == "ping":
            self.send({"jsonrpc": "2.0", "id": request_id, "result": {}})
        elif method in EMPTY_LISTS:
            self.send({"jsonrpc": "2.0", "id": request_id, "result": EMPTY_LISTS[method]})
        else:
            reason = self.setup.failed() or (
                f"gradient-doctor is still being installed (first run); log: {log_path()}. "
                "Try again in a minute, or run the `gradient-doctor` command, which waits."
            )
            if method == "tools/call":  # A tool result, so the model reads why.
                result = {"content": [{"type": "text", "text": reason}], "isError": True}
                self.send({"jsonrpc": "2.0", "id": request_id, "result": result})
            else:
                error = {"code": -32603, "message": reason}
                self.send({"jsonrpc": "2.0", "id": request_id, "error": error})

    def relay(self, executable: Path) -> int:
        """Start the real server, replay the handshake, then pass messages both ways."""
        server = subprocess.Popen(
            [str(executable), *self.serve_args], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        assert server.stdin is not None and server.stdout is not None
        to_server, from_server = server.stdin, server.stdout
        initialize = next((m for m in self.handshake if m["method"] == "initialize"), None)
        if initialize is not None:
            to_server.write(json.dumps({**initialize, "id": REPLAYED_INIT_ID}).encode() + b"\n")
            to_server.flush()
            asked = (initialize.get("params") or {}).get("protocolVersion")
            for line in from_server:  # The host has its answer already: drop this one.
                with contextlib.suppress(ValueError, AttributeError):
                    answer = json.loads(line)
                    if answer.get("id") == REPLAYED_INIT_ID:
                        agreed = (answer.get("result") or {}).get("protocolVersion")
                        if asked and agreed and agreed != asked:
                            say(f"the server speaks MCP {agreed}, the host asked for {asked}")
                        break
            for message in self.handshake:
                if message["method"] == "notifications/initialized":
                    to_server.write(json.dumps(message).encode() + b"\n")
            to_server.flush()
            for kind in ("tools", "prompts", "resources"):
                self.send({"jsonrpc": "2.0", "method": f"notifications/{kind}/list_changed"})
        say(f"ready: relaying to {executable}")
        server_closed = threading.Event()

        def pump() -> None:
            for line in from_server:
                self.send_raw(line)
            server_closed.set()

        threading.Thread(target=pump, daemon=True).start()
        try:
            while not server_closed.is_set():
                try:
                    incoming = self.inbox.get(timeout=0.25)
                except queue.Empty:
                    continue
                if incoming is None:
                    break
                to_server.write(incoming)
                to_server.flush()
        except BrokenPipeError:
            pass
        with contextlib.suppress(OSError):
            to_server.close()
        try:
            return server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.terminate()
            return server.wait()


# --- modes -----------------------------------------------------------------------------------


def project_root(argv: list[str]) -> tuple[Path, list[str]]:
    """The project from ``--project DIR`` (unless unexpanded), ``CLAUDE_PROJECT_DIR`` or cwd."""
    rest, chosen = [], None
    index = 0
    while index < len(argv):
        if argv[index] == "--project" and index + 1 < len(argv):
            chosen = _given(argv[index + 1])
            index += 2
            continue
        rest.append(argv[index])
        index += 1
    chosen = chosen or _given(os.environ.get("CLAUDE_PROJECT_DIR")) or os.getcwd()
    root = Path(chosen).expanduser().resolve()
    if not root.is_dir():
        raise LaunchError(f"the project folder {root} does not exist")
    return root, rest


def _exec(executable: Path, args: Sequence[str]) -> int:
    command = [str(executable), *args]
    if os.name == "nt":
        return subprocess.call(command)
    os.execv(command[0], command)
    return 0  # not reached


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    mode, rest = (args[0], args[1:]) if args else ("", [])
    try:
        if mode == "_install":
            try:
                install(rest[0])
            except LaunchError as exc:
                with open(log_path(), "a", encoding="utf-8") as log:
                    log.write(f"== failed: {exc}\n")
                return 1
            return 0
        if mode == "mcp":
            project, serve_options = project_root(rest)
            os.chdir(project)
            serve_args = ["serve", "--root", str(project), *serve_options]
            found = find_installed()
            if found is not None:
                return _exec(found[0], serve_args)
            setup = Setup()
            ready = setup.wait(setup_wait_seconds())
            if ready is not None:
                return _exec(ready, serve_args)
            return StandIn(setup, serve_args).run()
        if mode == "cli":
            found = find_installed()
            executable = found[0] if found else Setup().wait(None)
            assert executable is not None
            return _exec(executable, rest)
        if mode == "setup":
            found = find_installed()
            executable = found[0] if found else Setup().wait(None)
            print(executable if found is None else f"{executable} (from {found[1]})")
            return 0
        say("usage: launcher.py mcp [--project DIR] [OPTIONS] | cli [ARGS] | setup")
        return 2
    except LaunchError as exc:
        say(str(exc))
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
