"""Adam with backpropagation through time (paper III-C).

Learning happens on the unconstrained raw parameters of `PhysicalParameters` (Adam with
gradient-norm clipping ``grad_clip``, minibatches of ``batch_size``), so a learning rate is
a step in logit space and never leaves the physical bounds. A coarse epoch draws at most
``max(1, coarse_work // (T/dt))`` minibatches (an implicit step costs about the same for any
batch size, so this bounds the time per epoch). Divergence (NaN/inf loss or gradient,
parameters saturating their bounds) restores the last good parameters and counts as a
non-improving epoch. Rebuilding for appended tuples keeps the Adam moments of tensors whose
shape is unchanged (the parameters) and drops the rest (the grown latent velocities).
"""
from __future__ import annotations

import math

import numpy as np
import torch


class AdamSolver:
    def __init__(self, config):
        self.config = config
        self.optimizer = None
        self.val_optimizer = None

    def rebuild(self, run, keep_state: bool = False) -> None:
        """A new optimiser over the learnt parameters (and the latents, if any) at run's lr."""
        old = self.optimizer.state_dict() if (keep_state and self.optimizer is not None) else None
        lr = run.schedule.lr
        groups = [{"params": [getattr(run.params, n) for n in run.learn], "lr": lr, "name": "params"}]
        if run.train is not None and run.train.latent is not None:
            groups.append({"params": [run.train.latent], "lr": lr * self.config.latent_lr_ratio,
                           "name": "latent"})
        self.optimizer = torch.optim.Adam(groups)
        if run.val is not None and run.val.latent is not None:
            self.val_optimizer = torch.optim.Adam([run.val.latent], lr=lr * self.config.latent_lr_ratio)
        if old is not None and len(old["param_groups"]) == len(self.optimizer.param_groups):
            # Keep the moments of tensors whose shape is unchanged; drop the rest (the latent
            # velocities grow when tuples are appended: their moments start afresh).
            new = self.optimizer.state_dict()
            params = [q for g in self.optimizer.param_groups for q in g["params"]]
            state = {}
            for i, q in enumerate(params):
                st = old["state"].get(i)
                if st and not any(torch.is_tensor(v) and v.dim() > 0 and v.shape != q.shape
                                  for v in st.values()):
                    state[i] = st
            new["state"] = state
            self.optimizer.load_state_dict(new)

    def set_lr(self, lr: float) -> None:
        for g in self.optimizer.param_groups:
            g["lr"] = lr * (self.config.latent_lr_ratio if g.get("name") == "latent" else 1.0)
        if self.val_optimizer is not None:
            for g in self.val_optimizer.param_groups:
                g["lr"] = lr * self.config.latent_lr_ratio

    def val_latent_step(self, loss: torch.Tensor) -> None:
        """One step of the validation latents (parameters frozen): pose-only validation."""
        self.val_optimizer.zero_grad()
        loss.backward()
        self.val_optimizer.step()

    def epoch(self, run) -> dict:
        """Minibatch BPTT over (a bounded share of) the training tuples, then validation."""
        cfg = self.config
        n = len(run.train)
        count = cfg.epoch_tuples or n
        if run.schedule.phase == "coarse" and cfg.coarse_work:
            # An implicit step costs about the same for any batch: bound the work per epoch.
            count = min(count, max(1, cfg.coarse_work // run.schedule.n_steps) * cfg.batch_size)
        order = run.rng.permutation(n)[:count]
        losses, diverged, used = [], False, 0
        for b in range(0, len(order), cfg.batch_size):
            idx = torch.as_tensor(order[b:b + cfg.batch_size], device=run.device)
            good = run.snapshot()
            p = run.engine.param_values(run.dtype, run.device)
            loss = run.batch_loss(run.train, idx, p)
            if not torch.isfinite(loss):
                diverged = True
                break
            self.optimizer.zero_grad()
            loss.backward()
            grads = [q.grad for g in self.optimizer.param_groups for q in g["params"] if q.grad is not None]
            if not all(torch.isfinite(g).all() for g in grads):
                diverged = True
                break
            if cfg.grad_clip:
                torch.nn.utils.clip_grad_norm_(self.optimizer.param_groups[0]["params"], cfg.grad_clip)
            self.optimizer.step()
            if not run.healthy():
                run.restore(good)
                diverged = True
                break
            losses.append(float(loss.detach()))
            used += len(idx)
        if diverged:
            run.restore(good)
            run.rollbacks += 1
            self.rebuild(run)    # Adam moments may carry the blow-up
            run.log(f"epoch {run.epoch}: diverged at {run.integrator} dt {run.dt * 1e3:g} ms, "
                    f"lr {run.lr:g}: restored the last good parameters")
        val = run.validate() if not diverged else math.inf
        if not math.isfinite(val) and not diverged:
            diverged = True
            run.restore(good)
            run.rollbacks += 1
        return {"loss": float(np.mean(losses)) if losses else math.nan, "val_loss": val,
                "tuples": used, "diverged": diverged}

    def state_dict(self):
        return self.optimizer.state_dict() if self.optimizer else None
