"""MPPI's temperature, side by side: a fixed lambda in cost units against one chosen per
iteration for a target effective sample size (`PlannerConfig.target_ess`).

    python bench/mppi_temperature.py [--robots superball,three_bar,four_bar] [--zoo soft_slow]
                                     [--variants T0.05,E0.1,E0.2] [--tasks roll,reach_stop,waypoints]
                                     [--seeds 2] [--soft-law]

``T<lambda>``: the fixed temperature; ``E<share>``: lambda per iteration for an ESS of that
share of the samples. Every variant plans with the package's MPPI (5 iterations x 40
samples, 1 s horizon, native kernel, no time budget: iterations are not cut) on the
config's values (``nominal``) and the robot's true values, and the plan is executed on the
zoo robot in MuJoCo (`bench/zoo_control.run_task`). With ``--soft-law`` a robot whose YAML
has the penalty law is also planned on under the soft law (what the online identifier
adopts for it by default). Tasks: ``roll`` (10 s towards a goal 30 m away at 1 m/s: the
distance made along x), and `bench/zoo_control.py`'s ``reach_stop`` and ``waypoints``
(success rate, time to success). Also printed: each run's median effective sample size of
the first iteration (of 40) and mean plan time (one core, load-dependent). Never asserts.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from zoo import machine, true_model  # noqa: E402
from zoo_control import TASKS, mean_time, run_task  # noqa: E402

from tensegrity_engine import control as mpc  # noqa: E402
from tensegrity_engine.groundtruth.zoo import zoo_robot  # noqa: E402
from tensegrity_engine.identification.online_structure import structure_robot  # noqa: E402
from tensegrity_engine.physics.config import load_robot  # noqa: E402
from tensegrity_engine.physics.params import PhysicalParameters  # noqa: E402

ROLL = {"waypoints": [(30.0, 0.0)], "duration": 10.0, "stop": False, "approach_time": None}


def variant_config(label: str) -> mpc.PlannerConfig:
    """``T0.05`` -> a fixed temperature 0.05; ``E0.2`` -> target_ess 0.2."""
    kind, value = label[:1], float(label[1:])
    if kind == "T":
        return mpc.PlannerConfig(temperature=value, target_ess=0.0)
    if kind == "E":
        return mpc.PlannerConfig(target_ess=value)
    raise SystemExit(f"a variant is T<lambda> or E<share>, not {label!r}")


def under_soft_law(p: PhysicalParameters) -> PhysicalParameters:
    """``p``'s values on its robot under the soft ground law (its solref, solimp, friction):
    the robot the online identifier's ``soft_contact`` option builds."""
    robot = structure_robot(p.robot, ("soft_contact",))
    keep = PhysicalParameters(robot).as_dict()
    return PhysicalParameters(robot, values={k: v for k, v in p.as_dict().items() if k in keep})


def models(z, soft_law: bool) -> dict:
    out = {"nominal": PhysicalParameters(z.nominal), "true values": true_model(z)}
    if soft_law and z.nominal.contact.law != "soft":
        out.update({f"{k} (soft law)": under_soft_law(v) for k, v in list(out.items())})
    return out


def summary(runs, task: str) -> str:
    ess = np.median([r["first_iteration_ess"] for r in runs])
    plan = 1e3 * np.mean([r["plan_time"] for r in runs])
    if task == "roll":
        made = [r["progress_x"] for r in runs]
        head = f"{np.mean(made):5.2f} m ({', '.join(f'{m:.2f}' for m in made)})"
    else:
        rate = 100 * np.mean([r["success"] for r in runs])
        head = f"{rate:4.0f} % in {mean_time(runs):4.1f} s"
    return f"{head}, ESS {ess:4.1f}, plan {plan:4.0f} ms"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--robots", default="superball,three_bar,four_bar")
    ap.add_argument("--zoo", default="soft_slow", help="zoo robots (comma list) each robot is played as")
    ap.add_argument("--variants", default="T0.05,E0.1,E0.2")
    ap.add_argument("--tasks", default="roll,reach_stop,waypoints")
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--soft-law", action="store_true")
    args = ap.parse_args(argv)
    tasks = dict(TASKS, roll=ROLL)
    variants = {v: variant_config(v) for v in args.variants.split(",")}
    print(f"machine: {machine()}", flush=True)
    totals = {v: {t: [] for t in args.tasks.split(",")} for v in variants}
    t0 = time.perf_counter()
    for robot_name in args.robots.split(","):
        base = load_robot(robot_name)
        for zname in args.zoo.split(","):
            z = zoo_robot(zname, base)
            print(f"\n== {robot_name} as {zname}: {z.description}", flush=True)
            for label, params in models(z, args.soft_law).items():
                for task in args.tasks.split(","):
                    for v, config in variants.items():
                        runs = [run_task(z, params, tasks[task], seed, config) for seed in range(args.seeds)]
                        totals[v][task] += runs
                        print(f"   {label:24s} {task:11s} {v:6s} {summary(runs, task)}", flush=True)
    print("\n== over every robot, model and seed")
    for v in variants:
        parts = []
        for task, runs in totals[v].items():
            if task == "roll":
                parts.append(f"roll {np.sum([r['progress_x'] for r in runs]):.1f} m in all")
            else:
                parts.append(f"{task} {sum(r['success'] for r in runs)}/{len(runs)}")
        print(f"   {v:6s} " + ", ".join(parts))
    print(f"\nTOTAL wall time {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
