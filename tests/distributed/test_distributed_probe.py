"""The probe under torchrun: 2 CPU ranks (gloo), tiny models, a few steps each.

Each run takes ~10 s on 2 cores (two interpreters importing torch plus a rendezvous), so every
test here is marked slow; they still run in CI.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from gradient_doctor.probes.runtime import ProbeInputError, run_probe
from gradient_doctor.probes.runtime.child.rankenv import RankEnv, channel_for_rank
from gradient_doctor.probes.runtime.ranks import merge_global_norms
from gradient_doctor.probes.runtime.result import StepRecord

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "distributed"
REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(autouse=True)
def _one_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    # Two ranks on two cores: more threads per rank only make them fight.
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


def _probe(script: str, *args: str, steps: int = 4) -> object:
    return run_probe(FIXTURES / script, list(args), steps=steps, nproc=2, timeout_s=150)


def _ids(result: object) -> list[str]:
    return [f.id for f in result.findings]  # type: ignore[attr-defined]


@pytest.mark.slow
def test_accumulation_without_no_sync_counts_one_allreduce_per_micro_batch() -> None:
    result = _probe("ddp_accum.py")
    assert result.status == "stopped", result.message
    info = result.distributed
    assert info is not None and info.world_size == 2 and info.launcher == "gradient-doctor"
    assert info.allreduce_counting == "comm-hook"
    assert [s.allreduces for s in info.steps] == [4, 4, 4, 4]
    (finding,) = [f for f in result.findings if f.id == "ddp-accum-without-no-sync"]
    assert finding.evidence["allreduces_per_step"] == 4
    assert finding.evidence["backward_per_step"] == 4
    assert "4 gradient all-reduces per optimizer step" in finding.message
    assert info.rank_status == {0: "stopped", 1: "stopped"}


@pytest.mark.slow
def test_accumulation_with_no_sync_counts_one_allreduce_per_step() -> None:
    result = _probe("ddp_accum.py", "--no-sync")
    assert result.status == "stopped", result.message
    assert result.distributed is not None
    assert [s.allreduces for s in result.distributed.steps] == [1, 1, 1, 1]
    assert "ddp-accum-without-no-sync" not in _ids(result)
    assert "ranks-diverge" not in _ids(result)
    # Synchronised gradients are identical on both ranks.
    for step in result.distributed.steps:
        assert step.replicated_norms[0] == pytest.approx(step.replicated_norms[1], rel=1e-9)


@pytest.mark.slow
def test_a_rank_that_changes_its_gradients_after_the_allreduce_is_named() -> None:
    result = _probe("ddp_diverge.py")
    (finding,) = [f for f in result.findings if f.id == "ranks-diverge"]
    assert finding.severity == "critical"
    assert finding.evidence["ranks"] == [1]
    assert finding.step == 1
    norms = finding.evidence["rank_norms"]
    # Rank 1 multiplies its synchronised gradient by 3.
    assert norms[1] == pytest.approx(3 * norms[0], rel=1e-4)
    assert "rank 1" in finding.message


@pytest.mark.slow
def test_fsdp2_global_norm_is_merged_from_the_shards() -> None:
    torch = pytest.importorskip("torch")
    import importlib.util

    result = _probe("fsdp2_mlp.py", steps=5)
    assert result.status == "stopped", result.message
    info = result.distributed
    assert info is not None and info.sharded_parameters == 6

    spec = importlib.util.spec_from_file_location("fsdp2_mlp", FIXTURES / "fsdp2_mlp.py")
    assert spec is not None and spec.loader is not None
    fixture = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fixture)
    reference = fixture.build()
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.05)
    expected_total, expected_layers, first_peaks = [], [], []
    for step in range(5):
        x, y = fixture.batch(step)
        torch.nn.functional.mse_loss(reference(x), y).backward()
        norms = [p.grad.norm().item() for p in reference.parameters()]
        if step == 0:
            first_peaks = [(p.grad.abs().max().item(), p.numel()) for p in reference.parameters()]
        expected_layers.append(norms)
        expected_total.append(math.sqrt(sum(n * n for n in norms)))
        optimizer.step()
        optimizer.zero_grad()
    assert result.total_norm == pytest.approx(expected_total, rel=1e-4)
    for record, norms in zip(result.records, expected_layers, strict=True):
        assert record.grad_norms == pytest.approx(norms, rel=1e-4)
    # Step 1 is sampled: its per-tensor max |g| and size are the whole tensor's, not a shard's.
    detail = result.records[0].detail
    assert detail is not None
    for item, (peak, numel) in zip(detail, first_peaks, strict=True):
        assert item is not None and item.numel == numel
        assert item.max_abs == pytest.approx(peak, rel=1e-5)
    # One rank's shard alone is not the global norm.
    for step, total in zip(info.steps, result.total_norm, strict=True):
        assert all(0 < n < total for n in step.rank_norms)
        assert math.sqrt(sum(n * n for n in step.rank_norms)) == pytest.approx(total, rel=1e-6)


@pytest.mark.slow
def test_the_first_rank_to_see_a_nan_is_named() -> None:
    result = _probe("ddp_nan_rank1.py")
    info = result.distributed
    assert info is not None
    assert (info.first_nonfinite_rank, info.first_nonfinite_step) == (1, 3)
    nonfinite = [
        f for f in result.findings if f.id in ("nan-gradients", "nan-loss-before-backward")
    ]
    assert nonfinite
    assert nonfinite[0].evidence["first_nonfinite_rank"] == 1
    assert "rank 1 at step 3" in nonfinite[0].message


@pytest.mark.slow
def test_a_script_launched_under_torchrun_by_the_user_is_probed_per_rank(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "--standalone",
        str(FIXTURES / "probe_each_rank.py"),
        str(FIXTURES / "ddp_diverge.py"),
        str(tmp_path),
    ]
    process = subprocess.Popen(
        command,
        env=env,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        output, _ = process.communicate(timeout=150)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == 0, output[-2000:]
    rank0 = json.loads((tmp_path / "rank0.json").read_text())
    rank1 = json.loads((tmp_path / "rank1.json").read_text())
    assert rank0["distributed"]["launcher"] == "user"
    assert rank0["distributed"]["rank"] == 0 and rank1["distributed"]["rank"] == 1
    assert len(rank0["distributed"]["steps"]) == 3
    assert rank1["distributed"]["steps"] == []
    diverge = [f for f in rank0["findings"] if f["id"] == "ranks-diverge"]
    assert diverge and diverge[0]["evidence"]["ranks"] == [1]


@pytest.mark.slow
def test_a_rank_that_crashes_stops_the_run_with_its_message(tmp_path: Path) -> None:
    script = tmp_path / "crash_rank1.py"
    script.write_text(
        "import torch, torch.distributed as dist\n"
        "from torch import nn\n"
        "dist.init_process_group('gloo')\n"
        "model = nn.parallel.DistributedDataParallel(nn.Linear(4, 1))\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for step in range(20):\n"
        "    if dist.get_rank() == 1 and step == 2:\n"
        "        raise ValueError('corrupt shard on rank 1')\n"
        "    model(torch.randn(2, 4)).sum().backward()\n"
        "    opt.step()\n"
        "    opt.zero_grad()\n"
    )
    started = time.monotonic()
    result = run_probe(script, steps=10, nproc=2, timeout_s=150)
    assert time.monotonic() - started < 60  # not the 150 s timeout: torchrun stopped rank 0
    assert result.status == "script-error"
    assert result.message is not None and result.message.startswith("rank 1: ValueError")
    assert "corrupt shard on rank 1" in result.message


def test_nproc_out_of_range_is_an_input_error() -> None:
    with pytest.raises(ProbeInputError, match="nproc"):
        run_probe(FIXTURES / "ddp_accum.py", nproc=0)


def test_rank_environment_and_channel_names() -> None:
    env = RankEnv.from_environ(
        {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}, {"launcher": "gradient-doctor"}
    )
    assert env.distributed and env.launched_here and env.rank == 1
    assert channel_for_rank("/tmp/c.jsonl", env) == "/tmp/c.jsonl.rank1"
    user = RankEnv.from_environ({"RANK": "1", "WORLD_SIZE": "2"}, {})
    assert user.distributed and not user.launched_here
    assert channel_for_rank("/tmp/c.jsonl", user) == "/tmp/c.jsonl"
    single = RankEnv.from_environ({}, None)
    assert not single.distributed and single.rank == 0
    broken = RankEnv.from_environ({"RANK": "x", "WORLD_SIZE": "two"}, None)
    assert broken.world_size == 1


def test_global_norms_replace_shard_norms_and_the_total_is_recomputed() -> None:
    from gradient_doctor.probes.runtime.rank_models import RankStep

    record = StepRecord(step=1, grad_norms=[3.0, None, 1.0], total_norm=math.sqrt(10))
    merged = merge_global_norms(
        [record],
        [
            RankStep(
                step=1,
                world_size=2,
                rank_norms=[3.0, 4.0],
                global_grad_norms={0: 5.0},
                sharded_parameters=1,
            )
        ],
    )
    assert merged[0].grad_norms == [5.0, None, 1.0]
    assert merged[0].total_norm == pytest.approx(math.sqrt(26))


def _processes_running(marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmdline:
            found.append(int(entry.name))
    return found


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc to find leftover processes")
def test_a_hanging_rank_times_out_and_no_rank_is_left_behind(tmp_path: Path) -> None:
    script = tmp_path / "hang_rank1.py"
    script.write_text(
        "import signal, time, torch, torch.distributed as dist\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a script that traps SIGTERM\n"
        "from torch import nn\n"
        "dist.init_process_group('gloo')\n"
        "model = nn.parallel.DistributedDataParallel(nn.Linear(4, 1))\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for step in range(100):\n"
        "    if dist.get_rank() == 1 and step == 1:\n"
        "        time.sleep(3600)  # rank 0 now waits in the all-reduce\n"
        "    model(torch.randn(2, 4)).sum().backward()\n"
        "    opt.step()\n"
        "    opt.zero_grad()\n"
    )
    result = run_probe(script, steps=10, nproc=2, timeout_s=15)
    assert result.status == "timeout"
    assert result.steps == 1
    time.sleep(0.5)
    assert _processes_running(str(script)) == []


@pytest.mark.slow
def test_cli_nproc_reports_the_ranks(tmp_path: Path, cli: Any) -> None:
    done = cli("probe", str(FIXTURES / "ddp_diverge.py"), "--nproc", "2", "--steps", "3")
    assert done.returncode == 1, done.stderr  # ranks-diverge is critical
    assert "`ranks-diverge`" in done.stdout
    assert "### Ranks" in done.stdout
    assert "**differ** on 3 of 3 steps (first: step 1, ranks 1)" in done.stdout
    as_json = cli(
        "probe",
        str(FIXTURES / "ddp_accum.py"),
        "--nproc",
        "2",
        "--steps",
        "2",
        "--format",
        "json",
        "--fail-on",
        "never",
        "--",
        "--no-sync",
    )
    assert as_json.returncode == 0, as_json.stderr
    data = json.loads(as_json.stdout)
    assert [s["allreduces"] for s in data["distributed"]["steps"]] == [1, 1]


def test_cli_rejects_nproc_zero(cli: Any) -> None:
    done = cli("probe", str(FIXTURES / "ddp_accum.py"), "--nproc", "0")
    assert done.returncode == 2
    assert "nproc" in done.stderr
