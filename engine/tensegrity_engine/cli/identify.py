"""``tensegrity-identify``: offline data generation, identification and evaluation.

    tensegrity-identify generate --robot superball --out runs/ident            # MuJoCo data
    tensegrity-identify identify --data runs/ident/noncontact --out runs/ident/noncontact_id
    tensegrity-identify identify --data runs/ident/contact --out runs/ident/contact_id \
        --initial runs/ident/noncontact_id/identified.yaml                    # paper order
    tensegrity-identify evaluate --robot runs/ident/contact_id/identified.yaml \
        --data runs/ident/contact --out runs/ident/contact_id
    tensegrity-identify export --params runs/ident/contact_id/identified.yaml --mjcf identified.xml

``identify`` writes identified.yaml (a robot config), identified.xml (its MJCF), report.md (data
coverage, values with 1-sigma and correlations, held-out prediction beside the nominal model),
checkpoint.safetensors (``--resume`` continues from it), history.json and PNG plots (loss per
stage, parameters against the data's config);
``evaluate`` writes com_error.png and evaluation.json. Nothing is written outside ``--out``.
``export --mjcf`` writes a calibrated MuJoCo model of identified values (`tensegrity_engine.export`)
and prints what MJCF could not represent.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np


def _robot(name_or_path):
    from tensegrity_engine.physics.params import load_representable
    return load_representable(name_or_path)


def _plot_history(trainer, reference, out: Path) -> list[Path]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tensegrity_engine.physics.params import PhysicalParameters

    hist = trainer.history
    if not hist:
        return []
    ep = np.array([h["epoch"] for h in hist])
    paths = []
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.semilogy(ep, [h["loss"] for h in hist], label="train")
    ax.semilogy(ep, [h["val_loss"] for h in hist], label="validation")
    for s in trainer.stage_log:
        ax.axvline(s["epoch"] - 0.5, color="grey", lw=0.5, ls=":")
    ax.set_xlabel("epoch")
    ax.set_ylabel("loss (m$^2$)")
    ax.set_title("loss per stage (dotted: stage changes)")
    ax.legend()
    fig.tight_layout()
    paths.append(out / "loss.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    ref = PhysicalParameters(reference).as_dict()
    names = list(trainer.learn)
    fig, axes = plt.subplots(len(names), 1, figsize=(8, 2.0 * len(names)), sharex=True, squeeze=False)
    for ax, n in zip(axes[:, 0], names):
        vals = np.array([np.mean(h["params"][n]) for h in hist])
        ax.plot(ep, vals, label="identified")
        ax.axhline(np.mean(ref[n]), color="k", ls="--", lw=1, label="data config")
        lo, hi = trainer.params.bounds_of(n)
        if trainer.params.specs[n].log_scale:
            ax.set_yscale("log")
        ax.set_ylabel(n, fontsize=8)
    axes[0, 0].legend(fontsize=8)
    axes[-1, 0].set_xlabel("epoch")
    fig.tight_layout()
    paths.append(out / "params.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    return paths


def plot_com_error(results: dict, out: Path, title: str = "") -> Path:
    """results: {label: evaluate() dict}. Mean and std of the CoM error against time."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for label, r in results.items():
        m, s = np.nanmean(r["com_error"], 0), np.nanstd(r["com_error"], 0)
        ax.plot(r["times"], m, label=label)
        ax.fill_between(r["times"], np.maximum(m - s, 1e-12), m + s, alpha=0.2)
    ax.set_yscale("log")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("CoM error (m)")
    ax.set_title(title or "CoM error on test trajectories (mean ± std)")
    ax.legend()
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def _summary(r: dict) -> str:
    return (f"CoM error at {r['times'][-1]:.2f} s: mean {np.mean(r['final_error']):.4g} m "
            f"(max {np.max(r['final_error']):.4g}); path length {np.mean(r['path_length']):.4g} m; "
            f"relative {100 * np.mean(r['relative']):.3g} %")


def cmd_generate(args) -> int:
    from tensegrity_engine.identification.dataset import SPLITS, generate_dataset

    robot = _robot(args.robot)
    counts = dict(SPLITS)
    if args.counts:
        vals = [int(v) for v in args.counts.split(",")]
        if len(vals) != 3:
            raise SystemExit("--counts needs train,val,test")
        counts = dict(zip(("train", "val", "test"), vals))
    for env in args.env:
        t = time.perf_counter()
        generate_dataset(robot, env, args.out, counts=counts, duration=args.duration,
                         period=args.period, seed=args.seed, dense=not args.no_dense, progress=True)
        print(f"{env}: written under {Path(args.out) / env} in {time.perf_counter() - t:.1f} s")
    return 0


