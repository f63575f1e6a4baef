"""Gentle gaits bench (issue 12): how much speed it costs to keep the robot on the floor.

    python bench/gait.py [--robot superball] [--weights 0,1,3,10,30] [--steps 100] [--seed 0]

MPPI at the paper's sizes (5 x 40 x 1 s, native kernel) on the config's engine, executed
on MuJoCo (lockstep: every plan gets all its iterations), rolling along +x at 1 m/s from
the task start, for each weight of `LocomotionCost`'s airborne term (cost per metre the
lowest capsule point is above 1 cm, averaged over the knots). Printed per weight: mean vx,
the fraction of time the robot is airborne (lowest point > 1 cm, 10 ms samples), its
longest flight, and the peak floor contact force (sum of MuJoCo's normal contact forces
with the floor, 1 ms samples): the trade-off curve.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import mujoco
import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from zoo import machine  # noqa: E402

from tensegrity_engine.control import LocomotionCost, MPPIController, PlannerConfig, task_start  # noqa: E402
from tensegrity_engine.groundtruth.environments import contact_twin  # noqa: E402
from tensegrity_engine.physics.config import load_robot  # noqa: E402


def floor_force(twin) -> float:
    """Sum of the normal forces of the contacts that involve the floor (N)."""
    m, d = twin.model, twin.data
    out = np.zeros(6)
    total = 0.0
    for i in range(d.ncon):
        c = d.contact[i]
        if m.geom_bodyid[c.geom1] == 0 or m.geom_bodyid[c.geom2] == 0:    # the world body: the floor
            mujoco.mj_contactForce(m, d, i, out)
            total += abs(out[0])
    return total


def run(robot, weight: float, steps: int, seed: int) -> dict:
    cost = LocomotionCost(robot, target_velocity=(1.0, 0.0), w_airborne=weight)
    ctrl = MPPIController(robot, config=PlannerConfig(seed=seed), cost=cost)
    s0, a0 = task_start(robot)
    twin = contact_twin(robot, nthread=1)
    twin.reset(s0, a0)
    sampled, force, xs = [], [], []
    t0 = time.perf_counter()
    for _ in range(steps):
        rs, act = twin.get_state()
        u = ctrl.plan(rs, act)
        for k in range(100):
            twin.step(u, nsteps=1)
            force.append(floor_force(twin))
            if k % 10 == 9:
                sampled.append(twin.get_state()[0])
        xs.append(float((sampled[-1][:, 0] * robot.rod_mass).sum() / robot.rod_mass.sum()))
    wall = time.perf_counter() - t0
    twin.close()
    lowest = cost.lowest_point(torch.as_tensor(np.stack(sampled))).numpy()
    air = lowest > 0.01
    flights = np.diff(np.flatnonzero(np.diff(np.r_[0, air.astype(int), 0])))[::2] if air.any() else [0]
    com_x0 = float((s0[:, 0] * robot.rod_mass).sum() / robot.rod_mass.sum())
    return {"vx": (xs[-1] - com_x0) / (steps * 0.1), "airborne": float(air.mean()),
            "longest_flight_s": 0.01 * float(max(flights)), "peak_force": float(max(force)),
            "p99_force": float(np.percentile(force, 99)), "wall": wall}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--robot", default="superball")
    ap.add_argument("--weights", default="0,1,3,10,30")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    robot = load_robot(args.robot)
    print(machine(), flush=True)
    weight_n = float(robot.rod_mass.sum() * 9.81)
    print(f"{robot.name}: weight {weight_n:.0f} N; {args.steps * 0.1:g} s rolling per run, airborne = lowest "
          f"point > 1 cm (sampled every 10 ms)", flush=True)
    print(f"{'w_airborne':>10s} {'vx m/s':>8s} {'airborne':>9s} {'longest':>8s} {'peak N':>8s} {'p99 N':>8s} "
          f"{'peak/weight':>11s} {'wall s':>7s}", flush=True)
    for w in (float(x) for x in args.weights.split(",")):
        r = run(robot, w, args.steps, args.seed)
        print(f"{w:10g} {r['vx']:8.3f} {100 * r['airborne']:8.1f}% {r['longest_flight_s']:7.1f}s "
              f"{r['peak_force']:8.0f} {r['p99_force']:8.0f} {r['peak_force'] / weight_n:11.1f} {r['wall']:7.0f}",
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
