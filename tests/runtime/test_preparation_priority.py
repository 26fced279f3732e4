"""The CLI's own preparation (imports, knowledge base) runs below the script's priority."""

from __future__ import annotations

import os
import sys
import threading

import pytest

from gradient_doctor.probes.runtime.launch import PREPARATION_NICE, lower_thread_priority

linux_only = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="per-thread nice values are a Linux feature"
)


def _nice_of_this_thread() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


@linux_only
def test_only_the_calling_thread_and_the_threads_it_starts_are_lowered() -> None:
    seen: dict[str, object] = {}

    def preparation() -> None:
        before = _nice_of_this_thread()
        seen["lowered"] = lower_thread_priority()
        seen["step"] = _nice_of_this_thread() - before

        def started_later() -> None:
            seen["inherited"] = _nice_of_this_thread()

        worker = threading.Thread(target=started_later)
        worker.start()
        worker.join()
        seen["preparation"] = _nice_of_this_thread()

    main_before = _nice_of_this_thread()
    thread = threading.Thread(target=preparation)
    thread.start()
    thread.join()

    assert seen["lowered"] is True
    assert seen["step"] == min(PREPARATION_NICE, 19 - main_before)
    assert seen["inherited"] == seen["preparation"]
    # The main thread (the watcher and the report at the end) keeps its priority.
    assert _nice_of_this_thread() == main_before


def test_elsewhere_nothing_is_changed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "platform", "darwin")
    before = os.getpriority(os.PRIO_PROCESS, 0)
    assert lower_thread_priority() is False
    assert os.getpriority(os.PRIO_PROCESS, 0) == before