def cmd_identify(args) -> int:
    import torch

    from tensegrity_engine.identification.dataset import load_split, tuples_from
    from tensegrity_engine.identification import IdentificationConfig, ProgressiveTrainer, export_yaml
    from tensegrity_engine.physics.params import PhysicalParameters

    torch.set_num_threads(args.threads)
    train = load_split(args.data, "train", args.kind)
    val = load_split(args.data, "val", args.kind)
    data_robot = train[0].robot              # what the files say they were recorded with
    robot = _robot(args.robot) if args.robot else data_robot
    if args.robot:
        train = load_split(args.data, "train", args.kind, robot)
        val = load_split(args.data, "val", args.kind, robot)
    if args.pose_only:
        train = [t.without_velocity() for t in train]
        val = [t.without_velocity() for t in val]
    initial = PhysicalParameters(_robot(args.initial)) if args.initial else None
    cfg = IdentificationConfig(
        period=args.period, learn=tuple(args.learn) if args.learn else None,
        per_element=tuple(args.per_element or ()), schedule=args.schedule,
        fine_integrator=args.fine_integrator, patience=args.patience,
        max_stage_epochs=args.max_stage_epochs or None, max_epochs=args.max_epochs,
        max_seconds=args.max_seconds, batch_size=args.batch_size, epoch_tuples=args.epoch_tuples or None,
        val_tuples=args.val_tuples or None, seed=args.seed, n_starts=args.starts,
        fine_optimizer=args.fine_optimizer, init=args.init, native_threads=max(1, args.threads),
        compile_training={"auto": None, "on": True, "off": False}[args.compile],
        gradient_dtype=None if args.gradient_dtype == "same" else args.gradient_dtype)
    dtype = {"float64": torch.float64, "float32": torch.float32}[args.dtype]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    # the model a fit replaces: --initial's values, else the robot config's (also with --structure,
    # whose selection fits are candidates, not the user's model)
    replaced = PhysicalParameters.keeping_elements(initial.robot if initial is not None else robot)
    if args.structure:
        robot, cfg, initial = _select_structure(args, robot, cfg, initial, train, val, out)
    trainer = ProgressiveTrainer(robot, cfg, device=args.device, dtype=dtype, initial=initial,
                                 log=lambda m: print(m, flush=True))
    ts, vs = tuples_from(train, cfg.period), tuples_from(val, cfg.period)
    trainer.set_data(ts, vs)
    ckpt = out / "checkpoint.safetensors"
    if args.resume and ckpt.exists():
        trainer.load_checkpoint(ckpt)
        print(f"resumed from {ckpt} at epoch {trainer.epoch} ({trainer.schedule.stage_name()})")
    print(f"data: {len(train)} train / {len(val)} val trajectories, {len(ts)} train tuples, "
          f"{ts.data_points} ground-truth train data points ({vs.data_points} validation)")
    t0 = time.perf_counter()
    trainer.run(progress=not args.quiet, callback=lambda m: trainer.save_checkpoint(ckpt))
    wall = time.perf_counter() - t0
    trainer.save_checkpoint(ckpt)
    verdict = _gate(trainer, replaced, val)
    print(f"hold-out gate on the val split: {verdict}")
    comment = f"data: {args.data} ({args.kind}); learned: {', '.join(trainer.learn)}"
    # never hand out a model that predicts the val split worse than the one it replaces (and
    # leave no stale file of an earlier run beside this run's verdict)
    for stale in ("identified.yaml", "identified.xml", "candidate.yaml"):
        (out / stale).unlink(missing_ok=True)
    if not verdict.accepted:
        export_yaml(trainer.parameters, out / "candidate.yaml", comment=comment + f"; REJECTED: {verdict}")
    else:
        export_yaml(trainer.parameters, out / "identified.yaml", comment=comment)
    from tensegrity_engine.export import write_mjcf
    mjcf = (write_mjcf(trainer.parameters, out / "identified.xml", floor=trainer.engine.floor,
                       fixed_rods=trainer.engine.fixed_rods, source=f"{args.data} ({args.kind})")
            if verdict.accepted else None)
    (out / "history.json").write_text(json.dumps(
        {"history": trainer.history, "stages": trainer.stage_log, "learn": trainer.learn,
         "wall_seconds": wall, "data_points": ts.data_points}, indent=1, default=float))
    plots = _plot_history(trainer, train[0].robot, out)
    secs = [h["seconds"] for h in trainer.history]
    written = out / ("identified.yaml" if verdict.accepted else "candidate.yaml")
    print(f"identified in {wall:.1f} s, {trainer.epoch} epochs, {np.mean(secs):.2f} s/epoch "
          f"(paper: 126 s/epoch on GPU); wrote {written}, {ckpt}, " + ", ".join(str(p) for p in plots))
    if mjcf is not None:
        print(f"wrote {out / 'identified.xml'} (a calibrated MuJoCo model)"
              + "".join(f"\n  not represented: {n}" for n in mjcf.notes))
    gate_note = (f"hold-out gate (val split, 1 s ahead): {verdict}"
                 + ("" if verdict.accepted else "; so written as candidate.yaml, not identified.yaml"))
    report = _report(args, trainer, robot, data_robot, train, out, wall,
                     [f"MJCF export: {n}" for n in mjcf.notes] if mjcf else [], gate_note)
    print(f"wrote {report} (the identification report)")
    if not verdict.accepted:
        print(f"NOT written: identified.yaml / identified.xml. The fit ({written}) predicts the val split "
              f"{'unstably' if verdict.reason == 'unstable' else 'worse'} than the model it would replace "
              f"({'--initial' if args.initial else 'the robot config'}): keep that model, or identify "
              f"from more (or more exciting) data", file=sys.stderr)
        return 1
    return 0


