"""Zoo bench (issue 10): identification on robots that are not the engine.

    python bench/zoo.py [--robot three_bar] [--zoo soft_slow,payload | all] [--budget 120]
                        [--pose-only] [--start config|random] [--out runs/bench_zoo] [--threads 1]

For every zoo robot (config/zoo.yaml applied to --robot): MuJoCo data recorded at 10 Hz
(hanging: random commands and pushes; rolling: launched on the floor), identification with
this package's trainer (non-contact parameters from hanging data, then contact parameters
from rolling data; ``--start config``, the default: Levenberg-Marquardt from the config's
values, the user's prior; ``--start random``: Algorithm 1 from random starts), then on
held-out data of the same robot:

* identified vs true parameter values (cable stiffness, damping, rod mass, tau, friction);
* CoM error of the nominal (config) model, the identified model and a model with the robot's
  true values, k seconds ahead (restarted from the recorded state every 0.5 s) and 5 s open
  loop; for rolling, next to the chaos floor: the robot itself restarted with every
  velocity 1 % off.

``--peer`` also fits the robot's MuJoCo model with ``mujoco.sysid`` on the same data, as a
careful user would (`bench/peer_sysid.py`: 1 s windows from recorded states, rod-end
residuals, known pushes, each integrator in turn), and prints it beside this package:
identified vs true, held-out error, wall time on the same cores (issue 18's targets). It
needs ``pip install -r bench/requirements-peer.txt`` and stops with that message without it.

``--structure`` also selects the model's structure from the hanging data
(`identification.structure.select_structure`: integrator, slack damping, end-heavy
inertia, winch speed, per-cable and per-rod values, each kept only if it predicts the
validation trajectories better beyond noise), fits contact on top of it under the penalty
and the soft (MuJoCo's) contact law, each alone and with a mass per rod (the hung rod's
mass is not in hanging data) or slack-cable damping if selection left them out, and keeps
another law or an option only if it predicts the
rolling validation data better beyond noise, then under the soft law the other condims
(3, 4, 6) with what it kept (`select_contact_law`), and prints it as
"structure" beside "identified" (every non-contact value learnt, semi-implicit), with the
structure each robot revealed next to its true realisation (issue 19). The all-values fit
is a structure too: "structure" is whichever of the two predicts the validation data of
both regimes better (1 s ahead, relative to the nominal model, mean over the regimes).

``--pose-only`` identifies a second time from the robot's mocap recording (noise, latency,
jitter, dropped frames, no velocities) and evaluates it on the same clean held-out data.
Targets (issue 10; printed, never asserted): median error of K, c, m, tau <= 5 % with
velocities (10 % pose-only); held-out 5 s hanging CoM error <= 1/2 of nominal's.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import peer_sysid  # noqa: E402

from tensegrity_engine import identification as idf
from tensegrity_engine.groundtruth import environments as envs
from tensegrity_engine.groundtruth.zoo import zoo_names, zoo_robot
from tensegrity_engine.identification import dataset as ds
from tensegrity_engine.identification.acceptance import judge, select
from tensegrity_engine.identification.evaluation import evaluate, horizon_errors
from tensegrity_engine.identification.structure import refit_noncontact, select_contact_law, select_structure
from tensegrity_engine.physics.config import load_robot
from tensegrity_engine.physics.parameter_files import export_yaml
from tensegrity_engine.physics.params import PhysicalParameters
from tensegrity_engine.physics.state import LIN_VEL, ANG_VEL

REPORTED = ("cable_stiffness", "cable_damping", "cable_slack_damping", "rod_mass", "rod_inertia_factor",
            "actuator_time_constant", "actuator_max_speed", "friction_sliding")
SHARES = ("cable_slack_damping",)     # in [0, 1]: errors in points of share, not relative
HANG_HORIZONS = (0.1, 1.0)
ROLL_HORIZONS = (0.1, 0.5, 1.0)
COUNTS = {"train": 8, "val": 2, "test": 6}


def _line(*a):
    print(*a, flush=True)


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    isa = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2"
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return f"{cpu}, {isa}, {torch.get_num_threads()} torch / C kernel thread(s), {gpu}"


def zoo_selection(robot: str, zoo: str, threads: int = 1):
    """(base robot config, zoo names) of a bench's --robot / --zoo ("all" or a comma list),
    torch on ``threads`` threads; prints the machine the figures are measured on."""
    torch.set_num_threads(threads)
    base = load_robot(robot)
    names = zoo_names() if zoo == "all" else zoo.split(",")
    _line(f"machine: {machine()}")
    return base, names


def record(z, env: str, root: Path, seed: int, pose_only: bool) -> dict:
    """Clean data (with velocities) for every split, and the mocap's train/val recording."""
    out = {}
    if not (root / "clean" / env / "test").exists():
        ds.generate_dataset(z.nominal, env, root / "clean", counts=COUNTS, seed=seed, dense=False, truth=z)
    out["clean"] = {s: ds.load_split(root / "clean" / env, s, robot=z.nominal) for s in COUNTS}
    if pose_only:
        counts = {k: v for k, v in COUNTS.items() if k != "test"}
        if not (root / "mocap" / env / "val").exists():
            ds.generate_dataset(z.nominal, env, root / "mocap", counts=counts, seed=seed + 1, dense=False,
                                truth=z, sensing=z.sensing)
        out["mocap"] = {s: ds.load_split(root / "mocap" / env, s, robot=z.nominal) for s in counts}
    return out


