"""A `ProgressiveTrainer`'s state for checkpoints (`checkpoint` writes it without pickle)."""
from __future__ import annotations

import copy
import dataclasses
import math

import numpy as np
import torch

from tensegrity_engine.identification.uncertainty import SHIFT_POOL
from tensegrity_engine.physics.params import checked_bounds


def trainer_state(trainer) -> dict:
    """Everything a `ProgressiveTrainer` needs to resume (`load_trainer_state`)."""
    lm = trainer.window_lm if trainer.schedule.pose_stage == "window" else trainer.tuple_lm
    return trainer.schedule.state_dict() | {
        "config": dataclasses.asdict(trainer.config), "params": copy.deepcopy(trainer.params.state_dict()),
        # the raw values mean something only with the bounds they were stored under
        "param_bounds": {n: list(trainer.params.bounds_of(n)) for n in trainer.params.specs},
        "learn": trainer.learn, "optimizer": trainer.adam.state_dict(), "epoch": trainer.epoch,
        "elapsed": trainer.elapsed, "history": trainer.history, "rng": trainer.rng.bit_generator.state,
        "latent": None if not trainer.latent else trainer.train.latent.detach().clone(),
        "val_latent": (None if trainer.val is None or trainer.val.latent is None
                       else trainer.val.latent.detach().clone()),
        "rollbacks": trainer.rollbacks, "coarse_params": trainer.coarse_params,
        "loss_scale": trainer.loss_scale, "lm_lambda": lm.lm_lambda,
        **{k: getattr(trainer.window_lm, k) for k in ("windows", "window_vel", "latent_jac", "jac_age")},
        "windows_drawn_from": trainer.window_lm.drawn_from,
        # the windowed stage's convergence test in the values: a resumed run passes it when
        # the uninterrupted one would, not lm_patience accepted steps later
        "settled_path": torch.stack(trainer.window_lm.settled.path) if trainer.window_lm.settled.path else None,
        # the model's horizon-shift draws (`uncertainty.pooled_shift`): a restart keeps its sigma's pool
        "horizon_shifts": [{n: np.array(v, dtype=np.float64) for n, v in h.items()}
                           for h in getattr(trainer, "horizon_shifts", []) if set(h) == set(trainer.learn)]}


PHASES = ("coarse", "fine", "done")
POSE_STAGES = ("finite_difference", "window")


def check_trainer_state(trainer, sd: dict) -> None:
    """ValueError unless ``sd`` (read from a file: no more trusted than a topic) is a state
    this trainer can resume from: the schedule's counters, step count, rate and best loss,
    the damping, the loss scale, what it learns, the values it started from and its stage's
    best, its settle test's path, its horizon-shift pool, and its windows' indices (latents
    of another shape the loader leaves out: a rollback's state is older than data that grew
    since). A value that does not raise later would mislead (a step count of 0 divides by
    zero, a NaN damping never recovers, a best loss of -inf ends every stage on patience)."""
    def number(key, allow_inf=False):
        v = sd.get(key)
        if not isinstance(v, (int, float)) or isinstance(v, bool) or math.isnan(v) \
                or (math.isinf(v) and not allow_inf):
            raise ValueError(f"trainer state: {key} = {str(v)[:40]!r} is not a number of its range")
        return v
    if sd.get("phase") not in PHASES or sd.get("pose_stage", "finite_difference") not in POSE_STAGES:
        raise ValueError("trainer state: unknown phase or pose stage")
    if not (isinstance(sd.get("n_steps"), int) and 1 <= sd["n_steps"] <= trainer.full_steps):
        raise ValueError(f"trainer state: n_steps = {str(sd.get('n_steps'))[:40]!r}, not 1-{trainer.full_steps}")
    if number("lr") <= 0 or number("best_val", allow_inf=True) == -math.inf:
        raise ValueError("trainer state: a learning rate <= 0 or a best loss of -inf")
    for key in ("bad_epochs", "stage_epochs", "epoch", "rollbacks"):
        if not (isinstance(sd.get(key, 0), int) and sd.get(key, 0) >= 0):
            raise ValueError(f"trainer state: {key} is not a count")
    if sd.get("lm_lambda") is not None and number("lm_lambda") <= 0:
        raise ValueError("trainer state: lm_lambda <= 0")
    if sd.get("loss_scale") is not None and number("loss_scale") <= 0:
        raise ValueError("trainer state: loss_scale <= 0")
    learn = sd.get("learn")
    if not isinstance(learn, (list, tuple)) or not all(isinstance(n, str) and n in trainer.params.specs for n in learn):
        raise ValueError(f"trainer state: learn {str(learn)[:80]} names no parameters of this engine")
    _check_raw_values(trainer, sd, "start_values", learn)
    _check_raw_values(trainer, sd, "best_snapshot", learn, latents=("__latent", "__window_vel"))
    path = sd.get("settled_path")
    width = sum(getattr(trainer.params, n).numel() for n in learn)
    if path is not None and not (isinstance(path, torch.Tensor) and path.is_floating_point() and path.dim() == 2
                                 and path.shape[1] == width and bool(torch.isfinite(path).all())):
        raise ValueError("trainer state: settled_path is not rows of finite raw values of what it learns")
    shifts = sd.get("horizon_shifts", [])
    if not (isinstance(shifts, list) and len(shifts) <= SHIFT_POOL and all(
            isinstance(h, dict) and set(h) == set(learn) and all(
                isinstance(v, np.ndarray) and v.ndim == 1 and v.size and v.dtype.kind == "f"
                and bool(np.isfinite(v).all()) and bool((v >= 0).all()) for v in h.values()) for h in shifts)):
        raise ValueError(f"trainer state: horizon_shifts are not at most {SHIFT_POOL} rows of finite, non-negative "
                         "relative shifts of what it learns")
    windows, vel = sd.get("windows"), sd.get("window_vel")
    if windows is not None:
        if not (isinstance(windows, torch.Tensor) and isinstance(vel, torch.Tensor) and windows.dim() == 2
                and not windows.is_floating_point() and len(windows) and len(vel) == len(windows)
                and int(windows.min()) >= 0):
            raise ValueError("trainer state: windows are not index rows with one latent block each")


