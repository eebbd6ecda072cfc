"""FairLock: reentrant, and granted in arrival order even against a thread that keeps asking."""

from __future__ import annotations

import threading
import time

import pytest

from pc_cpu.engine.turns import FairLock


def test_reentrant_and_released_only_by_its_owner():
    lock = FairLock()
    with lock:
        with lock:
            pass
        other = threading.Thread(target=lambda: pytest.raises(RuntimeError, lock.release))
        other.start()
        other.join()
    with lock:  # fully released above: can be taken again
        pass


def test_a_waiting_thread_gets_in_between_a_busy_threads_turns():
    lock = FairLock()
    stop = threading.Event()
    turns_while_waiting = []

    def busy():
        while not stop.is_set():
            with lock:
                time.sleep(0.002)

    worker = threading.Thread(target=busy)
    worker.start()
    time.sleep(0.02)
    started = time.perf_counter()
    with lock:
        turns_while_waiting.append(time.perf_counter() - started)
    stop.set()
    worker.join()
    assert turns_while_waiting[0] < 0.5  # one of the busy thread's turns, not "until it stops"