def identify(robot, data, cfg, initial=None):
    """Train, then gate: the result replaces ``initial`` (or nominal) only if it is stable and
    predicts the validation trajectories 1 s ahead no worse (`acceptance.judge`)."""
    tr = idf.ProgressiveTrainer(robot, cfg, initial=initial, log=lambda m: None)
    tr.set_data(ds.tuples_from(data["train"]), ds.tuples_from(data["val"]))
    t0 = time.perf_counter()
    tr.run()
    incumbent = initial if initial is not None else PhysicalParameters(robot)
    verdict = judge(tr.parameters, incumbent, data["val"])
    return (tr.parameters if verdict.accepted else incumbent), time.perf_counter() - t0, verdict


def true_model(z) -> PhysicalParameters:
    """The engine with the robot's true values (per cable / rod), on the nominal geometry
    but the true capsule radii. Values the engine has no counterpart for stay nominal."""
    robot = z.nominal.replace(rod_radius=z.truth.rod_radius)
    return PhysicalParameters(robot, values=z.true_values(),
                              per_element=("cable_stiffness", "cable_damping", "rod_mass"))


def kicked_com_gaps(twin, s0: np.ndarray, act0: np.ndarray, cmd: np.ndarray, rod_mass: np.ndarray,
                    steps) -> np.ndarray:
    """[B, len(steps)] CoM gap after each of ``steps`` steps between the robot restarted at
    ``s0`` [B, R, 13] (``act0`` [B, A], commands ``cmd`` [B, S, A]) and itself restarted there
    with every velocity 1 % larger (the chaos floor's measure; the CoM weighted by
    ``rod_mass``)."""
    kicked = s0.copy()
    kicked[..., LIN_VEL] *= 1.01
    kicked[..., ANG_VEL] *= 1.01
    n = s0.shape[0]
    out, _ = twin.rollout(np.concatenate([s0, kicked]), np.concatenate([act0, act0]), np.concatenate([cmd, cmd]))
    w = rod_mass / rod_mass.sum()
    com = (out[:, [k - 1 for k in steps], :, 0:3] * w[:, None]).sum(-2)
    return np.linalg.norm(com[n:] - com[:n], axis=-1)


def chaos_floor(z, trajs, horizons) -> dict:
    """CoM gap between the robot and itself restarted with every velocity 1 % larger."""
    S = int(round(max(horizons) / z.truth.dt))
    steps = [int(round(h / z.truth.dt)) for h in horizons]
    gaps = []
    with z.twin(floor=True, nthread=1) as twin:
        for t in trajs:
            cmd = t.command_grid(t.t[0], S, z.truth.dt)
            gaps.append(kicked_com_gaps(twin, t.states()[:1], np.asarray(t.initial_act())[None], cmd[None],
                                        z.nominal.rod_mass, steps)[0])
    return {h: float(np.mean([g[i] for g in gaps])) for i, h in enumerate(horizons)}


