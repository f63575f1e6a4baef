"""Identification while the robot works (ROS-free; the identifier node drives it).

A sliding window of the newest tuples (`streaming.TupleBatch` chunks, at most
``max_tuples``) feeds a `ProgressiveTrainer`, created once ``min_tuples`` have arrived.
Every ``holdout_every``-th block of tuples (1 s) is held out instead (the newest
``max_holdout``): `gate` lets a model be published only if it predicts them better than the
one it replaces, and says both models' CoM error 1 s ahead on them.
Each `step` runs one epoch. A diverging epoch (NaN loss, non-finite parameters, an
exception) rolls back to the last healthy trainer state; the best healthy parameters so far
are what a caller publishes. `checkpoint` / `restore` carry the whole session (window,
trainer, best values) across a restart.

With ``structure_options``, a challenger fits one structural option at a time beside the
solver (`online_structure`: the robot's end-heavy rods, slack-cable damping, a winch speed
limit, another integrator or contact dimensionality), judged by the gate with a stricter
test; adopted, it becomes the session's trainer and its structure the session's
(``robot``). Every model is scored in the structure it was fitted in: the config
in the config's (``config_robot``), the published one in ``published_robot``.
"""
from __future__ import annotations

import collections
import dataclasses
import math
import time
from typing import Callable, Optional

import numpy as np
import torch

from tensegrity_engine.identification.acceptance import log_ratio_gain
from tensegrity_engine.identification.config import IdentificationConfig, resolve_learn
from tensegrity_engine.identification.heldout_scoring import StructuredScores
from tensegrity_engine.identification.online_structure import (StructureTrials, healthy_values,
                                                                robot_in_structure, structure_key, structure_robot)
from tensegrity_engine.identification.holdout import (HOLDOUT_KEPT_BLOCKS, MIN_GATE_BLOCKS,  # noqa: F401
                                                       HeldOutBlocks, kept_tuples)
from tensegrity_engine.identification.streaming import TupleBatch, to_tuple_set
from tensegrity_engine.identification.uncertainty import inherit_scratch
from tensegrity_engine.identification.worker_account import WorkerAccount, accounted
from tensegrity_engine.physics.actuators import delayed_commands
from tensegrity_engine.physics.config import MODEL_INTEGRATORS, RobotConfig
from tensegrity_engine.physics.params import PhysicalParameters, checked_parameters

# A full window slides by this share of ``max_tuples`` at once: the trainer takes a slid
# window anew (`set_data`: its windowed stage's windows and latents drawn again), so a
# slide on every new batch would leave it refitting latents for good
WINDOW_SLIDE = 0.25
HOLDOUT_SECONDS = 1.0      # held out in blocks this long: the gate also says the CoM error this far ahead
TrainerFactory = Callable[..., object]   # (robot, config, device, initial, log) -> ProgressiveTrainer


def default_trainer_factory(robot, config, device, initial=None, log=None):
    from tensegrity_engine.identification.trainer import ProgressiveTrainer

    return ProgressiveTrainer(robot, config, device=device, dtype=torch.float64, initial=initial, log=log)


@dataclasses.dataclass(frozen=True)
class HeldOutVerdict:
    accepted: bool
    reason: str              # "better", "worse", "worse_com" (CoM error larger), "not_significant"
    #                          (lower mean loss within the blocks' noise), "worse_than_config",
    #                          "unstable", "no_heldout_yet", "gate_off"
    candidate_loss: float    # recurrent loss on the held-out tuples (normalised, see objective)
    incumbent_loss: float
    tuples: int
    candidate_com_error: float = math.nan   # m, CoM error HOLDOUT_SECONDS ahead (held-out blocks)
    incumbent_com_error: float = math.nan
    # today's held-out data says the config predicts better than the published model (and
    # this candidate does not beat the config): publish the config again
    revert: bool = False
    # m, the config's own CoM error on the same blocks: the nominal model beside the others
    config_com_error: float = math.nan

    @property
    def improvement(self) -> float:
        """Incumbent's held-out loss over the candidate's (> 1: better)."""
        return self.incumbent_loss / self.candidate_loss if self.candidate_loss > 0 else math.inf


