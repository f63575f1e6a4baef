"""The two callables every planner is written against, and their shared helpers.

* dynamics ``(state0 [R, 13], act0 [A], plans [N, H, A]) -> states [N, H, R, 13]``: the rod
  state at the end of each of the H control intervals ("knots", ``control_dt`` long,
  command held over each) for N candidate plans (see `dynamics`);
* cost ``(states [N, H, R, 13], plans [N, H, A], state0, prev_command) -> [N]`` (see `costs`).
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import torch

Dynamics = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
Cost = Callable[..., torch.Tensor]
BAD_COST = 1e6          # cost of a rollout that produced NaN/inf


def as_tensor(x, dtype, device) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x.to(dtype=dtype, device=device)
    return torch.as_tensor(np.asarray(x), dtype=dtype, device=device)
