"""Protocol details of the MCP server: JSON-RPC error codes, one answer outside the roots, the
cached ``initialize`` answer over stdio, and hostile probed scripts seen from the server."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError
from server_helpers import REPO, process_alive, structured, text_of

from gradient_doctor.skill_server.server import build_server

HOSTILE = REPO / "tests" / "fixtures" / "isolation"
INVALID_PARAMS = -32602
RESOURCE_NOT_FOUND = -32002


def _initialize(version: str = "2025-11-25", request_id: int = 1) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": "initialize",
        "params": {
            "protocolVersion": version,
            "capabilities": {},
            "clientInfo": {"name": "protocol-test", "version": "0"},
        },
    }


# -- error codes -------------------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("name", "arguments", "fragment"),
    [
        ("check-gradients", {}, "needs the argument(s): script_path"),
        ("triage", {"other": "x"}, "needs the argument(s): symptoms"),
        ("no-such-prompt", {}, "unknown prompt 'no-such-prompt'"),
    ],
)
async def test_bad_prompt_requests_are_invalid_params(
    workspace: Path, name: str, arguments: dict[str, str], fragment: str
) -> None:
    async with Client(build_server([workspace])) as client:
        with pytest.raises(MCPError) as caught:
            await client.get_prompt(name, arguments)
        still = await client.get_prompt("triage", {"symptoms": "loss is nan"})
    assert caught.value.error.code == INVALID_PARAMS
    assert fragment in caught.value.error.message
    assert "\n" not in caught.value.error.message
    assert still.messages


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("mode", "code"), [("legacy", RESOURCE_NOT_FOUND), ("auto", INVALID_PARAMS)]
)
@pytest.mark.parametrize(
    "uri", ["gradient-doctor://entry/no-such-id", "gradient-doctor://nowhere", "other://x"]
)
async def test_unknown_resource_is_resource_not_found_for_the_clients_protocol(
    workspace: Path, mode: str, code: int, uri: str
) -> None:
    # 2025-11-25 says -32002 "Resource not found"; 2026-07-28 moved it to -32602.
    async with Client(build_server([workspace]), mode=mode) as client:  # type: ignore[arg-type]
        with pytest.raises(MCPError) as caught:
            await client.read_resource(uri)
    assert caught.value.error.code == code
    assert caught.value.error.data == {"uri": uri}


@pytest.mark.anyio
async def test_every_path_outside_the_roots_gets_the_same_answer(
    workspace: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "exists.py").write_text("x = 1\n")
    (outside / "folder").mkdir()
    (outside / "loop").symlink_to(outside / "loop")
    (workspace / "escape.py").symlink_to(outside / "missing.py")
    names = ["exists.py", "missing.py", "folder", "loop", "folder/deeper/none.py"]
    answers = set()
    async with Client(build_server([workspace])) as client:
        for name in names:
            for tool, args in (
                ("lint_script", {"path": str(outside / name)}),
                ("probe_script", {"path": str(outside / name)}),
            ):
                result = await client.call_tool(tool, args)
                assert result.is_error
                answer = text_of(result).replace(str(outside / name), "PATH")
                answers.add(answer.replace(tool, "TOOL"))
        escaped = await client.call_tool("lint_script", {"path": "escape.py"})
    assert len(answers) == 1, answers
    assert "outside the allowed roots" in answers.pop()
    assert "outside the allowed roots" in text_of(escaped)


# -- stdio, raw ------------------------------------------------------------------------------------


@contextmanager
def _raw_server(
    root: Path, cache: Path, *extra: str, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    command = [sys.executable, "-m", "gradient_doctor.skill_server", "serve", "--root", str(root)]
    process = subprocess.Popen(
        [*command, *extra],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "XDG_CACHE_HOME": str(cache), **(env or {})},
    )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=10)


def _send(process: subprocess.Popen[bytes], message: dict[str, Any]) -> None:
    assert process.stdin is not None
    process.stdin.write((json.dumps(message) + "\n").encode())
    process.stdin.flush()


def _read(stream: IO[bytes] | None, wanted: int) -> dict[str, Any]:
    assert stream is not None
    while True:
        line = stream.readline()
        assert line, "the server closed its stdout"
        message = json.loads(line)
        if message.get("id") == wanted:
            return dict(message)


def _handshake(process: subprocess.Popen[bytes], version: str = "2025-11-25") -> dict[str, Any]:
    _send(process, _initialize(version))
    answer = _read(process.stdout, 1)
    _send(process, {"jsonrpc": "2.0", "method": "notifications/initialized"})
    return answer


@pytest.mark.slow
def test_stdio_errors_carry_the_spec_codes_and_no_traceback(
    workspace: Path, tmp_path: Path
) -> None:
    with _raw_server(workspace, tmp_path / "cache") as server:
        _handshake(server)
        _send(server, {"jsonrpc": "2.0", "id": 2, "method": "prompts/get",
                       "params": {"name": "check-gradients", "arguments": {}}})  # fmt: skip
        missing = _read(server.stdout, 2)
        _send(server, {"jsonrpc": "2.0", "id": 3, "method": "resources/read",
                       "params": {"uri": "gradient-doctor://entry/nope"}})  # fmt: skip
        unknown = _read(server.stdout, 3)
        _send(server, {"jsonrpc": "2.0", "id": 4, "method": "tools/list"})
        tools = _read(server.stdout, 4)
        assert server.stdin is not None
        server.stdin.close()
        server.wait(timeout=30)
        assert server.stderr is not None
        stderr = server.stderr.read().decode()
    assert missing["error"]["code"] == INVALID_PARAMS
    assert unknown["error"]["code"] == RESOURCE_NOT_FOUND
    assert tools["result"]["tools"]
    assert "Traceback" not in stderr, stderr


@pytest.mark.slow
def test_initialize_from_the_cache_is_the_sdks_own_answer(workspace: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    answers = []
    for _ in range(2):  # the first start fills the cache from the SDK, the second answers from it
        with _raw_server(workspace, cache) as server:
            answers.append(_handshake(server))
            _send(server, {"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
            assert _read(server.stdout, 2)["result"]["tools"]
    assert answers[0] == answers[1]
    assert answers[0]["result"]["serverInfo"]["name"] == "gradient-doctor"
    (cached,) = (cache / "gradient-doctor").glob("initialize-*.json")
    assert json.loads(cached.read_text())["2025-11-25"] == answers[0]["result"]

    # A stale entry (another SDK, another server version) is answered once, then replaced.
    stale = json.loads(cached.read_text())
    stale["2025-11-25"]["instructions"] = "stale"
    cached.write_text(json.dumps(stale))
    with _raw_server(workspace, cache) as server:
        assert _handshake(server)["result"]["instructions"] == "stale"
        _send(server, {"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
        _read(server.stdout, 2)
    assert json.loads(cached.read_text())["2025-11-25"] == answers[0]["result"]


@pytest.mark.slow
def test_gradient_doctor_cache_dir_moves_the_initialize_cache_or_turns_it_off(
    workspace: Path, tmp_path: Path
) -> None:
    xdg = tmp_path / "xdg"
    moved = tmp_path / "moved"
    with _raw_server(workspace, xdg, env={"GRADIENT_DOCTOR_CACHE_DIR": str(moved)}) as server:
        assert _handshake(server)["result"]["serverInfo"]["name"] == "gradient-doctor"
    assert list(moved.glob("initialize-*.json"))
    assert not xdg.exists()

    # Set but empty: caching is off, the SDK answers every time and nothing is written.
    with _raw_server(workspace, xdg, env={"GRADIENT_DOCTOR_CACHE_DIR": ""}) as server:
        assert _handshake(server)["result"]["serverInfo"]["name"] == "gradient-doctor"
        _send(server, {"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
        assert _read(server.stdout, 2)["result"]["tools"]
    assert not xdg.exists()


@pytest.mark.slow
def test_a_first_message_that_is_not_initialize_reaches_the_sdk(
    workspace: Path, tmp_path: Path
) -> None:
    with _raw_server(workspace, tmp_path / "cache") as server:
        _send(server, {"jsonrpc": "2.0", "id": 7, "method": "tools/list"})
        answer = _read(server.stdout, 7)
        assert "error" in answer or "result" in answer
        # An unknown protocol version is negotiated by the SDK itself (no cache entry).
        negotiated = _handshake(server, version="1999-01-01")
    assert negotiated["result"]["protocolVersion"] != "1999-01-01"


# -- hostile scripts, seen from the server ---------------------------------------------------------


@pytest.mark.slow
def test_server_survives_a_script_that_kills_its_parent(workspace: Path, tmp_path: Path) -> None:
    for name in ("kills_parent.py", "_train.py"):
        (workspace / name).write_text((HOSTILE / name).read_text())
    with _raw_server(workspace, tmp_path / "cache") as server:
        _handshake(server)
        outcomes = {}
        for request_id, sig in enumerate(("TERM", "KILL"), start=10):
            _send(server, {"jsonrpc": "2.0", "id": request_id, "method": "tools/call",
                           "params": {"name": "probe_script", "arguments": {
                               "path": "kills_parent.py", "args": [sig], "steps": 5,
                               "plots": False}}})  # fmt: skip
            outcomes[sig] = _read(server.stdout, request_id)["result"]["structuredContent"]
        explain = {"name": "explain", "arguments": {"id": "clip-after-step"}}
        _send(server, {"jsonrpc": "2.0", "id": 20, "method": "tools/call", "params": explain})
        still = _read(server.stdout, 20)
        assert server.poll() is None
    assert outcomes["TERM"]["status"] == "stopped"
    assert outcomes["TERM"]["measurements"]["isolation"]["parent_signals"]
    assert outcomes["KILL"]["status"] == "script-error"
    assert outcomes["KILL"]["measurements"]["isolation"]["parent_killed"] == "SIGKILL"
    assert not still["result"].get("isError")


@pytest.mark.slow
def test_server_token_is_not_in_the_scripts_environment(workspace: Path, tmp_path: Path) -> None:
    for name in ("reads_env.py", "_train.py"):
        (workspace / name).write_text((HOSTILE / name).read_text())
    seen = tmp_path / "env.json"
    env = {
        "GRADIENT_DOCTOR_TOKEN": "default-variable-token-123456",
        "TEAM_MCP_TOKEN": "named-variable-token-123456",
        "HF_HOME": str(tmp_path / "hf"),
    }
    params = ["--token-env", "TEAM_MCP_TOKEN"]
    with _raw_server(workspace, tmp_path / "cache", *params, env=env) as server:
        _handshake(server)
        _send(server, {"jsonrpc": "2.0", "id": 5, "method": "tools/call",
                       "params": {"name": "probe_script", "arguments": {
                           "path": "reads_env.py", "args": [str(seen)], "steps": 2,
                           "plots": False}}})  # fmt: skip
        report = _read(server.stdout, 5)["result"]["structuredContent"]
    script_env = json.loads(seen.read_text())
    assert "GRADIENT_DOCTOR_TOKEN" not in script_env and "TEAM_MCP_TOKEN" not in script_env
    assert not [k for k, v in script_env.items() if "variable-token" in v]
    assert script_env["HF_HOME"] == env["HF_HOME"]
    assert report["measurements"]["isolation"]["scrubbed_env"] == [
        "GRADIENT_DOCTOR_TOKEN",
        "TEAM_MCP_TOKEN",
    ]


@pytest.mark.slow
def test_probe_dies_with_the_server(workspace: Path, tmp_path: Path) -> None:
    for name in ("setsid_daemon.py", "_train.py"):
        (workspace / name).write_text((HOSTILE / name).read_text())
    pids = tmp_path / "pids"
    with _raw_server(workspace, tmp_path / "cache") as server:
        _handshake(server)
        _send(server, {"jsonrpc": "2.0", "id": 5, "method": "tools/call",
                       "params": {"name": "probe_script", "arguments": {
                           "path": "setsid_daemon.py", "args": [str(pids), "hang"],
                           "timeout_s": 300}}})  # fmt: skip
        deadline = time.time() + 120
        while time.time() < deadline and not (pids.exists() and pids.read_text().strip()):
            time.sleep(0.05)
        script, daemon = (int(p) for p in pids.read_text().split())
        assert process_alive(script) and process_alive(daemon)
        os.kill(server.pid, signal.SIGKILL)
        server.wait(timeout=10)
    deadline = time.time() + 3.0
    while time.time() < deadline and (process_alive(script) or process_alive(daemon)):
        time.sleep(0.05)
    assert not process_alive(script) and not process_alive(daemon)


@pytest.mark.anyio
async def test_cwd_argument_and_the_default_folder(workspace: Path, tmp_path: Path) -> None:
    project = workspace / "project"
    project.mkdir()
    for name in ("reports_cwd.py", "_train.py"):
        (project / name).write_text((HOSTILE / name).read_text())
    seen = tmp_path / "seen.json"
    async with Client(build_server([workspace])) as client:
        default = await client.call_tool(
            "probe_script",
            {"path": "project/reports_cwd.py", "args": [str(seen)], "steps": 2, "plots": False},
        )
        default_cwd = json.loads(seen.read_text())["cwd"]
        moved = await client.call_tool(
            "probe_script",
            {"path": "project/reports_cwd.py", "args": [str(seen)], "steps": 2, "plots": False,
             "cwd": "."},
        )  # fmt: skip
        moved_cwd = json.loads(seen.read_text())["cwd"]
        outside = await client.call_tool(
            "probe_script", {"path": "project/reports_cwd.py", "cwd": str(tmp_path)}
        )
    assert structured(default)["status"] == "stopped"
    assert default_cwd == str(project)
    assert structured(moved)["status"] == "stopped" and moved_cwd == str(workspace)
    assert outside.is_error and "outside the allowed roots" in text_of(outside)
