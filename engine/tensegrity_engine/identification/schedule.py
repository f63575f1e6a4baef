"""Algorithm 1 as an object that decides what the next epoch runs.

Progressive training (`schedule="progressive"`): implicit integration with dt = T and
lr = lr0; after ``patience`` epochs without a validation improvement of at least
``min_rel_improvement`` (or ``max_stage_epochs``) the best parameters of the stage are
restored and dt is halved down to the engine step (dt = max(dt/2, dt_r)); at dt_r lr is
halved down to ``coarse_lr_min`` (lr0/4 by default: an implicit step at 1 ms is the most
expensive part and the fine stage is exact anyway); then the fine stage starts from the
best coarse parameters with the semi-implicit (or ANI) integrator at dt_r:

* ``fine_optimizer="lm"`` (default): Levenberg-Marquardt. It ends when the validation loss
  stops improving (``lm_patience``; online, where the tuple stage's validation tuples grow
  between iterations, also when its steps stop lowering their own objective), reaches
  ``lm_tol`` (exact data: round-off), moves no raw parameter by more than ``lm_step_tol``
  or after ``lm_max_iters``. Pose-only data runs it twice: on finite-difference velocities,
  then on multiple-shooting windows.
* ``fine_optimizer="adam"``: lr reset to lr0 and halved until < lr_min, as in the paper.

With ``max_seconds`` the implicit phase may use ``coarse_time_fraction`` of it, then the
fine stage starts regardless. ``implicit_only`` stops after the implicit phase (lr down to
lr_min), ``feedforward`` (the prior work) keeps a single implicit step of T, ``fine_only``
runs only the fine phase (refinement from good values). ``online`` (identification while
the robot works) is ``fine_only`` that does not end for good: when enough new data has
arrived after it finished, `reopen` resumes the last Levenberg-Marquardt stage on all the
data, warm-started, and the next convergence test ends it again.

The schedule owns the stage state and the best snapshot of the stage; what a stage change
means for the solvers (a new optimiser, a new learning rate) its host carries out.
"""
from __future__ import annotations

import math
from typing import Protocol

from tensegrity_engine.identification.config import COARSE_ONLY_SCHEDULES, IdentificationConfig


class ScheduleHost(Protocol):
    latent: bool                                    # the data has poses only

    def snapshot(self): ...
    def restore(self, snapshot) -> None: ...
    def stage_changed(self, kind: str) -> None: ...   # "dt", "lr", "fine" or "window"
    def log_stage(self, entry: dict) -> None: ...
    def log(self, message: str) -> None: ...


# stops that are convergence tests; the others ("epoch/time limit reached", "Levenberg-
# Marquardt iteration limit") are budgets running out
SETTLED = "Levenberg-Marquardt values settled within lm_settle_sigmas"
CONVERGED_STOPS = ("Levenberg-Marquardt converged", "Levenberg-Marquardt reached round-off",
                   "Levenberg-Marquardt step below lm_step_tol", SETTLED, "lr below lr_min")


