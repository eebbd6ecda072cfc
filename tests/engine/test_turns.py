"""FairLock: reentrant, and granted in arrival order even against a thread that keeps asking.

What another thread does is collected and asserted on in the test's own thread: an assert that
fails inside a thread only prints a warning.
"""

from __future__ import annotations

import threading
import time

from pc_cpu.engine.turns import ContextLocks, FairLock


def raised_in_another_thread(fn) -> BaseException | None:
    """Returns what `fn` raised when run in a new thread (None if it returned), once that thread ended."""
    raised = []

    def run():
        try:
            fn()
        except BaseException as exc:  # handed to the test's thread, which asserts on it
            raised.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(timeout=10)
    assert not thread.is_alive(), f"{fn} did not return within 10 s"
    return raised[0] if raised else None


def test_only_the_owner_can_release():
    lock = FairLock()
    with lock:
        error = raised_in_another_thread(lock.release)
        assert isinstance(error, RuntimeError) and "does not hold it" in str(error)
    assert raised_in_another_thread(lambda: lock.acquire() and lock.release()) is None  # free again


def test_reentrant_and_free_only_after_the_outermost_release():
    lock = FairLock()
    taken = threading.Event()

    def take():
        with lock:
            taken.set()

    other = threading.Thread(target=take)
    with lock:
        with lock:
            other.start()
        assert not taken.wait(0.1)  # still held after the inner release
    assert taken.wait(10)  # the outer release lets the other thread in
    other.join(timeout=10)


def test_a_waiting_thread_gets_in_between_a_busy_threads_turns():
    lock = FairLock()
    stop = threading.Event()
    deadline = time.monotonic() + 5  # an unfair lock makes the test fail after 5 s, not hang

    def busy():
        while not stop.is_set() and time.monotonic() < deadline:
            with lock:
                time.sleep(0.002)

    worker = threading.Thread(target=busy)
    worker.start()
    time.sleep(0.02)
    started = time.perf_counter()
    with lock:
        waited = time.perf_counter() - started
    stop.set()
    worker.join(timeout=10)
    assert waited < 0.5  # one of the busy thread's turns, not "until it stops"


def test_yield_turn_lets_every_waiting_thread_in_first_then_resumes():
    lock = FairLock()
    order = []
    lock.acquire()
    waiters = [threading.Thread(target=lambda i=i: (lock.acquire(), order.append(i), lock.release())) for i in range(2)]
    for thread in waiters:
        thread.start()
    deadline = time.monotonic() + 5
    while lock._next_ticket < 3 and time.monotonic() < deadline:  # both hold a ticket: they are waiting
        time.sleep(0.001)
    lock.yield_turn()
    order.append("resumed")
    lock.release()
    for thread in waiters:
        thread.join(timeout=10)
    assert order == [0, 1, "resumed"]


def test_yield_turn_keeps_the_lock_when_nobody_waits_or_when_nested():
    lock = FairLock()
    with lock:
        lock.yield_turn()  # nobody waits: still held, by this thread
        assert isinstance(raised_in_another_thread(lock.release), RuntimeError)
        with lock:
            waiter = threading.Thread(target=lambda: (lock.acquire(), lock.release()))
            waiter.start()
            time.sleep(0.05)
            lock.yield_turn()  # nested: an outer holder expects no interruption
            assert waiter.is_alive()
    waiter.join(timeout=10)
    assert not waiter.is_alive()


def test_the_adder_is_taken_only_when_free_and_never_waited_for_under_a_nested_context():
    locks = ContextLocks()
    with locks.adder_if_free() as taken:
        assert taken
        with locks.adder_if_free() as again:  # busy: refused at once, not waited for
            assert not again
    with locks.context, locks.context:  # a nested holder cannot yield the context between batches
        with locks.adder_if_free() as taken:
            assert not taken
    with locks.context:
        with locks.adder_if_free() as taken:
            assert taken


def test_adding_takes_the_adder_then_the_context_and_gives_both_back():
    locks = ContextLocks()
    with locks.adding():
        assert raised_in_another_thread(lambda: _assert_adder_busy(locks)) is None
    with locks.adder_if_free() as taken:
        assert taken  # released


def _assert_adder_busy(locks: ContextLocks) -> None:
    with locks.adder_if_free() as taken:
        assert not taken
