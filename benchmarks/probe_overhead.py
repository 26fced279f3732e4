"""Overhead of the runtime gradient probe, measured in one run against baselines of the same run.

Prints:
1. probe vs no probe on a GPT-2-style training step (a scaled-down GPT-2: same block layout —
   token + position embeddings, pre-LayerNorm attention and 4x MLP blocks, tied head — with
   fewer/narrower layers so a step takes well under a second on 2 CPU cores), at the probe's
   default settings (per-tensor norms every step, richer statistics every 10 steps);
2. the common per-parameter loop that computes only norms with ``.item()`` vs no probe, and the
   time spent inside each per step, measured directly in the same run (the probe's plain and
   sampled steps, its channel write included, and the loop);
3. the monitoring time per step on GPT-2-124M's own gradient tensors (148 tensors, 124 M
   parameters), probe (plain, sampled and averaged steps) vs loop vs one read of all gradients
   (``torch._foreach_norm`` and one host sync: the memory-bound floor), without the training step;
4. per-step measurement cost for 10 → 5,000 gradient tensors (same total size), probe vs loop.

The probe's time is measured from outside, around every hook call (the measurement, the
record's decoding and its channel write, forward hooks on sampled steps, event bookkeeping).

Timings are interleaved (baseline, probe, loop, repeated) and summarised by medians, so machine
noise hits every variant alike. ``--device cuda`` runs the same on a GPU when one is present.

    python benchmarks/probe_overhead.py [--layers 4] [--width 256] [--steps 20] [--trials 5]
        [--skip-gpt2] [--skip-scaling]
"""

from __future__ import annotations

import argparse
import math
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from gradient_doctor.probes.runtime.child import hooks, measure
from gradient_doctor.probes.runtime.child.channel import ChannelWriter
from gradient_doctor.probes.runtime.child.collector import Collector