GATE_TOLERANCE = 1e-6    # m: an exact fit and an exact start differ by rounding, not by a micrometre


def _gate(trainer, replaced, val):
    """`acceptance.judge` of the fit against the model it replaces on the val split, 1 s
    ahead, each model with its own integrator and sub-steps."""
    from tensegrity_engine.identification.acceptance import judge

    return judge(trainer.parameters, replaced, val, tolerance=GATE_TOLERANCE)


def _select_structure(args, robot, cfg, initial, train, val, out: Path):
    """--structure: choose the model's structure on the validation split, then identify it
    (warm-started from the selection's fit). Returns (robot, config, initial)."""
    import dataclasses

    from tensegrity_engine.identification.structure import BASE_LEARN, select_structure, structure_config

    if train[0].floor:
        if args.learn or args.fine_integrator:
            print("--structure on floor data learns the chosen law's contact values (and an option's) in the "
                  "start's step: --learn and --fine-integrator are not used")
        return _select_contact_structure(robot, cfg, initial, train, val, out)
    if args.fine_integrator:
        print(f"--structure chooses the integrator; --fine-integrator {args.fine_integrator} is the base's")
        robot = robot.replace(integrator=args.fine_integrator) if args.fine_integrator != "ani" else robot
    sel = select_structure(robot, train, val, cfg, initial=initial, log=lambda m: print(m, flush=True))
    lines = sel.lines()
    print("\n".join(lines))
    (out / "structure.txt").write_text("\n".join(lines) + "\n")
    learn, per_element, integrator = structure_config(sel.chosen.options, robot, cfg.learn or BASE_LEARN)
    cfg = dataclasses.replace(cfg, learn=learn, per_element=per_element, fine_integrator=integrator, init="given")
    return sel.params.robot, cfg, sel.params


def _select_contact_structure(robot, cfg, initial, train, val, out: Path):
    """--structure on floor data: the contact law (under the soft law, its condim) and the
    options only contact data shows (a mass per rod, slack damping; `select_contact_law`),
    each fitted from --initial's values
    (a hanging identification's, say) or the config's, then that structure identified
    (warm-started from its fit). Returns (robot, config, initial)."""
    from tensegrity_engine.identification.structure import CONTACT_OPTIONS, contact_fit_config, select_contact_law
    from tensegrity_engine.physics.params import PhysicalParameters

    start = initial if initial is not None else PhysicalParameters.keeping_elements(robot)
    sel = select_contact_law(start, train, val, cfg, log=lambda m: print(m, flush=True))
    lines = sel.lines()
    print("\n".join(lines))
    (out / "structure.txt").write_text("\n".join(lines) + "\n")
    chosen = sel.params
    options = [name for name in sel.chosen.options if name in CONTACT_OPTIONS]
    return chosen.robot, contact_fit_config(chosen, options, cfg), chosen


def _truth(args, data_robot, train):
    """The robot's true values when they are known: ``--truth``, else what generated data
    says it was recorded from (the twin or a zoo robot of the files' own config, whatever
    ``--robot`` the user believes in); None for recorded data."""
    from tensegrity_engine.groundtruth.zoo import ground_truth, zoo_names

    spec = args.truth
    if spec is None:
        names = {t.meta.get("ground_truth") for t in train}
        if len(names) != 1 or None in names:
            return None
        name = names.pop()
        spec = "twin" if name == "twin" else (f"zoo/{name}" if name in zoo_names() else None)
    return None if spec is None else ground_truth(spec, data_robot).truth


