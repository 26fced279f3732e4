"""What a user's install weighs: the wheel alone versus the wheel with the ``probe`` extra.

Builds the wheel from this checkout, installs it into two fresh virtualenvs the way a user on
PyPI would (``pip --isolated``: PyPI only, no local wheel folders or pip configuration), one
plain and one with ``[probe]`` (torch), and prints each venv's size on disk, the number of
distributions installed, and whether torch or NVIDIA CUDA packages came along. The baseline is
the size of an empty virtualenv, measured in the same run. Slow (the extra downloads torch
with its CUDA libraries); it needs the network and a few GB of free disk.

    .venv/bin/python benchmarks/install_size.py [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import venv
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _fresh_copy(target: Path) -> Path:
    """The checkout's files as git sees them (no stale build/ folder in the wheel)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO, capture_output=True, check=True,
    ).stdout.decode()  # fmt: skip
    for name in filter(None, listed.split("\0")):
        if (REPO / name).is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, target / name)
    return target


def folder_bytes(folder: Path) -> int:
    """Bytes of the regular files under ``folder`` (links not followed)."""
    total = 0
    for dirpath, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(dirpath, name)
            if not os.path.islink(path):
                total += os.path.getsize(path)
    return total


def install(target: Path, requirement: str) -> dict[str, object]:
    """Install ``requirement`` into a new venv at ``target``; its size and what came along."""
    venv.create(target, with_pip=True)
    python = str(target / "bin" / "python")
    subprocess.run(
        [python, "-m", "pip", "install", "--isolated", "-q", "--disable-pip-version-check",
         requirement],
        check=True, env={k: v for k, v in os.environ.items() if not k.startswith("PIP_")},
    )  # fmt: skip
    listed = subprocess.run(
        [python, "-m", "pip", "list", "--format", "json"], capture_output=True, text=True,
        check=True,
    )  # fmt: skip
    names = sorted(p["name"].lower() for p in json.loads(listed.stdout))
    return {
        "bytes": folder_bytes(target),
        "distributions": len(names),
        "torch": [n for n in names if n == "torch" or n == "triton"],
        "cuda": [n for n in names if n.startswith("nvidia-")],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", type=Path, default=None, help="keep the venvs in DIR")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gd-install-size-")) if args.keep is None else args.keep
    work.mkdir(parents=True, exist_ok=True)
    try:
        dist = work / "dist"
        subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
             "-w", str(dist), str(_fresh_copy(work / "source"))],
            check=True,
        )  # fmt: skip
        (wheel,) = dist.glob("gradient_doctor-*.whl")
        empty = work / "empty"
        venv.create(empty, with_pip=True)
        baseline = folder_bytes(empty)
        rows = {
            "plain": install(work / "plain", str(wheel)),
            "[probe]": install(work / "probe", f"{wheel}[probe]"),
        }
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    print(f"wheel {wheel.name}: {wheel.stat().st_size / 2**20:.2f} MiB")
    print(f"empty venv (baseline): {baseline / 2**20:.0f} MiB")
    for name, row in rows.items():
        size = int(row["bytes"])  # type: ignore[call-overload]
        print(
            f"{name:<8} {size / 2**20:8.0f} MiB  ({(size - baseline) / 2**20:.0f} MiB over the "
            f"baseline, {size / baseline:.1f}x)  {row['distributions']} distributions; "
            f"torch: {row['torch'] or 'none'}; CUDA packages: {len(row['cuda'])}"  # type: ignore[arg-type]
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
