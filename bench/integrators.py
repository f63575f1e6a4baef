"""How far MuJoCo's integrators at the robot's step are from the continuous-time robot.

    python bench/integrators.py [--robot superball] [--truth twin,zoo/soft_slow,... | zoo]
                                [--episodes 8] [--seed 0]

A real robot has no integrator: the closest thing to it is the same model stepped ten times
finer with RK4. For each ground truth (its values and realisation: contacts, actuation,
slack damping, end-heavy rods), the same random episodes are rolled out by MuJoCo with
Euler (the engine's semi_implicit), implicitfast and RK4 at the robot's step, and by RK4 at a
tenth of it; printed: the mean rod-centre distance from the fine run 0.1, 0.3 and 1 s in,
hanging (rod 0 welded, random commands and pushes) and rolling (launched on the floor,
random commands), or "diverged", and the damping step c dt / m (the largest cable damping
times the step over the lightest rod's mass; a cable's end moved sideways sees a quarter of
a uniform rod's mass, so the cables' own ratio is several times larger: implicit damping
adds inertia c dt along each cable). Rolling is chaotic: at 1 s the distances mix the
step's error with its growth. A few tenths of a millimetre are not the mechanical step's:
RK4 at the step is no closer than Euler there (the motors' command filter, stepped with the
rest, is discretised too).
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from zoo import machine  # noqa: E402  (bench/zoo.py prints the machine the same way)

from tensegrity_engine.groundtruth.environments import (NONCONTACT_FIXED_ROD, contact_twin,  # noqa: E402
                                                        noncontact_twin, sample_contact_episode,
                                                        sample_noncontact_episode)
from tensegrity_engine.groundtruth.mujoco_twin import GroundTruthDiverged  # noqa: E402
from tensegrity_engine.groundtruth.realisation import INTEGRATORS  # noqa: E402
from tensegrity_engine.groundtruth.zoo import ground_truth, zoo_names  # noqa: E402
from tensegrity_engine.physics.config import load_robot  # noqa: E402

FINE = 10                 # the continuous-time stand-in: RK4 at a tenth of the step
HORIZONS = (0.1, 0.3, 1.0)


def episodes(zr, regime: str, count: int, steps: int, seed: int):
    """``count`` episodes of ``steps`` steps of the robot ``zr`` (its realisation's rest or
    hanging pose), stacked: state0, act0, commands[, wrenches]."""
    rng = np.random.default_rng(seed)
    if regime == "hanging":
        eps = [sample_noncontact_episode(zr.truth, rng, steps, realisation=zr.realisation) for _ in range(count)]
    else:
        eps = [sample_contact_episode(zr.truth, rng, steps, randomize_commands=True, realisation=zr.realisation)
               for _ in range(count)]
    return [np.stack([e[i] for e in eps]) for i in range(len(eps[0]))]


def rod_centres(zr, regime: str, data, integrator: str, sub: int) -> np.ndarray:
    """[B, S, R, 3] rod centres of ``data`` rolled out with ``integrator`` at step dt / sub,
    recorded at the robot's step."""
    robot = zr.truth.replace(dt=zr.truth.dt / sub)
    real = dataclasses.replace(zr.realisation, integrator=integrator)
    make = noncontact_twin if regime == "hanging" else contact_twin
    state0, act0, commands = data[:3]
    wrench = np.repeat(data[3], sub, axis=1) if len(data) > 3 else None
    with make(robot, nthread=1, realisation=real) as twin:
        states, _ = twin.rollout(state0, act0, np.repeat(commands, sub, axis=1), wrench, record_every=sub)
    return states[..., :3]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--robot", default="superball")
    ap.add_argument("--truth", default="twin,zoo", help="comma-separated: twin, twin/<name>, zoo/<name>, or 'zoo'")
    ap.add_argument("--episodes", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    base = load_robot(args.robot)
    specs = []
    for s in args.truth.split(","):
        specs += [f"zoo/{n}" for n in zoo_names()] if s == "zoo" else [s]
    print(f"machine: {machine()}")
    print(f"MuJoCo integrators at the step against RK4 at 1/{FINE} of it, {args.robot}, {args.episodes} episodes "
          f"each: mean rod-centre distance (mm) {' / '.join(f'{t:g}' for t in HORIZONS)} s in")
    steps = int(round(max(HORIZONS) / base.dt))
    for spec in specs:
        zr = ground_truth(spec, base)
        t = zr.truth
        ratio = float(np.max(t.cable_damping) * t.dt / np.min(t.rod_mass))
        print(f"\n{spec}: its own integrator {zr.realisation.integrator}, c dt / m = {ratio:.2f}")
        for regime in ("hanging", "rolling"):
            start = time.perf_counter()
            data = episodes(zr, regime, args.episodes, steps, args.seed)
            try:
                fine = rod_centres(zr, regime, data, "RK4", FINE)
            except GroundTruthDiverged:
                print(f"  {regime:8s} RK4 at 1/{FINE} of the step diverged: no reference")
                continue
            # the welded rod never moves: it is left out of the mean
            moving = [r for r in range(t.num_rods) if regime == "rolling" or r != NONCONTACT_FIXED_ROD]
            cells = []
            for integrator in INTEGRATORS:
                own = "*" if integrator == zr.realisation.integrator else ""
                try:
                    x = rod_centres(zr, regime, data, integrator, 1)
                except GroundTruthDiverged:
                    cells.append(f"{integrator}{own} diverged")
                    continue
                err = [float(np.linalg.norm(x[:, int(round(h / t.dt)) - 1, moving]
                                            - fine[:, int(round(h / t.dt)) - 1, moving], axis=-1).mean()) * 1e3
                       for h in HORIZONS]
                cells.append(f"{integrator}{own} {' / '.join(f'{e:.2f}' for e in err)}")
            print(f"  {regime:8s} " + ";  ".join(cells) + f"  ({time.perf_counter() - start:.0f} s)")
    print("\n* the robot's own integrator")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