def _report(args, trainer, robot, data_robot, train, out: Path, wall: float, notes, gate_note: str) -> Path:
    from tensegrity_engine.export.report import write_report
    from tensegrity_engine.identification.dataset import DatasetError, load_split
    from tensegrity_engine.identification.uncertainty import trainer_uncertainty
    from tensegrity_engine.physics.params import PhysicalParameters

    heldout, label = None, "test"
    for split in ("test", "val"):
        try:
            heldout, label = load_split(args.data, split, args.kind, robot), split
            break
        except DatasetError:
            continue
    if args.pose_only:
        heldout = [t.without_velocity() for t in heldout]
    try:
        uncertainty = trainer_uncertainty(trainer, max_tuples=128)
    except RuntimeError as err:
        print(f"no uncertainty estimate: {err}")
        uncertainty = None
    notes = [gate_note, *notes]
    if args.initial:
        notes.append(f"values not learnt come from {args.initial}")
    return write_report(out, params=trainer.parameters, nominal=PhysicalParameters.keeping_elements(robot),
                        learn=trainer.learn, train=train, heldout=heldout, heldout_label=f"{label}-split",
                        uncertainty=uncertainty, truth=_truth(args, data_robot, train), notes=notes,
                        title=f"{robot.name} from {args.data}", wall_seconds=wall)


def cmd_evaluate(args) -> int:
    import torch

    from tensegrity_engine.identification.dataset import load_split
    from tensegrity_engine.identification import evaluate
    from tensegrity_engine.physics.params import PhysicalParameters

    torch.set_num_threads(args.threads)
    robot = _robot(args.robot)
    test = load_split(args.data, args.split, args.kind, robot)
    r = evaluate(PhysicalParameters(robot), test, integrator=args.integrator, dt=args.dt,
                 device=args.device)
    out = Path(args.out)
    plot_com_error({Path(args.robot).stem: r}, out / "com_error.png")
    (out / "evaluation.json").write_text(json.dumps({k: np.asarray(v).tolist() for k, v in r.items()}))
    print(_summary(r))
    return 0


