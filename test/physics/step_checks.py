"""Shared checks of one engine step (test helpers, not tests)."""
import torch


def one_step_gradcheck(engine, state, act, names) -> bool:
    """torch.autograd.gradcheck of one 1 ms step w.r.t. ``state`` and the parameters
    ``names`` (the command held at ``act``)."""
    base = engine.param_values(torch.float64, "cpu")

    def one_step(S, *values):
        p = dict(base)
        p.update(zip(names, values))
        nxt, _ = engine.step(S, act, act, 1e-3, params=p)
        return nxt

    inputs = (state.requires_grad_(True), *[base[n].detach().clone().requires_grad_(True) for n in names])
    return torch.autograd.gradcheck(one_step, inputs, eps=1e-7, atol=1e-5, rtol=1e-4)
