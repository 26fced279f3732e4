"""Speed of the static analyser: lines per second, a folder of scripts, and linearity.

Generates realistic training code (model classes, several training-loop styles, evaluation
loops, helpers), lints it in-process on one core and prints:

* lines/s on a generated 2,000-line script (target: at least 5,000 lines/s);
* the time for a folder of 200 generated scripts through ``lint_paths`` (reading included);
* the ratio of the time for a 10x larger script to the 2,000-line one (linear cost: about 10);
* a generated project of 1,000 files (packages of models, data helpers, training utilities
  and loops that import them) linted as a folder with the project index, and the same folder
  without it: the index's cost as a ratio measured in the same run (target: the whole project
  in seconds, the index adding at most 50 %).

Every number is measured in the same run; nothing is compared with a stored baseline. Times
are CPU seconds of this process (``time.process_time``), best of ``--repeats``.

    .venv/bin/python benchmarks/lint_speed.py [--lines 2000] [--files 200] [--check] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

TARGET_LINES_PER_S = 5000.0
TARGET_PROJECT_SECONDS = 60.0
"""A 1,000-file project "in seconds": well under a minute of CPU on one core."""
TARGET_INDEX_OVERHEAD = 1.5

HEADER = '''\
"""Generated benchmark script: models, training loops and evaluation loops."""

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import clip_grad_norm_ as clip
'''

BLOCKS = [
    """

class Block{i}(nn.Module):
    def __init__(self, width={w}):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, 4 * width)
        self.fc2 = nn.Linear(4 * width, width)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))
""",
    """

def train_classic_{i}(model, loader, epochs={e}, max_norm=1.0):
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10, gamma=0.5)
    for epoch in range(epochs):
        model.train()
        for x, y in loader:
            optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
            optimizer.step()
        scheduler.step()
        print(f"epoch {{epoch}}: loss {{loss.item():.4f}} norm {{norm:.3f}}")
""",
    """

def train_accumulate_{i}(model, loader, optimizer, accum_steps={a}):
    optimizer.zero_grad()
    for i, (x, y) in enumerate(loader):
        loss = F.mse_loss(model(x), y)
        loss = loss / accum_steps
        loss.backward()
        if (i + 1) % accum_steps == 0:
            clip(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad()
""",
    """

def train_amp_{i}(model, loader, optimizer, device="cuda"):
    scaler = torch.amp.GradScaler("cuda")
    for step, (x, y) in enumerate(loader):
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device_type="cuda", dtype=torch.float16):
            loss = F.cross_entropy(model(x.to(device)), y.to(device))
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        total = nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)
        scaler.update()
        if step % 100 == 0:
            print(step, total.item())
""",
    """

@torch.no_grad()
def evaluate_{i}(model, loader):
    model.eval()
    correct, total = 0, 0
    for x, y in loader:
        prediction = model(x).argmax(dim=-1)
        correct += (prediction == y).sum().item()
        total += y.numel()
    return correct / max(total, 1)
""",
    """

class Trainer{i}:
    def __init__(self, model, lr=1e-3):
        self.model = model
        self.optimizer = torch.optim.Adam(model.parameters(), lr=lr)

    def _clip(self):
        return nn.utils.clip_grad_norm_(self.model.parameters(), 0.5)

    def train_step(self, x, y):
        self.optimizer.zero_grad()
        loss = F.smooth_l1_loss(self.model(x), y)
        loss.backward()
        self._clip()
        self.optimizer.step()
        return loss.item()

    def fit(self, loader, epochs={e}):
        for _ in range(epochs):
            for x, y in loader:
                self.train_step(x, y)
""",
    """

def train_micro_{i}(model, get_batch, optimizer, grad_accum={a}, iters=1000):
    for it in range(iters):
        for micro_step in range(grad_accum):
            x, y = get_batch()
            loss = model(x, y) / grad_accum
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def cosine_lr_{i}(step, warmup=100, total=10000, base=3e-4):
    if step < warmup:
        return base * step / warmup
    return 0.5 * base * (1 + math.cos(math.pi * (step - warmup) / (total - warmup)))
