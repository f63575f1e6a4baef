"""The cables' own sensors in the objective: winch encoders (rest lengths) and load cells
(tensions) fitted beside the poses (`IdentificationConfig.rest_length_weight`,
``tension_weight``). Poses see the cables' force only through the motion it causes, which
fixes c / K of an overdamped robot but not its scale (docs/online_identification.md): a
load cell fixes it; an encoder fixes the motors' lag, which poses confuse with the cables'."""
from __future__ import annotations

import torch

from tensegrity_engine.identification.measurements import REST_LENGTH, TENSION

__all__ = ["sensed", "cable_errors", "window_cable_rows", "tuple_cable_rows"]


def sensed(config, data) -> bool:
    """Whether the objective fits cable states: a weight set and readings in the data."""
    return bool(config.rest_length_weight or config.tension_weight) and data.cables0 is not None


def cable_errors(engine, states, acts, measured, seen, p: dict, weights, scale: float) -> torch.Tensor:
    """[N, K C k]: the model's cable states at states [N, K, R, 13] and actuator states
    [N, K, A] less the ``measured`` ones [N, K, C, 2] where ``seen``, for each of the k kinds
    whose ``weights`` (rest length, tension) is not 0, times it and ``scale``; zero where not
    measured, so the residual keeps its size."""
    out = []
    for kind, weight in ((REST_LENGTH, weights[0]), (TENSION, weights[1])):
        if weight:
            model = (engine.rest_lengths(acts, p) if kind == REST_LENGTH
                     else engine.cable_tensions(states, acts, p))                          # [N, K, C]
            error = torch.where(seen[..., kind], model - measured[..., kind], torch.zeros_like(model))
            out.append(error.flatten(1) * (weight * scale))
    return torch.cat(out, 1)


def _weights(config) -> tuple:
    return config.rest_length_weight, config.tension_weight


def window_cable_rows(objective, data, windows: torch.Tensor, vel: torch.Tensor, pred: torch.Tensor,
                      acts: torch.Tensor, p: dict, scale: float = 1.0, weights=None) -> torch.Tensor:
    """[N, (W + 1) C k] at each window's start (its pose and latent velocity ``vel``) and at
    each of its samples (the rollout's ``pred`` [N, W, R, 13] and ``acts`` [N, W, A]); a
    dropped pose's sample counts nothing. ``weights`` None: the config's."""
    first = windows[:, 0]
    start = torch.cat([data.x0[first][..., :7], vel], -1)[:, None]
    at = windows.clamp(min=0)
    return cable_errors(
        objective.engine, torch.cat([start, pred], 1),
        torch.cat([objective.act_starts(data, p)[first][:, None], acts], 1),
        torch.cat([data.cables0[first][:, None], data.cables1[at]], 1),
        torch.cat([data.cables_seen0[first][:, None], data.cables_seen1[at] & (windows >= 0)[..., None, None]], 1),
        p, _weights(objective.config) if weights is None else weights, scale)


def tuple_cable_rows(objective, data, idx: torch.Tensor, x0, act, pred, act_end, p: dict,
                     scale: float = 1.0) -> torch.Tensor:
    """[N, 2 C k] at each tuple's start (``x0``, ``act``) and end (``pred``, ``act_end``)."""
    return cable_errors(objective.engine, torch.stack([x0, pred], 1), torch.stack([act, act_end], 1),
                        torch.stack([data.cables0[idx], data.cables1[idx]], 1),
                        torch.stack([data.cables_seen0[idx], data.cables_seen1[idx]], 1), p,
                        _weights(objective.config), scale)