# Standard errors of the per-block loss difference a candidate must win by (with >= 3
# blocks): a mean over the few blocks of the day is noise, and a model that wins on it by
# chance replaces one that predicts the robot better (measured: end_heavy, seed 2, a model
# published on 2-3 blocks ended 105.9 mm off 1 s ahead where the config was 62.1 mm).
GATE_SIGNIFICANCE = 1.0


def slide_window(window: collections.deque, length: int, max_tuples: int) -> int:
    """Drop the oldest tuples of ``window`` (TupleBatch chunks, ``length`` tuples in all)
    down to (1 - `WINDOW_SLIDE`) x ``max_tuples``, the oldest chunk in part: the tuples left."""
    keep = max(1, int(max_tuples * (1.0 - WINDOW_SLIDE)))
    while length - len(window[0]) >= keep and len(window) > 1:
        length -= len(window.popleft())
    if length > keep:                   # the oldest chunk in part (fewer than its length)
        oldest = window.popleft()
        window.appendleft(oldest.slice(slice(length - keep, None)))
        length = keep
    return length


def _mean(a) -> float:
    a = np.asarray(a, dtype=np.float64)
    return float(a.mean()) if a.size else math.nan


def _compare(candidate, reference, significance: float = GATE_SIGNIFICANCE, min_gain: float = 0.0) -> str:
    """How a candidate's held-out (loss, CoM error) per block compares with a reference's:
    "better", "worse", "worse_com" (its CoM ends further off) or "not_significant" (a lower
    mean loss by less than ``min_gain`` of the reference's, or a mean log ratio of the
    losses per block within ``significance`` standard errors: `acceptance.log_ratio_gain`,
    as offline selection judges). Both yardsticks: the pose loss over each block, and where
    the centre of mass ends up, which a loss dominated by shape can trade away (MPPI plans
    the path)."""
    (c_loss, c_com), (r_loss, r_com) = (tuple(np.asarray(x, dtype=np.float64) for x in pair)
                                        for pair in (candidate, reference))
    if not np.isfinite(c_loss).all():
        return "worse"
    d = c_loss - r_loss
    if np.isfinite(r_loss).all() and not d.mean() < 0.0:
        return "worse"
    if math.isfinite(_mean(c_com)) and math.isfinite(_mean(r_com)) and _mean(c_com) > _mean(r_com):
        return "worse_com"
    if not np.isfinite(r_loss).all():
        return "better"
    if d.mean() + min_gain * float(r_loss.mean()) >= 0.0:
        return "not_significant"
    return "better" if d.size < 3 or log_ratio_gain(c_loss, r_loss) > significance else "not_significant"