class Block(nn.Module):
    """Pre-LayerNorm Transformer block: causal self-attention and a 4x GELU MLP."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(width)
        self.c_attn = nn.Linear(width, 3 * width)
        self.c_proj = nn.Linear(width, width)
        self.ln_2 = nn.LayerNorm(width)
        self.c_fc = nn.Linear(width, 4 * width)
        self.mlp_proj = nn.Linear(4 * width, width)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        batch, length, width = h.shape
        q, k, v = self.c_attn(self.ln_1(h)).split(width, dim=2)
        shape = (batch, length, self.heads, width // self.heads)
        q, k, v = (t.view(shape).transpose(1, 2) for t in (q, k, v))
        attended = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        h = h + self.c_proj(attended.transpose(1, 2).reshape(batch, length, width))
        return h + self.mlp_proj(nn.functional.gelu(self.c_fc(self.ln_2(h))))


class SmallGPT(nn.Module):
    """GPT-2 layout at a reduced size (GPT-2 124M is 12 layers, width 768, 50257 tokens)."""

    def __init__(self, layers: int, width: int, heads: int, vocab: int, context: int) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(context, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.wte.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        h = self.wte(tokens) + self.wpe(positions)
        for block in self.blocks:
            h = block(h)
        return self.head(self.ln_f(h))


def naive_norm_loop(model: nn.Module) -> float:
    """The common monitoring loop: one norm and one ``.item()`` (a host sync) per parameter."""
    total = 0.0
    for _, param in model.named_parameters():
        if param.grad is not None:
            total += param.grad.norm(2).item() ** 2
    return math.sqrt(total)


def one_read_norm(model: nn.Module) -> float:
    """The floor: every gradient read once (one fused norm per tensor group) and one host sync."""
    grads = [param.grad for param in model.parameters() if param.grad is not None]
    norms = torch._foreach_norm(grads)
    return float(torch.linalg.vector_norm(torch.stack(norms)).item())


def make_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    data: torch.Tensor,
    monitor: Callable[[nn.Module], float] | None,
    batch: int = 8,
    autocast: torch.dtype | None = None,
) -> Callable[[], None]:
    vocab = model.wte.num_embeddings  # type: ignore[union-attr]

    def step() -> None:
        index = torch.randint(0, data.shape[0], (batch,), device=data.device)
        tokens = data[index]
        with torch.autocast(
            data.device.type, dtype=autocast or torch.float32, enabled=autocast is not None
        ):
            logits = model(tokens[:, :-1])
            loss = nn.functional.cross_entropy(logits.reshape(-1, vocab), tokens[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if monitor is not None:
            monitor(model)
        optimizer.step()

    return step


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def time_steps(step: Callable[[], None], steps: int, device: torch.device) -> list[float]:
    times = []
    for _ in range(steps):
        sync(device)
        start = time.perf_counter()
        step()
        sync(device)
        times.append(time.perf_counter() - start)
    return times


def overhead(args: argparse.Namespace, device: torch.device) -> None:
    torch.manual_seed(0)
    model = SmallGPT(args.layers, args.width, args.heads, args.vocab, args.context).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    data = torch.randint(0, args.vocab, (256, args.context + 1), device=device)
    n_params = sum(p.numel() for p in model.parameters())
    n_tensors = sum(1 for _ in model.parameters())
    # The child's own side channel: every record becomes one flushed JSON line.
    channel = ChannelWriter(Path(tempfile.mkdtemp()) / "channel.jsonl")

    #: Whether each recorded step was a sampled one, by step number.
    sampled_steps: dict[int, bool] = {}
    loop_costs: list[float] = []

    def sink(record: dict[str, object]) -> None:
        sampled_steps[int(record["step"])] = bool(record["sampled"])  # type: ignore[call-overload]
        channel.send("step", record)

    def timed_loop(module: nn.Module) -> float:
        start = time.perf_counter()
        total = naive_norm_loop(module)
        loop_costs.append(time.perf_counter() - start)
        return total

    autocast = {"none": None, "bf16": torch.bfloat16}[args.autocast]
    plain = make_step(model, optimizer, data, None, args.batch, autocast)
    naive = make_step(model, optimizer, data, timed_loop, args.batch, autocast)
    read_once = make_step(model, optimizer, data, one_read_norm, args.batch, autocast)
    for _ in range(3):
        plain()  # warm-up: allocator, kernels, optimizer state
    # One collector for the whole run, as in the probe's child (one first step, then sampled
    # steps every --sample-every); its hooks are installed only while the probe variant runs.
    collector = Collector(sink, sample_every=args.sample_every)
    step_costs = time_every_hook(collector)

    def probed() -> None:
        uninstall = hooks.install(collector)
        try:
            plain()
        finally:
            uninstall()

    variants: dict[str, Callable[[], None]] = {
        "baseline": plain,
        "probe": probed,
        "loop": naive,
        "one_read": read_once,
    }
    samples: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    # Round robin, one step each, rotating the order: load on a shared machine hits every
    # variant alike, and each round gives paired timings.
    for round_index in range(args.trials * args.steps):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            samples[name] += time_steps(variants[name], 1, device)
    collector.flush()
    channel.close()
    base = statistics.median(samples["baseline"])
    base_mean = statistics.mean(samples["baseline"])
    loop = statistics.median(samples["loop"])
    pairs = list(zip(samples["baseline"], samples["probe"], samples["loop"], strict=True))
    # Probe time per step, measured from outside around every hook call (the measurement, the
    # record's decoding, the channel write, forward hooks on sampled steps, event bookkeeping).
    steps = sorted(sampled_steps)
    sampled_flags = [sampled_steps[k] for k in steps]
    plain_cost = sorted(step_costs[k] for k in steps if not sampled_steps[k])
    sampled_cost = sorted(step_costs[k] for k in steps if sampled_steps[k])
    # Robust to a shared machine's load spikes: medians of paired (same-round) ratios, taken
    # separately over the probe's plain and sampled steps and weighted by how often each occurs.
    plain_ratios = [p / b for (b, p, _), s in zip(pairs, sampled_flags, strict=False) if not s]
    sampled_ratios = [p / b for (b, p, _), s in zip(pairs, sampled_flags, strict=False) if s]
    share = len(sampled_ratios) / max(len(pairs), 1)
    probe_ratio = (1 - share) * statistics.median(plain_ratios) + share * (
        statistics.median(sampled_ratios) if sampled_ratios else 1.0
    )
    loop_ratio = statistics.median(q / b for b, _, q in pairs)
    read_ratio = statistics.median(
        r / b for b, r in zip(samples["baseline"], samples["one_read"], strict=True)
    )
    plain_total = statistics.median(plain_cost)
    sampled_total = statistics.median(sampled_cost) if sampled_cost else 0.0
    averaged = (1 - share) * plain_total + share * sampled_total
    loop_step = statistics.median(loop_costs)
    print(
        f"model: GPT-2-style, {args.layers} layers, width {args.width}, {args.heads} heads, "
        f"vocab {args.vocab}, context {args.context}, batch {args.batch}, autocast "
        f"{args.autocast}: {n_params / 1e6:.1f} M "
        f"parameters in {n_tensors} tensors; device {device}; "
        f"{args.trials * args.steps} interleaved steps per variant"
    )
    print(f"baseline step: median {base * 1e3:.1f} ms, mean {base_mean * 1e3:.1f} ms")
    print(
        f"probe overhead, wall clock (paired medians, sample_every={args.sample_every}): "
        f"{(probe_ratio - 1) * 100:+.2f} %"
    )
    sampled_median = statistics.median(sampled_ratios) if sampled_ratios else 1.0
    print(
        f"  of which plain steps {(statistics.median(plain_ratios) - 1) * 100:+.2f} % and sampled "
        f"steps {(sampled_median - 1) * 100:+.2f} % "
        f"(paired medians; {share:.0%} of the steps sampled)"
    )
    print(
        f"probe overhead, time inside the probe (per-step medians, weighted): "
        f"{averaged / base * 100:.2f} %"
    )
    print(
        "per-parameter .item() norm loop overhead, wall clock (paired median): "
        f"{(loop_ratio - 1) * 100:+.2f} % (median step {loop * 1e3:.1f} ms)"
    )
    print(
        "one read of all gradients (torch._foreach_norm + one host sync) overhead, wall clock "
        f"(paired median): {(read_ratio - 1) * 100:+.2f} %"
    )
    print(
        f"per-step monitoring time, measured in this run at {n_tensors} tensors: plain-step probe "
        f"{plain_total * 1e3:.2f} ms vs .item() loop {loop_step * 1e3:.2f} ms "
        f"(loop/probe {loop_step / plain_total:.2f}x); sampled-step probe "
        f"{sampled_total * 1e3:.2f} ms ({len(sampled_cost)} of {len(steps)} steps sampled); "
        f"probe averaged over steps (weighted) {averaged * 1e3:.2f} ms "
        f"(loop/probe {loop_step / averaged:.2f}x)"
    )
    loop_sorted = sorted(loop_costs)
    print(
        "tails (a stall shows here): plain-step probe p90 "
        f"{plain_cost[int(0.9 * (len(plain_cost) - 1))] * 1e3:.2f} ms, max "
        f"{plain_cost[-1] * 1e3:.2f} ms; loop p90 "
        f"{loop_sorted[int(0.9 * (len(loop_sorted) - 1))] * 1e3:.2f} ms, max "
        f"{loop_sorted[-1] * 1e3:.2f} ms"
    )
    print(
        f"RATIOS probe/baseline={probe_ratio:.4f} loop/baseline={loop_ratio:.4f} "
        f"one_read/baseline={read_ratio:.4f}"
    )


def time_every_hook(collector: Collector) -> dict[int, float]:
    """Wrap each of the collector's event methods with a timer; returns seconds per step.

    The hooks look the methods up on every call, so instance attributes take effect. A call
    is charged to the step it belongs to: the one after the steps finished when it began.
    """
    spent: dict[int, float] = {}

    def timed(method: Callable[..., object]) -> Callable[..., object]:
        def wrapper(*args: object, **kwargs: object) -> object:
            step = collector.steps_done + 1
            start = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                spent[step] = spent.get(step, 0.0) + time.perf_counter() - start

        return wrapper

    for name in dir(collector):
        if name.startswith("on_") and callable(getattr(collector, name)):
            setattr(collector, name, timed(getattr(collector, name)))
    return spent


def gpt2_gradients(args: argparse.Namespace, device: torch.device) -> None:
    """Monitoring cost per step on GPT-2-124M's real gradient tensors (148 tensors, 124 M).

    A full GPT-2-124M training step takes seconds on 2 CPU cores, so this part times the
    monitoring alone, through the real code path: the probe's hooks on an ``SGD(lr=0)`` step
    (the step itself is not counted), against the ``.item()`` loop, both on the same gradients
    (half a GB, far larger than the caches, so every pass reads memory).
    """
    torch.manual_seed(0)
    model = SmallGPT(12, 768, 12, 50257, 1024).to(device)
    params = list(model.parameters())
    for param in params:
        param.grad = torch.randn_like(param)
    optimizer = torch.optim.SGD(params, lr=0.0)
    sampled_steps: dict[int, bool] = {}

    def sink(record: dict[str, object]) -> None:
        sampled_steps[int(record["step"])] = bool(record["sampled"])  # type: ignore[call-overload]

    collector = Collector(sink, sample_every=args.sample_every)
    step_costs = time_every_hook(collector)
    loop_costs: list[float] = []
    read_costs: list[float] = []
    uninstall = hooks.install(collector)
    try:
        for _ in range(args.gpt2_steps):
            optimizer.step()
            for monitor, costs in ((naive_norm_loop, loop_costs), (one_read_norm, read_costs)):
                sync(device)
                start = time.perf_counter()
                monitor(model)
                sync(device)
                costs.append(time.perf_counter() - start)
    finally:
        uninstall()
    collector.flush()
    plain = statistics.median(step_costs[k] for k, s in sampled_steps.items() if not s)
    sampled = statistics.median(step_costs[k] for k, s in sampled_steps.items() if s)
    share = sum(sampled_steps.values()) / len(sampled_steps)
    averaged = (1 - share) * plain + share * sampled
    loop = statistics.median(loop_costs)
    one_read = statistics.median(read_costs)
    n_params = sum(p.numel() for p in params)
    grad_bytes = sum(p.numel() * p.element_size() for p in params)
    print(
        f"\nGPT-2-124M gradients ({n_params / 1e6:.1f} M parameters in {len(params)} tensors, "
        f"{device}, {args.gpt2_steps} steps, sample_every={args.sample_every}): plain-step probe "
        f"{plain * 1e3:.1f} ms, sampled-step probe {sampled * 1e3:.1f} ms, averaged "
        f"{averaged * 1e3:.1f} ms vs .item() loop {loop * 1e3:.1f} ms "
        f"(loop/probe: plain {loop / plain:.2f}x, averaged {loop / averaged:.2f}x)"
    )
    print(
        f"one read of all gradients (torch._foreach_norm + one host sync, the floor): "
        f"{one_read * 1e3:.2f} ms = {grad_bytes / one_read / 1e9:.0f} GB/s over "
        f"{grad_bytes / 1e6:.0f} MB; probe/one-read: plain {plain / one_read:.2f}x, "
        f"averaged {averaged / one_read:.2f}x; loop/one-read {loop / one_read:.2f}x"
    )


def _scaling_row(count: int, total: int, repeats: int, device: torch.device) -> tuple[float, float]:
    """Median seconds per step: the probe's per-step measurement vs the ``.item()`` loop."""
    size = total // count
    grads: list[torch.Tensor | None] = [torch.randn(size, device=device) for _ in range(count)]
    grouping = measure.group_tensors(grads)
    transfer = measure.HostTransfer()

    def probe_once() -> None:
        transfer.submit(None, measure.per_tensor_norms(grads, grouping))
        transfer.flush()

    def loop_once() -> None:
        math.sqrt(sum(g.norm(2).item() ** 2 for g in grads if g is not None))

    probe_once()
    loop_once()
    probe_times: list[float] = []
    loop_times: list[float] = []
    for _ in range(repeats):
        for fn, times in ((probe_once, probe_times), (loop_once, loop_times)):
            sync(device)
            start = time.perf_counter()
            fn()
            sync(device)
            times.append(time.perf_counter() - start)
    return statistics.median(probe_times), statistics.median(loop_times)


