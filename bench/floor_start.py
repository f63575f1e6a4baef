"""Does pose-only identification on the floor reach the truth, and from where? (issue 11)

    python bench/floor_start.py [--truth twin] [--iters 30] [--out runs/bench_floor_start]

MuJoCo's robot (``--truth``: the twin or zoo/<name>) rolls on the floor under random
commands (8 training and 4 validation trajectories of 5 s, 10 Hz). The cables, the motor
and the contact (K, c, tau, contact stiffness and damping, sliding friction) are fitted
four ways, Levenberg-Marquardt at the engine's 1 ms step:

* full state (velocities measured), from the config's values;
* pose only, the windowed stage alone, from the config's values;
* pose only, finite-difference stage then the windowed stage (the online schedule), from
  a start far off (K -30 %, c +50 %, tau x2, contact stiffness /2, damping x2,
  friction -40 %);
* pose only, the windowed stage alone, from that start.

Printed: each fit's values against the truth and the validation CoM error 0.1 / 0.5 / 1 s
ahead (the truth's own beside it). On the twin the config is the truth, so the first two
rows say whether the objective's minimum is the truth, the last two whether the solver
gets there.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

from tensegrity_engine import identification as idf
from tensegrity_engine.groundtruth.zoo import ground_truth
from tensegrity_engine.identification import dataset as ds
from tensegrity_engine.identification.evaluation import horizon_errors
from tensegrity_engine.identification.config import resolve_learn
from tensegrity_engine.physics.config import load_robot
from tensegrity_engine.physics.params import PhysicalParameters

sys.path.insert(0, str(Path(__file__).resolve().parent))
from zoo import machine, true_model  # noqa: E402

LEARN = ("cable_stiffness", "cable_damping", "actuator_time_constant", "contact")    # the law's contact values
# far start: factors on the config's values (the contact's normal pair under either law)
FAR = {"cable_stiffness": 0.7, "cable_damping": 1.5, "actuator_time_constant": 2.0, "contact_stiffness": 0.5,
       "contact_damping": 2.0, "contact_time_constant": 2.0, "contact_damping_ratio": 0.5, "friction_sliding": 0.6}


def fit(robot, data, *, pose: bool, windows_only: bool, far: bool, iters: int):
    initial = PhysicalParameters(robot)
    learnt = resolve_learn(LEARN, robot.contact.law)
    for name, factor in (FAR.items() if far else ()):
        if name in learnt:
            initial.set_value(name, np.asarray(initial.as_dict()[name]) * factor)
    cfg = idf.IdentificationConfig(learn=LEARN, schedule="online" if pose else "fine_only", init="given", seed=0,
                                   lm_tuples=128, lm_max_iters=iters, max_seconds=600)
    tr = idf.ProgressiveTrainer(robot, cfg, initial=initial, log=lambda m: None)
    use = {k: [t.without_velocity() for t in v] if pose else v for k, v in data.items()}
    tr.set_data(ds.tuples_from(use["train"]), ds.tuples_from(use["val"]))
    if windows_only:
        tr.schedule.pose_stage = "window"
    t0 = time.perf_counter()
    tr.run()
    return tr.parameters, time.perf_counter() - t0, tr.schedule.stop_reason


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--robot", default="superball")
    ap.add_argument("--truth", default="twin")
    ap.add_argument("--iters", type=int, default=30, help="Levenberg-Marquardt iterations per stage")
    ap.add_argument("--out", default="runs/bench_floor_start")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    print(f"machine: {machine()}", flush=True)
    z = ground_truth(args.truth, load_robot(args.robot))
    root = Path(args.out) / args.truth.replace("/", "_")
    if not (root / "contact" / "val").exists():
        ds.generate_dataset(z.nominal, "contact", root, counts={"train": 8, "val": 4}, seed=777, dense=False,
                            truth=z, contact_commands="random")
    data = {k: ds.load_split(root / "contact", k, robot=z.nominal) for k in ("train", "val")}
    truth = z.true_values()
    rows = [("truth (the config's values with the robot's known ones)", None)]
    for label, kw in (("full state, from the config", dict(pose=False, windows_only=False, far=False)),
                      ("pose only, windows alone, from the config", dict(pose=True, windows_only=True, far=False)),
                      ("pose only, finite differences then windows, far start", dict(pose=True, windows_only=False, far=True)),
                      ("pose only, windows alone, far start", dict(pose=True, windows_only=True, far=True))):
        rows.append((label, fit(z.nominal, data, iters=args.iters, **kw)))
    names = [n for n in resolve_learn(LEARN, z.nominal.contact.law) if n in truth]
    print(f"\n{args.truth}: values relative to the truth; validation CoM error 0.1 / 0.5 / 1 s ahead (mm)")
    for label, result in rows:
        params = true_model(z) if result is None else result[0]
        values = params.as_dict()
        errs = "  ".join(f"{n.split('_')[-1][:5]} {100 * (np.mean(values[n]) / np.mean(truth[n]) - 1):+6.1f}%"
                         for n in names)
        e = horizon_errors(params, data["val"], (0.1, 0.5, 1.0))
        com = " / ".join(f"{1e3 * np.mean(e[h]):.1f}" for h in (0.1, 0.5, 1.0))
        extra = "" if result is None else f"  ({result[1]:.0f} s, {result[2] or 'budget'})"
        print(f"  {label:56s} {errs}  CoM {com}{extra}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
