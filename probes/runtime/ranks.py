"""Data parallelism, parent side: rank environment, merged rank series, findings (no torch).

Under ``torchrun`` every rank runs the probe (``probes.runtime.child.distributed``, child side).
At each
optimizer step the ranks send their local measurements to rank 0 through a ``torch.distributed``
collective; rank 0 merges them and writes one ``{"kind": "ranks", ...}`` message per step to the
side channel. This module reads those messages back, puts the global (shard-merged) gradient
norms into rank 0's step records so the ordinary diagnosis judges the whole model and not one
shard, and turns the rank series into findings: ``ranks-diverge`` (ranks hold different
gradients or parameters after synchronisation), ``ddp-accum-without-no-sync`` with the measured
number of gradient all-reduces per optimizer step, and which rank and step first saw a
non-finite value.

When ``gradient-doctor probe --nproc N`` launched the ranks, they share one channel folder:
rank 0 writes the channel itself, rank r > 0 writes ``<channel>.rank<r>`` (read here only for
its final status) and every rank writes ``<channel>.pid<r>`` so the parent can stop ranks that
the launcher left behind. A script launched under ``torchrun`` by the user is probed per rank by
one parent each; every rank then writes its own channel, and rank 0's carries the merged series.
"""

from __future__ import annotations

import math
import os
import re
import signal
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gradient_doctor.knowledge.findings import Finding, Fix
from gradient_doctor.probes.runtime.child import STAGED_PACKAGE
from gradient_doctor.probes.runtime.child.rankenv import pid_file
from gradient_doctor.probes.runtime.rank_models import DistributedInfo, RankStep
from gradient_doctor.probes.runtime.result import ChildSummary, ProbeResult, StepRecord

# -- merged per-step series (rank 0 → parent) ---------------------------------------------------


def merge_global_norms(
    records: Sequence[StepRecord], rank_steps: Sequence[RankStep]
) -> list[StepRecord]:
    """Rank 0's records with each parameter's gradient norm replaced by its global norm.

    Under FSDP a rank measures only its shard; the norm of the whole gradient is the square
    root of the sum of the squared shard norms of every rank. The total norm is recomputed from
    the merged per-parameter norms; on sampled steps the element count and max |g| of a sharded
    tensor become the whole tensor's too. Records without a merged step are returned unchanged.
    """
    by_step = {s.step: s for s in rank_steps if s.global_grad_norms}
    merged: list[StepRecord] = []
    for record in records:
        step = by_step.get(record.step)
        if step is None or not step.sharded_parameters:
            merged.append(record)
            continue
        norms = list(record.grad_norms)
        for index, value in step.global_grad_norms.items():
            if 0 <= index < len(norms):
                norms[index] = value
        present = [v for v in norms if v is not None]
        total = math.sqrt(math.fsum(v * v for v in present)) if present else 0.0
        update: dict[str, Any] = {"grad_norms": norms, "total_norm": total}
        if record.detail and step.global_numel:
            # Whole-tensor size and peak; the other statistics stay rank 0's shard.
            detail = list(record.detail)
            for index, count in step.global_numel.items():
                item = detail[index] if 0 <= index < len(detail) else None
                if item is None:
                    continue
                changes: dict[str, Any] = {"numel": count}
                if index in step.global_max_abs:
                    changes["max_abs"] = step.global_max_abs[index]
                detail[index] = item.model_copy(update=changes)
            update["detail"] = detail
        merged.append(record.model_copy(update=update))
    return merged


#: Error text of a rank that failed only because another rank went away first.
COLLATERAL_FAILURE = re.compile(
    r"Connection closed by peer|Connection reset by peer|DistBackendError|DistNetworkError|"
    r"Socket Timeout|Broken pipe|NCCL communicator was aborted|recvBytes|sendBytes|"
    r"heartbeat|watchdog",
    re.IGNORECASE,
)


def _collateral(summary: ChildSummary) -> bool:
    text = f"{summary.message or ''}\n{summary.traceback_tail or ''}"
    return bool(COLLATERAL_FAILURE.search(text))


