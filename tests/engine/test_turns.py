"""FairLock: reentrant, and granted in arrival order even against a thread that keeps asking.

What another thread does is collected and asserted on in the test's own thread: an assert that
fails inside a thread only prints a warning.
"""

from __future__ import annotations

import threading

from pc_cpu.engine.runtime.locks import ContextLocks, FairLock

WAIT_S = 60  # a deadline for what takes milliseconds, generous on a loaded machine: a broken lock fails, not hangs


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
    thread.join(timeout=WAIT_S)
    assert not thread.is_alive(), f"{fn} did not return within {WAIT_S} s"
    return raised[0] if raised else None


def started(target) -> threading.Thread:
    """Returns a running thread of `target`, a daemon: one that a failed test leaves waiting cannot hang pytest."""
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread


def joined(thread: threading.Thread) -> bool:
    """Returns whether `thread` ended within WAIT_S."""
    thread.join(timeout=WAIT_S)
    return not thread.is_alive()


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

    with lock:
        with lock:
            other = started(take)
            assert lock.wait_for_waiters(1, WAIT_S)
        # Still held after the inner release. The other thread waits already, so a lock freed too
        # early lets it in within this window on a quiet machine; a loaded one can only miss it.
        assert not taken.wait(0.1) and lock.waiting == 1
    assert taken.wait(WAIT_S)  # the outer release lets the other thread in
    assert joined(other)


def test_waiting_counts_the_threads_queued_for_the_lock_and_can_be_waited_for():
    lock = FairLock()
    assert lock.waiting == 0 and not lock.wait_for_waiters(1, 0.01)
    with lock:
        assert lock.waiting == 0  # the holder is not waiting
        with lock:
            assert lock.waiting == 0  # nor is it when it takes the lock again
        threads = [started(lambda: (lock.acquire(), lock.release())) for _ in range(2)]
        assert lock.wait_for_waiters(2, WAIT_S) and lock.waiting == 2
    assert all(joined(thread) for thread in threads)
    assert lock.waiting == 0


def test_a_waiting_thread_gets_in_between_a_busy_threads_turns():
    lock = FairLock()
    order, first_turn, stop = [], threading.Event(), threading.Event()

    def busy():
        # Each turn lasts until the test's thread waits for the lock; an unfair lock lets this
        # thread take every turn back at once, so it stops after a few rather than forever.
        for _ in range(5):
            with lock:
                order.append("busy")
                first_turn.set()
                if stop.is_set() or not lock.wait_for_waiters(1, WAIT_S):
                    return

    worker = started(busy)
    assert first_turn.wait(WAIT_S)
    with lock:  # asked for during the busy thread's first turn
        order.append("waiter")
        stop.set()
    assert joined(worker)
    assert order == ["busy", "waiter", "busy"]  # in after one turn, not "until it stops"


def test_yield_turn_lets_every_waiting_thread_in_first_then_resumes():
    lock = FairLock()
    order = []
    lock.acquire()
    waiters = []
    for i in range(2):  # one at a time, so that they queue in this order
        waiters.append(started(lambda i=i: (lock.acquire(), order.append(i), lock.release())))
        assert lock.wait_for_waiters(i + 1, WAIT_S)
    lock.yield_turn()
    order.append("resumed")
    lock.release()
    assert all(joined(thread) for thread in waiters)
    assert order == [0, 1, "resumed"]


def test_yield_turn_keeps_the_lock_when_nobody_waits_or_when_nested():
    lock = FairLock()
    with lock:
        lock.yield_turn()  # nobody waits: still held, by this thread
        assert isinstance(raised_in_another_thread(lock.release), RuntimeError)
        with lock:
            waiter = started(lambda: (lock.acquire(), lock.release()))
            assert lock.wait_for_waiters(1, WAIT_S)
            lock.yield_turn()  # nested: an outer holder expects no interruption
            assert lock.waiting == 1  # it was not let in
    assert joined(waiter)


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
