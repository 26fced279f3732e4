"""Confinement, size caps, --no-exec, and that a bad call is one readable line, not a crash."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from mcp import Client
from server_helpers import structured, text_of

from gradient_doctor.skill_server.safety import MAX_SOURCE_BYTES, InputError, PathPolicy
from gradient_doctor.skill_server.server import ProbeQueue, build_server

pytestmark = pytest.mark.anyio


async def _call(server, tool: str, args: dict):  # type: ignore[no-untyped-def]
    async with Client(server) as client:
        return await client.call_tool(tool, args)


def _assert_one_line_error(result, *fragments: str) -> None:  # type: ignore[no-untyped-def]
    assert result.is_error
    message = text_of(result)
    assert "\n" not in message.strip() and "Traceback" not in message
    for fragment in fragments:
        assert fragment in message, message


async def test_path_outside_the_roots_is_refused(workspace: Path, tmp_path: Path) -> None:
    outside = tmp_path / "secret.py"
    outside.write_text("print('hi')\n")
    result = await _call(build_server([workspace]), "lint_script", {"path": str(outside)})
    _assert_one_line_error(result, "outside the allowed roots")
    dotdot = await _call(build_server([workspace]), "lint_script", {"path": "../secret.py"})
    _assert_one_line_error(dotdot, "outside the allowed roots")


async def test_symlink_escaping_the_root_is_refused(workspace: Path, tmp_path: Path) -> None:
    target = tmp_path / "elsewhere.py"
    target.write_text("x = 1\n")
    (workspace / "link.py").symlink_to(target)
    result = await _call(build_server([workspace]), "lint_script", {"path": "link.py"})
    _assert_one_line_error(result, "outside the allowed roots")


async def test_extra_root_allows_that_directory(workspace: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    (other / "train.py").write_text("x = 1\n")
    result = await _call(
        build_server([workspace, other]), "lint_script", {"path": str(other / "train.py")}
    )
    assert structured(result)["findings"] == []


@pytest.mark.parametrize(
    ("name", "content", "fragment"),
    [
        ("missing.py", None, "no such file"),
        ("binary.py", b"\x00\x01\x02torch", "binary"),
        ("latin1.py", "x = 'caf\xe9'\n".encode("latin-1"), "not UTF-8"),
        ("huge.py", b"#" * (MAX_SOURCE_BYTES + 10), "limit"),
        ("broken.py", b"def f(:\n", "broken.py"),
    ],
)
async def test_bad_files_give_one_line(
    workspace: Path, name: str, content: bytes | None, fragment: str
) -> None:
    if content is not None:
        (workspace / name).write_bytes(content)
    server = build_server([workspace])
    async with Client(server) as client:
        result = await client.call_tool("lint_script", {"path": name})
        still_serving = await client.call_tool("explain", {"id": "clip-after-step"})
    _assert_one_line_error(result, fragment)
    assert not still_serving.is_error


async def test_directory_and_both_inputs_are_refused(workspace: Path) -> None:
    server = build_server([workspace])
    async with Client(server) as client:
        directory = await client.call_tool("lint_script", {"path": "."})
        both = await client.call_tool("lint_script", {"path": "a.py", "source": "x=1"})
        neither = await client.call_tool("lint_script", {})
    _assert_one_line_error(directory, "directory")
    _assert_one_line_error(both, "exactly one")
    _assert_one_line_error(neither, "exactly one")


async def test_no_exec_refuses_probes_but_diagnose_still_reads(workspace: Path) -> None:
    server = build_server([workspace], allow_exec=False)
    async with Client(server) as client:
        probe = await client.call_tool("probe_script", {"path": "buggy_train.py"})
        diagnosis = await client.call_tool("diagnose", {"path": "buggy_train.py"})
    _assert_one_line_error(probe, "--no-exec")
    data = structured(diagnosis)
    assert data["probe_status"] is None and "--no-exec" in data["probe_note"]
    assert data["issues"], "static findings are still reported"
    assert "--no-exec" in text_of(diagnosis)


async def test_argument_caps(workspace: Path) -> None:
    server = build_server([workspace])
    async with Client(server) as client:
        many_args = await client.call_tool(
            "probe_script", {"path": "buggy_train.py", "args": ["x"] * 500}
        )
        steps = await client.call_tool("probe_script", {"path": "buggy_train.py", "steps": 0})
        device = await client.call_tool(
            "probe_script", {"path": "buggy_train.py", "device": "cuda; rm -rf /"}
        )
        long_text = await client.call_tool("match_symptoms", {"text": "nan " * 10_000})
    _assert_one_line_error(many_args, "limit")
    assert steps.is_error and device.is_error
    assert long_text.is_error


def test_path_policy_resolves_relative_to_first_root(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("x = 1\n")
    policy = PathPolicy.from_roots([tmp_path])
    assert policy.resolve_file("a.py") == (tmp_path / "a.py").resolve()
    with pytest.raises(InputError, match="not a directory"):
        PathPolicy.from_roots([tmp_path / "a.py"])


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
async def test_unreadable_file(workspace: Path) -> None:
    script = workspace / "locked.py"
    script.write_text("x = 1\n")
    script.chmod(0)
    result = await _call(build_server([workspace]), "lint_script", {"path": "locked.py"})
    _assert_one_line_error(result, "cannot read")


def test_probe_queue_slots() -> None:
    assert ProbeQueue.default(gpu_count=0).kind_for("auto") == "cpu"
    queue = ProbeQueue.default(gpu_count=2)
    assert queue.gpu_slots == 2 and queue.cpu_slots == 2
    assert queue.kind_for("cuda:1") == "gpu" and queue.kind_for("cpu") == "cpu"


async def test_probe_queue_limits_concurrency() -> None:
    import anyio

    queue = ProbeQueue.default(gpu_count=0)
    running = 0
    peak = 0

    async def fake_probe() -> None:
        nonlocal running, peak
        async with queue.limiter("auto"):
            running += 1
            peak = max(peak, running)
            await anyio.sleep(0.05)
            running -= 1

    async with anyio.create_task_group() as group:
        for _ in range(5):
            group.start_soon(fake_probe)
    assert peak == 2


@pytest.mark.parametrize(
    ("tool", "args", "fragments"),
    [
        ("match_symptoms", {"text": ""}, ["invalid arguments for match_symptoms", "text:"]),
        ("probe_script", {"path": "x.py", "steps": 0}, ["steps:", "greater than or equal to 1"]),
        ("probe_script", {"path": "x.py", "steps": "many"}, ["steps:", "(got 'many')"]),
        ("explain", {}, ["id: Field required"]),
    ],
)
async def test_arguments_the_schema_refuses_are_one_line(
    workspace: Path, tool: str, args: dict, fragments: list[str]
) -> None:
    """The SDK's pydantic dump (several lines and a link to its docs) becomes one line."""
    server = build_server([workspace])
    async with Client(server) as client:
        result = await client.call_tool(tool, args)
        _assert_one_line_error(result, *fragments)
        assert "errors.pydantic.dev" not in text_of(result)
        # The server is still up and answers the next call.
        assert (await client.call_tool("explain", {"id": "clip-after-step"})).is_error is False
