"""The worker's account of where an online session's compute goes."""
import pytest

from tensegrity_engine.identification.worker_account import WorkerAccount, accounted


class _Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_nested_work_counts_once_under_its_own_label():
    """A gate inside a challenger's verdict is the gate's: each second lands under exactly
    one label, and the labels sum to the time spent."""
    clock, account = _Clock(), WorkerAccount()
    with account.timed(clock, "challengers"):
        clock.now += 3.0
        with account.timed(clock, "gate"):
            clock.now += 2.0
            with account.timed(clock, "sigma"):
                clock.now += 4.0
        clock.now += 1.0
    with account.timed(clock, "solver"):
        clock.now += 5.0
    assert account.snapshot() == pytest.approx({"challengers": 4.0, "gate": 2.0, "sigma": 4.0, "solver": 5.0})
    assert account.total() == pytest.approx(clock.now)
    text = account.summary(worker_total=20.0)
    assert text.startswith("solver 5.0 s (25 %), challengers 4.0 s (20 %), gate 2.0 s (10 %), sigma 4.0 s (20 %)")
    assert text.endswith("other 5.0 s (25 %)")


def test_a_call_that_raises_is_still_counted_and_the_stack_unwinds():
    clock, account = _Clock(), WorkerAccount()

    class Session:
        work, compute_clock = account, clock

        @accounted("sigma")
        def uncertainty(self):
            clock.now += 2.5
            raise RuntimeError("no estimate")

    with pytest.raises(RuntimeError):
        with account.timed(clock, "solver"):
            clock.now += 1.0
            Session().uncertainty()
    assert account.snapshot() == pytest.approx({"solver": 1.0, "sigma": 2.5})
    with account.timed(clock, "gate"):               # nothing left open: a fresh call is its own
        clock.now += 1.0
    assert account.snapshot()["gate"] == pytest.approx(1.0)


def test_threads_time_their_own_calls():
    """A call timed on another thread (a node publishing a checkpoint's values while its
    worker trains) neither closes nor nests in the worker's open one."""
    import threading

    clock, account = _Clock(), WorkerAccount()
    inside, release = threading.Event(), threading.Event()

    def other():
        with account.timed(clock, "sigma"):
            inside.set()
            release.wait(5.0)

    with account.timed(clock, "solver"):
        clock.now += 1.0
        thread = threading.Thread(target=other)
        thread.start()
        inside.wait(5.0)
        clock.now += 2.0                                  # both calls open over these 2 s
        release.set()
        thread.join(5.0)
    assert account.snapshot() == pytest.approx({"solver": 3.0, "sigma": 2.0})
