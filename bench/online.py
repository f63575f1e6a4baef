"""Online identification bench (issue 11): the identifier's session fed as the robot works.

    python bench/online.py [--robot superball] [--truth twin,zoo/soft_slow,... | zoo | random/0-7]
                           [--seeds 5] [--duration 60] [--noise robot|none] [--init given|random]
                           [--law config|penalty|soft] [--integrator config|semi_implicit|implicitfast|rk4]
                           [--learn cable_stiffness,cable_damping,rod_mass,actuator_time_constant]
                           [--geometry measured|config] [--fresh 20] [--out runs/bench_online]

What the sim2sim's identifier node does, without ROS and replayed against a clock: MuJoCo
plays the robot (``--truth``: the twin, a zoo robot (config/zoo.yaml), or robots nobody
tuned for, drawn from seeds (``random/<first>-<last>``, `groundtruth.random_robots`))
resting on the floor (the model has the robot's rod masses and radii, as a user who weighed and measured
its rods writes them in the robot YAML; the rest is the config's), excited by the controller's multisine for ``--duration`` s of sim time; its mocap
(``--noise robot``: the zoo robot's own noise, latency, jitter and drops; the twin's is
ideal) and commands go through the node's `StreamAligner` into an `OnlineIdentification`
session. The session computes in *sim time*: every second it spends (one core) is one
second of robot time, during which new data arrives (``--clock wall``, the default; ``--clock
work``: a second of the native kernel's rollout work at its reference cost,
`physics.work`, so that a seed runs the same on any machine and at any load). A candidate
meets the hold-out gate when the node's pacing lets it (`gate_pacing`), and is published
only if it passes; its 1-sigma is computed then (and costs time).

Printed per robot and seed: the published values at the end vs the truth (relative error,
beside the nominal config's), the CoM error 1 s ahead on ``--fresh`` s of data the robot
goes on to record after the session stops (1 s blocks; neither the solver nor the gate saw
them: the gate's own held-out blocks favour the model it picked on them) of the nominal
model, the published model, the robot's true values of the learnt parameters in the model's
structure (the other values as published; a value the model shares gets the mean of the
robot's per-element ones) and all its true values (per element too, and those of parameters
that structure options learn: inertia factor, slack damping, winch speed) and the chaos
floor beside them (the robot itself restarted from every whole second of its run with every
velocity 1 % larger: where the CoM is after 1 s; rolling on a floor is chaotic, and no
model is judged below that yardstick), with the training
objective of the first two (where the true learnt values predict the fresh data worse
than the published ones, the model's structure limits the values; where they predict better
and also fit the training windows better, the solver stopped in a worse local minimum),
their 1-sigma (the spread, and what the node publishes: the spread and the horizon shift,
`ParameterUncertainty.published`), whether the truth is within
2 of each, the learnt values pinned at a bound of their range, the sim time after which all learnt
values stay within 5 % (10 % with noise), the session's state. Then the medians over seeds
and the 2-sigma coverage (the published sigma's over the values it is finite for: it is inf
for every value while one is compensating, `ParameterUncertainty.compensating`). Targets
(printed, never asserted): K, c, m, tau within 5 % noise-free / 10 % noisy within 60 s,
median over >= 5 seeds; truth within 2 sigma in >= 90 % of cases. Then the contact: the
published sliding friction and, where the model is under the soft law, its time constant and
damping ratio against the robot's MuJoCo contact (`ZooRobot.true_contact`), beside the
config's, with the published 2-sigma's coverage. With ``--profile on`` also the training
objective along the straight line from the published values to the robot's: where the
robot's values fit better, whether the solver stopped on a slope or behind a ridge.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from tensegrity_engine.control.excitation import DEFAULT_BAND, KINDS, ExcitationPolicy
from tensegrity_engine.groundtruth.environments import rest_pose
from tensegrity_engine.groundtruth.mujoco_twin import GroundTruthDiverged
from tensegrity_engine.groundtruth.sensors import SensorModel
from tensegrity_engine.groundtruth.zoo import RANDOM_PREFIX, ZOO_PREFIX, ground_truth, zoo_names
from tensegrity_engine.identification.acceptance import window_fit
from tensegrity_engine.identification.config import WINDOWS_FROM, IdentificationConfig, contact_params, resolve_learn
from tensegrity_engine.identification.gate_pacing import GatePacing
from tensegrity_engine.identification.online import HOLDOUT_SECONDS, OnlineIdentification, unseen_tuples
from tensegrity_engine.identification.lag_split import motor_and_cable_lags
from tensegrity_engine.identification.online_structure import (DEFAULT_STRUCTURE_OPTIONS, ONLINE_OPTIONS, online_options,
                                                                 structure_key)
from tensegrity_engine.identification.streaming import StreamAligner, StreamConfig, TupleBatch
from tensegrity_engine.identification.uncertainty import data_information, element_mean_sigma, elements_covered
from tensegrity_engine.identification.worker_account import work_summary
from tensegrity_engine.physics.config import MODEL_INTEGRATORS, load_robot
from tensegrity_engine.physics.params import PhysicalParameters
from tensegrity_engine.physics.state import ANG_VEL, QUAT, quat_conjugate, quat_rotate
from tensegrity_engine.physics.work import METER

sys.path.insert(0, str(Path(__file__).resolve().parent))
from zoo import kicked_com_gaps, machine  # noqa: E402  (bench/zoo.py: the same machine line and chaos floor)

TARGETS = ("cable_stiffness", "cable_damping", "rod_mass", "actuator_time_constant")
# the contact values with a MuJoCo counterpart (`ZooRobot.true_contact`)
CONTACT_TARGETS = ("friction_sliding", "contact_time_constant", "contact_damping_ratio")
# Floor data: the cables, the motor, the rods' inertia and the contact, as the identifier
# node's robot.yaml. The rods' inertia factor (end-heavy rods: motors and batteries at the
# ends) is learnt since 2026-11-28: seeds 0-2, held-out CoM error 1 s ahead without -> with
# it, end_heavy 43-85 -> 20-43 mm, noisy_mocap 19-23 -> 12-15, soft_slow 18-23 -> 9-16, the
# twin within 5 % from 15-20 s with it within 4 %; payload 5-9 -> 8-20 mm (docs/online_identification.md).
# The winch speed limit too since 2026-11-28 (ninth session): slow_winch's K / c / tau from
# 3-41 / 519-838 / 76-84 % off to within 5 % on seeds 0-2, held-out CoM error 1 s ahead
# 18-37 -> 6-11 mm; on seven other robots as without it (docs/online_identification.md). The slack share
# stays out (--learn or --structure).
# The contact's values are those of the model's ground contact law: its normal response
# (penalty stiffness and damping, or the soft law's time constant and damping ratio) and
# sliding friction.
LEARN = ("cable_stiffness", "cable_damping", "actuator_time_constant", "rod_inertia_factor", "actuator_max_speed")


def _median_diverged_last(values) -> float:
    """The median of per-run errors over the runs scored (NaN: not scored, no fresh data or no
    trainer), a run whose model diverged on the fresh data (inf) counting as the largest
    error, not as no run; NaN if none was scored."""
    v = np.asarray(values, dtype=np.float64)
    v = v[~np.isnan(v)]
    return float(np.median(v)) if v.size else math.nan


def default_learn(law: str) -> tuple:
    return LEARN + contact_params(law)[:3]
NS = 1_000_000_000
# N: a load cell's noise on a cable (a 500 N cell at 0.4 % of its range); the weight's
# position noise is at least a mocap's millimetre (noise-free runs weigh as if it were there)
TENSION_NOISE = 2.0
# m: a winch encoder's rest length (a 4096-count encoder on a 2 cm spool: 0.03 mm a count;
# the spool's wrap and the cable's creep make it 0.2 mm)
REST_LENGTH_NOISE = 2e-4
WEIGHT_FLOOR_NOISE = 1e-3
GYRO_NOISE = 0.01          # rad/s: a MEMS gyro's white noise at 10 Hz, the order of a data sheet's
CONTROL_DT = 0.1


def _band(text: str) -> tuple[float, float]:
    """``FMIN,FMAX`` (Hz) from the command line."""
    lo, hi = (float(v) for v in text.split(","))
    return lo, hi


def _line(*a):
    print(*a, flush=True)


# --noise: which of the robot's mocap imperfections (`SensorModel`) its data has; the rest zeroed
NOISE_PARTS = {"robot": ("position_noise", "rotation_noise", "latency", "jitter", "drop_rate"), "none": (),
               "pose": ("position_noise", "rotation_noise"), "timing": ("latency", "jitter", "drop_rate"),
               "jitter": ("jitter",), "latency": ("latency",), "drops": ("drop_rate",)}


def cable_sensors(args) -> Optional[tuple]:
    """`record`'s ``cables``: (encoder noise or None, load cell noise or None), or None."""
    if args.encoders == "off" and args.tension == "off":
        return None
    return (args.rest_length_noise if args.encoders == "on" else None,
            args.tension_noise if args.tension == "on" else None)


