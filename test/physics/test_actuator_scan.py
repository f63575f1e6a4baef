"""The rate-limited filter's sequential scan (`actuators.LimitedFilterScan`): the same states
as chaining `actuator_update`, and a hand-written backward that agrees with autograd in
every phase of the filter (exponential only, linear then exponential, linear only) and
across empty padding stretches."""
import torch

from tensegrity_engine.physics.actuators import _limited_step, actuator_update, limited_filter_states


def _inputs(seed=0, B=3, L=40, A=4, padding=5):
    g = torch.Generator().manual_seed(seed)
    a0 = torch.rand(B, A, generator=g, dtype=torch.float64)
    commands = torch.rand(B, L, A, generator=g, dtype=torch.float64)
    h = 0.002 + 0.1 * torch.rand(B, L, generator=g, dtype=torch.float64)
    h[:, L - padding:] = 0.0                                   # padding stretches
    tau = torch.tensor([0.03], dtype=torch.float64)
    speed = torch.tensor([0.5, 2.0, 8.0, 30.0], dtype=torch.float64)[:A]     # per actuator: all phases
    return a0, commands, h, tau, speed


def test_scan_states_equal_chained_actuator_updates():
    a0, commands, h, tau, speed = _inputs()
    got = limited_filter_states(a0, commands, h, tau, speed)
    a, ref = a0, [a0]
    for i in range(commands.shape[1]):
        a = actuator_update(a, commands[:, i], tau, h[:, i, None], speed)[0]
        ref.append(a)
    torch.testing.assert_close(got, torch.stack(ref, 1), rtol=0, atol=0)
    # every phase occurs
    gap = (torch.stack(ref, 1)[:, :-1] - commands).abs()
    t1 = torch.minimum(torch.clamp((gap - tau * speed) / speed, min=0.0), h[..., None])
    moving = h[..., None] > 0
    assert bool(((t1 <= 0) & moving).any() and ((t1 > 0) & (t1 < h[..., None])).any()
                and ((t1 >= h[..., None]) & moving).any())


def test_scan_backward_equals_autograd_of_the_plain_steps():
    a0, commands, h, _, per_actuator_speed = _inputs(1)
    for tau, speed in ((torch.tensor([0.03]), per_actuator_speed),
                       (torch.tensor([0.02, 0.03, 0.05, 0.08]), torch.tensor([1.5]))):
        tau, speed = tau.double(), speed.double()
        grads = []
        for scan in (True, False):
            leaves = [x.clone().requires_grad_() for x in (a0, commands, tau, speed)]
            states = limited_filter_states(leaves[0], leaves[1], h, leaves[2], leaves[3], scan=scan)
            weights = torch.linspace(0.5, 1.5, states.numel(), dtype=torch.float64).reshape(states.shape)
            (states * weights).sum().backward()
            grads.append([x.grad for x in leaves])
        for g_scan, g_plain in zip(*grads):
            assert float(g_plain.abs().max()) > 0
            torch.testing.assert_close(g_scan, g_plain, rtol=1e-10, atol=1e-13)


def test_scan_gradcheck():
    a0, commands, h, tau, speed = _inputs(2, B=2, L=8, A=3, padding=1)
    inputs = (a0.requires_grad_(), commands.requires_grad_(), h, tau.requires_grad_(), speed.requires_grad_())
    assert torch.autograd.gradcheck(lambda a, c, hh, t, v: limited_filter_states(a, c, hh, t, v), inputs)


def test_single_step_partials_are_the_closed_form():
    # linear only (a far gap), exponential only (a small one), linear then exponential
    a = torch.tensor([0.9, 0.31, 0.5], dtype=torch.float64)
    u = torch.tensor([0.1, 0.3, 0.32], dtype=torch.float64)
    tau, v, h = torch.tensor(0.05, dtype=torch.float64), torch.tensor(2.0, dtype=torch.float64), 0.1
    end, d_a, d_u, d_tau, d_v = _limited_step(a, u, tau, v, torch.tensor(h, dtype=torch.float64))
    t1 = torch.clamp(((a - u).abs() - tau * v) / v, min=0.0)
    assert t1[0] >= h and t1[1] == 0 and 0 < t1[2] < h
    torch.testing.assert_close(end, actuator_update(a, u, tau, h, v)[0], rtol=0, atol=0)
    for i in range(3):
        leaves = [x.clone().requires_grad_() for x in (a[i], u[i], tau, v)]
        actuator_update(leaves[0], leaves[1], leaves[2], h, leaves[3])[0].backward()
        torch.testing.assert_close(torch.stack([d_a[i], d_u[i], d_tau[i], d_v[i]]),
                                   torch.stack([x.grad for x in leaves]), rtol=1e-10, atol=1e-14)
