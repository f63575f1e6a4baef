"""When candidates meet the hold-out gate: the node's and the bench's one pacing."""
import pytest

from tensegrity_engine.identification.gate_pacing import GatePacing


class _Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_the_newest_candidate_waits_for_the_interval_after_a_publication():
    clock = _Clock()
    pacing = GatePacing(min_interval=1.0, spacing=0.0, clock=clock)
    pacing.offer("a")
    assert pacing.due() == "a" and pacing.due() is None          # taken off once
    pacing.published()
    pacing.offer("b")
    pacing.offer("c")                                             # replaces b
    clock.now += 0.5
    assert pacing.due() is None and pacing.pending == "c"
    clock.now += 0.6
    assert pacing.due() == "c"


def test_a_gate_idles_spacing_times_its_own_duration():
    clock = _Clock()
    pacing = GatePacing(min_interval=0.0, spacing=4.0, clock=clock)
    verdicts = []

    def judge(candidate):                 # a gate that takes 0.3 s
        clock.now += 0.3
        verdicts.append(candidate)
        return candidate == "good"

    pacing.offer("bad")
    assert pacing.gate(judge) == ("bad", False)
    assert pacing.gates == 1 and pacing.next_gate == pytest.approx(100.3 + 1.2)
    pacing.offer("good")
    clock.now += 1.1                       # 1.1 s of training: not yet 4 x 0.3 s
    assert pacing.gate(judge) is None and pacing.pending == "good"
    clock.now += 0.2
    assert pacing.gate(judge) == ("good", True)
    assert verdicts == ["bad", "good"]
    # by the time a third gate may start, the gates had at most 1 / (1 + 4) of the time
    assert 0.6 / (pacing.next_gate - 100.0) <= 1.0 / (1.0 + 4.0) + 1e-9


def test_force_gates_at_once_and_drop_forgets():
    clock = _Clock()
    pacing = GatePacing(min_interval=10.0, clock=clock)
    pacing.offer("x")
    pacing.published()
    assert pacing.gate(lambda c: True) is None
    assert pacing.gate(lambda c: True, force=True) == ("x", True)
    pacing.offer("y")
    pacing.drop()
    assert pacing.gate(lambda c: True, force=True) is None


def test_a_failed_gate_still_counts_its_time():
    clock = _Clock()
    pacing = GatePacing(min_interval=0.0, spacing=2.0, clock=clock)

    def judge(candidate):
        clock.now += 1.0
        raise RuntimeError("non-finite rollout")

    pacing.offer("x")
    with pytest.raises(RuntimeError):
        pacing.gate(judge)
    assert pacing.next_gate == pytest.approx(103.0) and pacing.pending is None


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="min_interval"):
        GatePacing(min_interval=-1.0)
    with pytest.raises(ValueError):
        GatePacing(spacing=float("nan"))
