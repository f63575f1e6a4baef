"""How much of a ground-truth robot's motion is MuJoCo's step, not its physics.

    python bench/discretisation.py [--robot superball] [--truth zoo | twin/as_built,zoo/stiff_light]
                                   [--seconds 10] [--finer 2,10,40] [--reference 80]

A zoo robot stands for a robot someone built: continuous physics. MuJoCo steps it at the
robot's ``dt`` (divided by its realisation's ``substeps``) with the realisation's integrator, and
where the cables are stiff or heavily damped for the rods' mass that step is not converged:
the played motion is then partly the integrator's error, which no model of the physics (and
no identified value) can reproduce, only a model with the same step. This prints, per robot,
the CoM gap 1 s ahead between the robot as played and the same robot stepped at dt /
``--reference`` (the converged motion), restarted from the played run's state every second
of a ``--seconds`` multisine excitation on the floor (the online bench's) and given the same
commands; the same for the steps dt / ``--finer`` (convergence); and, beside them,
the chaos floor (the robot as played, restarted with every velocity 1 % larger: what any
model's error 1 s ahead is judged against, `bench/online.py`). A played motion more than a
few chaos floors from its converged one is a discretisation artefact at that step.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from zoo import kicked_com_gaps, machine  # noqa: E402

from tensegrity_engine.control.excitation import ExcitationPolicy  # noqa: E402
from tensegrity_engine.groundtruth.environments import rest_pose  # noqa: E402
from tensegrity_engine.groundtruth.mujoco_twin import MujocoTwin  # noqa: E402
from tensegrity_engine.groundtruth.zoo import ground_truth, twin_names, zoo_names  # noqa: E402
from tensegrity_engine.physics.config import load_robot  # noqa: E402

CONTROL_DT = 0.1          # s, as bench/online.py's excitation
HORIZON = 1.0             # s ahead


def com(states: np.ndarray, rod_mass: np.ndarray) -> np.ndarray:
    w = rod_mass / rod_mass.sum()
    return (states[..., 0:3] * w[:, None]).sum(-2)


def gaps(z, finer, reference: int, seconds: float, seed: int = 0) -> dict:
    """Mean CoM gap (m) 1 s ahead: {factor: stepped at dt / ``factor`` vs at dt /
    ``reference``} with factor 1 the robot as played (at dt / its substeps), and "chaos" its 1 %
    velocity kick."""
    truth, real = z.truth, z.realisation
    excite = ExcitationPolicy(z.nominal, seed=seed, kind="multisine", amplitude=0.8, control_dt=CONTROL_DT)
    n_cmd = int(round((seconds + HORIZON) / CONTROL_DT)) + 1
    steps = np.repeat(excite.command_at(np.arange(n_cmd) * CONTROL_DT), int(round(CONTROL_DT / truth.dt)), 0)
    rs, act = rest_pose(truth, realisation=real)
    span = int(round(HORIZON / truth.dt))
    with z.twin(floor=True, nthread=1) as played:
        states, acts = played.rollout(rs, act, steps)
        starts = np.arange(span, int(round(seconds / truth.dt)) + 1, span)
        s0, a0 = states[0, starts - 1], acts[0, starts - 1]
        cmd = np.stack([steps[k:k + span] for k in starts])
        out = {"chaos": float(kicked_com_gaps(played, s0, a0, cmd, truth.rod_mass, [span]).mean())}
        ends = {1: played.rollout(s0, a0, cmd)[0][:, -1]}
    for factor in sorted(set(finer) | {reference}):
        fine = dataclasses.replace(real, substeps=int(factor))
        with MujocoTwin(truth, floor=True, nthread=1, realisation=fine) as twin:
            ends[factor] = twin.rollout(s0, a0, cmd)[0][:, -1]
    ref = com(ends[reference], truth.rod_mass)
    for factor, end in ends.items():
        if factor != reference:
            out[factor] = float(np.linalg.norm(com(end, truth.rod_mass) - ref, axis=-1).mean())
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--robot", default="superball")
    ap.add_argument("--truth", default="zoo", help="comma-separated: twin/<name>, zoo/<name>, or 'zoo' (all)")
    ap.add_argument("--seconds", type=float, default=10.0, help="excitation run; a restart every second of it")
    ap.add_argument("--finer", default="2,10,40", help="comma-separated divisors of dt: the convergence columns")
    ap.add_argument("--reference", type=int, default=80, help="the converged motion: stepped at dt / this")
    args = ap.parse_args(argv)
    finer = [int(f) for f in args.finer.split(",") if f]
    if any(f < 2 or f >= args.reference for f in finer) or args.reference < 2:
        ap.error("--finer factors must be >= 2 and below --reference")
    base = load_robot(args.robot)
    specs = ([f"zoo/{n}" for n in zoo_names()] + [f"twin/{n}" for n in twin_names()]
             if args.truth == "zoo" else args.truth.split(","))
    print(f"machine: {machine()}")
    print(f"CoM gap 1 s ahead (mm), mean over restarts every second of {args.seconds:g} s of multisine on the "
          f"floor: the robot as played (dt / its substeps, its integrator) and at dt / {', '.join(map(str, finer))}, "
          f"each against dt / {args.reference}; the chaos floor beside")
    header = ["robot", "played step", "as played"] + [f"dt / {f}" for f in finer] + ["chaos floor", "as played / chaos"]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for spec in specs:
        z = ground_truth(spec, base)
        t0 = time.perf_counter()
        g = gaps(z, finer, args.reference, args.seconds)
        step = z.truth.dt / z.realisation.substeps
        cells = [spec, f"{step * 1e3:g} ms {z.realisation.integrator}", f"{g[1] * 1e3:.1f}"]
        cells += [f"{g[f] * 1e3:.1f}" for f in finer] + [f"{g['chaos'] * 1e3:.1f}", f"{g[1] / g['chaos']:.1f}"]
        print("| " + " | ".join(cells) + " |", f"({time.perf_counter() - t0:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