def cable_weights(args, sensing: SensorModel) -> dict:
    """The identifier's ``rest_length_weight`` and ``tension_weight`` of a run (0 without the
    sensor; by default the mocap's position noise, at least `WEIGHT_FLOOR_NOISE`, over its)."""
    position = max(sensing.position_noise, WEIGHT_FLOOR_NOISE)
    out = {}
    for name, on, noise, floor in (("rest_length_weight", args.encoders, args.rest_length_noise, 1e-6),
                                   ("tension_weight", args.tension, args.tension_noise, 1e-3)):
        given = getattr(args, name)
        out[name] = 0.0 if on == "off" else given if given is not None else position / max(noise, floor)
    return out


def sensing_for(z, noise: str) -> SensorModel:
    """The zoo robot ``z``'s mocap with only the imperfections ``noise`` names (`NOISE_PARTS`)."""
    return dataclasses.replace(z.sensing, **{f: 0.0 for f in NOISE_PARTS["robot"] if f not in NOISE_PARTS[noise]})


def record(z, seed: int, duration: float, noise: str, gyro_noise: Optional[float] = None,
           excitation: str = "multisine", band=DEFAULT_BAND, cables: Optional[tuple] = None):
    """The robot's run: command events [(stamp ns, targets)] and mocap events
    [(stamp ns, poses [R, 7])], in time order of their stamps, and its chaos floor (m).
    ``noise``: the mocap's imperfections it has (`NOISE_PARTS`).
    ``gyro_noise`` (rad/s) not None: every rod's IMU too, with every pose (events
    [(stamp ns, (rod, body-frame angular velocity, orientation))]).
    ``cables`` (rest length noise m or None, tension noise N or None) not None: the winches'
    encoders and / or every cable's load cell too, with every pose (events [(stamp ns, (rest
    lengths [C] or None, tensions [C] or None))], NaN where a cable has no encoder; their
    noise drawn apart, so the poses are the same either way)."""
    robot = z.nominal
    excite = ExcitationPolicy(robot, seed=seed, kind=excitation, amplitude=0.8, control_dt=CONTROL_DT,
                              freq_range=band)
    n_cmd = int(round(duration / CONTROL_DT)) + 2
    held = int(round(CONTROL_DT / robot.dt))
    cmd = excite.command_at(np.arange(n_cmd) * CONTROL_DT)
    rs, act = rest_pose(z.truth, realisation=z.realisation)
    steps = np.repeat(cmd, held, 0)
    sensing = sensing_for(z, noise)
    if gyro_noise is not None:
        sensing = dataclasses.replace(sensing, gyro_noise=gyro_noise)
    if cables is not None:
        sensing = dataclasses.replace(sensing, rest_length_noise=cables[0] or 0.0, tension_noise=cables[1] or 0.0)
    stamps = np.arange(1, n_cmd) * CONTROL_DT
    with z.twin(floor=True, nthread=1) as twin:
        states, acts = twin.rollout(rs, act, steps)
        dense = np.concatenate([rs[None], states[0]])          # t = k dt
        dense_act = np.concatenate([np.asarray(act)[None], acts[0]])
        floor = chaos_floor(z, twin, dense, dense_act, steps)
        kept, poses, seen = sensing.measure_at(dense, robot.dt, stamps, np.random.default_rng(seed + 7),
                                               gyro=gyro_noise is not None)
        readings = None if cables is None else sensing.measure_cables(
            twin.rest_lengths(dense_act[seen]), twin.cable_tensions(dense[seen], dense_act[seen]),
            np.random.default_rng(seed + 11), actuated=robot.cable_actuated)
    events = [(int(round(k * CONTROL_DT * NS)), "cmd", cmd[k]) for k in range(n_cmd)]
    events += [(int(round(t * NS)), "pose", p[:, :7]) for t, p in zip(kept, poses)]
    if gyro_noise is not None:     # the IMU reports in its rod's frame, with its orientation
        body = quat_rotate(quat_conjugate(poses[..., QUAT]), poses[..., ANG_VEL])
        events += [(int(round(t * NS)), "imu", (r, b[r], p[r, QUAT])) for t, p, b in zip(kept, poses, body)
                   for r in range(p.shape[0])]
    if readings is not None:
        rest, tension = readings
        events += [(int(round(t * NS)), "cables", (r if cables[0] is not None else None,
                                                   f if cables[1] is not None else None))
                   for t, r, f in zip(kept, rest, tension)]
    events.sort(key=lambda e: (e[0], e[1] != "cmd"))
    return events, floor


def chaos_floor(z, twin, dense: np.ndarray, acts: np.ndarray, steps: np.ndarray) -> float:
    """The yardstick of the CoM error 1 s ahead on a rolling robot: the mean CoM gap after
    1 s between the robot restarted from every whole second of its run and itself restarted
    there with every velocity 1 % larger (``dense`` [S+1, R, 13] and ``acts`` [S+1, A] at
    t = k dt, ``steps`` [S, A] its commands; as `bench/zoo.py`'s: both restarted, so what a
    restart loses, MuJoCo's warm start, is in neither)."""
    span = int(round(HOLDOUT_SECONDS / z.truth.dt))
    starts = np.arange(span, dense.shape[0] - span, span)
    if starts.size == 0:
        return math.nan
    cmd = np.stack([steps[k:k + span] for k in starts])
    return float(kicked_com_gaps(twin, dense[starts], acts[starts], cmd, z.truth.rod_mass, [span]).mean())


def shared_like(truth, model):
    """``truth`` in the shape of the model's value: its mean where the model shares one."""
    truth = np.asarray(truth, dtype=np.float64)
    return np.full(np.shape(model), truth.mean()) if np.size(model) == 1 and truth.size > 1 else truth


def relative_errors(values: dict, truth: dict, names) -> dict:
    return {n: float(np.mean(values[n]) / np.mean(truth[n]) - 1.0) for n in names}


def model_robot(z, law: str, integrator: str = "config"):
    """The robot's model: the config, under ``law`` and stepped by ``integrator`` (the truth
    keeps its own)."""
    robot = z.nominal
    if law != "config" and law != robot.contact.law:
        robot = robot.replace(contact=dataclasses.replace(robot.contact, law=law))
    if integrator != "config":
        robot = robot.replace(integrator=integrator)
    return robot


def truth_information(trainer, truth: dict, names) -> Optional[dict]:
    """The training data's information at the robot's true values in the model's structure
    (`uncertainty.data_information`; learnt values without a truth, the contact's, as
    published): each name's Gauss-Newton 1-sigma of its mean under independent residuals
    (correlations between elements taken in) relative to the true mean, and the residual scale
    there; None where the windowed problem fails there or the trainer has no pose-only windows.
    Where the model is the robot this estimates the Cramer-Rao bound of these data (an
    efficient fit: a median |error| of 0.67 sigma)."""
    try:
        u = data_information(trainer, truth)
    except RuntimeError:
        return None
    return {"sigma": {n: u.mean_sigma(n) / abs(float(np.mean(truth[n]))) for n in names},
            "residual_sigma": u.residual_sigma}


# points of the line from the published values (0) to the robot's (1) the training objective
# is scored at with --profile on (0 and 1 are the bench's own scores; 1.25: beyond the robot)
PROFILE_POINTS = (0.25, 0.5, 0.75, 1.25)


