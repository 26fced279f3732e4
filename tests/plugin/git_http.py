"""A throwaway smart-HTTP git server on loopback, so Claude Code can add a git marketplace.

Claude Code clones a marketplace given as a URL (shallowly, which git's dumb HTTP cannot
serve), so the test serves the repository through ``git http-backend`` behind a small WSGI
server: the same path a GitHub marketplace takes, without the network.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


def _backend(project_root: Path) -> Any:
    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        length = int(environ.get("CONTENT_LENGTH") or 0)
        body = environ["wsgi.input"].read(length) if length else b""
        cgi_env = {
            "PATH": os.environ.get("PATH", ""),
            "GIT_PROJECT_ROOT": str(project_root),
            "GIT_HTTP_EXPORT_ALL": "1",
            "REQUEST_METHOD": environ["REQUEST_METHOD"],
            "PATH_INFO": environ.get("PATH_INFO", ""),
            "QUERY_STRING": environ.get("QUERY_STRING", ""),
            "CONTENT_TYPE": environ.get("CONTENT_TYPE", ""),
            "CONTENT_LENGTH": str(len(body)),
            "REMOTE_ADDR": "127.0.0.1",
        }
        if environ.get("HTTP_GIT_PROTOCOL"):
            cgi_env["GIT_PROTOCOL"] = environ["HTTP_GIT_PROTOCOL"]
        out = subprocess.run(
            ["git", "-c", "safe.directory=*", "http-backend"],
            input=body,
            env=cgi_env,
            capture_output=True,
            check=False,
        ).stdout
        head, _, payload = out.partition(b"\r\n\r\n")
        if not _:
            head, _, payload = out.partition(b"\n\n")
        status, headers = "200 OK", []
        for raw in head.decode("latin-1").splitlines():
            name, _, value = raw.partition(":")
            if name.lower() == "status":
                status = value.strip()
            elif name:
                headers.append((name.strip(), value.strip()))
        start_response(status, headers)
        return [payload]

    return app


def snapshot(repo: Path, target: Path) -> Path:
    """A new one-commit git repository holding ``repo``'s working tree as git sees it (tracked
    and untracked-but-not-ignored files, links kept as links): what a fresh clone would get."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=repo,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for raw in filter(None, listed):
        relative = raw.decode()
        source, destination = repo / relative, target / relative
        if not source.is_symlink() and not source.exists():
            continue  # deleted in the working tree
        destination.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():
            os.symlink(os.readlink(source), destination)
        else:
            shutil.copy2(source, destination)
    git = ["git", "-c", "user.name=test", "-c", "user.email=test@example.invalid"]
    for command in (["init", "--quiet"], ["add", "-A"], ["commit", "--quiet", "-m", "snapshot"]):
        subprocess.run([*git, *command], cwd=target, check=True, capture_output=True)
    return target


@contextmanager
def serve_repository(source: Path, workdir: Path) -> Iterator[str]:
    """Serve a bare clone of the git repository ``source`` at the returned URL."""
    bare = workdir / "repo.git"
    subprocess.run(
        ["git", "clone", "--quiet", "--bare", str(source), str(bare)],
        check=True,
        capture_output=True,
    )
    server = make_server(
        "127.0.0.1",
        0,
        _backend(workdir),
        server_class=_ThreadingServer,
        handler_class=_QuietHandler,
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/repo.git"
    finally:
        server.shutdown()
        server.server_close()