class ProgressiveSchedule:
    def __init__(self, config: IdentificationConfig, full_steps: int, host: ScheduleHost):
        self.config, self.full_steps, self.host = config, full_steps, host
        self.phase = "fine" if config.schedule in ("fine_only", "online") else "coarse"
        self.n_steps = full_steps if self.phase == "fine" else 1
        self.lr = config.lr0
        self.best_val = math.inf
        self.bad_epochs = 0
        self.stage_epochs = 0
        self.best_snapshot = None
        self.pose_stage = "finite_difference"        # pose-only LM: then "window"
        self.start_values = None                     # the learnt values at the first epoch
        self.stage_log: list[dict] = []

    # ------------------------------------------------------------------ what runs now
    @property
    def dt(self) -> float:
        return self.config.period / self.n_steps

    @property
    def integrator(self) -> str:
        return self.config.coarse_integrator if self.phase == "coarse" else self.config.fine_integrator

    @property
    def done(self) -> bool:
        return self.phase == "done"

    @property
    def stop_reason(self) -> str:
        """Why the schedule ended ("" while it runs)."""
        return self.stage_log[-1].get("why", "") if self.done and self.stage_log else ""

    @property
    def converged(self) -> bool:
        """Ended by a convergence test, not by a budget (epochs, time, iterations)."""
        return self.stop_reason in CONVERGED_STOPS

    @property
    def use_lm(self) -> bool:
        return self.phase == "fine" and self.config.fine_optimizer == "lm"

    @property
    def latent_adam(self) -> bool:
        """Per-tuple latent velocities trained by Adam (pose-only, fine_optimizer="adam")."""
        return self.phase == "fine" and self.config.fine_optimizer == "adam"

    @property
    def windows(self) -> bool:
        """Pose-only windowed multiple-shooting LM."""
        return self.use_lm and self.host.latent and self.pose_stage == "window"

    @property
    def lr_floor(self) -> float:
        cfg = self.config
        if self.phase == "coarse" and cfg.schedule == "progressive":
            return cfg.coarse_lr_min if cfg.coarse_lr_min is not None else cfg.lr0 / 4.0
        return cfg.lr_min

    def stage_name(self) -> str:
        if self.use_lm:
            what = ""
            if self.host.latent:
                what = (" (windows, latent velocities)" if self.pose_stage == "window"
                        else " (finite-difference velocities)")
            return f"{self.phase} {self.integrator} dt={self.dt * 1e3:g}ms Levenberg-Marquardt{what}"
        return f"{self.phase} {self.integrator} dt={self.dt * 1e3:g}ms lr={self.lr:g}"

    # ------------------------------------------------------------------ decisions
    def before_epoch(self) -> None:
        """Keep the values the solver starts from (``windows_from: start``). A pose-only
        Levenberg-Marquardt schedule that starts in its fine phase ("online", "fine_only")
        then goes straight to its windowed stage: the finite-difference fit it would discard
        is time lost (a `fresh_start` challenger's, which the held-out gate judged while it
        had not begun its windows)."""
        if self.start_values is None:
            snap = self.host.snapshot()      # the trainer's: values, and latents under "__" keys (not kept)
            self.start_values = ({k: v for k, v in snap.items() if not k.startswith("__")}
                                 if isinstance(snap, dict) else snap)
            if (self.config.windows_from == "start" and self.use_lm and self.host.latent
                    and self.pose_stage == "finite_difference"):
                before = self.stage_name() + " (skipped: the windows start from the start values)"
                self.pose_stage = "window"
                self.host.stage_changed("window")
                self._log_stage(before, math.inf, 0)

    def after_epoch(self, val: float, epoch: int, elapsed: float, progress: bool = True) -> None:
        """Algorithm 1's stage update after an epoch with validation loss ``val``; an epoch
        whose solver made no ``progress`` on its own objective counts as not improving (its
        values are still the stage's best if ``val`` is)."""
        cfg = self.config
        self.stage_epochs += 1
        improved = val < self.best_val * (1.0 - cfg.min_rel_improvement)
        if improved:
            self.best_val = val
            self.best_snapshot = self.host.snapshot()
        if improved and progress:
            self.bad_epochs = 0
        else:
            self.bad_epochs += 1
        out_of_time = cfg.max_seconds is not None and elapsed >= cfg.max_seconds
        coarse_out = (cfg.max_seconds is not None and self.phase == "coarse" and cfg.schedule == "progressive"
                      and elapsed >= cfg.coarse_time_fraction * cfg.max_seconds)
        if coarse_out and not out_of_time and epoch < cfg.max_epochs:
            # Keep time for the fine stage: leave the implicit phase early.
            self._restore_best()
            before = self.stage_name()
            self._enter_fine()
            self._reset_best()
            self.bad_epochs, self.stage_epochs = 0, 0
            self._log_stage(before + " (coarse time budget spent)", val, epoch)
            return
        if epoch >= cfg.max_epochs or out_of_time:
            self.finish("epoch/time limit reached", epoch)
            return
        patience = cfg.lm_patience if self.use_lm else cfg.patience
        stalled = self.bad_epochs >= patience or (
            cfg.max_stage_epochs is not None and not self.use_lm and self.stage_epochs >= cfg.max_stage_epochs)
        if not stalled:
            return
        self._restore_best()
        before = self.stage_name()
        reset_best = False
        if self.phase == "coarse" and cfg.schedule != "feedforward" and self.n_steps < self.full_steps:
            self.n_steps = min(2 * self.n_steps, self.full_steps)   # dt = max(dt / 2, dt_r)
            reset_best = True
            self.host.stage_changed("dt")
        elif self.phase == "fine" and self.use_lm:      # stalled without one finite loss: no convergence
            self.lm_finish("Levenberg-Marquardt converged" if math.isfinite(self.best_val)
                           else "Levenberg-Marquardt found no finite loss", epoch, val)
            return
        elif self.lr / 2.0 >= self.lr_floor:
            self.lr = self.lr / 2.0
            self.host.stage_changed("lr")
        elif self.phase == "coarse" and cfg.schedule == "progressive":
            self._enter_fine()
            reset_best = True
        else:
            self.finish("lr below lr_min", epoch)
            return
        if reset_best:
            self._reset_best()
        self.bad_epochs = 0
        self.stage_epochs = 0
        self._log_stage(before, val, epoch)

    def after_lm_iteration(self, val: float, step: float, epoch: int, elapsed: float,
                           reduction: float | None = None, settled: float | None = None) -> None:
        """The stage update, then Levenberg-Marquardt's own stops. ``reduction``: the
        iteration's relative decrease of its own objective, given where its validation loss is
        measured on data that changes between iterations (less than ``min_rel_improvement``
        is no progress, whatever the validation loss did); None: the validation loss decides.
        ``settled``: how far the values moved over the last ``lm_patience`` accepted steps in
        their 1-sigma (the windowed solver's); within ``lm_settle_sigmas`` the values have
        converged as far as the data can tell, though the objective still falls (the latents
        improving, or a direction the data does not determine drifting). Measured: a zoo
        robot (soft_slow, the model's integrator not the robot's) whose values stayed within
        0.3 % from 18 s was still improving its objective by more than ``min_rel_improvement``
        per iteration at 60 s, so its solver never said converged."""
        cfg = self.config
        stage = (self.phase, self.pose_stage)
        progress = reduction is None or reduction >= cfg.min_rel_improvement
        self.after_epoch(val, epoch, elapsed, progress)
        if (self.phase, self.pose_stage) != stage:      # the schedule already moved on
            return
        if (self.phase == "fine" and settled is not None and cfg.lm_settle_sigmas > 0
                and settled <= cfg.lm_settle_sigmas):
            self.lm_finish(SETTLED, epoch, val)
        elif (self.phase == "fine" and cfg.fd_max_iters is not None and self.host.latent
              and self.pose_stage == "finite_difference" and self.stage_epochs >= cfg.fd_max_iters):
            self.lm_finish("finite-difference iteration limit", epoch, val)
        elif self.phase == "fine" and self.stage_epochs >= cfg.lm_max_iters:
            self.lm_finish("Levenberg-Marquardt iteration limit", epoch, val)
        elif self.phase == "fine" and val <= cfg.lm_tol:
            self.lm_finish("Levenberg-Marquardt reached round-off", epoch, val)
        elif self.phase == "fine" and step < cfg.lm_step_tol:
            self.lm_finish("Levenberg-Marquardt step below lm_step_tol", epoch, val)

    # ------------------------------------------------------------------ transitions
    def _restore_best(self) -> None:
        if self.best_snapshot is not None:
            self.host.restore(self.best_snapshot)

    def _reset_best(self) -> None:
        self.best_val, self.best_snapshot = math.inf, None

    def skip_coarse(self, why: str) -> None:
        """Start at the fine stage (before the first epoch): the coarse stages do not suit
        this model (``why`` is logged). The soft contact law's: its ground is solved with
        the rod masses and the implicit step applies it with the cables' implicit terms (at
        100 ms SUPERball gains energy, velocities 200 m/s), and its time constant is held at
        two coarse steps (MuJoCo's refsafe), so nothing learns it there. The schedules that
        are nothing but coarse stages (the paper's ablations) are refused."""
        if self.config.schedule in COARSE_ONLY_SCHEDULES:
            raise ValueError(f"schedule {self.config.schedule!r} runs only implicit steps of up to T, which this "
                             f"model cannot take ({why}); use the penalty contact law (contact.law: penalty)")
        if self.phase == "coarse":
            self._enter_fine()
            self.host.log(f"fine stage from the start: {why}")

    def _enter_fine(self) -> None:
        self.phase = "fine"
        self.n_steps = self.full_steps
        self.lr = self.config.lr0
        self.host.stage_changed("fine")

    def lm_finish(self, why: str, epoch: int, val: float) -> None:
        """End of a Levenberg-Marquardt stage. Pose-only data: the tuple LM on
        finite-difference velocities is followed by the windowed latent-velocity LM, from
        that fit or from the start (``windows_from``)."""
        if not (self.host.latent and self.pose_stage == "finite_difference"):
            return self.finish(why, epoch)
        self._restore_best()
        if self.config.windows_from == "start" and self.start_values is not None:
            self.host.restore(self.start_values)
        before = self.stage_name() + f" ({why})"
        self.pose_stage = "window"
        self.host.stage_changed("window")
        self._reset_best()
        self.bad_epochs, self.stage_epochs = 0, 0
        self._log_stage(before, val, epoch)

    def reopen(self, epoch: int, why: str) -> None:
        """``online``: after `finish`, go on with the same (last) stage on new data."""
        if not self.done:
            return
        self.phase = "fine"
        self.n_steps = self.full_steps
        self._reset_best()
        self.bad_epochs, self.stage_epochs = 0, 0
        entry = {"epoch": epoch, "from": "done", "to": self.stage_name(), "why": why}
        self.stage_log.append(entry)
        self.host.log_stage(entry)

    def restart(self, epoch: int, why: str) -> None:
        """The running stage starts again on a new problem (more windows): its best and its
        counters from scratch, the values kept."""
        self._reset_best()
        self.bad_epochs, self.stage_epochs = 0, 0
        entry = {"epoch": epoch, "from": self.stage_name(), "to": self.stage_name(), "why": why}
        self.stage_log.append(entry)
        self.host.log_stage(entry)

    def finish(self, why: str, epoch: int) -> None:
        self._restore_best()
        before = self.stage_name()
        self.phase = "done"
        entry = {"epoch": epoch, "from": before, "to": "done", "why": why}
        self.stage_log.append(entry)
        self.host.log_stage(entry)

    def _log_stage(self, before: str, val: float, epoch: int) -> None:
        entry = {"epoch": epoch, "from": before, "to": self.stage_name(), "val_loss": val}
        self.stage_log.append(entry)
        self.host.log_stage(entry)

    # ------------------------------------------------------------------ checkpoint
    STATE = ("phase", "n_steps", "lr", "best_val", "bad_epochs", "stage_epochs", "pose_stage", "stage_log")

    def state_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.STATE} | {"best_snapshot": self.best_snapshot,
                                                            "start_values": self.start_values}

    def load_state_dict(self, sd: dict) -> None:
        for k in self.STATE:
            if k in sd:
                setattr(self, k, sd[k])
        self.best_snapshot = sd.get("best_snapshot")
        # a resumed run's windows start from the run's start, not from where it was resumed
        # (a state without it: the first epoch after the resume keeps the values then)
        self.start_values = sd.get("start_values")
