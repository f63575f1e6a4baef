"""Rollout loops over a step function, plain or with gradient checkpointing.

``step(S, act, command, dt, wrench, p) -> (S, act)`` advances the components-first state
S [..., 13, R]; commands are [..., S, A] and wrenches (or None) [..., S, 6, R]. Both loops
return (states [..., n, 13, R], acts [..., n, A]) after steps record_every, 2 record_every, ...
"""
from __future__ import annotations

from typing import Callable, Optional

import torch


def run(step: Callable, S, act, commands, dt, wr: Optional[torch.Tensor], p: dict, record_every: int):
    states, acts = [], []
    for i in range(commands.shape[-2]):
        S, act = step(S, act, commands[..., i, :], dt, None if wr is None else wr[..., i, :, :], p)
        if (i + 1) % record_every == 0:
            states.append(S)
            acts.append(act)
    return torch.stack(states, -3), torch.stack(acts, -2)


def run_checkpointed(step: Callable, S, act, commands, dt, wr: Optional[torch.Tensor], p: dict,
                     record_every: int, every: int):
    """As `run`, keeping for backward only the state at every ``every``-th step.

    The parameters enter each segment as explicit inputs so that their gradients flow
    through the recomputation.
    """
    from torch.utils.checkpoint import checkpoint

    if every % record_every:
        raise ValueError("record_every must divide checkpoint_every")
    names = list(p)

    def segment(S_, act_, start, stop, *values):
        pp = dict(zip(names, values))
        recorded = []
        for i in range(start, stop):
            S_, act_ = step(S_, act_, commands[..., i, :], dt, None if wr is None else wr[..., i, :, :], pp)
            if (i + 1) % record_every == 0:
                recorded.append((S_, act_))
        if not recorded:
            return S_, act_, S_.new_zeros((*S_.shape[:-2], 0, *S_.shape[-2:])), act_.new_zeros(
                (*act_.shape[:-1], 0, act_.shape[-1]))
        return (S_, act_, torch.stack([r[0] for r in recorded], -3),
                torch.stack([r[1] for r in recorded], -2))

    states, acts = [], []
    steps = commands.shape[-2]
    for start in range(0, steps, every):
        stop = min(start + every, steps)
        S, act, seg_states, seg_acts = checkpoint(segment, S, act, start, stop, *p.values(),
                                                  use_reentrant=False)
        states.append(seg_states)
        acts.append(seg_acts)
    return torch.cat(states, -3), torch.cat(acts, -2)
