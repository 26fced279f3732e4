"""MCP tool results as an assistant reads them: ordering and the errors that point elsewhere."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from mcp import Client
from server_helpers import structured, text_of

from gradient_doctor.skill_server.server import build_server

pytestmark = pytest.mark.anyio


async def test_lint_script_text_lists_the_most_severe_first(workspace: Path) -> None:
    async with Client(build_server([workspace])) as client:
        result = await client.call_tool("lint_script", {"path": "buggy_train.py"})
    findings = structured(result)["findings"]
    severities = {f["severity"] for f in findings}
    assert {"critical", "info"} <= severities  # the example has both, info on an earlier line
    numbered = [line for line in text_of(result).splitlines() if re.match(r"\d+\. ", line)]
    marks = [
        "critical" if "**critical**" in n else "info" if "**info**" in n else "warning"
        for n in numbered
    ]
    rank = {"critical": 0, "warning": 1, "info": 2}
    assert len(numbered) == len(findings)
    assert marks == sorted(marks, key=rank.__getitem__), numbered


async def test_explain_sends_guide_topics_and_snippet_ids_to_their_own_door(
    workspace: Path,
) -> None:
    async with Client(build_server([workspace])) as client:
        guide = await client.call_tool("explain", {"id": "amp"})
        snippet = await client.call_tool("explain", {"id": "clip-norm"})
        unknown = await client.call_tool("explain", {"id": "clip-after-stp"})
    assert guide.is_error and "gradient-doctor://guide/amp" in text_of(guide)
    assert snippet.is_error and "call get_fix with id='clip-norm'" in text_of(snippet)
    assert unknown.is_error and "clip-after-step" in text_of(unknown)
    for result in (guide, snippet, unknown):
        assert len(text_of(result).splitlines()) == 1


NEEDS_ARGS = """\
import argparse

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--data", required=True)
parser.add_argument("--lr", type=float, default=0.1)
opts = parser.parse_args()
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=opts.lr)
for _ in range(20):
    loss = model(torch.randn(8, 4)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""


async def test_diagnose_passes_the_scripts_own_arguments(workspace: Path) -> None:
    # A script with a required option could only be probed by probe_script, never diagnosed.
    (workspace / "needs_args.py").write_text(NEEDS_ARGS)
    async with Client(build_server([workspace])) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        assert "args" in tools["diagnose"].input_schema["properties"]
        bare = await client.call_tool(
            "diagnose", {"path": "needs_args.py", "steps": 3, "plots": False}
        )
        given = await client.call_tool(
            "diagnose",
            {"path": "needs_args.py", "steps": 3, "plots": False, "args": ["--data", "x"]},
        )
    assert structured(bare)["probe_status"] == "script-error"
    assert structured(given)["probe_status"] == "stopped", text_of(given)