def scaling(args: argparse.Namespace, device: torch.device) -> None:
    total = args.scaling_elements
    print(f"\nscaling: {total / 1e6:.0f} M gradient elements split into N tensors ({device})")
    print(f"{'N':>6} {'probe norms/step':>18} {'item() loop/step':>18} {'loop/probe':>11}")
    for count in (10, 100, 1000, 5000):
        probe, loop = _scaling_row(count, total, args.scaling_repeats, device)
        print(f"{count:>6} {probe * 1e3:>15.2f} ms {loop * 1e3:>15.2f} ms {loop / probe:>10.1f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--sample-every", type=int, default=10)
    parser.add_argument("--scaling-elements", type=int, default=4_000_000)
    parser.add_argument("--scaling-repeats", type=int, default=20)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument(
        "--autocast", choices=("none", "bf16"), default="none", help="bf16 autocast forward"
    )
    parser.add_argument("--skip-scaling", action="store_true")
    parser.add_argument("--gpt2-steps", type=int, default=30)
    parser.add_argument("--skip-gpt2", action="store_true")
    args = parser.parse_args()
    device = torch.device(args.device)
    overhead(args, device)
    if not args.skip_gpt2:
        gpt2_gradients(args, device)
    if not args.skip_scaling:
        scaling(args, device)


if __name__ == "__main__":
    main()