class OnlineIdentification:
    def __init__(self, robot: RobotConfig, config: IdentificationConfig, *, device="cpu",
                 min_tuples: int = 20, max_tuples: int = 2000, floor: bool = True, fixed_rods=(),
                 holdout_every: int = 5, max_holdout: Optional[int] = None, reopen_tuples: int = 50,
                 trainer_factory: TrainerFactory = default_trainer_factory, structure_options=(),
                 follow_pins: bool = True, log: Callable[[str], None] = lambda msg: None,
                 compute_clock: Callable[[], float] = time.perf_counter):
        if config.fine_integrator in MODEL_INTEGRATORS and config.fine_integrator != robot.integrator:
            robot = robot.replace(integrator=config.fine_integrator)     # as the trainer builds it
        self.config_robot, self.config, self.device = robot, config, device
        self.min_tuples, self.max_tuples = int(min_tuples), int(max_tuples)
        self.reopen_tuples, self.holdout_every = int(reopen_tuples), int(holdout_every)
        self.holdout_block = max(2, int(round(HOLDOUT_SECONDS / config.period)))
        self.max_holdout = kept_tuples(max_holdout, self.holdout_block, self.holdout_every, config.period)
        self.floor, self.fixed_rods = bool(floor), tuple(fixed_rods)
        self.trainer_factory, self.log = trainer_factory, log
        self.compute_clock = compute_clock      # seconds of the worker's compute: the challenger's share
        self.work = WorkerAccount()             # and where they went (`accounted`)
        self.trials = StructureTrials(structure_options, follow_pins)
        self.scores = StructuredScores()
        self.reset()

    def reset(self) -> None:
        """Forget everything: no data, no trainer, no best values, the config's structure."""
        self.robot = self.config_robot           # the session's structure (the trainer's)
        self.published_robot: Optional[RobotConfig] = None   # the structure of best_values
        self.window: collections.deque = collections.deque()   # TupleBatch chunks in the trainer
        self.window_len = 0
        self.holdout = HeldOutBlocks(self.holdout_every, self.holdout_block, self.max_holdout)
        self.trainer = None
        self.good_state = None               # last healthy trainer.state_dict()
        self.best_loss = math.inf
        self.best_values: Optional[dict] = None   # set by the caller when it publishes them
        self.epochs = 0
        self.rollbacks = 0
        self._uncertainty_memo = None        # (key, estimate) of the last uncertainty()
        self.batches_added = 0               # training batches taken (the memo's data version)
        self.last_metrics: dict = {}
        self.status = "waiting for data"
        self.converged = False
        self.since_end = 0                   # training tuples added after the schedule's end
        self.scores.reset()                  # scorers per structure, the reference models' scores
        self.trials.reset()                  # structure: adopted options, the running challenger
        self._looked_at = -1                 # held-out tuples (ever) when the gate last judged a fit of the solver's
        self._blocks_at_end = 0              # scorable held-out blocks when the solver's schedule last ended
        self.judging_end_again = False       # `finished` once more: an end the gate could not judge

    # ------------------------------------------------------------------ data window
    def _tuple_set(self, batch: TupleBatch, context=()):
        return to_tuple_set(batch, self.robot, period=self.config.period, floor=self.floor,
                            fixed_rods=self.fixed_rods, context=context)

    def window_batch(self) -> TupleBatch:
        return TupleBatch.cat(list(self.window))

    def window_tuples(self):
        """The training window as the trainer takes it: the held-out blocks' commands carry
        the actuator state across them (only their poses are held out)."""
        return self._tuple_set(self.window_batch(), context=self.holdout.context())

    def heldout_tuples(self):
        """The held-out blocks, each starting with the actuator state the commands before it
        (in the window) leave."""
        return self._tuple_set(self.holdout.batch(), context=list(self.window))

    def _new_trainer(self, batch: TupleBatch) -> None:
        config = self.config
        if self.trials.adopted:          # a restored session: the structure it had adopted
            base = resolve_learn(config.learn, self.config_robot.contact.law, floor=self.floor)
            config = self.trials.config_with(config, base, self.trials.adopted)
            self.robot = structure_robot(self.config_robot, self.trials.adopted)
            if self.robot is not self.config_robot:
                config = dataclasses.replace(config, fine_integrator=None)
        self.trainer = self.trainer_factory(self.robot, config, self.device, None, self.log)
        self.trainer.set_data(self._tuple_set(batch, context=self.holdout.context()))

    @accounted("gate")
    def gate(self, values: dict, significance: float = GATE_SIGNIFICANCE, min_gain: float = 0.0,
             run=None) -> HeldOutVerdict:
        """May ``values`` replace the published model (``best_values``, else the config's)?
        Only if their loss on the held-out blocks is finite and lower by more than ``significance``
        standard errors of the per-block log ratio (and by ``min_gain`` of the reference's loss),
        and their CoM error at the end of the blocks no larger, than both the published model's
        and the config's (``revert``: the config now beats the published model); not before
        ``MIN_GATE_BLOCKS`` held-out blocks (an early fit to a few seconds would become the
        incumbent every later model is judged against), unless the gate is off (``holdout_every``
        < 2). ``values`` are scored by ``run`` (a trainer of their structure: a structure
        challenger; the session's trainer by default), each reference model in its own structure."""
        if self.holdout_every < 2:
            return HeldOutVerdict(True, "gate_off", math.nan, math.nan, 0)
        if self.trainer is None or not self.can_judge:           # nothing scored (rollouts cost)
            return HeldOutVerdict(False, "no_heldout_yet", math.nan, math.nan, self.heldout_len)
        data = self.heldout_tuples()
        config = PhysicalParameters(self.config_robot).as_dict()
        incumbent = self.best_values if self.best_values is not None else config
        candidate = self.scores.candidate(self, run or self.trainer, data, values)
        if np.asarray(candidate[0]).size < MIN_GATE_BLOCKS:
            return HeldOutVerdict(False, "no_heldout_yet", _mean(candidate[0]), math.nan, self.heldout_len)
        if run is None:                                  # a fit of the solver's judged (`step`)
            self._looked_at = self.heldout_total
        reference = self.scores.reference(self, data, incumbent, self.incumbent_robot)
        cand, cand_com, inc, inc_com = (_mean(a) for a in candidate + reference)
        if not math.isfinite(cand):
            return HeldOutVerdict(False, "unstable", math.inf, inc, self.heldout_len, math.inf, inc_com)
        # a chain of models, each better than the last on the data of its day, can end worse
        # than the config on today's: never publish one that does, nor keep one that is
        configured = None if incumbent is config else self.scores.reference(self, data, config, self.config_robot)
        config_com = inc_com if configured is None else _mean(configured[1])
        revert = configured is not None and _compare(configured, reference) == "better"
        reason = _compare(candidate, configured if revert else reference, significance, min_gain)
        if (reason == "better" and configured is not None and not revert
                and _compare(candidate, configured, significance, min_gain) != "better"):
            reason = "worse_than_config"
        return HeldOutVerdict(reason == "better", reason, cand, inc, self.heldout_len, cand_com, inc_com,
                              revert=revert and reason != "better", config_com_error=config_com)

    heldout = property(lambda self: self.holdout.chunks)       # the gate's held-out chunks
    heldout_len = property(lambda self: self.holdout.length)
    heldout_total = property(lambda self: self.holdout.total)

    @property
    def can_judge(self) -> bool:
        """``MIN_GATE_BLOCKS`` completed held-out blocks the gate can score (`HeldOutBlocks.scorable`,
        not tuples: an open block's are not scored); False without a gate."""
        return self.holdout_every >= 2 and self.holdout.scorable >= MIN_GATE_BLOCKS

    @accounted("gate")
    def compare_on_heldout(self, values: dict, reference: dict, significance: float = GATE_SIGNIFICANCE,
                           min_gain: float = 0.0, run=None) -> str:
        """`_compare` of two models on today's held-out blocks ("better": ``values``, scored
        by ``run`` as in `gate`, win over ``reference`` in the session's structure)."""
        data = self.heldout_tuples()
        candidate = self.scores.scores(self, run or self.trainer, data, values)
        return _compare(candidate, self.scores.reference(self, data, reference, self.robot), significance, min_gain)

    @property
    def incumbent_robot(self) -> RobotConfig:
        """The structure of the model in use: the published one's, else the config's."""
        if self.best_values is None:
            return self.config_robot
        return self.published_robot if self.published_robot is not None else self.robot

    def mark_published(self, values: Optional[dict], robot: Optional[RobotConfig] = None) -> None:
        """``values`` (fitted in ``robot``: the session's structure by default) are the model
        in use now; None: the config's again."""
        self.best_values = values
        self.published_robot = None if values is None else (robot or self.robot)

    def heldout_scores(self, values: dict, robot: Optional[RobotConfig] = None, data=None) -> tuple[float, float]:
        """(loss, CoM error 1 s ahead) of ``values`` in the structure ``robot`` (the session's
        by default) on the held-out blocks (or ``data``: `unseen_tuples`), means over blocks."""
        data = self.heldout_tuples() if data is None else data
        loss, com = self.scores.scores(self, self.scores.scorer(self, robot or self.robot), data, values)
        return _mean(loss), _mean(com)

    def add(self, new: TupleBatch) -> None:
        """Append new tuples (less the held-out ones); beyond ``max_tuples`` the oldest
        leave, `WINDOW_SLIDE` of the window at once."""
        new = self.holdout.split(new)
        if new is None:                 # a held-out block may have just completed
            return self._maybe_reopen(0) if self.trainer is not None else None
        self.batches_added += 1
        self.window.append(new)
        self.window_len += len(new)
        if self.trainer is None:
            if self.window_len >= self.min_tuples:
                self._new_trainer(self.window_batch())
                self.status = "training"
            return
        if self.window_len > self.max_tuples:
            self.window_len = slide_window(self.window, self.window_len, self.max_tuples)
            self.holdout.prune(int(self.window[0].t0.min()), self.max_tuples)
            self.trainer.set_data(self.window_tuples())                    # keeps the parameters
        else:
            # the window converted anew: the new tuples continue the record they belong to
            # a stage restarted on more windows (`window_refresh`) keeps the best loss of the
            # windows before, as a reopened one does: its candidates come mostly at its end
            self.trainer.extend_data(self.window_tuples())
        self._maybe_reopen(len(new))
        if self.converged:             # the solver waits: a refused option may have its evidence now
            self.trials.maybe_start(self)

    def _maybe_reopen(self, added: int) -> None:
        """Schedule "online": resume the finished solver once ``reopen_tuples`` new tuples have
        arrived. An end the gate could not judge (too few blocks) is taken again once it can
        (`finished`; resumed, it had to end anew: MPPI at 33-91 s)."""
        if not (self.converged and self.trainer.done and self.config.schedule == "online"):
            return
        self.since_end += added
        if self._looked_at < 0 and self.can_judge and self.holdout.scorable > self._blocks_at_end:
            self.converged = False
            self.judging_end_again = True
        elif self.since_end >= self.reopen_tuples > 0:
            self.trainer.reopen(f"{self.since_end} new tuples")
            self.since_end, self.converged, self.status = 0, False, "training"

    # ------------------------------------------------------------------ training
    @property
    def training(self) -> bool:
        """An epoch is due: the solver's, or a structure challenger's once the solver's
        end has been taken (`finish`)."""
        if self.trainer is None:
            return False
        return not self.trainer.done or (self.trials.active and self.converged)

    @property
    def finished(self) -> bool:
        """The schedule ended and `finish` has not been called yet."""
        return self.trainer is not None and self.trainer.done and not self.converged

    def step(self) -> Optional[tuple[dict, dict]]:
        """One epoch. Returns (metrics, parameter values) when the validation loss improved on
        the best so far or the gate can judge (`can_judge`) and has judged no fit of the solver's
        since the last held-out block was completed, None otherwise; a diverged epoch is rolled
        back and counted in ``rollbacks``. Once the solver is done, an epoch of the structure
        challenger, and its share of the compute while both train (`StructureTrials.challengers_turn`;
        None, or the values of one adopted before its end: the solver now, the gate passed them)."""
        trials = self.trials
        if trials.active and (self.trainer.done or trials.challengers_turn()
                              or (trials.urgent and self.best_values is not None)):
            return trials.step(self)
        # on the floor the solver rarely waits (it reopens on every reopen_tuples new
        # tuples and trains until then): a running challenger takes its share of the time
        with self.work.timed(self.compute_clock, "solver") as epoch:
            m = self.trainer.train_epoch()
        trials.solver_took(epoch.seconds)
        self.epochs += 1
        self.last_metrics = {k: v for k, v in m.items() if k != "params"}
        values = self.trainer.parameters.as_dict()
        loss = float(m.get("val_loss", math.nan))
        if m.get("diverged") or not math.isfinite(loss) or not healthy_values(values):
            self.rollbacks += 1
            self.rollback()
            return None
        self.good_state = self.trainer.state_dict()
        self.trials.observe(self)               # a challenger beside the solver; its pins
        # a loss below the best so far, or new evidence: the best losses came on the first windows
        # (a stage restarted on more data has larger ones), so a solver that never ends was
        # judged once (noisy_mocap: none judged 14-55.7 s; then, judged at 17.2 s, none to 60 s)
        if loss < self.best_loss or self._new_evidence:
            self.best_loss = min(self.best_loss, loss)
            return m, values
        return None

    @property
    def _new_evidence(self) -> bool:
        """The gate can judge, and has judged no fit of the solver's since a held-out block
        was completed (held-out tuples counted in whole blocks): an epoch is then a
        candidate whatever its loss."""
        return self.can_judge and (self._looked_at < 0 or
                                   self.heldout_total // self.holdout_block > self._looked_at // self.holdout_block)

    def rollback(self) -> None:
        """Back to the last healthy trainer state (or at least the best values)."""
        if self.trainer is None or self.good_state is None:
            return
        try:
            self.trainer.load_state_dict(self.good_state)
        except Exception:  # noqa: BLE001 - data changed shape: restore parameters only
            if self.best_values is not None and structure_key(self.incumbent_robot) == structure_key(self.robot):
                for k, v in self.best_values.items():
                    self.trainer.parameters.set_value(k, v)

    def finish(self) -> tuple[dict, dict]:
        """The schedule ended: (metrics with the best loss, final healthy values). ``status``
        says "converged" only if a convergence test ended it, else "final (<why>)": a
        budget ran out."""
        self.converged = True           # finished: no more epochs (the checkpoint's flag)
        self.since_end = self.since_end if self.judging_end_again else 0   # since an end judged again: still new
        self.judging_end_again = False
        self._blocks_at_end = self.holdout.scorable
        schedule = self.trainer.schedule
        self.status = "converged" if schedule.converged else f"final ({schedule.stop_reason or 'stopped'})"
        values = self.trainer.parameters.as_dict()
        if not healthy_values(values):
            self.rollback()
            values = self.trainer.parameters.as_dict()
        m = dict(self.last_metrics)
        m["val_loss"] = self.best_loss
        self.trials.maybe_start(self)
        return m, values

    def adopt(self, trainer, val_loss: float) -> None:
        """A structure challenger won (`online_structure`): it becomes the session's trainer.
        Its end is taken like the solver's (`finished`, then `finish`): the caller's gate and
        convergence test see its values before they are published. It fitted the window it
        started with; it takes the window as it is now (its values kept). One adopted before
        its end trains on under the session's budget, and its next epoch is a candidate
        (its loss on its own window does not compare with the window's). The window is
        taken as an extension of the one it fitted (`extend_data`: its windows and latents
        kept, the new tuples in its training data, in its windows once the data has grown
        ``window_refresh`` times; set anew if the window slid since), not set anew, which
        fitted every window's latents again first. Its finite differences keep the
        challenger's cap (`online_structure.CHALLENGER_FD_ITERS`, measured there). Raises
        (the session unchanged) if the challenger cannot take the window."""
        old = self.trainer
        if not trainer.done and hasattr(trainer, "set_budget"):
            trainer.set_budget(self.config.max_epochs, self.config.max_seconds, trainer.config.fd_max_iters)
        trainer.extend_data(self.window_tuples())
        inherit_scratch(trainer, old)            # its first sigma polishes the old solver's latents
        self.robot = getattr(trainer, "robot", self.robot)
        if old is not None and structure_key(getattr(old, "robot", self.robot)) != structure_key(self.robot):
            self.scores.keep(old)                # scores the model it fitted
        self.trainer = trainer
        self.good_state = trainer.state_dict()
        self.best_loss = float(val_loss) if trainer.done else math.inf
        self._uncertainty_memo = None
        self.converged = False

    @accounted("sigma")
    def uncertainty(self, max_tuples: int = 256, at: Optional[dict] = None):
        """`session_uncertainty`: the current values' (or ``at``'s) on the window, or None."""
        return session_uncertainty(self, max_tuples, at)

    def predict_newest(self) -> Optional[tuple[np.ndarray, int]]:
        """`predict_newest`: the model's X_t+T [R, 13] of the newest tuple and its stamp (ns)."""
        return predict_newest(self)

    def checkpoint(self) -> Optional[dict]:
        """The session as a dict, or None before the trainer exists."""
        return session_state(self)

    def restore(self, data: dict) -> None:
        """Resume from `checkpoint` output; raises (the session left empty) on another robot's or a malformed one."""
        try:
            restore_session(self, data)
        except Exception:
            self.reset()
            raise


def unseen_tuples(s: OnlineIdentification, batch: TupleBatch, since_ns: Optional[int] = None):
    """Tuples of ``s``'s stream that neither training nor the gate saw (a bench's fresh data
    after the session stopped), each starting with the actuator state the known commands
    before it leave; for `OnlineIdentification.heldout_scores`' ``data``. ``since_ns``: only
    the tuples from that stamp on (the earlier ones give their commands), so runs that
    stopped at different points of one stream are scored on the same tuples."""
    context = list(s.window) + s.holdout.context()
    if since_ns is not None:
        late = batch.t0 >= int(since_ns)
        if not bool(late.any()):
            raise ValueError("no tuple from the given stamp on")
        if not bool(late.all()):
            context.append(batch.slice(torch.nonzero(~late).flatten()))
        batch = batch.slice(torch.nonzero(late).flatten())
    return s._tuple_set(batch, context=context)


def session_uncertainty(s: OnlineIdentification, max_tuples: int = 256, at: Optional[dict] = None):
    """`uncertainty.ParameterUncertainty` of the session trainer's current values (or of
    ``at``) on the window, or None (no trainer yet, or the estimate failed: no sigma beats a
    wrong one)."""
    from tensegrity_engine.identification.uncertainty import trainer_uncertainty

    if s.trainer is None:
        return None
    # the same values on the same data and solver state (the node asks twice when a run
    # ends: for its convergence test and for the message) cost one estimate
    values = at if at is not None else s.trainer.parameters.as_dict()
    key = (max_tuples, s.batches_added, s.epochs, s.rollbacks,
           tuple((k, np.asarray(v, dtype=np.float64).tobytes()) for k, v in sorted(values.items())))
    if s._uncertainty_memo is not None and s._uncertainty_memo[0] == key:
        return s._uncertainty_memo[1]
    try:
        u = trainer_uncertainty(s.trainer, max_tuples=max_tuples, at=at)
    except Exception as exc:  # noqa: BLE001 - a failed sigma must not hold back the model
        s.log(f"no uncertainty estimate: {exc!r}")
        u = None
    s._uncertainty_memo = (key, u)
    return u


@torch.no_grad()
def predict_newest(s: OnlineIdentification) -> Optional[tuple[np.ndarray, int]]:
    """The identified model's prediction X_t+T [R, 13] of the newest tuple and its start
    stamp (ns), or None (no model or data yet, or a non-finite prediction)."""
    engine = getattr(s.trainer, "engine", None)
    if engine is None or not s.window:
        return None
    last = s.window[-1].slice(slice(-1, None))
    device = s.trainer.device
    p = engine.param_values(torch.float64, device)
    S = last.commands.shape[1]
    timed = delayed_commands(torch.cat([last.prev_commands, last.commands], 1).to(device),
                             p["actuator_delay"], s.robot.dt)[:, -S:]
    pred, _ = engine.rollout(last.x0.to(device), timed[:, 0], timed, s.robot.dt,
                             record_every=S, params=p)
    rs = pred[0, -1].cpu().double().numpy()
    return (rs, int(last.t0[0])) if np.isfinite(rs).all() else None


def session_state(s: OnlineIdentification) -> Optional[dict]:
    """`OnlineIdentification.checkpoint`: JSON and tensors only."""
    if s.trainer is None:
        return None
    state = s.trainer.state_dict() if healthy_values(s.trainer.parameters.as_dict()) else None
    heldout = s.holdout.batch().to_dict() if s.heldout else None
    return {"robot": s.robot.name, "window": s.window_batch().to_dict(), "heldout": heldout,
            "seen": s.holdout.seen, "holdout_phase": s.holdout.phase(), "trainer": state,
            "best_loss": s.best_loss, "best_values": s.best_values, "epochs": s.epochs,
            "converged": s.converged, "status": s.status, "rollbacks": s.rollbacks,
            "structure": s.trials.state(), "heldout_total": s.heldout_total,
            "published_structure": None if s.best_values is None else list(structure_key(s.incumbent_robot))}


def restore_session(s: OnlineIdentification, data: dict) -> None:
    """`OnlineIdentification.restore` (which empties the session if this raises)."""
    if data.get("robot") != s.robot.name:
        raise ValueError(f"checkpoint is for robot {data.get('robot')!r}")
    window = TupleBatch.from_dict(data["window"])
    s.window = collections.deque([window])
    s.window_len = len(window)
    held = TupleBatch.from_dict(data["heldout"]) if data.get("heldout") is not None else None
    s.holdout.restore(held, int(data.get("seen", 0)), data.get("heldout_total"), data.get("holdout_phase"))
    s._uncertainty_memo = None
    s.trials.restore(data.get("structure"))
    s._new_trainer(window)
    saved = data["trainer"]
    learnt = None if saved is None else saved.get("learn")
    now = getattr(s.trainer, "learn", None)
    if learnt is not None and now is not None and tuple(learnt) != tuple(now):
        # another learn (a changed setting): its solver state is not this session's; the data
        # and the published model still are
        s.log(f"checkpoint learnt {', '.join(map(str, learnt))[:300]}; this session learns {', '.join(now)}: "
              "its solver starts afresh on the restored data")
        saved = None
    if saved is not None:
        try:
            s.trainer.load_state_dict(saved)
            s.good_state = saved
        except (ValueError, TypeError, KeyError, IndexError, RuntimeError) as exc:
            # a state of another shape (an adopted split this session does not take) or a
            # malformed one: the data and the published model are still this session's
            s.log(f"checkpoint's solver state does not fit this session ({str(exc)[:200]}): "
                  "its solver starts afresh on the restored data")
            s._new_trainer(window)
            saved = None
    s.best_loss = float(data["best_loss"])
    best = data["best_values"]
    if best is not None:            # a file is no more trusted than a topic
        published = data.get("published_structure")
        robot = s.robot if published is None else robot_in_structure(s.config_robot, tuple(published))
        s.mark_published(checked_parameters(robot, best).as_dict(), robot)
    s.epochs = int(data["epochs"])
    s.rollbacks = int(data.get("rollbacks", 0))
    s.converged = bool(data.get("converged")) and saved is not None     # a fresh solver has not ended
    s._looked_at = s.heldout_total if s.best_values is not None else -1   # a published fit was judged
    # a finished session says how it finished (text from a file: bounded)
    s.status = str(data.get("status", "final"))[:120] if s.converged else "resumed"
    if s.best_values is not None and structure_key(s.incumbent_robot) == structure_key(s.robot):
        for k, v in s.best_values.items():   # not into a trainer of another structure (an adopted one)
            s.trainer.parameters.set_value(k, v)
