"""Every tool, resource and prompt through the SDK's in-process client (``mcp.Client(server)``)."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from mcp import Client
from server_helpers import dump, process_alive, structured, text_of

from gradient_doctor.skill_server.server import build_server

pytestmark = pytest.mark.anyio

BUGGY = "buggy_train.py"
HEALTHY = "healthy_train.py"


async def test_lists_the_seven_tools_with_truthful_annotations(workspace: Path) -> None:
    async with Client(build_server([workspace])) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
    assert set(tools) == {
        "match_symptoms",
        "lint_script",
        "probe_script",
        "diagnose",
        "get_fix",
        "explain",
        "diagnose_logs",
    }
    for name in ("match_symptoms", "lint_script", "get_fix", "explain", "diagnose_logs"):
        hints = tools[name].annotations
        assert hints is not None and hints.read_only_hint and hints.idempotent_hint, name
    for name in ("probe_script", "diagnose"):
        hints = tools[name].annotations
        assert hints is not None and hints.read_only_hint is False, name
        assert hints.open_world_hint is True, name
    for tool in tools.values():
        assert tool.output_schema is not None, tool.name
        # Flat arguments: no nested model ($ref) that clients render poorly.
        assert "$defs" not in tool.input_schema and "$ref" not in dump(tool.input_schema)
        for prop in tool.input_schema["properties"].values():
            assert prop.get("description"), (tool.name, prop)


async def test_match_symptoms_ranks_nan_guidance(workspace: Path) -> None:
    async with Client(build_server([workspace])) as client:
        result = await client.call_tool(
            "match_symptoms", {"text": "my loss becomes NaN after a few hundred steps", "top_k": 5}
        )
    data = structured(result)
    ids = [m["id"] for m in data["matches"]]
    assert ids and len(ids) <= 5
    assert any("nan" in i for i in ids[:3]), ids
    assert data["out_of_scope"] is False
    scores = [m["score"] for m in data["matches"]]
    assert scores == sorted(scores, reverse=True)
    assert ids[0] in text_of(result)


async def test_match_symptoms_rationalization_says_what_instead(workspace: Path) -> None:
    async with Client(build_server([workspace])) as client:
        result = await client.call_tool(
            "match_symptoms",
            {"text": "gradient clipping is just a hack, real models don't need it"},
        )
    data = structured(result)
    rationalizations = [m for m in data["matches"] if m["kind"] == "rationalization"]
    assert rationalizations, dump(data)
    assert rationalizations[0]["say_instead"]
    assert "Say instead" in text_of(result)


async def test_lint_script_reports_lines_and_combined_diff(workspace: Path) -> None:
    source = (workspace / BUGGY).read_text()
    async with Client(build_server([workspace])) as client:
        result = await client.call_tool("lint_script", {"path": BUGGY})
        by_source = await client.call_tool("lint_script", {"source": source})
    data = structured(result)
    ids = {f["id"] for f in data["findings"]}
    assert {"accum-unscaled-loss", "clip-after-step"} <= ids, dump(data)
    lines = source.splitlines()
    clip = next(f for f in data["findings"] if f["id"] == "clip-after-step")
    assert "clip_grad_norm_" in lines[clip["line"] - 1]
    assert data["combined_diff"] and data["combined_diff"].startswith("--- ")
    assert "clip-after-step" in text_of(result)
    assert {f["id"] for f in structured(by_source)["findings"]} == ids
    # The user's file is never written.
    assert (workspace / BUGGY).read_text() == source


async def test_lint_script_select_and_ignore(workspace: Path) -> None:
    async with Client(build_server([workspace])) as client:
        only = await client.call_tool("lint_script", {"path": BUGGY, "select": ["clip-after-step"]})
        without = await client.call_tool(
            "lint_script", {"path": BUGGY, "ignore": ["clip-after-step"]}
        )
    assert {f["id"] for f in structured(only)["findings"]} == {"clip-after-step"}
    assert "clip-after-step" not in {f["id"] for f in structured(without)["findings"]}


async def test_get_fix_uses_the_callers_names(workspace: Path) -> None:
    async with Client(build_server([workspace])) as client:
        result = await client.call_tool(
            "get_fix", {"id": "clip-norm", "names": {"model": "net", "optimizer": "opt"}}
        )
        by_entry = await client.call_tool("get_fix", {"id": "clip-after-step"})
        bad_name = await client.call_tool("get_fix", {"id": "clip-norm", "names": {"nope": "x"}})
    data = structured(result)
    assert "net.parameters()" in data["code"] and "opt.step()" in data["code"]
    assert structured(by_entry)["snippet_id"]
    assert bad_name.is_error and "model" in text_of(bad_name)


async def test_explain_returns_the_entry(workspace: Path) -> None:
    async with Client(build_server([workspace])) as client:
        result = await client.call_tool("explain", {"id": "clip-after-step"})
        unknown = await client.call_tool("explain", {"id": "clip-after-stp"})
    data = structured(result)
    assert data["id"] == "clip-after-step" and data["kind"] == "red-flag"
    assert data["severity"] == "critical"
    assert data["entry"]["title"] in text_of(result)
    assert unknown.is_error and "clip-after-step" in text_of(unknown)


async def test_diagnose_without_probe_renders_the_report(workspace: Path) -> None:
    async with Client(build_server([workspace])) as client:
        result = await client.call_tool(
            "diagnose",
            {"path": BUGGY, "run_probe": False, "description": "loss is not going down"},
        )
    data = structured(result)
    report = text_of(result)
    assert data["probe_status"] is None and data["probe_note"] == "skipped on request"
    assert {"accum-unscaled-loss", "clip-after-step"} <= {i["id"] for i in data["issues"]}
    assert data["worst_severity"] == "critical"
    for heading in ("### Summary", "### Issues Detected", "### Recommendations", "### Code to Add"):
        assert heading in report
    assert "| Metric | Value | Status |" in report and "❌" in report
    assert "```diff" in report


async def test_diagnose_needs_a_path_or_description(workspace: Path) -> None:
    async with Client(build_server([workspace])) as client:
        result = await client.call_tool("diagnose", {})
        text_only = await client.call_tool("diagnose", {"description": "loss becomes NaN"})
    assert result.is_error and "description" in text_of(result)
    data = structured(text_only)
    assert data["script"] is None and data["matches"]
    assert data["worst_severity"] is None and data["issues"] == []
    assert "Nothing was checked" in text_of(text_only)
    assert any(data["matches"][0]["id"] in rec for rec in data["recommendations"])


@pytest.mark.slow
async def test_probe_script_reports_progress_and_measurements(workspace: Path) -> None:
    progress: list[tuple[float, float | None]] = []

    async def on_progress(done: float, total: float | None, message: str | None) -> None:
        progress.append((done, total))

    async with Client(build_server([workspace])) as client:
        result = await client.call_tool(
            "probe_script",
            {"path": BUGGY, "steps": 8, "timeout_s": 120, "device": "cpu"},
            progress_callback=on_progress,
        )
    data = structured(result)
    assert data["status"] in ("ok", "stopped"), dump(data)
    assert data["steps"] == 8 and data["steps_requested"] == 8
    assert len(data["measurements"]["total_norm"]) == 8
    assert progress and progress[-1] == (8, 8)
    assert all(total == 8 for _, total in progress)


@pytest.mark.slow
async def test_diagnose_merges_static_and_runtime_evidence(workspace: Path) -> None:
    async with Client(build_server([workspace])) as client:
        result = await client.call_tool("diagnose", {"path": BUGGY, "steps": 12})
    data = structured(result)
    assert data["probe_status"] in ("ok", "stopped"), dump(data)
    ids = [i["id"] for i in data["issues"]]
    assert len(ids) == len(set(ids)), "one issue per id"
    both = [i for i in data["issues"] if {"static", "runtime"} <= set(i["sources"])]
    assert both, dump(data["issues"])
    assert "Runtime probe" in text_of(result)


@pytest.mark.slow
async def test_probe_script_crashing_script_is_a_status(workspace: Path) -> None:
    async with Client(build_server([workspace])) as client:
        result = await client.call_tool(
            "probe_script", {"path": "crash_train.py", "steps": 5, "device": "cpu"}
        )
        again = await client.call_tool("match_symptoms", {"text": "loss is NaN"})
    data = structured(result)
    assert data["status"] == "script-error"
    assert "corrupt batch 2" in dump(data["measurements"])
    assert not again.is_error


async def test_every_resource_reads(workspace: Path) -> None:
    async with Client(build_server([workspace])) as client:
        resources = (await client.list_resources()).resources
        templates = (await client.list_resource_templates()).resource_templates
        uris = [str(r.uri) for r in resources]
        assert {
            "gradient-doctor://catalog",
            "gradient-doctor://thresholds",
            "gradient-doctor://rationalizations",
            "gradient-doctor://red-flags",
        } <= set(uris)
        assert {t.uri_template for t in templates} == {
            "gradient-doctor://entry/{id}",
            "gradient-doctor://guide/{topic}",
        }
        texts = {}
        for uri in [
            *uris,
            "gradient-doctor://entry/clip-after-step",
            "gradient-doctor://guide/amp",
        ]:
            contents = (await client.read_resource(uri)).contents
            texts[uri] = contents[0].text  # type: ignore[union-attr]
            assert contents[0].mime_type == "text/markdown"
            assert len(texts[uri]) > 100, uri
    assert "clip-after-step" in texts["gradient-doctor://catalog"]
    assert "lower-lr-for-nan" in texts["gradient-doctor://rationalizations"] or (
        "learning rate" in texts["gradient-doctor://rationalizations"].lower()
    )
    assert (
        "65" in texts["gradient-doctor://guide/amp"]
        or "unscale" in texts["gradient-doctor://guide/amp"]
    )


async def test_unknown_resource_is_an_error_not_a_crash(workspace: Path) -> None:
    async with Client(build_server([workspace])) as client:
        with pytest.raises(Exception, match=r"closest|unknown"):
            await client.read_resource("gradient-doctor://entry/clip-aftr-step")
        assert (await client.list_tools()).tools


async def test_prompts_name_the_tools_and_the_claims_to_avoid(workspace: Path) -> None:
    async with Client(build_server([workspace])) as client:
        prompts = {p.name: p for p in (await client.list_prompts()).prompts}
        assert set(prompts) == {"check-gradients", "triage", "review-training-loop"}
        check = await client.get_prompt(
            "check-gradients", {"script_path": BUGGY, "symptoms": "loss spikes"}
        )
        triage = await client.get_prompt("triage", {"symptoms": "loss goes NaN"})
        review = await client.get_prompt("review-training-loop", {"code": "loss.backward()"})
    check_text = check.messages[0].content.text  # type: ignore[union-attr]
    assert "diagnose" in check_text and BUGGY in check_text and "loss spikes" in check_text
    assert "get_fix" in check_text and "Do not say" in check_text
    triage_text = triage.messages[0].content.text  # type: ignore[union-attr]
    assert "match_symptoms" in triage_text and "loss goes NaN" in triage_text
    review_text = review.messages[0].content.text  # type: ignore[union-attr]
    assert "lint_script" in review_text and "loss.backward()" in review_text
    assert "Do not say" in review_text


@pytest.mark.slow
async def test_probes_wait_in_the_queue(workspace: Path) -> None:
    messages: dict[int, list[str]] = {0: [], 1: []}
    results: dict[int, object] = {}

    async with Client(build_server([workspace], max_probes=1)) as client:

        async def probe(index: int) -> None:
            async def on_progress(done: float, total: float | None, message: str | None) -> None:
                messages[index].append(message or "")

            results[index] = await client.call_tool(
                "probe_script",
                {"path": "crash_train.py", "steps": 5, "device": "cpu"},
                progress_callback=on_progress,
            )

        async with anyio.create_task_group() as group:
            group.start_soon(probe, 0)
            group.start_soon(probe, 1)
    queued = [i for i, seen in messages.items() if any("queued" in m for m in seen)]
    assert len(queued) == 1, messages
    assert all(structured(r)["status"] == "script-error" for r in results.values())


async def test_explain_and_resources_cover_every_kind_and_guide(workspace: Path) -> None:
    from gradient_doctor.knowledge import load_knowledge

    kb = load_knowledge()
    one_per_kind = {entry.kind: entry.id for entry in kb}
    assert set(one_per_kind) == {"red-flag", "signal", "rationalization", "symptom"}
    async with Client(build_server([workspace])) as client:
        for kind, entry_id in one_per_kind.items():
            data = structured(await client.call_tool("explain", {"id": entry_id}))
            assert data["kind"] == kind and data["markdown"]
        for topic, guide in kb.guides.items():
            contents = (await client.read_resource(f"gradient-doctor://guide/{topic}")).contents
            assert guide.title in contents[0].text  # type: ignore[union-attr]
        with pytest.raises(Exception, match=r"topics"):
            await client.read_resource("gradient-doctor://guide/astrology")


@pytest.mark.slow
async def test_hanging_script_times_out_and_is_stopped(workspace: Path, tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    async with Client(build_server([workspace])) as client:
        result = await client.call_tool(
            "probe_script",
            {
                "path": "forever_train.py",
                "args": [str(pid_file)],
                "steps": 10_000,
                "timeout_s": 8,
                "device": "cpu",
                "plots": False,
            },
        )
    data = structured(result)
    assert data["status"] == "timeout", data["status"]
    pid = int(pid_file.read_text())
    assert not process_alive(pid)