def line_values(start: dict, end: dict, s: float) -> dict:
    """The values a share ``s`` of the way from ``start`` to ``end`` (each name of ``end``):
    geometric where both ends are positive (stiffness, time constants: the solver's log
    scales), linear otherwise; the other names as in ``start``."""
    out = dict(start)
    for name, b in end.items():
        a, b = np.asarray(start[name], float), np.asarray(b, float)
        out[name] = (np.exp((1 - s) * np.log(a) + s * np.log(b)) if bool((a > 0).all() and (b > 0).all())
                     else (1 - s) * a + s * b)
    return out


def _line_points(profile: list) -> list:
    """A profile's finite points up to the robot's values (s <= 1)."""
    return [(s, f) for s, f in profile if s <= 1.0 and math.isfinite(f)]


def ridge(profile: list) -> Optional[float]:
    """The first point of ``profile`` ((s, objective) pairs in s order, up to s = 1) where the
    objective rises above its predecessor by more than rounding *before* the line's lowest
    point: a ridge between the published values and the lowest point toward the robot's;
    None where it falls from the published values to that lowest point (a local solver could
    have gone on downhill; a rise after the lowest point is where the line passes the
    objective's minimum short of the robot)."""
    points = _line_points(profile)
    if not points:
        return None
    lowest = min(range(len(points)), key=lambda i: points[i][1])
    for (_, before), (s, f) in zip(points[:lowest], points[1:lowest + 1]):
        if f > before * (1 + 1e-9):
            return s
    return None


def line_lowest(profile: list) -> float:
    """Where along the line (s up to 1) the objective is lowest."""
    points = _line_points(profile)
    return min(points, key=lambda p: p[1])[0] if points else math.nan


def training_objective(trainer, values: dict, width: int, max_windows: int = 256) -> float:
    """The solver's pose-only objective for ``values`` on the session's training window
    (`acceptance.window_fit`, summed; NaN without windows)."""
    fit = window_fit(trainer, values, width, max_windows)
    return float(fit.sum()) if fit.size else math.nan


def feed(aligner: StreamAligner, event) -> None:
    """One recorded event (`record`) to the node's aligner."""
    stamp, kind, value = event
    if kind == "imu":
        aligner.add_imu(stamp, *value)
    elif kind == "cables":
        aligner.add_cable_states(stamp, *value)
    else:
        (aligner.add_command if kind == "cmd" else aligner.add_pose)(stamp, value)


def fresh_tuples(aligner: StreamAligner, events) -> Optional[TupleBatch]:
    """The tuples of the stream's remaining ``events`` (fed to ``aligner`` in order); None
    if they make none."""
    for event in events:
        feed(aligner, event)
    return aligner.pop_tuples()


class WorkerClock:
    """Seconds of the identifier's worker: wall seconds, or (``work``) the native kernel's
    rod-steps at their reference cost (`physics.work`: the same on any machine, at any load,
    so a seed runs the same way twice). Training counts what it spent; waiting for data, at
    least a control period per pass (the node's idle ticks)."""

    def __init__(self, kind: str):
        self.kind, self.total = kind, 0.0
        self.spent = {"wall": 0.0, "work": 0.0}        # both, over the passes: the calibration
        self.start()

    def start(self) -> None:
        self.marks = {"wall": time.perf_counter(), "work": METER.seconds}

    def now(self) -> float:
        current = time.perf_counter() if self.kind == "wall" else METER.seconds
        return self.total + current - self.marks[self.kind]

    def close(self, training: bool) -> float:
        """This pass's seconds; the worker's total advances by them (or a tick)."""
        ends = {"wall": time.perf_counter(), "work": METER.seconds}
        for k in ends:
            self.spent[k] += ends[k] - self.marks[k]
        spent = ends[self.kind] - self.marks[self.kind]
        self.total += spent if training else max(spent, CONTROL_DT)
        self.marks = ends
        return spent