def predictions(models: dict, test, horizons) -> dict:
    res = {}
    for name, p in models.items():
        he = horizon_errors(p, test, horizons)
        full = evaluate(p, test)
        res[name] = {**{h: float(np.mean(he[h])) for h in horizons},
                     5.0: float(np.mean(full["final_error"])),
                     "path": float(np.mean(full["path_length"]))}
    return res


def print_predictions(title, res, horizons, floor=None):
    cols = list(horizons) + [5.0]
    _line(f"    {title}: CoM error (mm) k s ahead, restarted every 0.5 s; 5 s open loop")
    _line("      model        " + "".join(f"{h:>9.1f}s" for h in cols) + "   path (m)")
    for name, r in res.items():
        _line(f"      {name:12s} " + "".join(f"{1e3 * r[h]:10.1f}" for h in cols) + f"   {r['path']:.2f}")
    if floor:
        _line(f"      {'chaos floor':12s} " + "".join(f"{1e3 * floor[h]:10.1f}" for h in cols)
              + "   (the robot itself, velocities 1 % off)")


def params_rows(z, identified: dict) -> dict:
    """Relative error of each reported value (mean over cables / rods) per identification."""
    truth = z.true_values()
    rows = {}
    for n in REPORTED:
        t = float(np.mean(truth[n]))
        nominal = float(np.mean(PhysicalParameters(z.nominal).as_dict()[n]))
        got = {k: float(np.mean(p.as_dict()[n])) for k, p in identified.items()}
        rows[n] = {"true": t, "nominal": nominal, **{k: v for k, v in got.items()},
                   **{f"{k}_err": abs(v - t) / (1.0 if n in SHARES else abs(t)) for k, v in got.items()}}
    return rows


