"""Residual bench (issue 19): physics, physics + learned residual, and a purely learned model.

    python bench/residual.py [--from runs/bench_zoo_structure] [--robot three_bar] [--zoo all]

Runs on what `bench/zoo.py --structure --out DIR` recorded and identified (its data under
DIR/<robot>/<zoo name>/clean and its models under .../models): for every zoo robot and each
regime (hanging, rolling), a residual is trained on three quarters of the training
trajectories on top of the selected structure ("structure"), early-stopped on the last
quarter, and kept only if it predicts the validation trajectories better than the physics
alone (the gate, `residual_fit.judge_residual`: better at every horizon, and beyond noise
1 s ahead); the same network without physics (constant-velocity base) is the purely
learned model. Held-out test data: CoM error 0.1 / 0.5 / 1 s ahead (restarted every 0.5 s), the
chaos floor beside rolling. Targets (issue 19): physics + residual ahead of the purely
learned model on held-out data; rolling 1 s within 2x the chaos floor.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from zoo import chaos_floor, zoo_selection  # noqa: E402

from tensegrity_engine.groundtruth.zoo import zoo_robot
from tensegrity_engine.identification import dataset as ds
from tensegrity_engine.identification.residual_fit import fit_residual, judge_residual, residual_horizon_errors
from tensegrity_engine.physics.parameter_files import params_from_file
from tensegrity_engine.physics.params import PhysicalParameters

H = (0.1, 0.5, 1.0)


def _line(*a):
    print(*a, flush=True)


def _mm(metres: float) -> str:
    """A column of millimetres that stays a column for a model that ran away."""
    v = 1e3 * metres
    return f"{v:10.1f}" if abs(v) < 1e6 else f"{v:10.2e}"


def run(name: str, base, root: Path, args) -> dict:
    z = zoo_robot(name, base)
    models = {"nominal": PhysicalParameters(base)}
    for label in ("identified", "structure"):
        path = root / "models" / f"{label}.yaml"
        if path.exists():
            models[label] = params_from_file(base, path)
    physics = models.get("structure", models.get("identified"))
    out = {}
    for regime, env in (("hanging", "noncontact"), ("rolling", "contact")):
        split = {s: ds.load_split(root / "clean" / env, s, robot=base) for s in ("train", "val", "test")}
        t0 = time.perf_counter()
        # early stopping on the last quarter of the training trajectories, so the gate's
        # validation trajectories are data the network never chose itself on
        cut = max(1, len(split["train"]) // 4)
        fit_on, stop_on = split["train"][:-cut], split["train"][-cut:]
        fit = fit_residual(physics, fit_on, stop_on, seed=args.seed)
        pure = fit_residual(physics, fit_on, stop_on, use_physics=False, seed=args.seed)
        wall = time.perf_counter() - t0
        kept, why = judge_residual(physics, fit.model, split["val"], horizons=H)
        rows = {label: residual_horizon_errors(p, None, split["test"], H) for label, p in models.items()}
        rows["structure + residual"] = residual_horizon_errors(physics, fit.model, split["test"], H)
        rows["gated"] = rows["structure + residual"] if kept else rows["structure" if "structure" in models
                                                                       else "identified"]
        rows["purely learned"] = residual_horizon_errors(physics, pure.model, split["test"], H)
        res = {k: {h: float(np.mean(v[h])) for h in H} for k, v in rows.items()}
        if regime == "rolling":
            res["chaos floor"] = chaos_floor(z, split["test"], H)
        _line(f"   {regime}: residual one-period val loss {fit.val_start:.3g} -> {fit.val_loss:.3g}; on val "
              f"{why}: {'kept' if kept else 'refused by the gate'}; both networks trained in {wall:.0f} s")
        for label, r in res.items():
            _line(f"     {label:22s} " + "".join(_mm(r[h]) for h in H))
        out[regime] = res | {"kept": kept}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--from", dest="source", default="runs/bench_zoo_structure",
                    help="the --out directory of a `bench/zoo.py --structure` run")
    ap.add_argument("--robot", default="three_bar")
    ap.add_argument("--zoo", default="all")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    base, names = zoo_selection(args.robot, args.zoo, args.threads)
    _line(f"robot {base.name}; data and models from {args.source}; CoM error (mm) 0.1 / 0.5 / 1 s ahead, held-out")
    results = {}
    for name in names:
        root = Path(args.source) / base.name / name
        if not (root / "models").exists():
            _line(f"\n== {name}: no models under {root} (run bench/zoo.py --structure --out {args.source})")
            continue
        _line(f"\n== {name}")
        results[name] = run(name, base, root, args)
    if not results:
        return 1
    _line("\n== summary (1 s ahead, mm)")
    for regime in ("hanging", "rolling"):
        ahead = [r[regime]["gated"][1.0] < r[regime]["purely learned"][1.0] for r in results.values()]
        _line(f"   {regime}: " + "; ".join(
            f"{n} structure {1e3 * r[regime]['structure'][1.0]:.1f}, +residual "
            f"{1e3 * r[regime]['structure + residual'][1.0]:.1f} ({'kept' if r[regime]['kept'] else 'refused'}), "
            f"learned {1e3 * r[regime]['purely learned'][1.0]:.1f}"
            + (f", floor {1e3 * r[regime]['chaos floor'][1.0]:.1f}" if regime == "rolling" else "")
            for n, r in results.items()))
        _line(f"   {regime}: physics (+ gated residual) ahead of the purely learned model on "
              f"{sum(ahead)} of {len(ahead)} robots  TARGET all: {'MET' if all(ahead) else 'NOT MET'}")
    floor = [r["rolling"]["gated"][1.0] / r["rolling"]["chaos floor"][1.0] for r in results.values()]
    _line("   rolling 1 s / chaos floor per robot: " + ", ".join(f"{x:.2f}" for x in floor)
          + f"  TARGET <= 2: {'MET' if max(floor) <= 2 else 'NOT MET'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
