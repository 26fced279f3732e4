"""Streamable HTTP: loopback Host/Origin protection, remote binds need --allow-remote + a token."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from subprocess import CompletedProcess

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from server_helpers import REPO

pytestmark = pytest.mark.slow

Cli = Callable[..., CompletedProcess[str]]
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "test", "version": "0"},
    },
}
MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
TOKEN = "test-token-0123456789abcdef"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def _serving(root: Path, *args: str, env: dict[str, str] | None = None) -> Iterator[int]:
    port = _free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gradient_doctor.skill_server",
            "serve",
            "--http",
            "--port",
            str(port),
            "--root",
            str(root),
            *args,
        ],
        cwd=REPO,
        env={**os.environ, **(env or {})},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise AssertionError(
                    f"server exited: {process.stderr.read() if process.stderr else ''}"
                )
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                    break
            except OSError:
                time.sleep(0.05)
        else:
            raise AssertionError("server did not start listening")
        yield port
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def test_loopback_refuses_a_foreign_host_header(workspace: Path) -> None:
    with _serving(workspace) as port:
        url = f"http://127.0.0.1:{port}/mcp"
        evil_host = httpx2.post(
            url, json=INITIALIZE, headers={**MCP_HEADERS, "Host": "evil.example"}
        )
        evil_origin = httpx2.post(
            url, json=INITIALIZE, headers={**MCP_HEADERS, "Origin": "http://evil.example"}
        )
        good = httpx2.post(url, json=INITIALIZE, headers=MCP_HEADERS)
    assert evil_host.status_code == 421
    assert evil_origin.status_code == 403
    assert good.status_code == 200


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "PORT"])
def test_loopback_accepts_its_own_names_with_or_without_the_port(
    workspace: Path, host: str
) -> None:
    with _serving(workspace) as port:
        header = f"127.0.0.1:{port}" if host == "PORT" else host
        answer = httpx2.post(
            f"http://127.0.0.1:{port}/mcp",
            json=INITIALIZE,
            headers={**MCP_HEADERS, "Host": header},
        )
        other_port = httpx2.post(
            f"http://127.0.0.1:{port}/mcp",
            json=INITIALIZE,
            headers={**MCP_HEADERS, "Host": "evil.example:80"},
        )
    assert answer.status_code == 200, answer.text
    assert other_port.status_code == 421


@pytest.mark.anyio
async def test_sdk_client_over_http(workspace: Path) -> None:
    with _serving(workspace) as port:
        async with Client(f"http://127.0.0.1:{port}/mcp") as client:
            tools = {t.name for t in (await client.list_tools()).tools}
            result = await client.call_tool("explain", {"id": "clip-after-step"})
    assert "diagnose" in tools
    assert not result.is_error


@pytest.mark.parametrize(
    ("args", "env", "fragment"),
    [
        (("--host", "0.0.0.0"), {}, "--allow-remote"),
        (("--host", "0.0.0.0", "--allow-remote"), {"GRADIENT_DOCTOR_TOKEN": ""}, "bearer token"),
        (("--host", "0.0.0.0", "--allow-remote"), {"GRADIENT_DOCTOR_TOKEN": "short"}, "16"),
        (
            ("--host", "0.0.0.0", "--allow-remote", "--token-file", "/nonexistent/token"),
            {},
            "cannot read --token-file",
        ),
    ],
)
def test_remote_bind_needs_allow_remote_and_a_token(
    cli: Cli, workspace: Path, args: tuple[str, ...], env: dict[str, str], fragment: str
) -> None:
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        result = cli("serve", "--http", "--root", str(workspace), *args, timeout=60)
    finally:
        for key, value in old.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    assert result.returncode == 2
    assert fragment in result.stderr and "Traceback" not in result.stderr


@pytest.mark.anyio
async def test_remote_bind_checks_the_bearer_token(workspace: Path) -> None:
    with _serving(
        workspace, "--host", "0.0.0.0", "--allow-remote", env={"GRADIENT_DOCTOR_TOKEN": TOKEN}
    ) as port:
        url = f"http://127.0.0.1:{port}/mcp"
        anonymous = httpx2.post(url, json=INITIALIZE, headers=MCP_HEADERS)
        wrong = httpx2.post(
            url, json=INITIALIZE, headers={**MCP_HEADERS, "Authorization": "Bearer nope-nope-nope"}
        )
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with (
            httpx2.AsyncClient(headers=headers) as http,
            Client(streamable_http_client(url, http_client=http)) as client,
        ):
            tools = (await client.list_tools()).tools
    assert anonymous.status_code == 401
    assert wrong.status_code == 401
    assert tools


@pytest.mark.anyio
async def test_hostile_scripts_over_http_cannot_reach_the_server_or_its_token(
    workspace: Path, tmp_path: Path
) -> None:
    hostile = REPO / "tests" / "fixtures" / "isolation"
    for name in ("kills_parent.py", "reads_env.py", "_train.py"):
        (workspace / name).write_text((hostile / name).read_text())
    seen = tmp_path / "env.json"
    with _serving(workspace, env={"GRADIENT_DOCTOR_TOKEN": TOKEN}) as port:
        url = f"http://127.0.0.1:{port}/mcp"
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with (
            httpx2.AsyncClient(headers=headers, timeout=300) as http,
            Client(streamable_http_client(url, http_client=http)) as client,
        ):
            killed = await client.call_tool(
                "probe_script",
                {"path": "kills_parent.py", "args": ["KILL"], "steps": 5, "plots": False},
            )
            env_run = await client.call_tool(
                "probe_script",
                {"path": "reads_env.py", "args": [str(seen)], "steps": 2, "plots": False},
            )
            still = await client.call_tool("explain", {"id": "clip-after-step"})
    assert killed.structured_content is not None
    assert killed.structured_content["status"] == "script-error"
    assert env_run.structured_content is not None
    assert env_run.structured_content["status"] == "stopped"
    assert not still.is_error
    script_env = json.loads(seen.read_text())
    assert "GRADIENT_DOCTOR_TOKEN" not in script_env
    assert TOKEN not in json.dumps(script_env)