def merge_rank_summaries(
    summary: ChildSummary | None, others: Mapping[int, ChildSummary]
) -> ChildSummary | None:
    """Rank 0's summary, or the failing rank's when a rank failed (or rank 0 sent none).

    When one rank fails, the others fail next in a collective whose peer is gone (or torchrun
    stops them, and rank 0 often dies without a summary); the root cause is the failed rank
    whose error is not such a communication error. Its message is prefixed with its rank.
    """
    everyone = dict(others)
    if summary is not None:
        everyone[0] = summary
    failed = sorted((rank, s) for rank, s in everyone.items() if s.status not in ("ok", "stopped"))
    if failed:
        primary = [(rank, s) for rank, s in failed if not _collateral(s)] or failed
        rank, worst = primary[0]
        base = summary or worst
        return base.model_copy(
            update={
                "status": worst.status,
                "message": f"rank {rank}: {worst.message or worst.status}",
                "traceback_tail": worst.traceback_tail,
            }
        )
    if summary is None and others:
        return others[min(others)]
    return summary


def read_rank_summaries(channel: str, world_size: int) -> dict[int, ChildSummary]:
    """The final summaries that ranks 1..N-1 wrote to their own channel files."""
    from gradient_doctor.probes.runtime.child.channel import ChannelReader

    found: dict[int, ChildSummary] = {}
    for rank in range(1, world_size):
        for message in ChannelReader(f"{channel}.rank{rank}").read_new():
            if message.get("kind") == "summary":
                payload = {k: v for k, v in message.items() if k != "kind"}
                try:
                    found[rank] = ChildSummary.model_validate(payload)
                except ValueError:
                    continue
    return found


def kill_ranks(channel: str, world_size: int) -> int:
    """SIGKILL the process group of every rank that recorded its pid and still runs.

    torchrun starts each rank in a session of its own, so stopping the launcher's group does not
    reach them. Returns how many groups were signalled.
    """
    killed = 0
    for rank in range(world_size):
        path = pid_file(channel, rank)
        try:
            pid = int(path.read_text().strip())
        except (OSError, ValueError):
            continue
        if not _is_probe_child(pid):
            continue
        try:
            os.killpg(pid, signal.SIGKILL)
            killed += 1
        except (ProcessLookupError, PermissionError):
            pass
    return killed


def _is_probe_child(pid: int) -> bool:
    """Guard against a recycled pid: the process must still be a probe child."""
    cmdline = Path(f"/proc/{pid}/cmdline")
    if not Path("/proc").is_dir():
        return True
    try:
        return STAGED_PACKAGE.encode() in cmdline.read_bytes()
    except OSError:
        return False


# -- findings -----------------------------------------------------------------------------------


def _ranks_text(ranks: Sequence[int]) -> str:
    names = [str(r) for r in sorted(set(ranks))]
    if len(names) == 1:
        return f"rank {names[0]}"
    return "ranks " + ", ".join(names[:-1]) + " and " + names[-1]


def distributed_findings(
    info: DistributedInfo,
    records: Sequence[StepRecord],
    findings: Sequence[Finding],
    profile: str,
) -> list[Finding]:
    """The findings list with the distributed evidence applied.

    Adds ``ranks-diverge``; replaces the event-based ``ddp-accum-without-no-sync`` by one that
    states the measured all-reduce count (or drops it when the count shows one all-reduce per
    step); adds the first non-finite rank and step to the non-finite findings.
    """
    out = list(findings)
    steps = sorted(info.steps, key=lambda s: s.step)
    diverging = [s for s in steps if s.diverging_ranks or s.param_diverging_ranks]
    if diverging:
        first = diverging[0]
        ranks = sorted(
            {r for s in diverging for r in (*s.diverging_ranks, *s.param_diverging_ranks)}
        )
        what = "gradients" if first.diverging_ranks else "parameters"
        norms = ", ".join(
            f"rank {r}: {v:.6g}" for r, v in enumerate(first.replicated_norms or first.rank_norms)
        )
        out.append(
            Finding(
                id="ranks-diverge",
                severity="critical",
                origin="runtime",
                step=first.step,
                message=(
                    f"After gradient synchronisation {_ranks_text(ranks)} held different "
                    f"{what} than the others on {len(diverging)} of {len(steps)} steps (first: "
                    f"step {first.step}; replicated gradient norms {norms}; largest relative "
                    f"difference {first.max_rel_diff:.3g}): the ranks no longer train one model."
                ),
                evidence={
                    "profile": profile,
                    "ranks": ranks,
                    "first_step": first.step,
                    "steps_diverging": len(diverging),
                    "steps_compared": len(steps),
                    "max_rel_diff": _num(max(s.max_rel_diff for s in diverging)),
                    "rank_norms": [_num(v) for v in first.replicated_norms or first.rank_norms],
                    "param_max_rel_diff": _num(first.param_max_rel_diff),
                    "world_size": info.world_size,
                },
                fix=Fix(
                    description="Change gradients only before the all-reduce (inside "
                    "backward, or with a DDP communication hook), never on one rank after it; "
                    "keep every rank's model, seed-dependent layers and optimizer identical.",
                    snippet_id="ddp-no-sync-accumulation",
                ),
            )
        )
    out = _measured_allreduces(info, records, out, profile)
    return _first_nonfinite(info, out)


