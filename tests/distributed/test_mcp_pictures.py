"""probe_script and diagnose over MCP: pictures as image content, and nproc for torchrun."""

from __future__ import annotations

import base64
import shutil
from pathlib import Path

import pytest
from mcp import Client

from gradient_doctor.skill_server.server import build_server

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "distributed"

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(240)]


@pytest.fixture
def workspace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    for name in ("plots_healthy.py", "ddp_accum.py"):
        shutil.copy(FIXTURES / name, tmp_path / name)
    return tmp_path


def _images(result: object) -> list[bytes]:
    return [
        base64.b64decode(block.data)
        for block in result.content  # type: ignore[attr-defined]
        if block.type == "image"
    ]


@pytest.mark.slow
async def test_probe_script_returns_png_pictures(workspace: Path) -> None:
    async with Client(build_server([workspace])) as client:
        result = await client.call_tool(
            "probe_script", {"path": "plots_healthy.py", "steps": 12, "device": "cpu"}
        )
        assert not result.is_error, result.content[0].text
        pictures = _images(result)
        captions = [b.text for b in result.content[1:] if b.type == "text"]
        assert captions == [
            "Figure: gradient-flow.png",
            "Figure: total-norm.png",
            "Figure: dead-units.png",
        ]
        assert len(pictures) == 3
        assert all(p.startswith(b"\x89PNG") and len(p) > 15_000 for p in pictures)
        assert result.content[0].type == "text"  # the report stays the first block

        without = await client.call_tool(
            "probe_script",
            {"path": "plots_healthy.py", "steps": 3, "device": "cpu", "plots": False},
        )
        assert not without.is_error
        assert _images(without) == []


@pytest.mark.slow
async def test_probe_script_with_nproc_reports_the_allreduce_count(workspace: Path) -> None:
    async with Client(build_server([workspace])) as client:
        result = await client.call_tool(
            "probe_script",
            {"path": "ddp_accum.py", "steps": 3, "nproc": 2, "device": "cpu", "plots": True},
        )
        assert not result.is_error, result.content[0].text
        data = result.structured_content
        assert data is not None
        ids = [f["id"] for f in data["findings"]]
        assert "ddp-accum-without-no-sync" in ids
        distributed = data["measurements"]["distributed"]
        assert distributed["world_size"] == 2
        assert [s["allreduces"] for s in distributed["steps"]] == [4, 4, 4]
        captions = [b.text for b in result.content[1:] if b.type == "text"]
        assert "Figure: ranks.png" in captions


@pytest.mark.slow
async def test_diagnose_returns_pictures_and_the_distributed_issue(workspace: Path) -> None:
    async with Client(build_server([workspace])) as client:
        result = await client.call_tool(
            "diagnose", {"path": "ddp_accum.py", "steps": 3, "nproc": 2}
        )
        assert not result.is_error, result.content[0].text
        data = result.structured_content
        assert data is not None
        issue = next(i for i in data["issues"] if i["id"] == "ddp-accum-without-no-sync")
        assert "runtime" in issue["sources"]
        assert any("4 gradient all-reduces" in m for m in issue["messages"])
        assert len(_images(result)) >= 3


async def test_nproc_out_of_range_is_refused(workspace: Path) -> None:
    async with Client(build_server([workspace])) as client:
        result = await client.call_tool("probe_script", {"path": "ddp_accum.py", "nproc": 99})
        assert result.is_error
