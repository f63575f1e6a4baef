"""tensegrity-identify-bag: identify from a recorded MCAP bag offline, with the identifier
node's own code and settings (the `identifier:` section of a parameter file): the same
message checks and tuple alignment, the same online session and hold-out gate, run to
the end of the data and to convergence instead of at the robot's pace.

    tensegrity-identify-bag run.mcap --robot superball [--params-file config/robot.yaml]
                            [--out summary.json] [--mjcf identified.xml] [--start 0] [--end 120]

``--mjcf`` writes the identified model as a calibrated MuJoCo model, only when it passed the
hold-out gate (a model that predicts worse than the config is not handed on).

Playing the bag into a running identifier (`tensegrity-play-bag`) gives the same tuples;
this tool is what to use when nothing needs to run live.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Optional

import numpy as np

from .common import ConfigurationError, ShutdownRequest

TOPIC_KIND = {"/tensegrity/rod_poses": "poses", "/tensegrity/imu": "imu", "/tensegrity/cable_states": "cables"}


def load_settings(params_file: Optional[str], robot_name: Optional[str]) -> tuple[dict, str]:
    """The identifier's ``ros__parameters`` from a parameter file ({} without one) and the
    robot (``robot_name`` overrides the file's)."""
    values: dict = {}
    if params_file:
        import yaml

        from .params import resolve_config

        data = yaml.safe_load(resolve_config(params_file).read_text()) or {}
        values = dict((data.get("identifier") or {}).get("ros__parameters") or {})
    robot = robot_name or values.get("robot") or "superball"
    values.pop("robot", None)
    return values, robot


def identify_bag(path, robot, values: dict, *, start: float = 0.0, end: Optional[float] = None,
                 device: str = "cpu", max_seconds: float = math.inf, score: Optional[dict] = None,
                 log=print) -> dict:
    """Run the identifier's session over the bag; a summary dict (values, sigma, gate).
    ``score`` {label: values}: other models judged on the same held-out tuples
    (summary["scored"][label]: their held-out loss and CoM error 1 s ahead)."""
    from rclpy.serialization import deserialize_message

    from .bag_player import _message_type, read_bag
    from .identifier_node import declare_identification, feed_aligner, make_session, stream_config
    from .params import file_declarer
    from tensegrity_engine.identification.streaming import StreamAligner

    d = file_declarer(values)
    setting = declare_identification(d)
    topics = dict(TOPIC_KIND, **{d("command_topic", "/tensegrity/cable_command"): "commands"})
    ignored = [k for k in d.unused() if k not in NODE_ONLY]
    if ignored:
        raise ConfigurationError(f"identifier parameters {ignored} are not identification settings")
    aligner = StreamAligner(stream_config(robot, setting))
    cable_names = [robot.cable_names[i] for i in robot.actuated_indices]
    counts = {"accepted": 0, "refused": 0}
    types: dict = {}
    for m in read_bag(path, list(topics), start, end):
        kind = topics[m.topic]
        msg = deserialize_message(m.data, types.setdefault(m.datatype, _message_type(m.datatype)))
        ok, _, _ = feed_aligner(aligner, kind, msg, setting["pose_frame"], cable_names)
        counts["accepted" if ok else "refused"] += 1
    aligner.flush()
    tuples = aligner.pop_tuples()
    if tuples is None:
        raise ValueError(f"{path}: no tuples (poses on the {setting['interval']} s grid with commands)")
    session = make_session(robot, setting, device, log=lambda _: None)
    session.add(tuples)
    t0 = time.monotonic()
    while session.training and time.monotonic() - t0 < max_seconds and not ShutdownRequest.event.is_set():
        session.step()
    metrics, values_out = session.finish()
    verdict = session.gate(values_out)
    sigma = session.uncertainty(at=values_out)
    summary = {"bag": str(path), "tuples": len(tuples), "messages": counts, "epochs": session.epochs,
               "floor": session.floor, "fixed_rods": list(session.fixed_rods),
               # the structure the values were fitted in (a structure option may have been adopted)
               "structure": {"integrator": session.robot.integrator, "contact_law": session.robot.contact.law,
                             "condim": int(session.robot.contact.soft_condim)},
               "status": session.status, "seconds": round(time.monotonic() - t0, 1),
               "values": {k: np.asarray(v, dtype=float).tolist() for k, v in values_out.items()},
               "sigma": {} if sigma is None else {k: np.asarray(v).tolist() for k, v in sigma.sigma.items()},
               "sigma_spread": {} if sigma is None else {k: np.asarray(v).tolist()
                                                         for k, v in sigma.sigma_spread.items()},
               # what the node publishes: the spread and the horizon shift in quadrature
               "sigma_published": {} if sigma is None else {k: np.asarray(v).tolist()
                                                            for k, v in sigma.published().items()},
               "horizon_shift": {} if sigma is None else {k: np.asarray(v).tolist()
                                                          for k, v in sigma.sigma_structure.items()},
               "gate": {"accepted": verdict.accepted, "reason": verdict.reason,
                        "heldout_loss": verdict.candidate_loss, "config_loss": verdict.incumbent_loss,
                        "heldout_com_error": verdict.candidate_com_error,
                        "config_com_error": verdict.incumbent_com_error}}
    summary["scored"] = {}
    for label, other in (score or {}).items():
        v = session.gate({k: np.asarray(x, dtype=float) for k, x in other.items()})
        summary["scored"][label] = {"heldout_loss": v.candidate_loss, "heldout_com_error": v.candidate_com_error}
    log(f"{len(tuples)} tuples ({counts['refused']} messages refused), {session.epochs} epochs, "
        f"{session.status}; hold-out gate: {verdict.reason}")
    return summary


# parameters of the node that have nothing to do with what is identified
NODE_ONLY = {"device", "checkpoint_dir", "export_mjcf_path", "checkpoint_period", "resume", "min_publish_interval",
             "publish_markers", "uncertainty_tuples", "converged_sigma", "torch_threads", "diagnostics_period"}


def main(argv=None) -> int:
    ShutdownRequest.install()
    ap = argparse.ArgumentParser(prog="tensegrity-identify-bag", description=__doc__.split("\n\n")[0])
    ap.add_argument("bag")
    ap.add_argument("--robot", default=None, help="robot YAML (default: the parameter file's, else superball)")
    ap.add_argument("--params-file", default=None, help="ROS parameter file; its identifier: section is used")
    ap.add_argument("--start", type=float, default=0.0)
    ap.add_argument("--end", type=float, default=None)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--max-seconds", type=float, default=math.inf, help="training time limit (wall s)")
    ap.add_argument("--out", default=None, help="write the summary (values, sigma, gate) as JSON")
    ap.add_argument("--mjcf", default=None, help="write the identified model as MJCF (if it passed the gate)")
    args = ap.parse_args(argv)
    from .params import load_robot

    try:
        values, robot_name = load_settings(args.params_file, args.robot)
        robot = load_robot(robot_name)
        summary = identify_bag(args.bag, robot, values, start=args.start, end=args.end, device=args.device,
                               max_seconds=args.max_seconds)
    except (ConfigurationError, FileNotFoundError, ValueError) as exc:
        print(f"tensegrity-identify-bag: {exc}", file=sys.stderr)
        return 2
    nominal = {k: np.asarray(v, dtype=float) for k, v in _config_values(robot).items()}
    for name, v in summary["values"].items():
        if name in summary["sigma"]:
            s = np.asarray(summary["sigma"][name])
            print(f"  {name:26s} {np.mean(v):12.5g} +- {np.mean(s):.3g}   (config {nominal[name].mean():.5g})")
    g = summary["gate"]
    print(f"held-out CoM error 1 s ahead: identified {g['heldout_com_error'] * 1e3:.1f} mm, "
          f"config {g['config_com_error'] * 1e3:.1f} mm ({g['reason']})")
    if args.out:
        Path(args.out).write_text(json.dumps(summary, indent=1, default=float))
    if args.mjcf:
        if not g["accepted"]:
            print(f"tensegrity-identify-bag: no MJCF written: the identified model did not pass the hold-out "
                  f"gate ({g['reason']})", file=sys.stderr)
            return 1
        from tensegrity_engine.export import write_mjcf
        from tensegrity_engine.identification.online_structure import robot_in_structure
        from tensegrity_engine.physics.params import PhysicalParameters

        try:
            fitted = robot_in_structure(robot, (summary["structure"]["integrator"], summary["structure"]["contact_law"],
                                                summary["structure"]["condim"] if robot.contact.law == "soft" else None))
            export = write_mjcf(PhysicalParameters.keeping_elements(fitted, summary["values"]), args.mjcf,
                                floor=summary["floor"], fixed_rods=summary["fixed_rods"], source=str(args.bag))
        except (OSError, ValueError) as exc:
            print(f"tensegrity-identify-bag: cannot write {args.mjcf}: {exc}", file=sys.stderr)
            return 2
        print(f"wrote {args.mjcf}" + "".join(f"\n  not represented: {n}" for n in export.notes))
    return 0


def _config_values(robot) -> dict:
    from tensegrity_engine.physics.params import PhysicalParameters

    return PhysicalParameters(robot).as_dict()


if __name__ == "__main__":
    raise SystemExit(main())