def _num(value: float | None) -> float | str | None:
    if value is None:
        return None
    if not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return float(f"{value:.6g}")


def _measured_allreduces(
    info: DistributedInfo, records: Sequence[StepRecord], findings: list[Finding], profile: str
) -> list[Finding]:
    counted = [s for s in info.steps if s.allreduces is not None]
    if not counted:
        return findings
    backward = {r.step: r.events.count("backward") for r in records}
    accumulated = [s for s in counted if backward.get(s.step, 0) >= 2]
    kept = [f for f in findings if f.id != "ddp-accum-without-no-sync"]
    if not accumulated or len(accumulated) * 2 < len(counted):
        return kept if accumulated else findings
    per_step = statistics.median(s.allreduces or 0 for s in accumulated)
    micro = statistics.median(backward[s.step] for s in accumulated)
    extra = [s for s in accumulated if (s.allreduces or 0) >= 2]
    if not extra or len(extra) * 2 < len(accumulated):
        return kept
    first = extra[0]
    kept.append(
        Finding(
            id="ddp-accum-without-no-sync",
            severity="warning",
            origin="runtime",
            step=first.step,
            message=(
                f"Measured {per_step:g} gradient all-reduces per optimizer step (DDP "
                f"communication hook, {len(extra)} of {len(accumulated)} accumulated steps) "
                f"with {micro:g} backward() calls per step: every micro-batch is synchronised, "
                f"where one all-reduce per step (the last micro-batch) is enough."
            ),
            evidence={
                "profile": profile,
                "allreduces_per_step": per_step,
                "backward_per_step": micro,
                "expected_allreduces_per_step": 1,
                "allreduce_buckets_per_step": statistics.median(
                    s.allreduce_buckets or 0 for s in accumulated
                ),
                "steps_affected": len(extra),
                "world_size": info.world_size,
                "counted_by": info.allreduce_counting,
            },
            fix=Fix(
                description="Run every micro-batch but the last inside `with model.no_sync():`.",
                snippet_id="ddp-no-sync-accumulation",
            ),
        )
    )
    return kept


NONFINITE_IDS = ("nan-gradients", "inf-gradients", "nan-loss-before-backward", "nan-parameters")


def _first_nonfinite(info: DistributedInfo, findings: list[Finding]) -> list[Finding]:
    if info.first_nonfinite_rank is None:
        return findings
    where = (
        f" First non-finite value: rank {info.first_nonfinite_rank} at step "
        f"{info.first_nonfinite_step} ({info.first_nonfinite_what})."
    )
    out: list[Finding] = []
    for finding in findings:
        if finding.id in NONFINITE_IDS:
            evidence = {
                **finding.evidence,
                "first_nonfinite_rank": info.first_nonfinite_rank,
                "first_nonfinite_step": info.first_nonfinite_step,
            }
            finding = finding.model_copy(
                update={"message": finding.message + where, "evidence": evidence}
            )
        out.append(finding)
    return out


def locate_first_nonfinite(steps: Sequence[RankStep]) -> tuple[int, int, str] | None:
    """(rank, step, what) of the first non-finite value: a rank's own loss before anything
    else (it is computed before the all-reduce spreads it), then its local gradients."""
    for step in sorted(steps, key=lambda s: s.step):
        if step.nonfinite_loss_ranks:
            return min(step.nonfinite_loss_ranks), step.step, "its loss"
        if step.nonfinite_grad_ranks:
            return min(step.nonfinite_grad_ranks), step.step, "its gradients"
    return None


