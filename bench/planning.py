"""Planning speed (issue 13): one MPPI control step at the paper's sizes (5 iterations x 40
samples x 1 s horizon at 1 ms) on the native kernel, per instruction set and thread count,
side by side in one run.

    python bench/planning.py [--robot superball] [--steps 20] [--threads 1 2]

Each configuration plans ``--steps`` consecutive control steps (warm-started, as the
controller does) from states of SUPERball rolling on the floor, after one warm-up step
(which builds the kernel). The kernel is compiled for this CPU (``native``) and, on a CPU
that has AVX2, for ``x86-64-v3`` (AVX2 + FMA, no AVX-512): the code an AVX2-only machine
runs, timed on this one. Prints median and 90th percentile seconds per control step and the
ratio to the 0.05 s target; never asserts.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from zoo import machine  # noqa: E402

from tensegrity_engine.control.controller import MPPIController  # noqa: E402
from tensegrity_engine.groundtruth import environments  # noqa: E402
from tensegrity_engine.physics import native  # noqa: E402
from tensegrity_engine.physics.config import load_robot  # noqa: E402

TARGET = 0.05          # s per control step (issue 13)


def states(robot, count: int, seed: int = 0):
    """Rolling states: the rest pose launched at 0.5-1.5 m/s in random directions."""
    rng = np.random.default_rng(seed)
    rest, act = environments.rest_pose(robot)
    out = []
    for _ in range(count):
        heading = rng.uniform(0, 2 * np.pi)
        v = rng.uniform(0.5, 1.5) * np.array([np.cos(heading), np.sin(heading), 0.0])
        out.append(environments.rolling_velocity(robot, rest, v))
    return out, act


def plan_seconds(controller, starts, act) -> np.ndarray:
    """Seconds per control step over ``starts[1:]``, after one warm-up plan (which builds /
    loads the kernel or compiles the torch step)."""
    controller.plan(starts[0], act)
    seconds = []
    for s in starts[1:]:
        t0 = time.perf_counter()
        controller.plan(s, act)
        seconds.append(time.perf_counter() - t0)
    return np.array(seconds)


def time_steps(robot, threads: int, steps: int) -> np.ndarray:
    starts, act = states(robot, steps + 1)
    return plan_seconds(MPPIController(robot, threads=threads), starts, act)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--robot", default="superball")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    robot = load_robot(args.robot)
    print(f"machine: {machine()}", flush=True)
    print(f"MPPI 5 it x 40 samples x 1 s at {robot.dt * 1e3:g} ms on {robot.name}, {args.steps} control steps "
          f"each; target <= {TARGET} s per step", flush=True)
    marches = ["native"]
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    if " avx2" in flags:
        marches.append("x86-64-v3")
    print(f"{'kernel':>22s} {'threads':>7s} {'median s':>9s} {'p90 s':>7s} {'x target':>8s}")
    for march in marches:
        os.environ[native.MARCH_ENV] = march
        isa = native.kernel_isa()
        for threads in args.threads:
            t = time_steps(robot, threads, args.steps)
            med, p90 = float(np.median(t)), float(np.percentile(t, 90))
            print(f"{march + ' (' + isa + ')':>22s} {threads:7d} {med:9.4f} {p90:7.4f} {med / TARGET:8.2f}",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