def run_session(z, args, seed: int, learn) -> dict:
    robot = model_robot(z, args.law, args.integrator)
    if args.masses == "weighed":          # the user weighed the rods: the config has their masses
        robot = robot.replace(rod_mass=z.truth.rod_mass.copy())
    if args.geometry == "measured":       # and measured them: the capsules' radii
        robot = robot.replace(rod_radius=z.truth.rod_radius.copy())
    if args.motors == "measured":         # a motor's step response on the bench gave its time constant
        robot = robot.replace(actuator=dataclasses.replace(robot.actuator,
                                                           time_constant=float(z.truth.actuator.time_constant)))
    sensing = sensing_for(z, args.noise)
    if "latency" in NOISE_PARTS[args.noise] and args.latency == "declared":   # the mocap's data sheet
        robot = robot.replace(actuator=dataclasses.replace(robot.actuator, delay=sensing.latency))
    # the robot runs on for --fresh s after the session stops: data neither the solver nor the
    # gate saw, on which every model is scored (the gate's own blocks favour the model it
    # picked on them)
    events, floor = record(z, seed, args.duration + args.fresh, args.noise,
                           None if args.imu == "off" else args.gyro_noise, args.excitation, args.excitation_band,
                           cable_sensors(args))
    cfg = IdentificationConfig(period=CONTROL_DT, learn=learn, init=args.init, seed=seed,
                               schedule=args.schedule, lm_windows=args.lm_windows, pose_window=args.pose_window,
                               chain_latents=args.chain_latents == "on", window_refresh=args.window_refresh,
                               gyro_weight=args.gyro_weight if args.imu == "on" else 0.0,
                               **cable_weights(args, sensing),
                               motor_settle=args.motor_settle, per_element=args.per_element,
                               windows_from=args.windows_from, latent_jacobian_reuse=args.latent_jacobian_reuse,
                               latent_restart_every=args.latent_restart_every)
    worker = WorkerClock(args.clock)
    session = OnlineIdentification(robot, cfg, min_tuples=args.min_tuples, max_tuples=args.max_tuples,
                                   compute_clock=worker.now,     # the challenger's share of the worker
                                   floor=True, holdout_every=args.holdout_every,
                                   structure_options=args.structure_options, follow_pins=args.follow_pins == "on",
                                   log=(lambda m: _line(f"    [{z.name} {seed}] {m}")) if args.verbose else (lambda m: None))
    aligner = StreamAligner(StreamConfig.for_robot(robot, interval=CONTROL_DT))
    truth = z.true_values(sensed=sensing.latency > 0)
    tol = 0.05 if dataclasses.replace(sensing, gyro_noise=0.0).ideal else 0.10     # the targets
    clock, i_event = 0.0, 0
    pacing = GatePacing(args.publish_interval, clock=worker.now)     # the node's pacing of the gate
    trace = []                        # (sim time, published values, sigma) per publication
    candidate_trace = []              # (sim time, the trainer's values) per epoch
    published, sigma, spread, full, shift, undetermined, at_bound, reverts = None, None, None, None, None, (), (), 0
    full_elements = None
    compensating = ()                 # learnt values pinned at a bound that void the published sigma
    converged_at = []                 # sim times at which the solver ended by its convergence test
    while clock < args.duration:
        while i_event < len(events) and events[i_event][0] <= clock * NS:
            feed(aligner, events[i_event])
            i_event += 1
        worker.start()
        new = aligner.pop_tuples()
        if new is not None:
            session.add(new)
        finished = False
        if session.training:
            structure = session.robot
            improved = session.step()
            if session.robot is not structure:      # as the node: older candidates were fitted
                pacing.drop()                       # in the structure that was replaced
            if args.verbose:
                m = session.last_metrics
                _line(f"    t={clock:5.1f}s epoch {m.get('epoch')} {m.get('stage')} loss {m.get('val_loss', 0):.3e} "
                      f"{m.get('seconds', 0):.2f}s settled {math.nan if m.get('settled_sigmas') is None else m['settled_sigmas']:.3g} sigma "
                      f"{session.trainer.format_parameters()}")
            candidate_trace.append((clock, session.trainer.parameters.as_dict()))
            if improved is not None:
                pacing.offer(improved)
        elif session.finished:             # as the node: the final values are gated at once
            pacing.drop()
            again = session.judging_end_again        # an end taken before, judged now
            pacing.offer(session.finish())
            finished = True
            if session.status == "converged" and not again:     # the solver's convergence test passed
                converged_at.append(clock)
        judged = pacing.gate(lambda candidate: session.gate(candidate[1]), force=finished)
        improved = None
        if judged is not None:
            improved, verdict = judged
        if improved is not None:
            _, values = improved
            if args.verbose:
                _line(f"    t={clock:5.1f}s gate: {verdict.reason} (held-out loss {verdict.candidate_loss:.3e} against "
                      f"{verdict.incumbent_loss:.3e}, {verdict.tuples} tuples)")
            if verdict.accepted:
                session.mark_published(values)
                pacing.published()
                published = values
                u = session.uncertainty(max_tuples=64, at=values)
                # a per-element value is scored as its mean, with the sigma its elements' sigmas give it
                sigma = None if u is None else _mean_sigmas(u.sigma)
                spread = None if u is None or not u.sigma_spread else _mean_sigmas(u.sigma_spread)
                full_elements = None if u is None else u.published()
                full = None if u is None else _mean_sigmas(full_elements)
                shift = None if u is None or not u.sigma_structure else _mean_sigmas(u.sigma_structure)
                undetermined = () if u is None else u.undetermined
                at_bound = () if u is None else u.at_bound
                compensating = () if u is None else u.compensating
                trace.append((clock, values, sigma))
            elif verdict.revert:                 # as the node: the config's values again
                session.mark_published(None)
                published = sigma = spread = full = shift = full_elements = None
                undetermined = at_bound = compensating = ()
                reverts += 1
                trace.append((clock, PhysicalParameters(robot).as_dict(), None))
        if args.clock == "work" and session.trainer is not None and session.trainer.objective.native is None:
            raise SystemExit("--clock work counts the native kernel's rollouts, and this model rolls out in torch")
        spent = worker.close(session.training)
        clock += spent / args.compute_per_sim_second if session.training else max(spent, CONTROL_DT)
    # where the worker's compute went in the session (not the scoring below)
    work = {**session.work.snapshot(), "other": max(worker.spent[args.clock] - session.work.total(), 0.0)}
    fresh = fresh_tuples(aligner, events[i_event:])
    nominal = PhysicalParameters(robot).as_dict()
    final = published if published is not None else nominal
    # CoM error 1 s ahead (the gate's measure) on the fresh data of the config, the published model,
    # the robot's true values of the learnt parameters in the model's structure (the rest as
    # published: a zoo robot's contacts are MuJoCo's own) and all its true values (inertia
    # factor, slack damping, winch speed too: what structure options could buy). Beside
    # them the training objective (pose windows, start velocities fitted) of the published
    # and the true learnt values: which the solver's objective prefers.
    com = {k: math.nan for k in ("nominal", "identified", "true", "true_all")}
    gate_com = {"identified": math.nan, "true": math.nan}     # the same on the gate's blocks
    information = None                 # `truth_information`, with --information on
    objective = {"identified": math.nan, "true": math.nan, "true_contact": math.nan}
    if session.heldout and session.trainer is not None:
        # from the session's end in sim time (its last epoch overshoots it by a varying
        # amount): every arm of an A/B is scored on the same tuples
        fresh = None if fresh is None else unseen_tuples(session, fresh, since_ns=int(round(args.duration * NS)))
        # in the model's structure: a value the model shares gets the mean of the robot's own
        # (a per-cable truth here would be a richer structure: stiff_light's +-20 % spread fits
        # the training windows far better than any shared value, which is no solver's fault)
        true_learnt = {**final, **{n: shared_like(truth[n], final[n]) for n in learn if n in truth and n in final}}
        true_all = {**final, **{n: v for n, v in truth.items() if n in final}}
        for name, values in (("nominal", nominal), ("identified", final), ("true", true_learnt),
                             ("true_all", true_all)):
            # each in its structure: the config's, the published model's
            structure = session.config_robot if name == "nominal" else session.incumbent_robot
            if fresh is not None:          # scored: a model that diverged on them is the largest error
                com[name] = session.heldout_scores(values, structure, data=fresh)[1]
                com[name] = com[name] if math.isfinite(com[name]) else math.inf
            if name in gate_com:
                gate_com[name] = session.heldout_scores(values, structure)[1]
        if structure_key(session.incumbent_robot) == structure_key(session.robot):   # the trainer's structure
            # also with the robot's own ground contact in the soft law's values (MuJoCo's solref):
            # the fitted contact can make up for the rest, so the true learnt values alone do not
            # say whether the objective's minimum lies at the robot
            own_contact = {n: v for n, v in z.true_contact().items() if n in final}
            robots = {**true_learnt, **own_contact} if own_contact else None
            for name, values in (("identified", final), ("true", true_learnt), ("true_contact", robots)):
                if values is not None:
                    objective[name] = training_objective(session.trainer, values, cfg.pose_window)
            if args.profile == "on":
                # the straight line to the robot's values (with its own contact where the model
                # has one): whether the objective falls all the way there, or a ridge lies between
                end = robots or true_learnt
                moving = {n: end[n] for n in end if n in learn or n in own_contact}
                ends = {0.0: objective["identified"],
                        1.0: objective["true_contact"] if robots else objective["true"]}
                objective["profile"] = sorted(
                    [*ends.items(), *((s, training_objective(session.trainer, line_values(final, moving, s),
                                                             cfg.pose_window)) for s in PROFILE_POINTS)])
            if args.information == "on":
                information = truth_information(session.trainer, true_learnt, [n for n in TARGETS if n in learn])
    reported = [n for n in TARGETS if n in learn]
    err = relative_errors(final, truth, reported)
    # the sigma of the published values estimated again on the session's last window: what the
    # node publishes with them when a finish ties them (`identifier_node.ties_published`)
    at_end = session.uncertainty(max_tuples=64, at=published) if published is not None else None
    full_at_end = None if at_end is None else _mean_sigmas(at_end.published())
    # the motors' lag plus the cables' (tau + c / k): what commanded motion determines, where
    # their split may not be (`lag_split`)
    lags = {name: motor_and_cable_lags(v) for name, v in (("identified", final), ("true", truth))}
    lag_sum_error = (math.nan if None in lags.values() or "cable_damping" not in learn
                     or "actuator_time_constant" not in learn
                     else sum(lags["identified"]) / sum(lags["true"]) - 1.0)
    within = None                     # sim time from which every published value stays within tol
    for t, values, _ in trace:
        ok = all(abs(e) <= tol for e in relative_errors(values, truth, reported).values())
        within = (within if within is not None else t) if ok else None
    cand = relative_errors(candidate_trace[-1][1], truth, reported) if candidate_trace else {}
    def within_2(s: Optional[dict], names=reported, true=truth) -> dict:
        return {n: (s is not None and math.isfinite(s.get(n, math.inf))
                    and abs(np.mean(final[n]) - np.mean(true[n])) <= 2 * s[n]) for n in names}
    # the contact values the published model learnt (a penalty model's time constant and
    # damping ratio are the config's, and not the ones it uses)
    contact_truth = z.true_contact()
    contact_names = [n for n in CONTACT_TARGETS if published is not None and n in (sigma or {})]
    def claimed(names) -> dict:          # the published sigma is finite: a claim the truth can miss
        return {n: full is not None and math.isfinite(full.get(n, math.inf)) for n in names}
    contact = {"names": contact_names, "error": relative_errors(final, contact_truth, contact_names),
               "nominal_error": relative_errors(nominal, contact_truth, contact_names),
               "covered_published": within_2(full, contact_names, contact_truth), "claimed": claimed(contact_names)}
    return {"robot": z.name, "seed": seed, "compute": dict(worker.spent), "work": work, "error": err, "candidate_error": cand, "sigma": sigma, "chaos_floor": floor,
            "nominal_error": relative_errors(nominal, truth, reported), "heldout_com_1s": com,
            "gate_com_1s": gate_com, "fresh_seconds": args.fresh,
            "training_objective": objective, "lag_sum_error": lag_sum_error, "lags": lags, "information": information,
            "relative_sigma": None if sigma is None else {n: sigma[n] / abs(np.mean(final[n])) for n in reported},
            "all_errors": relative_errors(final, truth, [n for n in learn if n in truth and n != "actuator_delay"]), "undetermined": undetermined, "at_bound": at_bound,
            "delay_ms": (1e3 * float(np.mean(final["actuator_delay"])), 1e3 * float(np.mean(truth["actuator_delay"]))),
            "covered": within_2(sigma), "covered_spread": within_2(spread), "covered_published": within_2(full),
            "elements_covered": {n: c for n in reported if full_elements is not None and n in full_elements
                                 and (c := elements_covered(final[n], truth[n], full_elements[n])) is not None},
            "claimed": claimed(reported), "compensating": compensating,
            "covered_at_end": within_2(full_at_end),
            "claimed_at_end": {n: full_at_end is not None and math.isfinite(full_at_end.get(n, math.inf))
                               for n in reported},
            "relative_shift": None if shift is None else {n: shift[n] / abs(np.mean(final[n])) for n in reported},
            "relative_spread": None if spread is None else {n: spread[n] / abs(np.mean(final[n])) for n in reported},
            "within_tol_from": within, "tol": tol, "publications": len(trace), "reverts": reverts,
            "epochs": session.epochs, "status": session.status, "tuples": session.window_len,
            "converged_at": converged_at,
            "structure": list(session.trials.adopted), "structure_log": list(session.trials.log),
            "published_structure": list(structure_key(session.incumbent_robot)), "contact": contact}


