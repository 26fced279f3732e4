"""Pasted errors: non-gradient ones are out of scope with their own pointer, ours stay in."""

from __future__ import annotations

import pytest

from gradient_doctor.knowledge._errors import read_errors
from gradient_doctor.knowledge.matcher import match


@pytest.mark.parametrize(
    ("text", "kind", "pointer_word"),
    [
        (
            'Traceback (most recent call last):\n  File "run.py", line 2, in <module>\n'
            "    import xformers.ops\nModuleNotFoundError: No module named 'xformers'",
            "install",
            "reinstall",
        ),
        (
            "RuntimeError: DataLoader worker (pid 771) is killed by signal: Bus error. It is "
            "possible that dataloader's workers are out of shared memory.",
            "loader-workers",
            "shm-size",
        ),
        (
            "RuntimeError: mat1 and mat2 shapes cannot be multiplied (8x4096 and 1024x3)",
            "shape",
            "in_features",
        ),
        (
            "RuntimeError: Expected all tensors to be on the same device, but found at least two "
            "devices, cpu and cuda:1!",
            "device",
            "model.to(device)",
        ),
        ("RuntimeError: expected scalar type Long but found Float", "dtype", ".long()"),
        (
            "RuntimeError: CUDA error: device-side assert triggered\nCompile with "
            "`TORCH_USE_CUDA_DSA` to enable device-side assertions.",
            "index",
            "CUDA_LAUNCH_BLOCKING",
        ),
        (
            "my eval loop under torch.no_grad() throws CUDA out of memory after 300 batches,"
            " training is fine",
            "eval-memory",
            "inference_mode",
        ),
        (
            "[rank1]:[E ProcessGroupNCCL.cpp:600] Watchdog caught collective operation timeout",
            "distributed",
            "NCCL_DEBUG",
        ),
        (
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 500 MiB, raised by "
            "AutoModel.from_pretrained on a 16 GB card",
            "load-memory",
            "half precision",
        ),
    ],
)
def test_non_gradient_errors_are_out_of_scope_with_their_pointer(
    text: str, kind: str, pointer_word: str
) -> None:
    reading = read_errors(text)
    assert reading is not None and reading.kind.name == kind
    result = match(text)
    assert result.out_of_scope
    assert [m.id for m in result.matches[:1]] == ["out-of-scope"]
    assert result.pointer and pointer_word in result.pointer
    assert "not a gradient failure" in result.matches[0].reasons[0]


@pytest.mark.parametrize(
    "text",
    [
        "RuntimeError: element 0 of tensors does not require grad and does not have a grad_fn",
        "RuntimeError: one of the variables needed for gradient computation has been modified by"
        " an inplace operation: [torch.cuda.FloatTensor [256]] is at version 3; expected version 2",
        "RuntimeError: Trying to backward through the graph a second time (or directly access"
        " saved tensors after they have already been freed).",
        "RuntimeError: Function 'PowBackward0' returned nan values in its 0th output.",
        "RuntimeError: The total norm of order 2.0 for gradients from `parameters` is"
        " non-finite, so it cannot be clipped.",
        # A gradient error next to a device message stays ours.
        "with anomaly mode on: RuntimeError: Function 'LogBackward0' returned nan values in its"
        " 0th output. Earlier I had fixed 'Expected all tensors to be on the same device'.",
    ],
)
def test_gradient_errors_stay_in_scope(text: str) -> None:
    # Read as a non-gradient error only with the gradient error that keeps it ours.
    reading = read_errors(text)
    assert reading is None or reading.gradient_kinds
    result = match(text)
    assert not result.out_of_scope and result.pointer is None
    assert "out-of-scope" not in [m.id for m in result.matches[:3]]


@pytest.mark.parametrize(
    "text",
    [
        # Memory in a training step is the memory questions' own.
        "torch.OutOfMemoryError: CUDA out of memory in loss.backward() at batch 64, I need 256",
        # The rest of the text reports a gradient problem after the import was fixed.
        "after fixing \"ImportError: cannot import name 'amp' from 'apex'\" my loss is nan"
        " from step 40 on",
    ],
)
def test_a_non_gradient_error_next_to_a_gradient_problem_stays_in_scope(text: str) -> None:
    result = match(text)
    assert not result.out_of_scope


def test_text_without_an_error_reads_none() -> None:
    assert read_errors("my loss goes to NaN after 2k steps with fp16") is None


def test_memory_while_training_is_no_loading_error() -> None:
    # The same message inside a step that computes gradients is the memory entries' own.
    text = "CUDA out of memory right after loading the model, in loss.backward() of step 1"
    assert read_errors(text) is None
