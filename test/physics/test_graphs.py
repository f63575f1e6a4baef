"""Whole rollouts replayed as one CUDA graph (`physics.graphs`): the buffered path on the
CPU (everything but the capture) and, where CUDA exists, the capture itself."""
import numpy as np
import pytest
import torch

from tensegrity_engine.control.dynamics import EngineDynamics
from tensegrity_engine.groundtruth import environments
from tensegrity_engine.physics.engine import TensegrityEngine
from tensegrity_engine.physics.graphs import CapturedRollout


def _inputs(robot, seed, batch=3, steps=60, device="cpu"):
    rng = np.random.default_rng(seed)
    rest, act0 = environments.rest_pose(robot)
    state = np.stack([environments.rolling_velocity(robot, rest, np.r_[rng.uniform(-1, 1, 2), 0.0])
                      for _ in range(batch)])
    commands = np.stack([environments.random_commands(robot, rng, steps, hold_range=(0.01, 0.02))
                         for _ in range(batch)])
    f = lambda a: torch.tensor(a, dtype=torch.float64, device=device)       # noqa: E731
    return f(state), f(np.repeat(act0[None], batch, 0)), f(commands)


def _params(engine, device="cpu", stiffness_scale=1.0):
    p = {k: v.detach().to(device) for k, v in engine.param_values(torch.float64, device).items()}
    p["cable_stiffness"] = p["cable_stiffness"] * stiffness_scale
    return p


def test_buffered_rollout_follows_its_inputs_and_parameters(superball):
    engine = TensegrityEngine(superball)
    captured = CapturedRollout(engine, integrator="semi_implicit")
    for seed, scale in ((0, 1.0), (1, 1.3)):                 # same shapes: the same buffers, new values
        s, a, c = _inputs(superball, seed)
        p = _params(engine, stiffness_scale=scale)
        got = captured(s, a, c, 1e-3, params=p, record_every=20)
        with torch.no_grad():
            ref = engine.rollout(s, a, c, 1e-3, integrator="semi_implicit", params=p, record_every=20)
        for x, y in zip(got, ref):
            torch.testing.assert_close(x, y, rtol=0, atol=0)
    assert len(captured._entries) == 1 and captured.captures == 0       # nothing to capture on the CPU
    kept = got[0].clone()
    got[0].zero_()                                             # outputs are the caller's, not the buffers
    again = captured(s, a, c, 1e-3, params=p, record_every=20)
    torch.testing.assert_close(again[0], kept, rtol=0, atol=0)
    assert float((kept - _inputs(superball, 0)[0][:, None]).abs().max()) > 1e-3   # the robot moved


def test_planning_through_the_buffered_path_equals_plain_rollouts(superball):
    s, a, _ = _inputs(superball, 2, batch=1)
    plans = torch.rand(4, 3, superball.num_actuated, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    low, high = (torch.as_tensor(x) for x in (superball.command_low, superball.command_high))
    plans = low + (high - low) * plans
    kw = dict(backend="torch", compile=False, dtype=torch.float64)
    plain = EngineDynamics(superball, graphs=False, **kw)(s[0], a[0], plans)
    graphed = EngineDynamics(superball, graphs=True, **kw)
    torch.testing.assert_close(graphed(s[0], a[0], plans), plain, rtol=0, atol=0)
    assert graphed._captured is not None
    with pytest.raises(ValueError, match="backend='torch'"):
        EngineDynamics(superball, graphs=True)                  # the native kernel has nothing to replay
    with pytest.raises(ValueError, match="linear"):
        EngineDynamics(superball, graphs=True, integrator="implicitfast", **kw)   # its solves sync the host


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
def test_cuda_graph_replays_the_rollout(superball):
    engine = TensegrityEngine(superball).to("cuda")
    captured = CapturedRollout(engine, integrator="semi_implicit")
    for seed, scale in ((0, 1.0), (1, 1.3)):
        s, a, c = _inputs(superball, seed, device="cuda")
        p = _params(engine, "cuda", scale)
        got = captured(s, a, c, 1e-3, params=p, record_every=20)
        with torch.no_grad():
            ref = engine.rollout(s, a, c, 1e-3, integrator="semi_implicit", params=p, record_every=20)
        torch.testing.assert_close(got[0], ref[0], rtol=1e-9, atol=1e-12)
    assert captured.captures == 1