def build_info(
    raw: Mapping[str, Any] | None,
    rank_steps: Sequence[RankStep],
    rank_status: Mapping[int, str],
) -> DistributedInfo | None:
    """Assemble :class:`DistributedInfo` from rank 0's end-of-run message and step series."""
    if raw is None and not rank_steps:
        return None
    data = dict(raw or {})
    data.pop("kind", None)
    if "world_size" not in data:
        data["world_size"] = rank_steps[0].world_size if rank_steps else 1
    info = DistributedInfo.model_validate(data)
    located = locate_first_nonfinite(rank_steps)
    update: dict[str, Any] = {
        "steps": sorted(rank_steps, key=lambda s: s.step),
        "rank_status": dict(rank_status),
        "sharded_parameters": max([s.sharded_parameters for s in rank_steps], default=0),
    }
    if located is not None:
        update["first_nonfinite_rank"], update["first_nonfinite_step"] = located[:2]
        update["first_nonfinite_what"] = located[2]
    return info.model_copy(update=update)


# -- launching and the parent's bookkeeping -----------------------------------------------------


def torchrun_command(python: str, nproc: int, child: Sequence[str]) -> list[str]:
    """``torchrun --nproc-per-node N`` around the probe's child module (``-m module args``).

    PyTorch's own launcher sets ``RANK``/``LOCAL_RANK``/``WORLD_SIZE``/``MASTER_*`` for each rank;
    ``--standalone`` runs a single-node rendezvous on a free port, so concurrent probes never
    collide on 29500.
    """
    return [
        python,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(nproc),
        "--standalone",
        "--max-restarts",
        "0",
        "-m",
        *child,
    ]


class RankCollector:
    """The parent's side of a distributed probe run: gathers the rank messages from the channel,
    reads the other ranks' final statuses, stops ranks left behind, and applies the merge."""

    KINDS = frozenset({"ranks", "distributed"})

    def __init__(self, channel: str | os.PathLike[str], nproc: int | None) -> None:
        self.channel = str(channel)
        self.nproc = nproc or 1
        self.steps: list[RankStep] = []
        self.raw: dict[str, Any] | None = None
        self.others: dict[int, ChildSummary] = {}

    def add(self, kind: str | None, message: dict[str, Any]) -> bool:
        """Take ``message`` if it is a rank message (True), else leave it to the caller."""
        if kind == "ranks":
            self.steps.append(RankStep.model_validate(message))
            return True
        if kind == "distributed":
            self.raw = dict(message)
            return True
        return False

    def stop(self) -> None:
        """SIGKILL the ranks still running (the launcher was stopped, or has exited)."""
        if self.nproc > 1:
            kill_ranks(self.channel, self.nproc)

    def finish(self) -> None:
        """After the launcher exited (or was stopped): read the ranks' files, stop stragglers.

        Call before the channel folder is removed."""
        if self.nproc > 1:
            self.others = read_rank_summaries(self.channel, self.nproc)
            kill_ranks(self.channel, self.nproc)

    def summary(self, summary: ChildSummary | None) -> ChildSummary | None:
        """Rank 0's summary, or the failing rank's (see :func:`merge_rank_summaries`)."""
        return merge_rank_summaries(summary, self.others) if self.others else summary

    def records(self, records: list[StepRecord]) -> list[StepRecord]:
        """Rank 0's records with global (shard-merged) gradient norms."""
        return merge_global_norms(records, self.steps) if self.steps else records

    def apply(self, result: ProbeResult, summary: ChildSummary | None) -> ProbeResult:
        """``result`` with the distributed findings and :class:`DistributedInfo` attached."""
        status = {0: summary.status} if summary is not None else {}
        status.update({rank: s.status for rank, s in self.others.items()})
        info = build_info(self.raw, self.steps, status if self.nproc > 1 else {})
        if info is None:
            return result
        findings = distributed_findings(info, result.records, result.findings, result.profile)
        rank = {"critical": 0, "warning": 1, "info": 2}
        findings.sort(key=lambda f: (rank[f.severity], f.step or 0))
        if any(f.severity != "info" for f in findings):
            findings = [f for f in findings if f.id != "healthy"]
        return result.model_copy(update={"findings": findings, "distributed": info})