def run_robot(name, base, args, out: Path) -> dict:
    z = zoo_robot(name, base)
    _line(f"\n== {name}: {z.description}")
    _line(f"   realisation {z.realisation.to_dict()}")
    root = out / name
    t0 = time.perf_counter()
    hang = record(z, "noncontact", root, args.seed, args.pose_only)
    roll = record(z, "contact", root, args.seed + 100, args.pose_only)
    _line(f"   data recorded in {time.perf_counter() - t0:.1f} s")
    cfg = dict(max_seconds=args.budget, epoch_tuples=args.epoch_tuples, batch_size=16, val_tuples=32,
               patience=2, max_stage_epochs=2, seed=args.seed, native_threads=args.threads)
    if args.start == "config":
        cfg.update(init="given", schedule="fine_only")
    identified, walls = {}, {}
    for kind in ["clean"] + (["mocap"] if args.pose_only else []):
        nc, w1, v1 = identify(z.nominal, hang[kind], idf.IdentificationConfig(**cfg))
        c, w2, v2 = identify(z.nominal, roll[kind], idf.IdentificationConfig(**cfg), initial=nc)
        label = "identified" if kind == "clean" else "pose-only"
        _line(f"   {label}: identified in {w1:.0f} s (hanging) + {w2:.0f} s (rolling)")
        _line(f"     hanging stage {v1}\n     rolling stage {v2}")
        # The model is used hanging and rolling: it must be no worse than nominal on both.
        nominal = PhysicalParameters(z.nominal)
        picked, model, verdicts = select([("both stages", c), ("hanging stage only", nc)], nominal,
                                         {"hanging": hang[kind]["val"], "rolling": roll[kind]["val"]})
        _line(f"     published: {picked} (" + "; ".join(
            f"{name}: " + ", ".join(f"{r} {v.reason}" for r, v in vs.items()) for name, vs in verdicts.items()) + ")")
        identified[label], walls[label] = model, w1 + w2
    structure, structure_wall = (run_structure(z, hang["clean"], roll["clean"], cfg, identified) if args.structure
                                 else (None, 0.0))
    if args.structure:      # selection refits every candidate from the config: its own time on top
        walls["structure"] = walls["identified"] + structure_wall
    peer = run_peer(z, hang["clean"], roll["clean"], args) if args.peer else {}
    for label, params in identified.items():      # for bench/zoo_control.py
        export_yaml(params, root / "models" / f"{label.replace(' ', '_')}.yaml",
                    comment=f"zoo robot {name}, {label}, {args.budget:g} s per stage")
    fitted = {**identified, **{f"sysid {i}": peer_sysid.as_parameters(z.nominal, r["values"])
                               for i, r in peer.items()}}
    rows = params_rows(z, fitted)
    _line("    parameter                     true    nominal " + "".join(f"{k:>12s}  err" for k in fitted)
          + f"   ({', '.join(SHARES)}: error in points of share)")
    for n, r in rows.items():
        _line(f"    {n:24s} {r['true']:10.4g} {r['nominal']:10.4g} "
              + "".join(f"{r[k]:12.4g} {100 * r[k + '_err']:4.0f}%" for k in fitted))
    models = {"nominal": PhysicalParameters(z.nominal), **identified, "true values": true_model(z)}
    res_hang = predictions(models, hang["clean"]["test"], HANG_HORIZONS)
    res_roll = predictions(models, roll["clean"]["test"], ROLL_HORIZONS)
    for integrator, r in peer.items():
        res_hang[f"sysid {integrator}"] = peer_predictions(r["hanging_model"], r["values"], hang["clean"]["test"],
                                                           HANG_HORIZONS, res_hang["nominal"]["path"])
        res_roll[f"sysid {integrator}"] = peer_predictions(r["rolling_model"], r["values"], roll["clean"]["test"],
                                                           ROLL_HORIZONS, res_roll["nominal"]["path"])
    print_predictions("hanging (held out)", res_hang, HANG_HORIZONS)
    floor = chaos_floor(z, roll["clean"]["test"], ROLL_HORIZONS + (5.0,))
    print_predictions("rolling (held out)", res_roll, ROLL_HORIZONS, floor)
    walls.update({f"sysid {i}": r["wall"] for i, r in peer.items()})
    _line("    wall time (s, same cores): " + ", ".join(f"{k} {v:.0f}" for k, v in walls.items()))
    return {"rows": rows, "hanging": res_hang, "rolling": res_roll, "floor": floor, "walls": walls,
            "peer": {i: {"values": r["values"], "wall": r["wall"]} for i, r in peer.items()},
            "structure": structure, "realisation": z.realisation.to_dict()}


