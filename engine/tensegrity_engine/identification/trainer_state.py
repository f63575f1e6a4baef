"""A `ProgressiveTrainer`'s state for checkpoints (`checkpoint` writes it without pickle)."""
from __future__ import annotations

import copy
import dataclasses

import torch

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
        "windows_drawn_from": trainer.window_lm.drawn_from}


def load_trainer_state(trainer, sd: dict) -> None:
    """Resume a `ProgressiveTrainer` from `trainer_state` (after `set_data` with the same data)."""
    if trainer.engine is None:
        raise RuntimeError("call set_data() before load_state_dict()")
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
    trainer.schedule.load_state_dict(sd)
    if sd.get("loss_scale") is not None:
        trainer.objective.loss_scale = sd["loss_scale"]
    lm = trainer.window_lm if trainer.schedule.pose_stage == "window" else trainer.tuple_lm
    lm.lm_lambda = sd.get("lm_lambda", lm.lm_lambda)
    trainer.window_lm.load(trainer, sd.get("windows"), sd.get("window_vel"), sd.get("latent_jac"), sd.get("jac_age"),
                           sd.get("windows_drawn_from"))
    trainer.rng.bit_generator.state = sd["rng"]
    with torch.no_grad():
        if sd["latent"] is not None and trainer.latent and sd["latent"].shape == trainer.train.latent.shape:
            trainer.train.latent.copy_(sd["latent"])
        if sd["val_latent"] is not None and trainer.val is not None and trainer.val.latent is not None:
            trainer.val.latent.copy_(sd["val_latent"])
    trainer.adam.rebuild(trainer)
    if sd["optimizer"] is not None:
        trainer.adam.optimizer.load_state_dict(sd["optimizer"])
