#!/usr/bin/env python3
"""Engine throughput against mujoco.rollout on the same robot, in one run (issue 2, section 6).

Scenario (identical for both): the robot at MuJoCo's settled rest pose, every sample
pushed with a random rolling velocity and held random commands, contact on, 1 ms steps.
Prints steps/s (= batch x steps / seconds) and ratios to MuJoCo for the torch engine (eager,
torch.compile'd, forward+backward) and the native C kernel (`tensegrity_engine.physics.native`,
forward only); never asserts timings.

    python bench/engine_throughput.py [--robot superball] [--steps 1000] [--threads 2]
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from tensegrity_engine.groundtruth import environments
from tensegrity_engine.physics import native
from tensegrity_engine.physics.config import load_robot
from tensegrity_engine.physics.params import PhysicalParameters
from tensegrity_engine.physics.engine import TensegrityEngine


def scenario(robot, batch: int, steps: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    state0, act0 = environments.rest_pose(robot)
    states = np.repeat(state0[None], batch, 0)
    for b in range(batch):
        heading = rng.uniform(0, 2 * np.pi)
        velocity = rng.uniform(0.5, 1.5) * np.array([np.cos(heading), np.sin(heading), 0.0])
        states[b] = environments.rolling_velocity(robot, state0, velocity)
    acts = np.repeat(act0[None], batch, 0)
    low, high = robot.command_low, robot.command_high
    held = rng.uniform(low, high, size=(batch, 1, robot.num_actuated))
    commands = np.repeat(held, steps, axis=1)
    return states, acts, commands


def time_call(fn, repeats: int = 1) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--robot", default="superball")
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--batches", type=int, nargs="+", default=[40, 1000])
    parser.add_argument("--threads", type=int, default=2, help="torch threads and mujoco.rollout threads")
    parser.add_argument("--checkpoint-every", type=int, default=50,
                        help="BPTT segment length for forward+backward (memory bound)")
    parser.add_argument("--skip-backward", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    robot = load_robot(args.robot)
    twin = environments.contact_twin(robot, nthread=args.threads)
    print(f"robot {robot.name}: {robot.num_rods} rods, {robot.num_cables} cables; {args.steps} steps of "
          f"{robot.dt * 1e3:g} ms; torch {torch.__version__} threads {torch.get_num_threads()}; "
          f"mujoco.rollout nthread {args.threads}")
    rows = []
    for batch in args.batches:
        states, acts, commands = scenario(robot, batch, args.steps)
        total = batch * args.steps
        mj_seconds = time_call(lambda: twin.rollout(states, acts, commands, record_every=args.steps), 2)
        mujoco_rate = total / mj_seconds
        rows.append((batch, "mujoco.rollout (float64)", mujoco_rate, 1.0))

        engine = TensegrityEngine(robot)
        s = torch.tensor(states, dtype=torch.float32)
        a = torch.tensor(acts, dtype=torch.float32)
        c = torch.tensor(commands, dtype=torch.float32)
        p = engine.param_values(torch.float32, "cpu")
        with torch.no_grad():
            engine.rollout(s, a, c[:, :5], robot.dt, params=p)
            eager = time_call(lambda: engine.rollout(s, a, c, robot.dt, params=p, record_every=args.steps))
            rows.append((batch, "engine eager, float32, no grad", total / eager, total / eager / mujoco_rate))
            start = time.perf_counter()
            engine.rollout(s, a, c[:, :2], robot.dt, params=p, compile=True)
            compile_seconds = time.perf_counter() - start
            compiled = time_call(lambda: engine.rollout(s, a, c, robot.dt, params=p, record_every=args.steps,
                                                        compile=True), 2)
            rows.append((batch, f"engine torch.compile, float32, no grad (compile {compile_seconds:.0f} s)",
                         total / compiled, total / compiled / mujoco_rate))
        fused = native.NativeRollout(engine)
        configs = [(torch.float32, 1), (torch.float64, 1)]
        configs += [(torch.float32, args.threads)] if args.threads > 1 else []
        for dtype, threads in configs:
            sn, an, cn = (x.to(dtype) for x in (s, a, c))
            start = time.perf_counter()
            fused.rollout(sn, an, cn[:, :2], robot.dt)                         # compiles on first use
            build_seconds = time.perf_counter() - start
            seconds = time_call(lambda: fused.rollout(sn, an, cn, robot.dt, record_every=args.steps,
                                                      threads=threads), 3)
            rows.append((batch, f"engine native C kernel, {str(dtype)[6:]}, {threads} thread"
                                f"{'s' if threads > 1 else ''} (first call {build_seconds:.1f} s)",
                         total / seconds, total / seconds / mujoco_rate))
        if not args.skip_backward:
            params = PhysicalParameters(robot, dtype=torch.float32)
            trainable = TensegrityEngine(robot, params)

            def forward_backward():
                pv = trainable.param_values(torch.float32, "cpu")
                out, _ = trainable.rollout(s, a, c, robot.dt, params=pv, record_every=args.checkpoint_every,
                                           checkpoint_every=args.checkpoint_every)
                out[..., :3].square().mean().backward()

            seconds = time_call(forward_backward)
            rows.append((batch, f"engine eager, float32, forward+backward (BPTT, checkpoint every "
                                f"{args.checkpoint_every})", total / seconds, total / seconds / mujoco_rate))

    print(f"\n{'batch':>6}  {'steps/s':>12}  {'x MuJoCo':>9}  what")
    for batch, what, rate, ratio in rows:
        print(f"{batch:>6}  {rate:>12,.0f}  {ratio:>9.2f}  {what}")
    print("\ntargets: engine >= 1x MuJoCo at batch 40 and >= 3x at batch 1000 (no grad)")


if __name__ == "__main__":
    main()