def run_structure(z, hang: dict, roll: dict, cfg: dict, identified: dict) -> tuple[str, float]:
    """Select the structure on the hanging data, fit contact on top of it, gate both stages
    against the nominal model, then keep it or the all-values fit, whichever predicts both
    regimes' validation data better; adds "structure" to ``identified``; returns (what was
    chosen, seconds)."""
    t0 = time.perf_counter()
    sel = select_structure(z.nominal, hang["train"], hang["val"], idf.IdentificationConfig(**cfg))
    for line in sel.lines():
        _line("   " + line)
    chosen = sel.params
    # the contact law is structure too, and only rolling data shows it: each law's contact
    # values fitted on top of the selected structure, alone and with a mass per rod (the hung
    # rod's mass is not in hanging data) or slack-cable damping (cables go slack on impacts),
    # another law or an option kept only if it predicts
    # the rolling validation data better beyond noise (`select_contact_law`)
    laws = select_contact_law(chosen, roll["train"], roll["val"], idf.IdentificationConfig(**cfg),
                              chosen=sel.chosen.options)
    for line in laws.lines():
        _line("   contact " + line)
    c = laws.params
    # what contact data added (a mass per rod, slack damping) was missing from the hanging
    # fit: the hanging values refitted in the structure it left, kept if they predict both
    # regimes' validation data better (the mean of the two error ratios: the model is used in both)
    refit = refit_noncontact(laws, hang["train"], hang["val"], idf.IdentificationConfig(**cfg),
                             chosen=sel.chosen.options)
    if refit is not None:
        held = {"hanging": hang["val"], "rolling": roll["val"]}
        ratios = {regime: validation_error(refit.params, trajs) / validation_error(c, trajs)
                  for regime, trajs in held.items()}
        kept = float(np.mean(list(ratios.values()))) < 1.0
        _line(f"   contact options' hanging refit: {'kept' if kept else 'refused'} (validation error / the contact "
              "stage's: " + ", ".join(f"{r} {v:.3f}" for r, v in ratios.items()) + ")")
        if kept:
            c = refit.params
            laws = dataclasses.replace(laws, chosen=dataclasses.replace(laws.chosen, params=c))
            # the contact values were fitted beside the hanging values the refit moved: once
            # more beside the new ones (the law's contact values alone), kept on the same terms
            again = select_contact_law(c, roll["train"], roll["val"], idf.IdentificationConfig(**cfg),
                                       laws=(c.robot.contact.law,), condims=(), options=()).params
            ratios = {regime: validation_error(again, trajs) / validation_error(c, trajs)
                      for regime, trajs in held.items()}
            kept = float(np.mean(list(ratios.values()))) < 1.0
            _line(f"   contact values refitted after it: {'kept' if kept else 'refused'} (validation error / "
                  "before: " + ", ".join(f"{r} {v:.3f}" for r, v in ratios.items()) + ")")
            if kept:
                c = again
                laws = dataclasses.replace(laws, chosen=dataclasses.replace(laws.chosen, params=c))
    verdict = judge(c, chosen, roll["val"])
    if not verdict.accepted:
        c = chosen
    nominal = PhysicalParameters(z.nominal)
    picked, model, _ = select([("structure, both stages", c), ("structure, hanging stage only", chosen)], nominal,
                              {"hanging": hang["val"], "rolling": roll["val"]})
    # the contact stage's law and options when its model is the one picked (not when the gate
    # refused it: then c is the hanging stage's model)
    contact = laws.chosen.options if model is laws.params else ()
    label = "+".join(sel.chosen.options + contact) or "base"
    label = label if model is not nominal else "nominal"
    # The all-values fit is a structure too (every non-contact value free in the engine's own
    # step): the published model is whichever of the two predicts both regimes' validation
    # data better, each regime's 1 s error taken relative to the nominal model's (a model is
    # used hanging and rolling; selection saw hanging data only).
    held = {"hanging": hang["val"], "rolling": roll["val"]}
    base = {regime: validation_error(nominal, trajs) for regime, trajs in held.items()}
    scores = {name: float(np.mean([validation_error(p, trajs) / base[regime] for regime, trajs in held.items()]))
              for name, p in (("structure", model), ("all values", identified["identified"]))}
    if scores["all values"] < scores["structure"]:
        model, label = identified["identified"], f"all values (over {label})"
    wall = time.perf_counter() - t0
    _line(f"   structure: rolling stage {verdict}; published {picked}; validation error / nominal's, mean over "
          f"hanging and rolling: " + ", ".join(f"{k} {v:.3f}" for k, v in scores.items()) + f": {label}; "
          f"{wall:.0f} s in all")
    identified["structure"] = model
    return label, wall


def validation_error(params, trajs) -> float:
    """Mean CoM error 1 s ahead, restarted every 0.5 s."""
    return float(np.mean(horizon_errors(params, trajs, (1.0,), stride=0.5)[1.0]))


def run_peer(z, hang: dict, roll: dict, args) -> dict:
    """mujoco.sysid on the same clean data: hanging values, then contact values from them,
    per integrator (the user's choice; all are reported)."""
    out = {}
    hanging = peer_sysid.peer_models(z.nominal, "noncontact", (envs.NONCONTACT_FIXED_ROD,))
    rolling = peer_sysid.peer_models(z.nominal, "contact", ())
    stage1 = peer_sysid.fit_robot(hanging, hang, "noncontact", {}, max_iters=args.peer_iters,
                                  threads=args.peer_threads, log=_line)
    stage2 = peer_sysid.fit_robot(rolling, roll, "contact", {i: stage1[i]["values"] for i in hanging},
                                  max_iters=args.peer_iters, threads=args.peer_threads, log=_line)
    for i in hanging:
        out[i] = {"values": stage2[i]["values"], "wall": stage1[i]["wall"] + stage2[i]["wall"],
                  "hanging_model": hanging[i], "rolling_model": rolling[i]}
    return out


