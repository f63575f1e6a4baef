"""Multi-start (``n_starts``; init "random" or "given+random"): that many starts are scored
on the first stage's loss (one implicit step of T, 64 fixed training tuples) and the best is
kept. The first start is the run's current values: random for init="random", the given
ones (the user's config: a prior, never the truth of a benchmark robot) for
"given+random"; the others are random within the bounds."""
from __future__ import annotations

import math

import numpy as np
import torch


@torch.no_grad()
def multi_start(run) -> None:
    """Score ``n_starts`` random starts of ``run`` (a `ProgressiveTrainer` with data) and
    keep the best (cheap: one implicit step of T per tuple)."""
    cfg = run.config
    rng = np.random.default_rng(cfg.seed + 7919)
    n = len(run.train)
    idx = torch.as_tensor(np.sort(rng.permutation(n)[:min(n, 64)]), device=run.device)
    best, best_loss = None, math.inf
    run.start_losses = []
    for k in range(cfg.n_starts):
        if k:
            run.params.randomize(rng, run.learn)
        with torch.no_grad():           # scoring only (and the native kernel where it applies)
            p = run.engine.param_values(run.dtype, run.device)
            loss = float(run.batch_loss(run.train, idx, p))
        run.start_losses.append(loss)
        if math.isfinite(loss) and loss < best_loss:
            best, best_loss = run.snapshot(), loss
    if best is not None:
        run.restore(best)
    run.log(f"multi-start: best of {cfg.n_starts} random starts (loss {best_loss:.3e}, worst "
            f"{max(run.start_losses):.3e}); start {run.format_parameters()}")
