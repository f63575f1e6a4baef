"""Algorithm 1's stage decisions, on a host that records what the schedule asks of it."""
import pytest

from tensegrity_engine.identification import IdentificationConfig
from tensegrity_engine.identification.schedule import ProgressiveSchedule


class RecordingHost:
    latent = True                       # pose-only: finite-difference stage, then windows

    def __init__(self):
        self.changes, self.values = [], 0

    def snapshot(self):
        return self.values

    def restore(self, snapshot) -> None:
        self.values = snapshot

    def stage_changed(self, kind: str) -> None:
        self.changes.append(kind)

    def log_stage(self, entry: dict) -> None:
        pass

    def log(self, message: str) -> None:
        pass


def _iterate(reductions, vals):
    """Feed LM iterations; the epoch at which the finite-difference stage handed over (None: never)."""
    cfg = IdentificationConfig(schedule="online")
    host = RecordingHost()
    schedule = ProgressiveSchedule(cfg, full_steps=100, host=host)
    for epoch, (reduction, val) in enumerate(zip(reductions, vals), start=1):
        schedule.after_lm_iteration(val, step=1.0, epoch=epoch, elapsed=0.0, reduction=reduction)
        if "window" in host.changes:
            return epoch, cfg
    return None, cfg


def test_a_validation_loss_that_falls_with_arriving_data_is_not_progress():
    # online the validation tuples grow between iterations: the loss falls 5 % per
    # iteration while the solver's own steps lower their objective by nothing
    n = 30
    vals = [1.0 * 0.95 ** k for k in range(n)]
    stalled_at, cfg = _iterate([0.0] * n, vals)
    # no iteration made progress, the first one included
    assert stalled_at == cfg.lm_patience
    # the same validation losses with steps that do lower their objective: the stage goes on
    moving_at, _ = _iterate([0.05] * n, vals)
    assert moving_at is None
    # progress on its own objective while the validation loss rises is no improvement either
    # (the first iteration sets the best)
    rising_at, _ = _iterate([0.05] * n, [1.0 + 0.01 * k for k in range(n)])
    assert rising_at == cfg.lm_patience + 1


def test_without_a_reduction_the_validation_loss_alone_decides():
    n = 30
    falling_at, _ = _iterate([None] * n, [0.95 ** k for k in range(n)])
    assert falling_at is None
    flat_at, cfg = _iterate([None] * n, [1.0] * n)
    assert flat_at == cfg.lm_patience + 1


def test_values_that_improved_the_validation_loss_without_progress_are_still_the_best():
    cfg = IdentificationConfig(schedule="online")
    host = RecordingHost()
    schedule = ProgressiveSchedule(cfg, full_steps=100, host=host)
    vals = [1.0, 0.9, 0.95, 0.97, 0.99]
    for epoch, val in enumerate(vals, start=1):
        host.values = epoch                     # the values the iteration leaves
        schedule.after_lm_iteration(val, step=1.0, epoch=epoch, elapsed=0.0, reduction=0.0)
        if "window" in host.changes:
            break
    # no iteration made progress: the stage ended, back at the values with the lowest loss
    assert "window" in host.changes and host.values == 2


def _windows_start(windows_from: str):
    """(The host's values when the windowed stage starts, the epoch it starts before): the
    solver moves them 1, 2, 3, ... per iteration on finite-difference velocities, the
    validation loss best at 3."""
    cfg = IdentificationConfig(schedule="online", windows_from=windows_from)
    host = RecordingHost()
    schedule = ProgressiveSchedule(cfg, full_steps=100, host=host)
    vals = [1.0, 0.9, 0.8] + [0.85] * 20
    for epoch, val in enumerate(vals, start=1):
        schedule.before_epoch()
        if "window" in host.changes:
            return host.values, epoch
        host.values = epoch                          # the epoch's step
        schedule.after_lm_iteration(val, step=1.0, epoch=epoch, elapsed=0.0, reduction=0.0)
        if "window" in host.changes:
            return host.values, epoch + 1
    raise AssertionError("the finite-difference stage never handed over")


def test_the_windowed_stage_starts_from_the_fit_or_from_the_start_values():
    # the finite-difference fit's best (epoch 3, the stage ending at its patience), or the
    # values before the first epoch (0), at once: no finite-difference fit to discard
    values, epoch = _windows_start("finite_difference")
    assert values == 3 and epoch > 4
    assert _windows_start("start") == (0, 1)