def peer_predictions(model, values, test, horizons, path) -> dict:
    ahead = peer_sysid.horizon_errors(model, values, test, horizons)
    return {**ahead, 5.0: peer_sysid.open_loop_error(model, values, test), "path": path}


def peer_summary(results: dict):
    """Issue 18's targets against the best mujoco.sysid configuration per robot and environment."""
    core = ("cable_stiffness", "cable_damping", "rod_mass", "actuator_time_constant")
    _line("\n== beside mujoco.sysid (best integrator per robot and environment, on held-out data)")
    # the package's model: the selected structure when --structure ran, else the all-values fit
    ours = "structure" if all("structure" in r["hanging"] for r in results.values()) else "identified"
    for env, horizons in (("hanging", HANG_HORIZONS), ("rolling", ROLL_HORIZONS)):
        for h in (0.1, 1.0):
            for label in dict.fromkeys(("identified", ours)):
                ratios = []
                for r in results.values():
                    best = min(v[h] for k, v in r[env].items() if k.startswith("sysid"))
                    ratios.append(r[env][label][h] / best)
                verdict = (f"  TARGET every robot <= 0.8: {'MET' if max(ratios) <= 0.8 else 'NOT MET'}"
                           if label == ours else "")
                _line(f"   {env} {h:g} s ahead: package {label} / best sysid per robot "
                      + ", ".join(f"{x:.2f}" for x in ratios) + verdict)
    for n in core:
        our_err = np.median([r["rows"][n]["identified_err"] for r in results.values()])
        their_err = min(np.median([r["rows"][n][f"{k}_err"] for r in results.values()])
                        for k in results[next(iter(results))]["rows"][n]
                        if k.startswith("sysid") and not k.endswith("err"))
        _line(f"   {n}: median error package {100 * our_err:.2f} %, best sysid {100 * their_err:.2f} %  "
              f"TARGET no worse (0.1 point tolerance): {'MET' if our_err <= their_err + 1e-3 else 'NOT MET'}")
    wall = [r["walls"][ours] / min(v for k, v in r["walls"].items() if k.startswith("sysid"))
            for r in results.values()]
    _line(f"   wall time package ({ours}) / fastest sysid per robot: " + ", ".join(f"{x:.2f}" for x in wall)
          + f"  TARGET <= 0.5: {'MET' if max(wall) <= 0.5 else 'NOT MET'}")


def summary(results: dict, pose_only: bool):
    _line("\n== summary over the zoo")
    core = ("cable_stiffness", "cable_damping", "rod_mass", "actuator_time_constant")
    for label, target in [("identified", 0.05)] + ([("pose-only", 0.10)] if pose_only else []):
        med = {n: float(np.median([r["rows"][n][label + "_err"] for r in results.values()])) for n in core}
        ok = all(v <= target for v in med.values())
        _line(f"   {label}: median error " + ", ".join(f"{n} {100 * v:.1f} %" for n, v in med.items())
              + f"  TARGET <= {100 * target:.0f} %: {'MET' if ok else 'NOT MET'}")
    for env in ("hanging", "rolling"):
        ratios = [r[env]["identified"][5.0] / r[env]["nominal"][5.0] for r in results.values()]
        near = [r[env]["identified"][1.0] / r[env]["nominal"][1.0] for r in results.values()]
        _line(f"   {env}: identified / nominal CoM error, median over robots: 5 s {np.median(ratios):.2f}, "
              f"1 s ahead {np.median(near):.2f}"
              + (f"  TARGET 5 s <= 0.5: {'MET' if np.median(ratios) <= 0.5 else 'NOT MET'}" if env == "hanging" else ""))