""",
]


def generate_script(target_lines: int, seed: int = 0) -> str:
    """A realistic training module of about ``target_lines`` lines (never fewer)."""
    parts = [HEADER]
    lines = HEADER.count("\n")
    i = seed * 100_000
    while lines < target_lines:
        block = BLOCKS[i % len(BLOCKS)].format(i=i, w=64 + 32 * (i % 5), e=5 + i % 7, a=2 + i % 6)
        parts.append(block)
        lines += block.count("\n")
        i += 1
    return "".join(parts)


PROJECT_MODEL = '''\
"""Model family {p}.{m}."""

import torch
from torch import nn


class Block{m}(nn.Module):
    def __init__(self, width={w}):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc = nn.Linear(width, width)

    def forward(self, x):
        return x + self.fc(torch.relu(self.norm(x)))


def build_{m}(depth=4, width={w}):
    return nn.Sequential(*[Block{m}(width) for _ in range(depth)])
'''

PROJECT_DATA = '''\
"""Data helpers {p}.{m}."""

import random

import torch


def batches_{m}(n, batch_size=8, width={w}):
    for _ in range(n):
        x = torch.randn(batch_size, width)
        yield x, x.sum(dim=1, keepdim=True) * random.random()


def split_{m}(items, fraction=0.9):
    cut = int(len(items) * fraction)
    return items[:cut], items[cut:]
'''

PROJECT_UTILS = '''\
"""Training utilities {p}.{m}."""

import torch


def clip_{m}(model, max_norm=1.0):
    return torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)


def backward_{m}(model, x, y, accum):
    loss = torch.nn.functional.mse_loss(model(x), y)
    {backward}
    return loss.detach()


def log_{m}(step, loss, norm):
    if step % 100 == 0:
        print(f"step {{step}}: loss {{loss:.4f}} grad norm {{norm:.3f}}")
'''

PROJECT_TRAIN = '''\
"""Training loop {p}.{m}: the model, data and helpers come from sibling modules."""

import torch

from {p}.data_{d} import batches_{d}
from {p}.models_{d} import build_{d}
from {p}.utils_{d} import backward_{d}, clip_{d}, log_{d}


def train_{m}(steps=1000, accum={a}):
    model = build_{d}()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    scaler = torch.amp.GradScaler("cuda")
    for step, (x, y) in enumerate(batches_{d}(steps)):
        loss = backward_{d}(model, x, y, accum)
        if (step + 1) % accum == 0:
            norm = clip_{d}(model)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            log_{d}(step, loss, norm)
    return model


if __name__ == "__main__":
    train_{m}()
'''

PROJECT_KINDS = (PROJECT_MODEL, PROJECT_DATA, PROJECT_UTILS, PROJECT_TRAIN)


def generate_project(root: Path, files: int) -> int:
    """Write a project of ``files`` modules under ``root`` in packages of 50; lines written."""
    lines = 0
    written = 0
    package_index = 0
    while written < files:
        package = f"pkg{package_index:02d}"
        (root / package).mkdir(parents=True, exist_ok=True)
        (root / package / "__init__.py").write_text("", encoding="utf-8")
        written += 1
        for m in range(49):
            if written >= files:
                break
            kind = m % len(PROJECT_KINDS)
            name = ("models", "data", "utils", "train")[kind]
            group = m // len(PROJECT_KINDS)  # models_g, data_g, utils_g and train_g go together
            # One group in five forgets to divide the loss in its utils module: a bug only the
            # index sees (the loop that accumulates is in train_g).
            backward = "loss.backward()" if group % 5 == 2 else "(loss / accum).backward()"
            text = PROJECT_KINDS[kind].format(
                p=package,
                m=group,
                d=group,
                w=32 + 8 * (group % 4),
                a=2 + group % 3,
                backward=backward,
            )
            # The rest of a real module: model code, loops and helpers of its own.
            for extra in range(3):
                text += BLOCKS[(m + extra + package_index) % len(BLOCKS)].format(
                    i=10_000 * package_index + 100 * m + extra, w=64, e=5, a=3
                )
            (root / package / f"{name}_{group}.py").write_text(text, encoding="utf-8")
            lines += text.count("\n")
            written += 1
        package_index += 1
    return lines


def _best_of(repeats: int, action: Callable[[], object]) -> float:
    """Best CPU time of ``repeats`` runs: the process's own CPU seconds, so other work on a
    shared machine does not count against the analyser (it is single-threaded)."""
    times = []
    for _ in range(repeats):
        start = time.process_time()
        action()
        times.append(time.process_time() - start)
    return min(times)


def _pin_to_one_core() -> str:
    if hasattr(os, "sched_setaffinity"):
        try:
            core = min(os.sched_getaffinity(0))
            os.sched_setaffinity(0, {core})
            return f"pinned to core {core}"
        except OSError:
            pass
    return "not pinned (single-threaded Python)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, default=2000, help="size of the single script")
    parser.add_argument("--files", type=int, default=200, help="scripts in the folder run")
    parser.add_argument("--file-lines", type=int, default=150, help="lines per folder script")
    parser.add_argument("--repeats", type=int, default=3, help="best of N timings")
    parser.add_argument("--project-files", type=int, default=1000, help="files in the project")
    parser.add_argument("--check", action="store_true", help="exit 1 below the targets")
    parser.add_argument("--profile", action="store_true", help="print a cProfile of one run")
    parser.add_argument("--json", action="store_true", help="print the numbers as JSON too")
    args = parser.parse_args(argv)

    pinned = _pin_to_one_core()
    from gradient_doctor.probes.static import lint_paths, lint_source

    one = generate_script(args.lines)
    ten = generate_script(args.lines * 10)
    one_lines, ten_lines = one.count("\n"), ten.count("\n")

    warm = lint_source(one, "bench.py")  # imports, rule discovery, caches
    if warm.error:
        print(f"the generated script did not analyse: {warm.error}", file=sys.stderr)
        return 2
    t_one = _best_of(args.repeats, lambda: lint_source(one, "bench.py"))
    t_ten = _best_of(max(1, args.repeats - 1), lambda: lint_source(ten, "bench10.py"))
    lines_per_s = one_lines / t_one
    ratio = t_ten / t_one

    with tempfile.TemporaryDirectory() as folder:
        total_folder_lines = 0
        for n in range(args.files):
            text = generate_script(args.file_lines, seed=n + 1)
            total_folder_lines += text.count("\n")
            (Path(folder) / f"script_{n:03d}.py").write_text(text, encoding="utf-8")
        t_folder = _best_of(args.repeats, lambda: lint_paths([folder]))
        folder_report = lint_paths([folder])
    errors = [f.error for f in folder_report.files if f.error]

    with tempfile.TemporaryDirectory() as project:
        project_lines = generate_project(Path(project), args.project_files)
        project_report = lint_paths([project])
        t_indexed = _best_of(max(1, args.repeats - 2), lambda: lint_paths([project]))
        t_plain = _best_of(
            max(1, args.repeats - 2), lambda: lint_paths([project], project_index=False)
        )
    cross_file = sum(
        1 for f in project_report.findings if f.path.rsplit("/", 1)[-1].startswith("utils_")
    )
    errors += [f.error for f in project_report.files if f.error]
    index_ratio = t_indexed / t_plain

    numbers = {
        "cpu": pinned,
        "script_lines": one_lines,
        "script_seconds": round(t_one, 4),
        "lines_per_second": round(lines_per_s),
        "findings_in_script": len(warm.findings),
        "folder_files": args.files,
        "folder_lines": total_folder_lines,
        "folder_seconds": round(t_folder, 3),
        "folder_lines_per_second": round(total_folder_lines / t_folder),
        "folder_errors": len(errors),
        "ten_x_lines": ten_lines,
        "ten_x_seconds": round(t_ten, 4),
        "ten_x_over_one_x": round(ratio, 2),
        "ten_x_over_one_x_per_line": round(ratio * one_lines / ten_lines, 3),
        "project_files": args.project_files,
        "project_lines": project_lines,
        "project_seconds_with_index": round(t_indexed, 3),
        "project_seconds_without_index": round(t_plain, 3),
        "index_over_plain": round(index_ratio, 3),
        "findings_in_helper_modules": cross_file,
    }
    print(f"CPU: {pinned}")
    print(
        f"single script : {one_lines} lines in {t_one * 1000:.1f} ms -> {lines_per_s:,.0f} lines/s "
        f"(target >= {TARGET_LINES_PER_S:,.0f}) [{len(warm.findings)} findings]"
    )
    print(
        f"folder        : {args.files} scripts, {total_folder_lines} lines in {t_folder:.2f} s -> "
        f"{total_folder_lines / t_folder:,.0f} lines/s, {args.files / t_folder:.1f} files/s"
        + (f" [{len(errors)} file errors: {errors[0]}]" if errors else "")
    )
    print(
        f"linearity     : {ten_lines} lines take {ratio:.2f}x the time of {one_lines} lines "
        f"(linear = {ten_lines / one_lines:.1f}x; "
        f"per-line ratio {numbers['ten_x_over_one_x_per_line']})"
    )
    print(
        f"project       : {args.project_files} files, {project_lines} lines in "
        f"{t_indexed:.2f} s with the index ({args.project_files / t_indexed:.0f} files/s; "
        f"target < {TARGET_PROJECT_SECONDS:.0f} s), {t_plain:.2f} s without "
        f"(index/plain {index_ratio:.2f}; target <= {TARGET_INDEX_OVERHEAD}); "
        f"{cross_file} findings in helper modules, seen through the index"
    )
    if args.json:
        print(json.dumps(numbers))
    if args.profile:
        profiler = cProfile.Profile()
        profiler.enable()
        lint_source(one, "bench.py")
        profiler.disable()
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(30)
        print(out.getvalue())
    if args.check:
        slow = lines_per_s < TARGET_LINES_PER_S
        superlinear = ratio * one_lines / ten_lines > 1.5
        slow_project = t_indexed > TARGET_PROJECT_SECONDS or index_ratio > TARGET_INDEX_OVERHEAD
        if slow or superlinear or slow_project or errors:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