def truth_specs(part: str) -> list[str]:
    """One ``--truth`` item as ground-truth specs: ``zoo`` (all its robots), ``random/A-B``
    (the robots drawn from seeds A..B), or itself."""
    if part == "zoo":
        return [ZOO_PREFIX + n for n in zoo_names()]
    if part.startswith(RANDOM_PREFIX) and "-" in part:
        first, _, last = part[len(RANDOM_PREFIX):].partition("-")
        if not (first.isdigit() and last.isdigit() and int(first) <= int(last)):
            raise SystemExit(f"--truth {part!r}: drawn robots are random/<seed> or random/<first>-<last>")
        return [f"{RANDOM_PREFIX}{i}" for i in range(int(first), int(last) + 1)]
    return [part]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--robot", default="superball")
    ap.add_argument("--truth", default="zoo", help="comma-separated: twin, zoo/<name>, or 'zoo' (all)")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--first-seed", type=int, default=0, help="seeds first-seed .. first-seed + seeds - 1")
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--fresh", type=float, default=20.0, help="s the robot runs on after the session stops: "
                    "the CoM errors 1 s ahead are scored on these data, which neither the solver nor the gate saw (0: none, NaN)")
    ap.add_argument("--noise", choices=tuple(NOISE_PARTS), default="robot",
                    help="the robot's mocap imperfections in its data: all, none, or one part (pose noise; "
                    "latency, stamp jitter and dropped frames; one of those alone)")
    ap.add_argument("--init", choices=("given", "random", "given+random"), default="given")
    ap.add_argument("--schedule", default="online")
    ap.add_argument("--law", choices=("config", "penalty", "soft"), default="config",
                    help="the model's ground contact law (config: the robot YAML's contact.law)")
    ap.add_argument("--integrator", choices=("config",) + MODEL_INTEGRATORS, default="config",
                    help="the model's integrator (config: the robot YAML's engine.integrator)")
    ap.add_argument("--learn", default=None, help=f"comma-separated (default {','.join(LEARN)}, the "
                    "law's normal contact values and sliding friction, and rod_mass with --masses learnt)")
    # measured by default, as the masses are weighed: a user's robot YAML has the capsules'
    # radii. spring_driven (rods 0.6x as thick) seeds 0-1 with the config's radii: K / c /
    # tau -0.4 / -8.7 / +12.1 and -1.2 / -14.7 / +16.5 %, the true values predicting the fresh
    # data worse than the fit (15.4 / 28.9 against 13.0 / 20.0 mm 1 s ahead: the contact's
    # geometry was the mismatch); with the robot's: +3.6 / -1.6 / +7.1 and +0.2 / -2.7 / +2.9 %,
    # the true values better (4.4 / 5.4 against 8.9 / 8.8 mm)
    ap.add_argument("--geometry", choices=("measured", "config"), default="measured",
                    help="measured: the model has the robot's rod radii (a ruler gives them); config: the config's")
    ap.add_argument("--masses", choices=("weighed", "learnt"), default="weighed",
                    help="weighed: the config has the robot's rod masses (pose-only data without known "
                    "forces cannot fix the force scale, see scale.py); learnt: they are identified too")
    # what the identifier's lag-split warning asks for: poses fix the sum of the motors' lag
    # and the cables' c/k (`identification.lag_split`), a bench step response the first
    ap.add_argument("--motors", choices=("learnt", "measured"), default="learnt",
                    help="measured: the config has the robot's motor time constant (a step response on the "
                    "bench gives it) and actuator_time_constant is not learnt; learnt: identified from the poses")
    ap.add_argument("--latency", choices=("declared", "learnt"), default="declared",
                    help="declared: the config carries the mocap's latency as actuator.delay (a data "
                    "sheet or a timing test gives it); learnt: actuator_delay is identified from 0")
    ap.add_argument("--structure", default=",".join(DEFAULT_STRUCTURE_OPTIONS),
                    help="comma-separated structure options the session tries online beside the solver "
                    f"({', '.join(ONLINE_OPTIONS)}; default, as the identifier node's: "
                    f"{','.join(DEFAULT_STRUCTURE_OPTIONS)}: soft_contact changes nothing under the soft law; "
                    "'none': the robot YAML's structure)")
    ap.add_argument("--follow-pins", choices=("on", "off"), default="on",
                    help="as the identifier node's structure_on_pin: a value the fit pins at a bound of its range "
                    "(at its end, or PIN_EPOCHS epochs in a row) has the option it points to tried next, not "
                    "refused early (PIN_OPTIONS)")
    ap.add_argument("--information", choices=("off", "on"), default="off",
                    help="on: after each session, how well its training data determine the robot's true values "
                    "in the model's structure (every window, the latents fitted there: the Gauss-Newton 1-sigma "
                    "under independent residuals, uncertainty.data_information); where the model is the robot, "
                    "an estimate of the Cramer-Rao bound. Costs a Jacobian over all the data per run")
    ap.add_argument("--profile", choices=("off", "on"), default="off",
                    help="on: after each session, the training objective along the straight line from the "
                    "published values to the robot's (its true learnt values, with its own contact where the model "
                    "has one; geometric in positive values), at s = 0.25, 0.5, 0.75 and 1.25 beside the bench's 0 "
                    "and 1: whether the objective falls all the way to the robot or a ridge lies between. Four "
                    "window fits more per run")
    ap.add_argument("--min-tuples", type=int, default=30)
    ap.add_argument("--max-tuples", type=int, default=1500)
    ap.add_argument("--holdout-every", type=int, default=5)
    ap.add_argument("--clock", choices=("wall", "work"), default="wall",
                    help="what the identifier's compute is measured in: wall seconds (what a robot "
                         "gets from this machine now), or the native kernel's rollout work at fixed "
                         "reference costs (physics.work: a seed runs the same on any machine and load, "
                         "for A/B comparisons)")
    ap.add_argument("--publish-interval", type=float, default=1.0,
                    help="as the identifier node's min_publish_interval: s of the worker's time between "
                         "publications (the gate also idles 4x its own duration: gate_pacing)")
    ap.add_argument("--lm-windows", type=int, default=256, help="as the identifier node's lm_windows")
    ap.add_argument("--pose-window", type=int, default=IdentificationConfig().pose_window, help="as the identifier node's "
                    "pose_window: tuples per multiple-shooting window")
    ap.add_argument("--chain-latents", choices=("on", "off"), default="on",
                    help="new pose windows start from their predecessor's predicted end velocity "
                    "(IdentificationConfig.chain_latents)")
    ap.add_argument("--windows-from", choices=WINDOWS_FROM, default=IdentificationConfig().windows_from,
                    help="pose-only: the windowed stage starts from the finite-difference fit or the start values")
    ap.add_argument("--window-refresh", type=float, default=IdentificationConfig().window_refresh,
                    help="a running windowed stage restarts on all the data once it has grown this many "
                    "times (IdentificationConfig.window_refresh; 0: only after its end)")
    ap.add_argument("--latent-jacobian-reuse", type=int, default=IdentificationConfig().latent_jacobian_reuse,
                    help="iterations a pose window's latent Jacobian is reused "
                    "(IdentificationConfig.latent_jacobian_reuse; 1: afresh at each)")
    ap.add_argument("--latent-restart-every", type=int, default=IdentificationConfig().latent_restart_every,
                    help="each iteration, one pose window in this many has its start velocity fitted afresh and "
                    "takes it where it fits better (IdentificationConfig.latent_restart_every; 0: never)")
    ap.add_argument("--imu", choices=("off", "on"), default="off",
                    help="on: every rod's gyro too, with every pose (the sim2sim's bridge does; the targets are pose-only)")
    ap.add_argument("--gyro-noise", type=float, default=None,
                    help=f"rad/s per axis (default {GYRO_NOISE} with --noise robot, else 0)")
    ap.add_argument("--gyro-weight", type=float, default=1.0,
                    help="with --imu on: as the identifier node's gyro_weight (its default 0 leaves the IMU unused)")
    ap.add_argument("--tension", choices=("off", "on"), default="off",
                    help="on: every cable's load cell too, with every pose (the targets are pose-only)")
    ap.add_argument("--tension-noise", type=float, default=TENSION_NOISE, help="N per cable, with --tension on")
    ap.add_argument("--tension-weight", type=float, default=None,
                    help="m/N, with --tension on: as the identifier node's tension_weight (default: the mocap's "
                         f"position noise, at least {WEIGHT_FLOOR_NOISE * 1e3:g} mm, over the tension noise)")
    ap.add_argument("--encoders", choices=("off", "on"), default="off",
                    help="on: every winch's encoder (its cable's rest length) too, with every pose")
    ap.add_argument("--rest-length-noise", type=float, default=REST_LENGTH_NOISE,
                    help="m per winch, with --encoders on")
    ap.add_argument("--rest-length-weight", type=float, default=None,
                    help="with --encoders on: as the identifier node's rest_length_weight (default: the mocap's "
                         "position noise over the encoder's)")
    ap.add_argument("--motor-settle", type=float, default=IdentificationConfig().motor_settle,
                    help="as IdentificationConfig.motor_settle (0: windows from a stream's first command on)")
    ap.add_argument("--per-element", default="", help="comma-separated learnt names identified per cable / per "
                    "rod (as the identifier node's per_element)")
    ap.add_argument("--excitation", choices=KINDS, default="multisine",
                    help="the excitation the robot runs (`ExcitationPolicy` kind; the controller node's "
                         "excitation_kind)")
    ap.add_argument("--excitation-band", type=_band, default=DEFAULT_BAND, metavar="FMIN,FMAX",
                    help="the excitation's band in Hz (the controller node's excitation_fmin / excitation_fmax)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default="runs/bench_online")
    ap.add_argument("--verbose", action="store_true")
    ap.add_argument("--compute-per-sim-second", type=float, default=1.0,
                    help="wall seconds of identification per second of robot time (1: real time on this "
                    "machine; more: a faster machine, or a loaded one)")
    args = ap.parse_args(argv)
    if args.gyro_noise is None:
        args.gyro_noise = GYRO_NOISE if "position_noise" in NOISE_PARTS[args.noise] else 0.0
    args.structure_options = online_options([n for n in args.structure.split(",") if n and n != "none"])
    args.per_element = tuple(n for n in args.per_element.split(",") if n)
    torch.set_num_threads(args.threads)
    robot = load_robot(args.robot)
    specs = [s for part in args.truth.split(",") for s in truth_specs(part)]
    law = robot.contact.law if args.law == "config" else args.law
    learn = resolve_learn(args.learn.split(",") if args.learn
                          else default_learn(law) + (("rod_mass",) if args.masses == "learnt" else ()), law)
    if args.motors == "measured":
        learn = tuple(n for n in learn if n != "actuator_time_constant")
    if args.latency == "learnt" and "actuator_delay" not in learn:
        learn += ("actuator_delay",)
    if args.latent_jacobian_reuse < 1:
        ap.error("--latent-jacobian-reuse must be >= 1")
    if args.latent_restart_every < 0:
        ap.error("--latent-restart-every must be >= 0")
    if unknown := [n for n in args.per_element if n not in learn]:
        ap.error(f"--per-element: {', '.join(unknown)} not learnt (learn: {', '.join(learn)})")
    _line(f"machine: {machine()}")
    _line(f"online identification of {', '.join(learn)} on {args.robot}: {args.duration:g} s of sim time, "
          f"contact law {law}, masses {args.masses}, rod radii {args.geometry}, motors' time constant {args.motors}, noise {args.noise}, latency {args.latency}, init {args.init}, schedule {args.schedule}, pose windows of {args.pose_window} from {args.windows_from} (latents chained: {args.chain_latents}, latent blocks reused {args.latent_jacobian_reuse}x, latent restarts 1 in {args.latent_restart_every or 'never'}, windows redrawn at {args.window_refresh:g}x, "
          f"none in the first {args.motor_settle:g} motor time constants), "
          f"gyros {args.imu}" + (f" (noise {args.gyro_noise} rad/s, weight {args.gyro_weight:g})" if args.imu == "on" else "")
          + f", load cells {args.tension}" + (f" (noise {args.tension_noise:g} N, weight "
                                               f"{'position noise / tension noise' if args.tension_weight is None else f'{args.tension_weight:g} m/N'})"
                                               if args.tension == "on" else "")
          + f", encoders {args.encoders}" + (f" (noise {args.rest_length_noise * 1e3:g} mm, weight "
                                             f"{'position noise / encoder noise' if args.rest_length_weight is None else f'{args.rest_length_weight:g}'})"
                                             if args.encoders == "on" else "")
          + f", {args.excitation} excitation ({args.excitation_band[0]:g}-{args.excitation_band[1]:g} Hz), seeds {args.seeds}, identification compute "
          f"{args.compute_per_sim_second:g} s per sim s on the {args.clock} clock"
          + (f", structure options tried online: {', '.join(args.structure_options)}" if args.structure_options else "")
          + f", options a pinned value points to tried: {args.follow_pins}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for spec in specs:
        z = ground_truth(spec, robot)
        if spec.startswith(RANDOM_PREFIX):          # nobody knows a drawn robot: say what it is
            _line(f"  {z.name}: {z.description}")
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            t0 = time.perf_counter()
            try:
                r = run_session(z, args, seed, learn)
            except GroundTruthDiverged as err:          # the robot itself, not identification
                _line(f"  {z.name:14s} seed {seed}: no run: {err}")
                continue
            results.append(r)
            errs = " ".join(f"{n.split('_')[-1][:5]} {100 * e:+6.1f}%" for n, e in r["error"].items())
            if not r["publications"] and r["candidate_error"]:      # the gate kept the config
                errs += " (unpublished candidate: " + " ".join(
                    f"{100 * e:+.1f}%" for e in r["candidate_error"].values()) + ")"
            sig = ("" if r["relative_sigma"] is None else " sigma " + " ".join(
                f"{100 * s:.1f}%" for s in r["relative_sigma"].values()))
            sig += ("" if r["relative_spread"] is None else " (spread " + " ".join(
                f"{100 * s:.1f}%" for s in r["relative_spread"].values()) + ")")
            sig += ("" if r["relative_shift"] is None else " (horizon shift " + " ".join(
                f"{100 * s:.1f}%" for s in r["relative_shift"].values()) + ")")
            if r["at_bound"]:
                sig += " (at a bound: " + ", ".join(r["at_bound"]) + ")"
            if math.isfinite(r["lag_sum_error"]):
                (tau, cable), (tau_true, cable_true) = r["lags"]["identified"], r["lags"]["true"]
                errs += (f" lag sum tau + c/k {100 * r['lag_sum_error']:+.1f}% (tau {1e3 * tau:.1f} + c/k {1e3 * cable:.1f} ms, "
                         f"true {1e3 * tau_true:.1f} + {1e3 * cable_true:.1f})")
            if "actuator_delay" in learn or args.latency == "declared":
                errs += " delay {:.1f} ms (true {:.1f})".format(*r["delay_ms"])
            c = r["contact"]
            errs += "; contact " + (" ".join(
                f"{CONTACT_LABEL[n]} {100 * c['error'][n]:+.1f}% (config {100 * c['nominal_error'][n]:+.1f}%"
                f"{', 2 sigma covers' if c['covered_published'][n] else ''})" for n in c["names"]) or "not learnt")
            if r["compensating"]:
                sig += " (published with no sigma: every value compensates)"
            if r["information"] is not None:
                sig += ("; the data's 1-sigma at the true values " + " ".join(
                    f"{100 * v:.1f}%" for v in r["information"]["sigma"].values())
                    + f" (residual scale there {r['information']['residual_sigma']:.3g})")
            _line(f"  {z.name:14s} seed {seed}: {errs};{sig}; within {100 * r['tol']:g}% from "
                  f"{r['within_tol_from'] if r['within_tol_from'] is None else round(r['within_tol_from'], 1)} s; "
                  f"CoM 1 s ahead on {args.fresh:g} s of fresh data: nominal {1e3 * r['heldout_com_1s']['nominal']:.1f} / identified "
                  f"{1e3 * r['heldout_com_1s']['identified']:.1f} / true learnt values {1e3 * r['heldout_com_1s']['true']:.1f} / all "
                  f"true values {1e3 * r['heldout_com_1s']['true_all']:.1f} / chaos floor {1e3 * r['chaos_floor']:.1f} mm "
                  f"(on the gate's blocks: identified {1e3 * r['gate_com_1s']['identified']:.1f} / true learnt "
                  f"{1e3 * r['gate_com_1s']['true']:.1f}); "
                  f"training objective identified "
                  f"{r['training_objective']['identified']:.4f} / true learnt {r['training_objective']['true']:.4f} "
                  f"(with the robot's contact {r['training_objective'].get('true_contact', math.nan):.4f}); "
                  + _profile_text(r['training_objective'].get("profile")) +
                  f"{r['publications']} publications ({r['reverts']} to the config), {r['epochs']} epochs, {r['status']}, solver converged "
                  f"{len(r['converged_at'])} times (first at "
                  f"{'-' if not r['converged_at'] else round(r['converged_at'][0], 1)} s); "
                  f"identification {r['compute']['wall']:.0f} s wall, {r['compute']['work']:.0f} s of reference work "
                  f"({work_summary(r['work'])})"
                  + (f", structure {'+'.join(r['structure']) or 'base'}, published in "
                     f"{'/'.join(str(k) for k in r['published_structure'] if k is not None)} (tried: "
                     + ", ".join(f"{o} {v}" for o, v in r["structure_log"]) + ")"
                     if args.structure_options or args.follow_pins == "on" else "")
                  + " "
                  f"({time.perf_counter() - t0:.0f} s wall)")
    _line("")
    reported = [n for n in TARGETS if n in learn]
    _line(f"| robot | {' | '.join(f'{n} identified / nominal' for n in reported)} | CoM error 1 s "
          f"ahead on {args.fresh:g} s of fresh data, nominal / identified / true learnt values / all true values / chaos floor (mm) | 2-sigma coverage: sigma / spread / published (of the finite ones) | within tol by {args.duration:g} s |")
    _line("|---|" + "---|" * (len(reported) + 3))
    for name in dict.fromkeys(r["robot"] for r in results):
        rs = [r for r in results if r["robot"] == name]
        med = lambda key, n: 100 * float(np.median([abs(r[key][n]) for r in rs]))     # noqa: E731
        cells = [f"{med('error', n):.1f} / {med('nominal_error', n):.0f} %" for n in reported]
        com = {k: 1e3 * _median_diverged_last([r["heldout_com_1s"][k] for r in rs])
               for k in ("nominal", "identified", "true", "true_all")}
        chaos = 1e3 * float(np.nanmedian([r["chaos_floor"] for r in rs]))
        cov = [np.mean([r[k][n] for r in rs for n in reported]) for k in ("covered", "covered_spread")]
        cov.append(_claimed_coverage(rs, reported)[0])
        ok = sum(r["within_tol_from"] is not None for r in rs)
        _line(f"| {name} | {' | '.join(cells)} | {com['nominal']:.1f} / {com['identified']:.1f} / {com['true']:.1f} / {com['true_all']:.1f} / {chaos:.1f} | "
              f"{100 * cov[0]:.0f} / {100 * cov[1]:.0f} / {_percent(cov[2])} | {ok}/{len(rs)} |")
    summed: dict = {}
    for r in results:
        for kind, seconds in r["work"].items():
            summed[kind] = summed.get(kind, 0.0) + seconds
    _line(f"the worker's compute within the sessions ({args.clock} clock), over the {len(results)} runs: {work_summary(summed)}")
    lag_runs = [r for r in results if math.isfinite(r["lag_sum_error"])]
    if lag_runs:
        med = lambda key: 100 * float(np.median([abs(r["error"][key]) for r in lag_runs]))    # noqa: E731
        _line(f"the motors' plus the cables' lag (tau + c/k), median |error| over {len(lag_runs)} runs: "
              f"{100 * float(np.median([abs(r['lag_sum_error']) for r in lag_runs])):.1f} % (largest "
              f"{100 * max(abs(r['lag_sum_error']) for r in lag_runs):.1f} %), against cable_damping {med('cable_damping'):.1f} % "
              f"and actuator_time_constant {med('actuator_time_constant'):.1f} %")
    # beyond 10 % and the chaos floor: two fits of the same model differ by a few percent, and
    # a gap below what a 1 % error in the start velocity makes is the start's (the twin: 0.5
    # against 0.8 mm 1 s ahead, floor 1.3 mm)
    com = lambda r, k: r["heldout_com_1s"][k]                               # noqa: E731
    fit = lambda r, k: r["training_objective"][k]                           # noqa: E731
    apart = lambda a, b, r: a > 1.1 * b and a - b > r["chaos_floor"]        # noqa: E731
    better = [r for r in results if apart(com(r, "identified"), com(r, "true"), r)]
    for label, runs, why in (
            ("worse", [r for r in results if apart(com(r, "true"), com(r, "identified"), r)],
             "the model's structure, not the data, keeps the values from the truth"),
            ("better", better, "the model holds better values than the published ones")):
        _line(f"the true learnt values predict the fresh data >10 % (and the chaos floor) {label} than the published model on "
              f"{len(runs)} of {len(results)} runs ({', '.join(sorted({r['robot'] for r in runs})) or 'none'}): "
              + why)
    if better:
        lower = [r for r in better if fit(r, "true") < fit(r, "identified")]
        _line(f"  of those, the true learnt values also fit the training windows better on {len(lower)} "
              f"({', '.join(sorted({r['robot'] for r in lower})) or 'none'}: the solver stopped in a worse "
              f"local minimum) and worse on {len(better) - len(lower)} (the objective prefers the published values)")
    _objective_line(results)
    _profile_line(results)
    # the product's promise: never publish a model that predicts worse than the one it replaced
    worse = [r for r in results if apart(com(r, "identified"), com(r, "nominal"), r)]
    _line(f"the published model predicts the fresh data >10 % (and the chaos floor) worse than the config on "
          f"{len(worse)} of {len(results)} runs ({', '.join(sorted({r['robot'] for r in worse})) or 'none'}), better on "
          f"{sum(apart(com(r, 'nominal'), com(r, 'identified'), r) for r in results)}")
    gain = [r for r in results if apart(com(r, "true"), com(r, "true_all"), r)]
    _line(f"all true values (structure options' included) predict >10 % (and the chaos floor) better than the true learnt ones on "
          f"{len(gain)} of {len(results)} runs ({', '.join(sorted({r['robot'] for r in gain})) or 'none'})")
    for key, label in (("covered", "sigma"), ("covered_spread", "spread sigma")):
        published = [r for r in results if r["sigma"] is not None]
        _line(f"2-{label} coverage over all: {100 * np.mean([r[key][n] for r in results for n in reported]):.0f} % "
              f"(target >= 90 %); over the published models: "
              f"{100 * np.mean([r[key][n] for r in published for n in reported]) if published else math.nan:.0f} %")
    rate, claimed = _claimed_coverage(results, reported)
    voided = [r for r in results if r["compensating"]]
    _line(f"2-published sigma (spread, horizon shift, remaining step: what the node publishes) coverage over the "
          f"values it gave a finite sigma: {_percent(rate) + f' of {claimed}' if claimed else 'none'} "
          f"(target >= 90 %); no finite sigma for "
          f"{len(results) * len(reported) - claimed}, on {len(voided)} runs because a cable, rod or motor value was "
          f"pinned at a bound ({', '.join(sorted({r['robot'] for r in voided})) or 'none'}), whose values were "
          f"covered by 2x the curvature-and-spread sigma on "
          f"{100 * np.mean([r['covered_spread'][n] for r in voided for n in reported]) if voided else math.nan:.0f} %")
    hits = [r["covered_at_end"][n] for r in results for n in reported if r["claimed_at_end"][n]]
    _line(f"the same, the published values' sigma estimated again on the last window (as the node publishes them "
          f"with a finish that ties them): {_percent(float(np.mean(hits))) + f' of {len(hits)}' if hits else 'none'}")
    split = [(r, c) for r in results for c in r["elements_covered"].values()]
    if split:
        hits, given = (sum(c[i] for _, c in split) for i in (0, 1))
        _line(f"per element (values split per cable or rod as the robot's): {hits} of {given} elements given a "
              f"finite sigma within 2 published sigma of their own true value ({_percent(hits / given) if given else 'none'}; "
              f"{len({id(r) for r, _ in split})} runs)")
    _information_table(results, reported)
    _contact_table(results)
    (out / "results.json").write_text(json.dumps(results, indent=1, default=float))
    return 0


CONTACT_LABEL = {"friction_sliding": "friction", "contact_time_constant": "time constant",
                 "contact_damping_ratio": "damping ratio"}


def _objective_line(results: list) -> None:
    """Where the solver's objective has its minimum: the robot's values (the true learnt ones,
    or with the robot's own contact where that is lower) against the published ones on the
    training windows, over every run the trainer's structure published in."""
    def truest(r) -> float:
        values = [v for k in ("true", "true_contact") if math.isfinite(v := r["training_objective"].get(k, math.nan))]
        return min(values) if values else math.nan

    runs = [r for r in results if math.isfinite(r["training_objective"]["identified"]) and math.isfinite(truest(r))]
    short = [r for r in runs if truest(r) < r["training_objective"]["identified"]]
    names = lambda rs: ", ".join(sorted({r["robot"] for r in rs})) or "none"          # noqa: E731
    _line(f"the robot's values (the true learnt ones, or with its own contact) fit the training windows better than "
          f"the published ones on {len(short)} of {len(runs)} runs ({names(short)}: the solver stopped short of the "
          f"objective's minimum) and worse on {len(runs) - len(short)} "
          f"({names([r for r in runs if r not in short])}: the minimum is away from the robot, by noise or structure)")


def _profile_text(profile: Optional[list]) -> str:
    """A run's objective along the line to the robot's values (--profile on), or nothing."""
    if not profile:
        return ""
    at = " ".join(f"{s:g}: {f:.4f}" for s, f in profile)
    where, lowest = ridge(profile), line_lowest(profile)
    shape = (f"a ridge before s = {where:g}" if where is not None else "falls all the way" if lowest == 1.0
             else "lowest at the published values" if lowest == 0.0 else f"falls to its lowest at s = {lowest:g}")
    return f"along the line to the robot's values {at} ({shape}); "


def _profile_line(results: list) -> None:
    """Over the runs with a profile (--profile on) whose robot's values fit the training windows
    better than the published ones: on how many the objective falls from the published values
    along the straight line toward the robot's (the solver stopped on a slope it could have
    gone down; its lowest point on the line at the robot's, or short of them) and on how many
    a ridge lies between (another basin)."""
    if not any(r["training_objective"].get("profile") for r in results):
        return
    runs = [r for r in results if r["training_objective"].get("profile")
            and min(f for s, f in r["training_objective"]["profile"] if s == 1.0)
            < r["training_objective"]["identified"]]
    ridged = [r for r in runs if ridge(r["training_objective"]["profile"]) is not None]
    slope = [r for r in runs if r not in ridged]
    at_robot = [r for r in slope if line_lowest(r["training_objective"]["profile"]) == 1.0]
    names = lambda rs: ", ".join(sorted({f"{r['robot']} {r['seed']}" for r in rs})) or "none"     # noqa: E731
    _line(f"of the {len(runs)} runs whose robot's values fit the training windows better, the objective falls from the "
          f"published values along the straight line toward the robot's on {len(slope)} ({names(slope)}: the solver "
          f"stopped on a slope; lowest at the robot's values on {len(at_robot)}, short of them on "
          f"{len(slope) - len(at_robot)}) and has a ridge between on {len(ridged)} ({names(ridged)}: another basin)")


def _mean_sigmas(sigmas: dict) -> dict:
    """Each value's sigma as the row of its mean sees it (`element_mean_sigma`)."""
    return {n: element_mean_sigma(s) for n, s in sigmas.items()}


def _percent(share: float) -> str:
    """A share as a percentage; "no sigma" for NaN (no value was given a finite sigma)."""
    return "no sigma" if math.isnan(share) else f"{100 * share:.0f} %"


def _claimed_coverage(runs: list, names=None, key: str = "covered_published") -> tuple:
    """(share of the values given a finite published sigma that it covers twice, NaN for
    none; how many were given one): of ``names``, or each run's own (``names`` None)."""
    hits = [r[key][n] for r in runs for n in (r["names"] if names is None else names) if r["claimed"][n]]
    return (float(np.mean(hits)) if hits else math.nan), len(hits)


def _information_table(results: list, reported) -> None:
    """With --information on: per robot, the median over its runs of the data's Cramer-Rao
    1-sigma at the true values beside the median |error| the runs reached, and whether an
    efficient estimator's median |error| (0.67 sigma) is within the tolerance."""
    runs = [r for r in results if r["information"] is not None]
    if not runs:
        return
    _line("")
    _line("how well 60 s of these data determine the true values in the model's structure (the Gauss-Newton "
          "1-sigma of each mean under independent residuals, every training window: where the model is the robot, "
          "an estimate of the Cramer-Rao bound; an efficient fit's median |error| is 0.67 sigma): median over "
          "runs, relative")
    _line("| robot | " + " | ".join(f"{n}: 1-sigma / reached" for n in reported) + " | 0.67 sigma within tol |")
    _line("|---|" + "---|" * (len(reported) + 1))
    for name in dict.fromkeys(r["robot"] for r in runs):
        rs = [r for r in runs if r["robot"] == name]
        sig = {n: float(np.median([r["information"]["sigma"][n] for r in rs])) for n in reported}
        got = {n: float(np.median([abs(r["error"][n]) for r in rs])) for n in reported}
        reach = [n for n in reported if 0.6745 * sig[n] <= rs[0]["tol"]]
        _line(f"| {name} | " + " | ".join(f"{100 * sig[n]:.1f} / {100 * got[n]:.1f} %" for n in reported)
              + f" | {len(reach)} of {len(reported)}" + ("" if len(reach) == len(reported) else
                                                        f" (not {', '.join(n for n in reported if n not in reach)})")
              + " |")


def _contact_table(results: list) -> None:
    """The contact identified online against the robot's MuJoCo contact: per robot the
    median |error| of each value over the runs that published it, the config's beside it,
    and the published 2-sigma's coverage."""
    _line("")
    _line("contact identified online vs the robot's MuJoCo contact (its solref, or MuJoCo's default (0.02 s, 1)): "
          "median |error| identified / config over the runs that published the value (runs), "
          "published-2-sigma coverage")
    _line("| robot | " + " | ".join(CONTACT_LABEL[n] for n in CONTACT_TARGETS) + " | coverage |")
    _line("|---|" + "---|" * (len(CONTACT_TARGETS) + 1))
    for name in dict.fromkeys(r["robot"] for r in results):
        rs = [r["contact"] for r in results if r["robot"] == name]
        cells = []
        for n in CONTACT_TARGETS:
            have = [c for c in rs if n in c["names"]]
            cells.append("-" if not have else
                         f"{100 * np.median([abs(c['error'][n]) for c in have]):.1f} / "
                         f"{100 * np.median([abs(c['nominal_error'][n]) for c in have]):.1f} % ({len(have)})")
        rate, _ = _claimed_coverage(rs)
        _line(f"| {name} | " + " | ".join(cells) + f" | {_percent(rate)} |")
    contacts = [r["contact"] for r in results]
    rate, claimed = _claimed_coverage(contacts)
    _line("contact: published-2-sigma coverage over the values given a finite sigma: "
          + (f"{_percent(rate)} of {claimed}" if claimed else "none"))


if __name__ == "__main__":
    sys.exit(main())
