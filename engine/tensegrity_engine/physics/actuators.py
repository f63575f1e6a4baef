"""Cable actuators: command -> rest length (rate-limited first-order filter, gain/offset calibration)."""
from __future__ import annotations

import torch

from tensegrity_engine.physics.topology import Topology

TIMINGS = ("start", "mean")


def actuator_update(act: torch.Tensor, command: torch.Tensor, tau: torch.Tensor, h, max_speed=None):
    """Exact rate-limited first-order filter over a step with held command:

        d act / dt = clip((command - act) / tau, -max_speed, max_speed)

    a winch that runs at its top speed while far from the command, then settles
    exponentially once within tau * max_speed of it. Closed form per step: a linear phase
    of t1 = min(h, (|gap| - tau v) / v, clipped at 0), then an exponential one of h - t1.
    ``max_speed`` None (or a limit that does not bind) is the plain first-order filter.

    Returns (act at the end of the step, act averaged over the step).
    """
    decay = torch.exp(-h / tau)
    gap = act - command
    if max_speed is None:
        return command + gap * decay, command + gap * (tau / h) * (1.0 - decay)
    size, sign = gap.abs(), torch.sign(gap)
    t1 = torch.clamp((size - tau * max_speed) / max_speed, min=0.0)
    t1 = torch.minimum(t1, h) if isinstance(h, torch.Tensor) else t1.clamp(max=h)   # h: one or per row
    knee = size - max_speed * t1                       # |gap| when the exponential phase starts
    # the exponential phase lasts the whole step unless the limit binds (reuse its decay:
    # the native kernel does, and rounds the same)
    decay2 = torch.where(t1 > 0, torch.exp(-(h - t1) / tau), decay)
    end = command + sign * (knee * decay2)
    area = size * t1 - 0.5 * max_speed * t1 * t1 + knee * tau * (1.0 - decay2)
    return end, command + sign * (area / h)


def _limited_step(a, u, tau, v, h):
    """One held-command step of the rate-limited filter and its partial derivatives
    (d end / d a, d u, d tau, d v), closed form per phase: exponential only (t1 = 0), a linear
    then an exponential phase (0 < t1 < h), linear only (t1 = h)."""
    gap = a - u
    size, sign = gap.abs(), torch.sign(gap)
    t1 = torch.minimum(torch.clamp((size - tau * v) / v, min=0.0), h)
    exp_only, lin_only = t1 <= 0, t1 >= h
    e = torch.exp(-(h - t1) / tau)
    end = torch.where(exp_only, u + gap * e, u + sign * (size - v * t1) * e)
    one, zero = torch.ones_like(e), torch.zeros_like(e)
    d_a = torch.where(lin_only, one, e)
    rest = h - size / v                                 # the exponential phase of a mixed step
    d_tau = torch.where(exp_only, gap * e * h / (tau * tau),
                        torch.where(lin_only, zero, sign * v * e * (1.0 + rest / tau)))
    d_v = torch.where(exp_only, zero, torch.where(lin_only, -sign * h, sign * e * (tau - size / v)))
    return end, d_a, 1.0 - d_a, d_tau, d_v


class LimitedFilterScan(torch.autograd.Function):
    """States of the rate-limited filter before each of L held-command stretches and after
    the last: a0 [B, A], commands [B, L, A], durations h [B, L] (0 s: padding), tau and
    max_speed [1] or [A] -> [B, L + 1, A]. The same numbers as chaining `actuator_update`,
    without an autograd node per op: forward keeps every step's partial derivatives, backward
    runs the adjoint recursion (a long sequential scan is dispatch-bound in autograd:
    ~15 recorded ops per stretch, a thousand stretches per trajectory)."""

    @staticmethod
    def forward(ctx, a0, commands, h, tau, max_speed):
        tau_a, v_a = tau.expand(commands.shape[-1]), max_speed.expand(commands.shape[-1])
        a, states, parts = a0, [a0], ([], [], [], [])        # d_a, d_u, d_tau, d_v per stretch
        for i in range(commands.shape[1]):
            a, *d = _limited_step(a, commands[:, i], tau_a, v_a, h[:, i, None])
            states.append(a)
            for kept, x in zip(parts, d):
                kept.append(x)
        stacked = torch.stack([torch.stack(k) for k in parts]) if states[1:] else a0.new_zeros(4, 0, *a0.shape)
        ctx.save_for_backward(stacked, tau, max_speed)
        return torch.stack(states, 1)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_states):
        parts, tau, max_speed = ctx.saved_tensors
        d_a, d_u, d_tau, d_v = parts.unbind(0)                 # each [L, B, A]
        L = d_a.shape[0]
        carry = grad_states[:, L]
        g_u = grad_states.new_zeros(grad_states.shape[0], L, grad_states.shape[-1])
        g_tau, g_v = torch.zeros_like(carry), torch.zeros_like(carry)
        for i in range(L - 1, -1, -1):
            g_u[:, i] = carry * d_u[i]
            g_tau = g_tau + carry * d_tau[i]
            g_v = g_v + carry * d_v[i]
            carry = carry * d_a[i] + grad_states[:, i]
        reduce = lambda g, like: g.sum(0).sum(0, keepdim=True) if like.numel() == 1 else g.sum(0)  # noqa: E731
        return carry, g_u, None, reduce(g_tau, tau).reshape(tau.shape), reduce(g_v, max_speed).reshape(max_speed.shape)