def cmd_export(args) -> int:
    from tensegrity_engine.export import write_mjcf
    from tensegrity_engine.physics.parameter_files import params_from_file

    robot = _robot(args.robot or args.params)
    params = params_from_file(robot, args.params)          # per-cable / per-rod values stay so
    try:
        export = write_mjcf(params, args.mjcf, floor=not args.no_floor, fixed_rods=tuple(args.fixed_rods),
                            source=str(args.params))
    except (OSError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"wrote {args.mjcf} (timestep {export.timestep:g} s)")
    for note in export.notes:
        print(f"not represented: {note}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="tensegrity-identify", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="run the MuJoCo ground truth and write trajectory files")
    g.add_argument("--robot", default="superball")
    g.add_argument("--out", default="runs/ident")
    g.add_argument("--env", nargs="+", default=["noncontact", "contact"], choices=["noncontact", "contact"])
    g.add_argument("--counts", help="train,val,test trajectories (default 10,2,10)")
    g.add_argument("--duration", type=float, default=5.0)
    g.add_argument("--period", type=float, default=0.1)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--no-dense", action="store_true", help="skip the 1 kHz files")
    g.set_defaults(func=cmd_generate)

    i = sub.add_parser("identify", help="progressive recurrent identification (Algorithm 1)")
    i.add_argument("--data", required=True, help="folder with train/ and val/ trajectory files")
    i.add_argument("--out", default="runs/ident/identified")
    i.add_argument("--robot", help="robot config (default: the one embedded in the data)")
    i.add_argument("--initial", help="robot YAML with values for the parameters not learned "
                                     "(e.g. the non-contact result for the contact stage)")
    i.add_argument("--kind", default="sparse", choices=["sparse", "dense"])
    i.add_argument("--period", type=float, default=0.1)
    i.add_argument("--learn", nargs="+")
    i.add_argument("--per-element", nargs="+")
    i.add_argument("--schedule", default="progressive", choices=["progressive", "implicit_only", "feedforward"])
    i.add_argument("--fine-integrator", default=None, choices=["semi_implicit", "implicitfast", "rk4", "ani"],
                   help="default: the robot config's engine.integrator")
    i.add_argument("--structure", action="store_true",
                   help="first choose the model structure on the val split (identification.structure): on "
                        "hanging data the integrator, slack damping, end-heavy inertia, winch speed, per-cable / "
                        "per-rod values; on floor data the contact law (under the soft law its condim 3, 4 or 6) and "
                        "a mass per rod or slack damping, "
                        "from --initial's values (e.g. the hanging identification's) or the config's")
    i.add_argument("--patience", type=int, default=2)
    from tensegrity_engine.identification.config import IdentificationConfig

    defaults = IdentificationConfig()
    i.add_argument("--max-stage-epochs", type=int, default=defaults.max_stage_epochs,
                   help="epochs of a gradient stage (Algorithm 1's dt or lr halving, an Adam fine stage) "
                        "before the next (0: until no improvement; default %(default)s)")
    i.add_argument("--max-epochs", type=int, default=10_000)
    i.add_argument("--max-seconds", type=float)
    i.add_argument("--batch-size", type=int, default=16)
    i.add_argument("--starts", type=int, default=16, help="multi-start: random starts scored, best kept")
    i.add_argument("--init", default="random", choices=["random", "given", "given+random"],
                   help="learnt parameters start random (multi-start), at the robot's (or --initial's) "
                        "values, or from the best of both")
    i.add_argument("--fine-optimizer", default="lm", choices=["lm", "adam"],
                   help="fine stage: Levenberg-Marquardt (default) or Adam with lr halving")
    i.add_argument("--epoch-tuples", type=int, default=defaults.epoch_tuples,
                   help="training tuples per epoch (0: all; default %(default)s)")
    i.add_argument("--val-tuples", type=int, default=defaults.val_tuples,
                   help="validation tuples, a fixed subset (0: all; default %(default)s)")
    i.add_argument("--pose-only", action="store_true",
                   help="drop velocities (finite-difference velocities, then windowed latent-velocity LM)")
    i.add_argument("--resume", action="store_true")
    i.add_argument("--seed", type=int, default=0)
    i.add_argument("--device", default="cpu")
    i.add_argument("--dtype", default="float64", choices=["float64", "float32"],
                   help="the whole fit's precision; float32 measured inaccurate (K -13 %%, tau -62 %% on exact data: "
                        "the Levenberg-Marquardt differences drown in rounding): use --gradient-dtype")
    i.add_argument("--gradient-dtype", default="same", choices=["same", "float32", "float64"],
                   help="precision of the rollouts backpropagated through (the Adam stages); the "
                        "Levenberg-Marquardt stage, validation and the gate keep --dtype (default: %(default)s)")
    i.add_argument("--compile", default="auto", choices=["auto", "on", "off"],
                   help="gradient epochs step a torch.compile'd engine step (2.5x faster per epoch on the CPU, "
                        "after 27-60 s of compiling per integrator and batch shape: worth it for long runs); "
                        "auto: on CUDA only")
    i.add_argument("--threads", type=int, default=2, help="torch's and the C kernel's threads")
    i.add_argument("--truth", help="the robot's true values for the report, when known: twin, zoo/<name> or a "
                                   "robot YAML (default: what generated data says it came from)")
    i.add_argument("--quiet", action="store_true")
    i.set_defaults(func=cmd_identify)

    e = sub.add_parser("evaluate", help="CoM error of a robot config on test trajectories")
    e.add_argument("--robot", required=True, help="identified robot YAML")
    e.add_argument("--data", required=True)
    e.add_argument("--split", default="test")
    e.add_argument("--kind", default="sparse", choices=["sparse", "dense"])
    e.add_argument("--out", default="runs/ident/evaluation")
    e.add_argument("--integrator", default=None, choices=["semi_implicit", "implicitfast", "rk4", "implicit", "ani"],
                   help="default: the model's engine.integrator")
    e.add_argument("--dt", type=float)
    e.add_argument("--device", default="cpu")
    e.add_argument("--threads", type=int, default=2)
    e.set_defaults(func=cmd_evaluate)

    x = sub.add_parser("export", help="write a calibrated MuJoCo model (MJCF) of identified values")
    x.add_argument("--params", required=True, help="identified.yaml (a robot config) or a parameter mapping")
    x.add_argument("--robot", help="the robot config a parameter mapping belongs to")
    x.add_argument("--mjcf", required=True, help="output .xml")
    x.add_argument("--no-floor", action="store_true", help="leave the floor out (a hanging robot)")
    x.add_argument("--fixed-rods", type=int, nargs="*", default=[], help="rods welded to the world")
    x.set_defaults(func=cmd_export)
    return ap


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from tensegrity_engine.physics.config import ConfigError
    from tensegrity_engine.identification.dataset import DatasetError
    from tensegrity_engine.physics.params import ParameterError
    try:
        return args.func(args)
    except (DatasetError, ConfigError, ParameterError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