def _check_raw_values(trainer, sd: dict, key: str, learn, latents=()) -> None:
    """``sd[key]``, where present, is what a schedule restores: the raw values of exactly what
    is learnt (and the ``latents`` keys), finite, of the parameters' shapes, within max_raw."""
    v = sd.get(key)
    if v is None:
        return
    ok = isinstance(v, dict) and set(learn) <= set(v) <= set(learn) | set(latents) and all(
        isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel() and bool(torch.isfinite(t).all())
        for t in v.values())
    if not (ok and all(v[n].shape == getattr(trainer.params, n).shape
                       and float(v[n].abs().max()) <= trainer.config.max_raw for n in learn)):
        raise ValueError(f"trainer state: {key} are not finite raw values of what it learns within max_raw")


def load_trainer_state(trainer, sd: dict) -> None:
    """Resume a `ProgressiveTrainer` from `trainer_state` (after `set_data` with the same data);
    `check_trainer_state` first: a state refused changes nothing."""
    if trainer.engine is None:
        raise RuntimeError("call set_data() before load_state_dict()")
    check_trainer_state(trainer, sd)
    bounds = {name: checked_bounds(trainer.params.specs[name], *ends)      # a file's: checked first
              for name, ends in (sd.get("param_bounds") or {}).items() if name in trainer.params.specs}
    for name, (lo, hi) in bounds.items():
        if trainer.params.bounds_of(name) != (lo, hi):
            trainer.params.specs[name] = dataclasses.replace(trainer.params.specs[name], lower=lo, upper=hi)
    with torch.no_grad():
        trainer.params.load_state_dict(sd["params"])
    trainer.learn = tuple(sd["learn"])
    for name, raw in trainer.params.named_parameters():
        raw.requires_grad_(name in trainer.learn)
    for key in ("epoch", "elapsed", "history", "rollbacks", "coarse_params"):
        setattr(trainer, key, sd[key])
    trainer.horizon_shifts = [{n: np.array(v, dtype=np.float64) for n, v in h.items()}
                              for h in sd.get("horizon_shifts", [])]
    trainer.schedule.load_state_dict(sd)
    if sd.get("loss_scale") is not None:
        trainer.objective.loss_scale = sd["loss_scale"]
    lm = trainer.window_lm if trainer.schedule.pose_stage == "window" else trainer.tuple_lm
    lm.lm_lambda = sd.get("lm_lambda", lm.lm_lambda)
    if trainer.window_lm.load(trainer, sd.get("windows"), sd.get("window_vel"), sd.get("latent_jac"),
                              sd.get("jac_age"), sd.get("windows_drawn_from")):
        path = sd.get("settled_path")        # the state's own problem: its path, or none yet
        trainer.window_lm.settled.path = [] if path is None else list(path.double().cpu())
    trainer.rng.bit_generator.state = sd["rng"]
    with torch.no_grad():
        if sd["latent"] is not None and trainer.latent and sd["latent"].shape == trainer.train.latent.shape:
            trainer.train.latent.copy_(sd["latent"])
        if sd["val_latent"] is not None and trainer.val is not None and trainer.val.latent is not None \
                and sd["val_latent"].shape == trainer.val.latent.shape:
            trainer.val.latent.copy_(sd["val_latent"])
    trainer.adam.rebuild(trainer)
    if sd["optimizer"] is not None:
        trainer.adam.optimizer.load_state_dict(sd["optimizer"])