def limited_filter_states(a0, commands, h, tau, max_speed, *, scan: bool = True) -> torch.Tensor:
    """[B, L + 1, A] filter states before each stretch and after the last: `LimitedFilterScan`
    where a gradient is wanted, else (and with ``scan=False``: ``torch.func`` transforms such
    as forward-mode Jacobians, which a custom backward does not serve) chained
    `actuator_update` steps, the same numbers."""
    wanted = torch.is_grad_enabled() and any(x.requires_grad for x in (a0, commands, tau, max_speed))
    if scan and wanted:
        return LimitedFilterScan.apply(a0, commands, h, tau, max_speed)
    a, states = a0, [a0]
    for i in range(commands.shape[1]):
        a = actuator_update(a, commands[:, i], tau, h[:, i, None], max_speed)[0]
        states.append(a)
    return torch.stack(states, 1)


def held_command_update(act, command, tau: float, duration: float, max_speed=None):
    """`actuator_update`'s end state for numpy values (drivers, controllers): float64 array."""
    import numpy as np

    f = lambda x: torch.as_tensor(np.asarray(x, dtype=np.float64))
    return actuator_update(f(act), f(command), f(tau), duration,
                           None if max_speed is None else f(max_speed))[0].numpy()


def delayed_commands(commands: torch.Tensor, delay: torch.Tensor, dt: float) -> torch.Tensor:
    """A zero-order-held command sequence [..., H, A] (one sample per engine step ``dt``) as
    it acts ``delay`` s later: sample j is the command of time j dt - delay, linear between
    samples (so the result is differentiable in the delay), the first sample held before
    the sequence and the last after it. A delay of zero returns ``commands`` itself."""
    delay = torch.as_tensor(delay).reshape(())
    if not delay.requires_grad and float(delay) == 0.0:
        return commands
    H = commands.shape[-2]
    shift = delay.to(commands.dtype) / dt
    whole = torch.floor(shift.detach())
    frac = shift - whole                                   # in [0, 1); carries the gradient
    src = torch.arange(H, device=commands.device) - int(whole)
    at = commands.index_select(-2, src.clamp(0, H - 1))
    before = commands.index_select(-2, (src - 1).clamp(0, H - 1))
    return at + frac * (before - at)


def speed_limit_binds(tau: torch.Tensor, max_speed: torch.Tensor, command_span: torch.Tensor) -> bool:
    """Whether the speed limit can ever act: the filter runs at (gap / tau) <= span / tau."""
    return bool(((tau * max_speed).reshape(-1) < command_span.max()).any())


class CableActuators:
    """Filtered commands ``act`` [..., A] and the rest lengths [..., C] they set.

    ``timing`` "start": a step's force uses the activation at the start of the step, like a
    motor loop and MuJoCo (actearly=false). "mean": the exact average of the filter over the
    step, better for coarse steps.
    """

    def __init__(self, topology: Topology, timing: str = "start"):
        if timing not in TIMINGS:
            raise ValueError(f"actuator_timing must be 'start' or 'mean', got {timing!r}")
        self.topology = topology
        self.timing = timing

    def initial_act(self, like: torch.Tensor) -> torch.Tensor:
        """Filtered commands that reproduce the config rest lengths (nominal calibration)."""
        robot = self.topology.robot
        act = torch.as_tensor(robot.cable_rest_length[robot.actuated_indices],
                              dtype=like.dtype, device=like.device)
        return act.expand(*like.shape[:-2], act.shape[-1]).clone()

    def clamp_command(self, command: torch.Tensor) -> torch.Tensor:
        k = self.topology.constants(command.dtype, command.device)
        return torch.maximum(torch.minimum(command, k["command_high"]), k["command_low"])

    def rest_lengths(self, act: torch.Tensor, p: dict) -> torch.Tensor:
        """[..., C] rest lengths from filtered commands [..., A]."""
        k = self.topology.constants(act.dtype, act.device)
        actuated = p["actuator_gain"] * act + p["actuator_offset"]
        passive = k["passive_rest"].expand(*act.shape[:-1], -1)
        return torch.cat([actuated, passive], -1).index_select(-1, k["rest_gather"])

    def advance(self, act: torch.Tensor, command: torch.Tensor, p: dict, h):
        """Filter ``act`` over a step h under the held (clamped) command.

        Returns (act at the end of the step, the rest lengths the step's forces use).
        """
        act_end, act_mean = actuator_update(act, command, p["actuator_time_constant"], h,
                                            p["actuator_max_speed"])
        return act_end, self.rest_lengths(act if self.timing == "start" else act_mean, p)