def test_a_resumed_run_starts_its_windows_from_the_runs_start_not_the_resume():
    """``windows_from: start`` after coarse stages: the values before the first epoch are
    checkpointed, so a run resumed mid-way still starts its windows from them."""
    cfg = IdentificationConfig(schedule="progressive", windows_from="start")
    first = ProgressiveSchedule(cfg, full_steps=100, host=RecordingHost())
    first.before_epoch()                                  # coarse: no windows yet, the start kept
    assert first.phase == "coarse" and first.start_values == 0
    host = RecordingHost()
    host.values = 5                                       # where the run was when it was saved
    resumed = ProgressiveSchedule(cfg, full_steps=100, host=host)
    resumed.load_state_dict(first.state_dict())
    resumed.before_epoch()
    resumed.phase = "fine"                                # its finite-difference stage ends
    resumed.lm_finish("Levenberg-Marquardt converged", epoch=9, val=1.0)
    assert resumed.pose_stage == "window" and host.values == 0


def test_values_settled_within_their_sigma_end_the_windowed_stage_as_converged():
    # the objective still falls 5 % per iteration (its latents improving): only the values'
    # path in sigmas can end the stage, and only at or below lm_settle_sigmas
    from tensegrity_engine.identification.schedule import SETTLED

    def run(settled, settle=0.25):
        cfg = IdentificationConfig(schedule="online", windows_from="start", lm_settle_sigmas=settle)
        schedule = ProgressiveSchedule(cfg, full_steps=100, host=RecordingHost())
        schedule.before_epoch()                    # straight to the windows
        assert schedule.windows
        for epoch, s in enumerate(settled, start=1):
            schedule.after_lm_iteration(0.95 ** epoch, step=1.0, epoch=epoch, elapsed=0.0, reduction=0.05,
                                        settled=s)
            if schedule.done:
                return epoch, schedule
        return None, schedule

    at, schedule = run([float("inf")] * 4 + [0.6, 0.3, 0.2, 0.1])
    assert at == 7 and schedule.stop_reason == SETTLED and schedule.converged
    assert run([float("inf")] * 4 + [0.26] * 10)[0] is None
    assert run([None] * 10)[0] is None                 # a solver that does not measure it
    assert run([0.1] * 10, settle=0.0)[0] is None      # off
    with pytest.raises(ValueError, match="lm_settle_sigmas"):
        IdentificationConfig(lm_settle_sigmas=-1.0)


def test_a_stage_without_one_finite_loss_does_not_end_as_converged():
    """Every iteration of the windowed stage diverged (validation loss inf): the stage ends on
    its patience, but not as "converged" (it found no finite loss); with a finite one it does."""
    import math

    for vals, converged in (([math.inf] * 10, False), ([1.0] + [2.0] * 9, True)):
        cfg = IdentificationConfig(schedule="fine_only")
        host = RecordingHost()
        host.latent = False
        schedule = ProgressiveSchedule(cfg, full_steps=100, host=host)
        for epoch, val in enumerate(vals, start=1):
            schedule.after_lm_iteration(val, step=math.inf, epoch=epoch, elapsed=0.0)
            if schedule.done:
                break
        assert schedule.done and schedule.converged is converged, schedule.stop_reason
        assert ("no finite loss" in schedule.stop_reason) is not converged


def test_a_finite_difference_stage_capped_at_fd_max_iters_moves_on_to_its_windows_not_to_its_end():
    """``fd_max_iters`` (a structure challenger's): the finite-difference stage hands over
    to the windows after that many iterations however well it still progresses; the
    windowed stage it hands over to is not capped by it. None: only
    convergence or lm_max_iters end it."""
    def run(cap, n=12):
        cfg = IdentificationConfig(schedule="online", fd_max_iters=cap, lm_settle_sigmas=0.0)
        host = RecordingHost()
        schedule = ProgressiveSchedule(cfg, full_steps=100, host=host)
        vals = [0.9 ** k for k in range(1, n + 1)]
        handed = None
        for epoch, val in enumerate(vals, start=1):
            host.values = epoch
            schedule.after_lm_iteration(val, step=1.0, epoch=epoch, elapsed=0.0, reduction=0.05)
            if handed is None and "window" in host.changes:
                handed = epoch, host.values, schedule.stage_log[-1]["from"]
        return handed, schedule

    (at, values, why), schedule = run(3)
    assert at == 3 and values == 3 and "finite-difference iteration limit" in why
    assert schedule.windows and not schedule.done                # windows ran on past 3 iterations
    assert run(None)[0] is None                                  # progress: the stage goes on
    for bad in (0, 2.5, -1):
        with pytest.raises(ValueError, match="fd_max_iters"):
            IdentificationConfig(fd_max_iters=bad)