def structure_summary(results: dict):
    """What each robot revealed, and the structure's prediction beside the all-values fit and
    the chaos floor (issue 19's targets)."""
    _line("\n== model structure (chosen on validation data; errors on held-out test data)")
    for name, r in results.items():
        real = r["realisation"]
        _line(f"   {name:14s} chosen {r['structure']:45s} truth: integrator {real['integrator']}, slack damping "
              f"{real['slack_damping']}, end mass {real['end_mass_fraction']}, actuation {real['actuation']['kind']}")
    for env, horizons in (("hanging", HANG_HORIZONS), ("rolling", ROLL_HORIZONS)):
        for h in horizons:
            cells = [f"{n} {1e3 * r[env]['nominal'][h]:.1f}/{1e3 * r[env]['identified'][h]:.1f}/"
                     f"{1e3 * r[env]['structure'][h]:.1f}" + (f"/{1e3 * r['floor'][h]:.1f}" if env == "rolling" else "")
                     for n, r in results.items()]
            _line(f"   {env} {h:g} s ahead, nominal/identified/structure" + ("/chaos floor" if env == "rolling" else "")
                  + " (mm): " + "; ".join(cells))
    contact = [r["rolling"]["structure"][1.0] / r["floor"][1.0] for r in results.values()]
    free = [r["hanging"]["structure"][1.0] / r["hanging"]["nominal"][1.0] for r in results.values()]
    _line("   rolling 1 s: structure / chaos floor per robot " + ", ".join(f"{x:.2f}" for x in contact)
          + f"  TARGET <= 2: {'MET' if max(contact) <= 2 else 'NOT MET'}")
    _line("   hanging 1 s: structure / nominal per robot " + ", ".join(f"{x:.2f}" for x in free)
          + f"  TARGET <= 0.5: {'MET' if max(free) <= 0.5 else 'NOT MET'}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--robot", default="three_bar")
    ap.add_argument("--zoo", default="all", help="comma-separated zoo names, or all")
    ap.add_argument("--budget", type=float, default=120.0, help="seconds per identification (hanging, rolling)")
    ap.add_argument("--epoch-tuples", type=int, default=128)
    ap.add_argument("--pose-only", action="store_true")
    ap.add_argument("--structure", action="store_true", help="also select the model structure (issue 19)")
    ap.add_argument("--peer", action="store_true", help="also fit with mujoco.sysid (needs bench/requirements-peer.txt)")
    ap.add_argument("--peer-iters", type=int, default=30, help="mujoco.sysid Levenberg-Marquardt iterations")
    ap.add_argument("--peer-threads", type=int, default=2, help="mujoco.sysid rollout threads")
    ap.add_argument("--start", default="config", choices=["config", "random"],
                    help="config: Levenberg-Marquardt from the robot config's values (what a user has); "
                         "random: the paper's progressive schedule from random starts")
    ap.add_argument("--out", default="runs/bench_zoo")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch's and the C kernel's threads (2: the cores mujoco.sysid's --peer-threads 2 use)")
    args = ap.parse_args(argv)
    if args.peer:
        sysid, why = peer_sysid.sysid_module()
        if sysid is None:
            print(f"--peer: {why}", file=sys.stderr)
            return 2
    base, names = zoo_selection(args.robot, args.zoo, args.threads)
    _line(f"robot {base.name}; zoo {names}; budget {args.budget} s per identification; start: "
          + ("the config's values, Levenberg-Marquardt" if args.start == "config"
             else "random (multi-start), Algorithm 1's progressive schedule"))
    out = Path(args.out) / base.name
    t0 = time.perf_counter()
    results = {n: run_robot(n, base, args, out) for n in names}
    summary(results, args.pose_only)
    if args.structure:
        structure_summary(results)
    if args.peer:
        peer_summary(results)
    _line(f"\nTOTAL wall time {time.perf_counter() - t0:.0f} s")
    out.mkdir(parents=True, exist_ok=True)
    (out / "zoo_summary.json").write_text(json.dumps(results, indent=1, default=str))
    envs._CACHE.clear()
    return 0


if __name__ == "__main__":
    sys.exit(main())
