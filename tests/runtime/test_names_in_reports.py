"""The fix snippets of ``gradient-doctor check`` speak the script's own names, and only names
it is sure of: the training loader among separate train and validation loops, and no
accumulation count read off a logging condition."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import run_cli

# A training loop and a validation loop over different loaders, a print every 100 steps and
# no accumulation; the third training batch holds a NaN (a runtime finding with a snippet).
TWO_LOOPS = """
import torch
import torch.nn.functional as F

torch.manual_seed(0)
net = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(net.parameters(), lr=0.1)
train_dl = [(torch.randn(8, 4), torch.randint(0, 2, (8,))) for _ in range(12)]
train_dl[2][0][0, 0] = float("nan")
valid_dl = [(torch.randn(8, 4), torch.randint(0, 2, (8,))) for _ in range(2)]
for epoch in range(2):
    for it, (xb, yb) in enumerate(train_dl):
        opt.zero_grad()
        loss = F.cross_entropy(net(xb), yb)
        loss.backward()
        opt.step()
        if it % 100 == 0:
            print(epoch, it, loss.item())
    with torch.no_grad():
        for xv, yv in valid_dl:
            print(F.cross_entropy(net(xv), yv).item())
"""


@pytest.mark.slow
def test_check_snippet_uses_the_training_loader_of_two_loops(tmp_path: Path) -> None:
    script = tmp_path / "two_loops.py"
    script.write_text(TWO_LOOPS)
    done = run_cli("check", str(script), "--steps", "6", "--python", __import__("sys").executable)
    assert done.returncode == 1, done.stderr
    out = done.stdout
    assert "nonfinite-inputs" in out
    # The snippet's loop is the script's training loop, in its names.
    assert "for it, (xb, yb) in enumerate(train_dl):" in out, out
    assert "valid_dl" not in out.split("### Code to add")[-1]
    assert script.read_text() == TWO_LOOPS  # the user's file is untouched


def test_a_logging_condition_is_no_accumulation_count() -> None:
    # No snippet that a runtime-only finding renders takes the count, so this one is read
    # from the guesser that ``check`` and the server call.
    from gradient_doctor.skill_server.names import guess_names

    assert "accumulation_steps" not in guess_names(TWO_LOOPS)
    gated = TWO_LOOPS.replace(
        "        opt.step()\n", "        if (it + 1) % ACCUM == 0:\n            opt.step()\n"
    )
    assert guess_names(gated)["accumulation_steps"] == "ACCUM"
    # A scheduler stepped every 500 iterations is not an accumulation window either.
    scheduled = TWO_LOOPS.replace(
        "        if it % 100 == 0:\n",
        "        if it % 500 == 0:\n            sched.step()\n        if it % 100 == 0:\n",
    )
    assert "accumulation_steps" not in guess_names(scheduled)
    # Two training loops over different loaders: not sure which one, so left generic.
    both = TWO_LOOPS.replace(
        "print(F.cross_entropy(net(xv), yv).item())", "F.cross_entropy(net(xv), yv).backward()"
    )
    assert "loader" not in guess_names(both)
