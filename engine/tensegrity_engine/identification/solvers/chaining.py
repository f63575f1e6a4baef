"""Latent start velocities chained along the record (pose-only windows, `windows`).

A window's latent velocity starts at the finite differences of the poses. For the spin of a
rod about its own axis they are a poor estimate at 10 Hz: a SUPERball rolling spins its rods
at up to 28 rad/s (7 rad/s on average), 1.4-5.6 rad between the poses of a central
difference. Taken straight from the pose before to the one after, that aliased (6.2 rad/s
off on average); through the middle pose (`physics.state.central_rotation`) it resolves
spins up to pi / 0.1 s, yet spin that friction changes within 0.1 s leaves it 0.4 rad/s
off, and the end nodes the loss compares do not see spin at all. On the floor spin
matters: a rod that spins wrong slides, friction pushes it, and its path changes.
Gauss-Newton from there stalls in the wrong spin, and the parameters make up for what the
latents cannot fit.

The window before knows better: rolled out over its 0.3 s, friction has brought the spin of
its rods on the floor to what the floor makes of it (the spin of a rod in the air changes
nothing: cables pull on the axis). So a window that continues another (its first tuple is
the tuple after the other's last) also starts from its predecessor's predicted end
velocity, and keeps whichever fits its own poses better. Measured on the SUPERball twin
rolling (20 s, true values, 66 windows of 3, 6 Gauss-Newton iterations): the window
objective 7.4e-4 from the finite differences, 1.7e-5 chained (true start velocities: 1e-17).
"""
from __future__ import annotations

import numpy as np
import torch

__all__ = ["window_predecessors", "window_end_velocities", "chain_latents"]


def window_predecessors(nxt, windows: torch.Tensor) -> torch.Tensor:
    """[N] for each window (rows of tuple indices) the row of the window it continues (the
    tuple after that one's last is this one's first; ``nxt[i]``: the tuple after i, -1 at a
    chain end), or -1."""
    rows = windows.cpu().numpy()
    first = {int(w[0]): j for j, w in enumerate(rows)}
    after = np.asarray(nxt.cpu() if torch.is_tensor(nxt) else nxt)[rows[:, -1]] if len(rows) else []
    pred = np.full(len(rows), -1, dtype=np.int64)
    for j, n in enumerate(after):
        k = first.get(int(n), -1) if n >= 0 else -1
        if k >= 0:
            pred[k] = j
    return torch.as_tensor(pred, device=windows.device)


@torch.no_grad()
def window_end_velocities(objective, data, windows: torch.Tensor, vel: torch.Tensor, p: dict) -> torch.Tensor:
    """[N, R, 6] the velocities the model ``p`` predicts at the end of each window, rolled
    out from its first pose and latent velocity ``vel`` (`RecurrentObjective.window_rollout`)."""
    return objective.window_rollout(data, windows, p, vel)[:, -1, :, 7:]


@torch.no_grad()
def chain_latents(objective, data, windows: torch.Tensor, vel: torch.Tensor, p: dict, fresh: torch.Tensor,
                  iterations: int = 2) -> tuple[torch.Tensor, int]:
    """(latents, how many were replaced): each window marked ``fresh`` [N] that continues
    another of ``windows``, in the order of the record (its predecessor settled first),
    starts from the predecessor's predicted end velocity, is fitted from there
    (`fit_start_velocities`, ``iterations``) and keeps the result if it fits the window's
    poses better than its latents ``vel`` as they are."""
    from tensegrity_engine.identification.solvers.windows import fit_start_velocities

    vel = vel.clone()
    pred = window_predecessors(data.ts.next, windows)
    pending = fresh.to(pred.device) & (pred >= 0)
    replaced = 0
    while bool(pending.any()):
        ready = pending & ~pending[pred.clamp(min=0)]
        idx = ready.nonzero()[:, 0]
        if not len(idx):                       # a cycle: no record runs back in time
            break
        start = window_end_velocities(objective, data, windows[pred[idx]], vel[pred[idx]], p)
        fitted = fit_start_velocities(objective, data, windows[idx], p, iterations, start=start)
        f_new = (objective.window_residual(data, windows[idx], fitted, p) ** 2).sum(-1)
        f_old = (objective.window_residual(data, windows[idx], vel[idx], p) ** 2).sum(-1)
        take = torch.isfinite(f_new) & ~(f_new >= f_old)
        vel[idx[take]] = fitted[take]
        replaced += int(take.sum())
        pending[idx] = False
    return vel, replaced
