"""``diagnose_logs`` through the MCP SDK's in-process client."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from logs_paths import FIXTURES
from mcp import Client
from mcp.types import ImageContent, TextContent

from gradient_doctor.skill_server.server import build_server

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    folder = tmp_path / "runs"
    folder.mkdir()
    shutil.copy(FIXTURES / "hf_nan.log", folder / "train.log")
    shutil.copytree(FIXTURES / "tb_rising", folder / "tb")
    (folder / "notes.txt").write_text("nothing to see here\n")
    return folder


async def test_a_console_log_is_diagnosed_with_a_picture(root: Path) -> None:
    async with Client(build_server([root])) as client:
        result = await client.call_tool("diagnose_logs", {"path": "train.log"})
    assert not result.is_error
    data = result.structured_content
    assert data is not None
    assert data["format"] == "hf-trainer"
    assert data["step_numbers"] == "record order"
    assert data["series"] is None  # the series stays out of the tool's answer
    critical = [f for f in data["findings"] if f["severity"] == "critical"]
    assert critical and critical[0]["id"] == "nan-gradients"
    text = result.content[0]
    assert isinstance(text, TextContent) and "nan-gradients" in text.text
    assert any(isinstance(block, ImageContent) for block in result.content)


async def test_a_tensorboard_folder_without_plots(root: Path) -> None:
    async with Client(build_server([root])) as client:
        result = await client.call_tool("diagnose_logs", {"path": "tb", "plots": False})
    data = result.structured_content
    assert data is not None and data["format"] == "tensorboard"
    assert data["counts"]["first_nonfinite_step"] == 150
    assert not any(isinstance(block, ImageContent) for block in result.content)


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("notes.txt", "not a training log this reader recognises"),
        ("missing.log", "no such file or folder"),
        ("/etc/hostname", "outside the allowed roots"),
    ],
)
async def test_bad_paths_are_one_error_line(root: Path, path: str, message: str) -> None:
    async with Client(build_server([root])) as client:
        result = await client.call_tool("diagnose_logs", {"path": path})
        still = await client.call_tool("diagnose_logs", {"path": "train.log", "plots": False})
    assert result.is_error
    text = result.content[0]
    assert isinstance(text, TextContent) and message in text.text
    assert "\n" not in text.text.strip() and "Traceback" not in text.text
    assert not still.is_error  # the server keeps serving
