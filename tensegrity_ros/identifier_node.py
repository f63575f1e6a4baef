"""identifier: online recurrent progressive identification over topics.

Subscribes to rod poses, IMU and cable commands; `tensegrity_engine.identification.streaming.StreamAligner`
validates them (counted, throttled rejections) and aligns them by stamp into
(X_t, U_t, X_t+T) tuples; a background thread feeds them to the ROS-free session
`tensegrity_engine.identification.online.OnlineIdentification` (never blocking the
callbacks), publishes the parameters (latched) whenever the loss improves, checkpoints to
disk and resumes from the checkpoint after a restart. A diverging epoch (NaN loss,
exploding parameters, an exception) restores the last good parameters, which stay published.
"""
from __future__ import annotations

import collections
import dataclasses
import math
import re
import threading
import time
from pathlib import Path

import numpy as np
import torch
from diagnostic_msgs.msg import DiagnosticStatus
from geometry_msgs.msg import PoseArray
from rclpy.node import Node
from sensor_msgs.msg import Imu, JointState
from std_srvs.srv import Trigger
from tensegrity_ros_interfaces.msg import CableCommand, IdentifiedParameters
from visualization_msgs.msg import MarkerArray

from tensegrity_engine.export import write_mjcf
from tensegrity_engine.identification.checkpoint import load_checkpoint, save_checkpoint
from tensegrity_engine.identification.config import INITS, WINDOWS_FROM
from tensegrity_engine.identification.gate_pacing import GatePacing
from tensegrity_engine.identification.identifiability import advice_text, structure_hints, unfixed_force_scale
from tensegrity_engine.identification.online import OnlineIdentification, default_trainer_factory
from tensegrity_engine.identification.online_structure import (DEFAULT_STRUCTURE_OPTIONS, robot_in_structure,
                                                                 structure_key)
from tensegrity_engine.identification.streaming import StreamAligner, StreamConfig
from tensegrity_engine.physics.params import PhysicalParameters, checked_parameters, element_count

from . import conversions as conv
from .common import (TOPIC_APPLIED, TOPIC_CABLE_STATES, TOPIC_COMMAND, TOPIC_IMU, TOPIC_MARKERS, TOPIC_PARAMS,
                     TOPIC_POSES, DONE_WORDS, ConfigurationError, latched_qos, lower_thread_priority, resolve_device,
                     run_node, stream_qos)
from .diagnostics import Diagnostics
from .params import declare, load_robot, refuse_undeclared

NS = conv.NS
STREAM_EVENTS = ("gap", "clock_jump", "decimated", "no_command", "overflow")
CHECKPOINT_NAME = "identifier_checkpoint.safetensors"
LEGACY_CHECKPOINT_NAME = "identifier_checkpoint.pt"   # pickle: never read


class IdentifierNode(Node):
    #: tests may replace this (e.g. by a trainer that diverges on purpose)
    trainer_factory = staticmethod(default_trainer_factory)

    def __init__(self, **kwargs):
        super().__init__("identifier", **kwargs)
        d = lambda *a, **k: declare(self, *a, **k)
        robot_name = d("robot", "superball", "robot config: shipped name or YAML path", read_only=True)
        self.device = resolve_device(d("device", "auto", "torch device for identification",
                                       choices=("auto", "cpu", "cuda")))
        setting = declare_identification(d)
        self.pose_frame = setting["pose_frame"]
        self.ckpt_dir = d("checkpoint_dir", "", "directory for checkpoints ('' = none)")
        self.ckpt_period = d("checkpoint_period", 10.0, "seconds (wall) between checkpoints", range=(0.1, 1e6))
        self.resume = d("resume", True, "resume from the checkpoint in checkpoint_dir if present")
        self.export_path = d("export_mjcf_path", "", "where ~/export_mjcf writes the published model as MJCF "
                             "('' = identified.xml in checkpoint_dir, else in the working directory)")
        self.publish_interval = d("min_publish_interval", 1.0,
                                  "improvements are published at most this often (wall s)", range=(0.0, 3600.0))
        self.publish_markers = d("publish_markers", True, "publish the identified model's prediction as markers")
        self.sigma_tuples = d("uncertainty_tuples", 64, "tuples of the window behind each published 1-sigma "
                              "(0 = publish none)", range=(0, 10**6))
        self.converged_sigma = d("converged_sigma", 0.05, "'converged' is published only when every learnt "
                                 "value's 1-sigma is within this fraction of it (else 'fitted ...: keep "
                                 "exciting'; 0 = the solver's test alone)", range=(0.0, 10.0))
        self.worker_niceness = d("worker_niceness", 10, "niceness added to the identification thread (Linux): "
                                 "the controller and the driver on the same CPU come first (0 = as the node)",
                                 range=(0, 19))
        threads = d("torch_threads", 0, "torch intra-op threads (0 = torch default)", range=(0, 256))
        if threads > 0:
            torch.set_num_threads(threads)

        self.robot = load_robot(robot_name)
        self.id_config = setting["config"]
        self.stream_cfg = stream_config(self.robot, setting)
        self.aligner = StreamAligner(self.stream_cfg)
        self.cable_names = [self.robot.cable_names[i] for i in self.robot.actuated_indices]
        self._lock = threading.Lock()        # aligner (callbacks <-> worker)
        self._stop = threading.Event()
        # trainer_factory is looked up per call: tests replace it on the instance
        self.session = make_session(self.robot, setting, self.device, log=lambda m: self.get_logger().info(m),
                                    trainer_factory=lambda *a: self.trainer_factory(*a))
        self.published = 0
        self.published_config_com_error = math.nan   # m, see `_publish`
        self.tie_verdict = ""                # why the latest finished fit did not tie (`ties_published`)
        self._last_ckpt = time.monotonic()
        self.pacing = GatePacing(self.publish_interval)     # an improvement waits for its gate
        self.undetermined: tuple = ()        # parameters the data cannot determine yet
        self.excite = ""                     # what would determine them (`identifiability`)
        self.structure_suspect: tuple = ()   # parameters whose values move with the horizon
        self.at_bound: tuple = ()            # parameters the data pushed against a bound
        self.unreached: tuple = ()           # limits (a winch's top speed) the data never reach
        self.sigma_state = "none published yet"   # the published values' sigma: estimated, or why not
        self.last_gate = None                # HeldOutVerdict of the newest candidate
        self.last_refused = None             # {name: mean value} of the newest refused candidate

        self.pub_params = self.create_publisher(IdentifiedParameters, TOPIC_PARAMS, latched_qos())
        self.pub_markers = self.create_publisher(MarkerArray, TOPIC_MARKERS, 5)
        self.create_subscription(PoseArray, TOPIC_POSES, self._on_pose, stream_qos())
        self.create_subscription(Imu, TOPIC_IMU, self._on_imu, stream_qos(100))
        self.create_subscription(JointState, TOPIC_CABLE_STATES, self._on_cables, stream_qos())
        command_topic = d("command_topic", TOPIC_COMMAND, "the commands to align with the poses: the "
                          "controller's (valid-from stamps) or a driver's echo of what it applied "
                          f"({TOPIC_APPLIED}: stamped when each took effect)", read_only=True)
        self.create_subscription(CableCommand, command_topic, self._on_command, stream_qos())
        self.create_service(Trigger, "~/export_mjcf", lambda _req, res: export_mjcf(self, res))
        self.diag = Diagnostics(self, extra=self._diag_values)
        refuse_undeclared(self)      # all declared by now, Diagnostics' period too
        self._counted = collections.Counter()
        if self.ckpt_dir and self.resume:
            self._load_checkpoint()
        self._worker = threading.Thread(target=self._run, name="identification", daemon=True)
        self._worker.start()
        self.get_logger().info(f"identifier on {self.device}: T={setting['interval']}s, window "
                               f"{setting['max_tuples']} tuples, "
                               f"schedule {self.id_config.schedule}")

    # ------------------------------------------------------------------ callbacks
    def _sync_events(self) -> None:
        """Mirror the aligner's stream events (not rejections: those are counted per
        message) into /diagnostics, with throttled warnings."""
        for reason in STREAM_EVENTS:
            new = self.aligner.counters[reason] - self._counted[reason]
            if new > 0:
                self._counted[reason] += new
                self.diag.count(f"event_{reason}", new)
                if reason in ("gap", "clock_jump"):
                    self.diag.warn_throttled(reason, f"stream {reason.replace('_', ' ')}: "
                                             "segment split, no tuple across it")

    def _account(self, topic: str, verdict) -> None:
        ok, reason = verdict
        if ok:
            self.diag.accept(topic)
        else:
            self.diag.reject(reason, topic=topic)
        self._sync_events()

    def _on_message(self, topic: str, msg) -> None:
        self.diag.received(topic)
        with self._lock:
            ok, reason, detail = feed_aligner(self.aligner, topic, msg, self.pose_frame, self.cable_names)
            if ok or not detail:
                return self._account(topic, (ok, reason))
        self.diag.reject(reason, detail, topic=topic)

    def _on_pose(self, msg: PoseArray) -> None:
        self._on_message("poses", msg)

    def _on_imu(self, msg: Imu) -> None:
        self._on_message("imu", msg)

    def _on_cables(self, msg: JointState) -> None:
        self._on_message("cables", msg)

    def _on_command(self, msg: CableCommand) -> None:
        self._on_message("commands", msg)

    # ------------------------------------------------------------------ the session
    trainer = property(lambda self: self.session.trainer)
    epochs = property(lambda self: self.session.epochs)
    rollbacks = property(lambda self: self.session.rollbacks)

    def _take_new(self):
        with self._lock:
            return self.aligner.pop_tuples()

    # ------------------------------------------------------------------ worker
    def _run(self) -> None:
        if problem := lower_thread_priority(self.worker_niceness):     # torch's pool threads inherit it
            self.diag.warn_throttled("niceness", f"identification runs at the node's priority ({problem})")
        while not self._stop.is_set() and self.context.ok():
            try:
                new = self._take_new()
                if new is not None:
                    self.session.add(new)
                if not self.session.training:
                    if self.session.finished:
                        self._finish_schedule()
                    self._flush_publication()
                    self._maybe_checkpoint()
                    self._stop.wait(0.2)
                    continue
                self._epoch()
                self._maybe_checkpoint()
            except Exception as exc:  # noqa: BLE001 - never die: roll back and go on
                if not self.context.ok():
                    break
                self.session.rollbacks += 1
                self.diag.warn_throttled("worker", f"identification step failed ({exc!r}); "
                                         "restoring the last good parameters")
                self.session.rollback()
                self._stop.wait(1.0)

    def _finish_schedule(self) -> None:
        """Publish the finished schedule's end; one that fails (the gate, sigma, the message)
        leaves it finished, so the next pass publishes it (else its end was never said)."""
        self.pacing.drop()
        try:
            self._on_done()
        except Exception:
            self.session.converged = False
            raise

    def _epoch(self) -> None:
        before, structure = self.session.rollbacks, self.session.robot
        improved = self.session.step()
        if self.session.robot is not structure:     # a challenger was adopted: older candidates
            self.pacing.drop()                      # were fitted in the structure it replaced
        if self.session.rollbacks > before:
            self.diag.count("divergences")
            self.diag.warn_throttled("diverged", "identification diverged: rolled back; publishing the "
                                     "last good parameters")
            return
        if improved is not None:
            self.pacing.offer(improved)
        self._flush_publication()

    def _flush_publication(self, force: bool = False) -> None:
        judged = self.pacing.gate(lambda candidate: passes_gate(self, candidate[1]), force)
        if judged is None:
            return
        (m, values), accepted = judged
        g = self.last_gate
        if accepted:
            self._publish(m, values, heldout_loss=g.candidate_loss,
                          com=(g.candidate_com_error, g.incumbent_com_error, g.config_com_error))
        elif g.revert:
            revert_to_config(self, m)

    def _publish(self, m: dict, values: dict, stage: str = "", params=None, heldout_loss: float = math.nan,
                 com: tuple = (math.nan, math.nan, math.nan), robot=None, estimate: bool = True) -> None:
        """Publish ``values`` (the best so far, fitted in the structure ``robot``: the
        session's by default) with the metrics ``m`` (latched); the message's validation
        loss is ``heldout_loss`` where there is one; ``com`` the held-out CoM errors of these
        values, the model they replace and the config (in diagnostics only); their sigma
        unless ``estimate`` is False (the config's values: nothing identified)."""
        self.pacing.published()
        robot = params.robot if params is not None else robot or self.session.robot
        self.session.mark_published(values, robot)
        if params is None:
            cur = self.trainer.parameters
            params = PhysicalParameters(robot, values, per_element=getattr(cur, "per_element", ()),
                                        bounds={n: (sp.lower, sp.upper) for n, sp in cur.specs.items()})
            # sigma and the step come from the session's trainer: only for values of its structure
            same = structure_key(robot) == structure_key(self.session.robot)
            if same and estimate:
                sigma = published_uncertainty(self, params, values)
            else:
                sigma = None
                why = "values of another structure" if estimate else "the config's values: nothing identified yet"
                clear_uncertainty_flags(self, f"not estimated ({why})")
        else:
            sigma, same = None, False        # a checkpoint's values: no data behind them yet
            clear_uncertainty_flags(self, "not estimated (values from a checkpoint)")
        stage = stage or f"{m.get('stage', '')} {m.get('integrator', '')} dt={m.get('dt', 0) * 1e3:g}ms"
        held = float(heldout_loss) if math.isfinite(heldout_loss) else float(m.get("val_loss", math.nan))
        msg = conv.params_to_msg(params, self.robot.name, self.get_clock().now().nanoseconds,
                                 train_loss=float(m.get("loss", math.nan)), validation_loss=held,
                                 stage=stage.strip(),
                                 engine_dt=float(m.get("dt", robot.dt) if same else robot.dt), epoch=int(m.get("epoch", 0)),
                                 tuples_used=self.session.window_len, uncertainty=sigma,
                                 heldout_com_error=com[0], replaced_com_error=com[1])
        self.pub_params.publish(msg)
        self.published += 1
        self.published_config_com_error = float(com[2])
        if self.publish_markers:
            publish_prediction(self)

    def _on_done(self) -> None:
        """The schedule finished: publish the final (best) parameters as converged."""
        m, values = self.session.finish()
        config_in_use = self.session.best_values is None
        accepted = passes_gate(self, values)
        g = self.last_gate
        # its sigma (seconds of the worker) says what to excite once published; refused with
        # nothing published, the config's values are said again, with none (never identified)
        estimate = accepted or not config_in_use
        stage = end_stage(self, self.session.status, values) if estimate else self.session.status
        if accepted:
            held, com = g.candidate_loss, (g.candidate_com_error, g.incumbent_com_error, g.config_com_error)
        else:                                   # the end state is said with the model in use
            if g.revert:
                revert_to_config(self, m, stage + "; ")
                return self._save_checkpoint()
            robot = self.session.incumbent_robot
            fitted, values = values, self.session.best_values or PhysicalParameters(robot).as_dict()
            stage = refused_finish_stage(self, g, stage, fitted)
            held = g.incumbent_loss
            com = (g.incumbent_com_error, g.incumbent_com_error, g.config_com_error)
        self._publish(m, values, stage=stage, heldout_loss=held, com=com,
                      robot=None if accepted else robot, estimate=estimate)
        if not accepted and config_in_use:
            self.session.mark_published(None)      # the config's values: nothing identified to export
        self.get_logger().info(f"identification {self.session.status} after {self.epochs} epochs: "
                               f"{self.trainer.format_parameters()}")
        self._save_checkpoint()

    # ------------------------------------------------------------------ checkpoints
    @property
    def ckpt_path(self) -> Path:
        return Path(self.ckpt_dir).expanduser() / CHECKPOINT_NAME

    def _maybe_checkpoint(self) -> None:
        if self.ckpt_dir and time.monotonic() - self._last_ckpt >= self.ckpt_period:
            self._save_checkpoint()

    def _save_checkpoint(self) -> None:
        data = self.session.checkpoint() if self.ckpt_dir else None
        if data is None:
            return
        self._last_ckpt = time.monotonic()
        try:
            save_checkpoint(self.ckpt_path, data, robot=self.robot, kind="identifier")
        except OSError as exc:       # full disk, read-only directory: keep training
            self.diag.count("checkpoint_errors")
            self.diag.warn_throttled("checkpoint", f"cannot write {self.ckpt_path}: {exc}")
            return
        self.diag.count("checkpoints_saved")

    def _load_checkpoint(self) -> None:
        resume_from_checkpoint(self)

    # ------------------------------------------------------------------ diagnostics
    def _diag_values(self) -> dict:
        with self._lock:
            st = self.aligner.stats()
        s = self.session
        m = s.last_metrics
        out = {"status": s.status, "device": self.device, "epochs": s.epochs,
               "rollbacks": s.rollbacks, "published": self.published, "window_tuples": s.window_len,
               "best_loss": s.best_loss, "stage": m.get("stage", ""), "dt": m.get("dt", ""),
               "lr": m.get("lr", ""), "undetermined": ", ".join(self.undetermined),
               "excite": self.excite,
               "at_bound": ", ".join(self.at_bound), "structure_suspect": ", ".join(self.structure_suspect),
               "unreached": ", ".join(self.unreached),
               "uncertainty": self.sigma_state, "heldout_tuples": s.heldout_len,
               "published_config_com_error": self.published_config_com_error,     # m, `_publish`
               "worker_compute": s.work.summary()}     # the worker's seconds per kind of work
        if self.last_gate is not None:
            g = self.last_gate
            out.update(gate=g.reason, heldout_loss=g.candidate_loss, heldout_improvement=g.improvement)
        # what the gate kept back, for the operator (a refused model is never published)
        out.update({f"refused_{n}": f"{v:.6g}" for n, v in (self.last_refused or {}).items()})
        out.update({f"stream_{k}": v for k, v in st.items()})
        if self.rollbacks:
            self.diag.level = DiagnosticStatus.WARN
        self.diag.message = s.status
        return out

    def close(self) -> None:
        self._stop.set()
        self._worker.join(timeout=60.0)
        if self._worker.is_alive():       # mid-epoch: its session is half updated, the last file stands
            self.get_logger().warning("the identification worker did not stop within 60 s: no checkpoint written")
            return
        try:
            self._save_checkpoint()
        except Exception:  # noqa: BLE001
            pass


def feed_aligner(aligner: StreamAligner, topic: str, msg, pose_frame: str, cable_names
                 ) -> tuple[bool, str, str]:
    """One message (topic "poses", "imu", "cables" or "commands") into the aligner, as the node and
    the offline bag tool both do: (accepted, reason, detail); a detail is set when the
    message was refused before the aligner saw it."""
    problem = conv.header_problem(msg.header, pose_frame if topic == "poses" else None)
    if problem:
        return False, problem[0], problem[1]
    stamp = conv.stamp_ns(msg.header.stamp)
    if topic == "poses":
        return (*aligner.add_pose(stamp, conv.pose_array_to_array(msg)), "")
    if topic == "imu":
        return (*aligner.add_imu(stamp, *conv.imu_to_arrays(msg)), "")
    if topic == "cables":
        rest, tension, problem = conv.joint_state_to_cable_states(msg, aligner.cfg.cable_names)
        if problem:
            return False, "wrong_length", problem
        return (*aligner.add_cable_states(stamp, rest, tension), "")
    u = conv.cable_command_to_array(msg, cable_names)
    if u is None:
        return False, "wrong_length", "cable names do not match the robot's"
    return (*aligner.add_command(stamp, u), "")


def declare_identification(d) -> dict:
    """What is identified from which data, and how: the node parameters that the offline
    bag tool (`bag_identify`) reads from the same parameter file."""
    out = {
        "interval": d("interval", 0.1, "T: time between X_t and X_t+T (s); the pose period", range=(0.001, 10.0)),
        "stamp_tolerance": d("stamp_tolerance", 0.002, "poses within T +- this count as on the grid (s)",
                             range=(0.0, 1.0)),
        "clock_jump": d("clock_jump", 5.0, "a stamp step larger than this restarts the stream (s)",
                        range=(0.01, 1e6)),
        "min_tuples": d("min_tuples", 20, "tuples needed before training starts", range=(1, 10**7)),
        "max_tuples": d("max_tuples", 2000, "training window: newest tuples kept", range=(1, 10**7)),
        "holdout_every": d("holdout_every", 5, "every n-th block of 1 s of tuples is held out (longer where "
                           "lost frames break its 1 s chain): a model is published only if it predicts "
                           "them better than the one it replaces, never before three blocks (0 = no gate)",
                           range=(0, 1000)),
        "max_holdout": d("max_holdout", 0, "held-out tuples kept (newest); 0 = 20 blocks of 1 s (200 at 10 Hz)",
                         range=(0, 10**6)),
        "pose_frame": d("pose_frame", "world", "frame the rod poses are given in; poses in any other frame "
                        "are refused"),
        "floor": d("floor", True, "the data has a floor (contact environment)"),
        "fixed_rods": d("fixed_rods", [-1], "rods welded to the world ([-1] = none)"),
        "reopen_tuples": d("reopen_tuples", 50, "schedule 'online': new tuples after convergence that resume "
                           "it (0 = never)", range=(0, 10**6)),
        "structure_options": d("structure_options", list(DEFAULT_STRUCTURE_OPTIONS),
                               "structural options fitted one at a time by a second trainer, each kept only if "
                               "it predicts the held-out blocks better by 2 standard errors and 5 %: end_heavy, "
                               "slack_damping, winch_speed (values), per_cable, per_cable_stiffness, per_rod_mass (per-element values), "
                               "implicitfast, rk4 (the integrator), soft_contact (the soft ground law, for a "
                               "penalty-law robot), condim_3, condim_4, condim_6 (soft ground law), fresh_start (the same "
                               "model, its windowed stage started from the config's values, not the "
                               "finite-difference fit: kept if it fits the training windows 1 % better and "
                               "predicts the held-out blocks no worse), swapped_lags (the same model from the solver's fit with the "
                               "motors' and the cables' lags exchanged, judged as fresh_start), long_windows (the "
                               "solver's converged fit refined on windows of twice pose_window where its motors' "
                               "and cables' lags both outlast a third of a window, judged on the held-out "
                               "blocks); each beside the solver, from the config's values (the start options "
                               "swapped_lags and long_windows from the solver's fit); the published message carries the structure "
                               "(default ['soft_contact', 'long_windows', 'fresh_start']: a penalty-law robot's ground "
                               "law is chosen by its held-out data, a soft-law robot's structure is kept, slow "
                               "lags are refined on longer windows, then the windowed stage is tried from the "
                               "config's values; ['none'] = the robot YAML's "
                               "structure and the first fit)"),
        "structure_on_pin": d("structure_on_pin", True,
                              "a value the fit pins at a bound of its range (at its end, or 3 epochs in a row), "
                              "where that points to missing structure (the motors' time constant at its lower "
                              "bound, the rods' inertia factor at its top: cables that differ), has the option it "
                              "points to (per_cable_stiffness: a stiffness per cable) tried next, not refused early, listed in structure_options "
                              "or not; the hold-out gate still decides"),
    }
    out["config"] = declare_solver(d, out["interval"])
    return out


def stream_config(robot, setting: dict) -> StreamConfig:
    return StreamConfig.for_robot(robot, interval=setting["interval"], stamp_tolerance=setting["stamp_tolerance"],
                                  clock_jump=setting["clock_jump"])


def make_session(robot, setting: dict, device, *, log, trainer_factory=default_trainer_factory
                 ) -> OnlineIdentification:
    from tensegrity_engine.identification.config import resolve_learn
    from tensegrity_engine.identification.online_structure import online_options

    config = setting["config"]
    try:                                             # a bad name is a start-up error, not a failed epoch
        learn = resolve_learn(config.learn, robot.contact.law, floor=setting["floor"])
    except ValueError as err:
        raise ConfigurationError(f"parameter learn: {err}") from None
    contact_acts = bool(setting["floor"] or robot.contact.rod_rod)
    # the cables' load cells, fitted beside the poses, are a known force
    if scaled := unfixed_force_scale(learn, robot.contact.law, contact_acts, config.tension_weight > 0):
        if config.learn is not None:                 # could never converge
            raise ConfigurationError(
                f"parameter learn: {', '.join(scaled)} scale together: poses without a known force fix only "
                "forces per unit mass, so their common scale could never be determined; weigh the rods (the "
                "robot YAML's rod mass) and leave rod_mass out of learn, keep a force whose value you know (e.g. "
                "cable_stiffness from its data sheet) out of it, or measure one: the cables' load cells on "
                "cable_states_topic with tension_weight > 0")
        # the default (offline data has known pushes; these topics do not): the rods as weighed
        learn = tuple(n for n in learn if n != "rod_mass")
        config = dataclasses.replace(config, learn=learn)
    if config.per_element:
        try:
            split = resolve_learn(config.per_element, robot.contact.law, floor=setting["floor"])
        except ValueError as err:
            raise ConfigurationError(f"parameter per_element: {err}") from None
        if unknown := [n for n in split if n not in learn]:
            raise ConfigurationError(f"parameter per_element: {', '.join(unknown)} not learnt (learn: "
                                     f"{', '.join(learn)})")
        if single := [n for n in split if element_count(robot, n) == 1]:
            raise ConfigurationError(f"parameter per_element: {', '.join(single)} has one value for the whole "
                                     "robot (only cable and rod values split)")
        config = dataclasses.replace(config, per_element=split)
    try:
        structure = online_options([n for n in setting["structure_options"] if n != "none"])
    except ValueError as err:
        raise ConfigurationError(f"parameter structure_options: {err}") from None
    try:
        return OnlineIdentification(
            robot, config, device=device, min_tuples=setting["min_tuples"],
            max_tuples=setting["max_tuples"], holdout_every=setting["holdout_every"],
            max_holdout=setting["max_holdout"] or None, reopen_tuples=setting["reopen_tuples"],
            floor=setting["floor"], fixed_rods=tuple(int(r) for r in setting["fixed_rods"] if int(r) >= 0),
            log=log, trainer_factory=trainer_factory, structure_options=structure,
            follow_pins=bool(setting["structure_on_pin"]))
    except ValueError as err:
        raise ConfigurationError(f"identifier settings: {err}") from None


def declare_solver(d, period: float):
    """The identification settings (node parameters) as an `IdentificationConfig`."""
    from tensegrity_engine.identification import IdentificationConfig

    learn = d("learn", ["default"], "parameters to identify (['default'] = the trainer's choice)")
    schedule = d("schedule", "online", "training schedule: 'online' (Levenberg-Marquardt from the start "
                 "values, resumed whenever reopen_tuples new tuples arrived) or Algorithm 1's",
                 choices=("online", "progressive", "implicit_only", "feedforward"))
    lm_windows = d("lm_windows", 256, "pose-only Levenberg-Marquardt: most multiple-shooting windows (of "
                   "pose_window tuples) per iteration (a random subset beyond; ~5 ms each per iteration on one core)",
                   range=(1, 10**5))
    pose_window = d("pose_window", IdentificationConfig().pose_window, "pose-only Levenberg-Marquardt: tuples per "
                    "multiple-shooting window (each with its own start velocity)", range=(2, 100))
    defaults = IdentificationConfig()
    latent_jacobian_reuse = d("latent_jacobian_reuse", defaults.latent_jacobian_reuse, "pose-only "
                              "Levenberg-Marquardt: iterations a window's start-velocity Jacobian is reused (1: "
                              "computed afresh at each, ~3x the rollouts; measured better on robots that lie on "
                              "the floor with most rods: docs/online_identification.md, the thirty-eighth session)",
                              range=(1, 1000))
    latent_restart_every = d("latent_restart_every", defaults.latent_restart_every, "pose-only "
                             "Levenberg-Marquardt: each iteration one window in this many fits its start velocity "
                             "afresh and keeps it where it fits better (0 = never; measured: the three- and "
                             "four-bar's twins without mocap noise within 5 % on 7 of 8 runs at 3, 3 of 8 without; "
                             "with 1-3 mm noise no better: docs/online_identification.md, the thirty-ninth session)",
                             range=(0, 1000))
    gyro_weight = d("gyro_weight", defaults.gyro_weight, "pose-only: weight of the IMU's angular velocity at "
                    "each window's start (1 rad/s as half a rod length x T of end-node error; 0 = the IMU unused "
                    "by identification; docs/online_identification.md, Gyros)", range=(0.0, 1e6))
    tension_weight = d("tension_weight", defaults.tension_weight, "pose-only: weight of the cables' measured "
                       "tensions (JointState effort on cable_states_topic) beside the poses, m/N: 1 N off as this "
                       "many m of end-node error (0 = unused; the mocap's position noise over the load cell's; "
                       "docs/online_identification.md, Cable sensors)", range=(0.0, 1e3))
    rest_length_weight = d("rest_length_weight", defaults.rest_length_weight, "pose-only: weight of the "
                           "cables' measured rest lengths (JointState position: the winches' encoders) beside the "
                           "poses, m/m (0 = unused; the mocap's position noise over the encoder's)", range=(0.0, 1e6))
    motor_settle = d("motor_settle", defaults.motor_settle, "pose-only: no window within this many actuator "
                     "time constants of a stream's first command (the motors' state there is assumed)",
                     range=(0.0, 1e3))
    windows_from = d("windows_from", defaults.windows_from, "pose-only: the windowed Levenberg-Marquardt "
                     "starts from the finite-difference stage's fit or from the start values",
                     choices=WINDOWS_FROM)
    lm_settle_sigmas = d("lm_settle_sigmas", defaults.lm_settle_sigmas, "pose-only: the windowed "
                         "Levenberg-Marquardt has converged once its last lm_patience steps moved every value "
                         "by at most this many of its 1-sigma (0: off)", range=(0.0, 100.0))
    lr0 = d("lr0", 0.1, "initial learning rate", range=(1e-6, 10.0))
    lr_min = d("lr_min", 1e-3, "stop when the learning rate falls below this", range=(1e-9, 10.0))
    patience = d("patience", 2, "non-improving epochs before a stage change", range=(1, 1000))
    batch = d("batch_size", 16, "tuples per gradient step", range=(1, 100000))
    epoch_tuples = d("epoch_tuples", defaults.epoch_tuples, "tuples per epoch of Algorithm 1's schedules "
                     "(0 = all; the offline CLI's default)", range=(0, 10**7))
    max_epochs = d("max_epochs", 10000, "epoch limit", range=(1, 10**7))
    max_seconds = d("max_seconds", 0.0, "training time limit (s, 0 = none)", range=(0.0, 1e7))
    init = d("init", "given", "start from random values within bounds, the config's, or the best of "
             "both (given+random)", choices=INITS)
    seed = d("seed", 0, "random start seed", range=(0, 2**31 - 1))
    per_element = d("per_element", ["none"], "learnt parameters identified per cable / per rod (['none'] = "
                    "each shared): e.g. [cable_stiffness] for cables that differ")
    return IdentificationConfig(
        period=period, learn=None if list(learn) == ["default"] else tuple(learn), schedule=schedule,
        lr0=lr0, lr_min=lr_min, patience=patience, batch_size=batch, epoch_tuples=epoch_tuples or None,
        max_epochs=max_epochs, max_seconds=max_seconds or None, init=init, seed=seed, lm_windows=lm_windows,
        pose_window=pose_window, gyro_weight=gyro_weight, tension_weight=tension_weight,
        rest_length_weight=rest_length_weight, motor_settle=motor_settle, windows_from=windows_from,
        lm_settle_sigmas=lm_settle_sigmas, per_element=tuple(n for n in per_element if n != "none"),
        latent_jacobian_reuse=latent_jacobian_reuse, latent_restart_every=latent_restart_every)


def export_mjcf(node, response):
    """~/export_mjcf: the published model (the one that passed the hold-out gate; never an
    unvetted candidate) as a calibrated MuJoCo model file."""
    values = node.session.best_values
    if values is None:
        response.success = False
        response.message = ("no identified model is published (none yet, or the config's values were "
                            "published again): nothing to export; the robot YAML is that model")
        return response
    path = (Path(node.export_path) if node.export_path else Path(node.ckpt_dir or ".") / "identified.xml").expanduser()
    try:
        params = PhysicalParameters.keeping_elements(node.session.incumbent_robot, values)
        export = write_mjcf(params, path, floor=node.session.floor,
                            fixed_rods=node.session.fixed_rods, source=f"identifier node, {node.published} "
                            "parameter messages published")
    except (OSError, ValueError) as err:
        response.success, response.message = False, f"cannot write {path}: {err}"
        node.get_logger().error(response.message)
        return response
    response.success = True
    response.message = f"wrote {path}" + "".join(f"; not represented: {n}" for n in export.notes)
    node.get_logger().info(response.message)
    return response


def resume_from_checkpoint(node) -> None:
    """Resume the node's session from its checkpoint file, if there is one: the file's
    published model is checked and published first; a file that cannot be restored
    leaves a fresh session (its published model, if it went out, the gate's incumbent)."""
    path = node.ckpt_path
    legacy = path.with_name(LEGACY_CHECKPOINT_NAME)
    if legacy.exists():
        node.get_logger().warning(f"ignoring {legacy}: pickle checkpoints of older versions are never "
                                  "read (loading one could run code)")
    if not path.exists():
        return
    s = node.session
    published = None           # (values, structure) of the checkpoint's model, once published
    try:
        data = load_checkpoint(path, robot=node.robot, kind="identifier")
        best = data.get("best_values") if data.get("robot") == node.robot.name else None
        if best is not None:
            # publish the checkpoint's model first: rebuilding the trainer on its
            # window takes seconds the controller need not wait for
            shape = data.get("published_structure")
            structure = node.robot if shape is None else robot_in_structure(node.robot, tuple(shape))
            early = checked_parameters(structure, best)
            node._publish({"val_loss": data.get("best_loss", math.nan), "epoch": data.get("epochs", 0)},
                          early.as_dict(), stage=str(data.get("status", "final"))[:120] if data.get("converged") else "resumed",
                          params=early)
            published = (early.as_dict(), structure)
        s.restore(data)
    except Exception as exc:  # noqa: BLE001 - a bad checkpoint must not stop the node
        node.diag.count("checkpoint_rejected")
        s.reset()
        if published is not None:     # the controller holds it: the gate judges against it
            s.mark_published(*published)
        node.get_logger().error(f"cannot resume from {path}: {exc}; starting fresh"
                                + (" (its published model, checked, stays published)" if published else ""))
        return
    node.diag.count("resumed")
    node.get_logger().info(f"resumed from {path}: {s.window_len} tuples, {s.epochs} epochs, "
                           f"best loss {s.best_loss:.3e}")


def passes_gate(node, values: dict) -> bool:
    """The hold-out gate (`OnlineIdentification.gate`), counted and logged."""
    verdict = node.session.gate(values)
    node.last_gate = verdict
    learnt = getattr(node.session.trainer, "learn", None) or ()
    node.last_refused = None if verdict.accepted else {n: float(np.mean(values[n])) for n in learnt if n in values}
    if not verdict.accepted:
        node.diag.count(f"gate_rejected_{verdict.reason}")
        node.diag.warn_throttled("gate", f"candidate not published ({verdict.reason} on "
                                 f"{verdict.tuples} held-out tuples: loss {verdict.candidate_loss:.3g} vs "
                                 f"{verdict.incumbent_loss:.3g} for the model it would replace)")
    return verdict.accepted


def publish_prediction(node) -> None:
    """Markers of the identified model's prediction X_t+T from the newest tuple."""
    try:
        pred = node.session.predict_newest()
        if pred is None:
            return
        rs, t0 = pred
        arr = MarkerArray()
        arr.markers = conv.rod_cable_markers(node.robot, rs, t0 + node.aligner.T_ns,
                                             "predicted", (1.0, 0.5, 0.1, 0.8), id_offset=100)
        node.pub_markers.publish(arr)
    except Exception as exc:  # noqa: BLE001 - visualisation only
        node.diag.warn_throttled("markers", f"prediction markers failed: {exc!r}")


def revert_to_config(node, m: dict, stage: str = "") -> None:
    """Today's held-out blocks say the config predicts better than the published model:
    publish the config's values again (counted), and judge later models against it."""
    node.diag.count("reverted_to_config")
    node.get_logger().warning("the published model predicts the held-out blocks worse than the config: "
                              "publishing the config's values again")
    node._publish(m, PhysicalParameters(node.session.config_robot).as_dict(),
                  stage=stage + "reverted to the config's values (the published model predicts the held-out "
                  "blocks worse)", robot=node.session.config_robot)
    node.session.mark_published(None)


def end_stage(node, status: str, values: dict) -> str:
    """The stage a finished schedule publishes: its status ("converged", or "final (why)"
    when an iteration or time limit ended it), unless a learnt value's sigma is still wider
    than ``converged_sigma``: then no word the controller takes for "done", so it keeps
    exciting (up to its ``max_excitation_time``), as long as training resumes on new data
    (schedule "online", ``reopen_tuples`` > 0, not a spent epoch/time budget). An iteration
    limit on a few seconds of data (measured: sim2sim, 56 tuples at sim t = 7.6 s) used to
    end the excitation."""
    session = node.session
    # a limit only ends the excitation early if training resumes with the new data; a spent
    # epoch/time budget does not, so its "final" stands
    resumes = (getattr(getattr(session, "config", None), "schedule", "online") == "online"
               and getattr(session, "reopen_tuples", 1) > 0 and "time limit" not in status)
    wide = not_yet_determined(node, values) if status == "converged" or (status.startswith("final") and resumes) else ()
    if not wide:
        return status
    return (f"fitted to the data so far; {', '.join(wide)} not yet within "
            f"{100 * node.converged_sigma:g} % (1 sigma): keep exciting")


def refused_finish_stage(node, gate, stage: str, fitted: dict) -> str:
    """The stage published with the model in use when the gate refused the finished fit:
    done if the fit ties the published model (`ties_published`), else keep exciting, and
    the log says why not."""
    if ties_published(node, gate, fitted, node.session.best_values):
        return f"{stage}; the published model predicts as well, within {TIE_SIGMAS:g} sigma of this fit"
    node.get_logger().info(f"the finished fit ({gate.reason} on held-out data) is not the published model "
                           f"again: {node.tie_verdict}")
    return refused_stage(stage)


def refused_stage(stage: str) -> str:
    """The stage published with the model in use when the finished schedule's fit was
    refused by the hold-out gate: no word the controller takes for done, since the model it
    would plan with is not the one that converged, so it keeps exciting (up to its
    ``max_excitation_time``). Measured: "converged; last candidate refused" started MPPI on
    the config's values at sim t = 15.6 s in a fresh-clone sim2sim (damping +7.2 % at the end)."""
    for word in DONE_WORDS:
        stage = re.sub(word, "fitted", stage, flags=re.IGNORECASE)
    return f"{stage}; last candidate refused by the hold-out gate: keep exciting"


TIE_SIGMAS = 2.0     # a refused fit this close to the published model is the same model
TIE_REASONS = ("not_significant", "worse", "worse_com")   # held-out verdicts (not "unstable", "worse_than_config")


def ties_published(node, gate, fitted: dict, published) -> bool:
    """The finished fit, refused by the held-out comparison (not significantly better, or
    worse), is the published model again: every learnt value within `TIE_SIGMAS` of the
    published one in the fit's published 1-sigma, and every value determined as
    `not_yet_determined` judges it (the estimate's own 1-sigma within ``converged_sigma``: the
    published one adds the groups' scatter, which no amount of data narrows. Measured: the
    fresh-clone sim2sim on soft_slow refused ties on a published damping 1-sigma of 5.6-9.0 %
    and excited on to its 90 s limit on 3 of 5 runs; on `bench/online.py`'s soft_slow runs that
    sigma is 7-15 %, the estimate's own 2.4-4.0 %, the error 1.6-4.4 %). Then the
    published model is what the solver converged to, and the controller may take it as done.
    Between two models this close the held-out verdict is the noise of each one's fitted
    start velocities. Measured: a sim2sim's twin within 0.5 % from sim t = 21.8 s had every
    later finish refused ("worse": loss 1.04e-4 against 8.5e-5 for values 0.1-0.9 % apart; "not
    significant": 0.4 against 0.4 mm CoM error 1 s ahead), and the controller excited on to
    its 90 s limit. An unstable fit never ties, nor do the config's values (nothing
    published yet, or published with an earlier refused finish)."""
    def verdict(why: str) -> bool:
        node.tie_verdict = why              # the operator's log says why a finish keeps exciting
        return not why

    if published is None:
        return verdict("nothing published yet")
    if not node.converged_sigma:
        return verdict("converged_sigma 0: the solver's test alone decides")
    if gate is None or gate.reason not in TIE_REASONS:
        return verdict(f"held-out verdict {getattr(gate, 'reason', None)!r}")
    if structure_key(node.session.incumbent_robot) != structure_key(node.session.robot):
        return verdict("the published model is of another structure")
    config = PhysicalParameters(node.session.config_robot).as_dict()
    if all(np.array_equal(np.asarray(published[n]), np.asarray(config[n])) for n in node.trainer.learn or ()
           if n in config):
        return verdict("the published values are the config's")   # published with a refused finish
    # the sigma of the fit the solver converged to: at the published values (an earlier
    # candidate) it carries their distance to the current data's optimum (the remaining step)
    # and the structure's shift there (measured: a fresh-clone sim2sim whose fits converged at
    # 23, 29 and 34 epochs were refused ties on sigmas of 35 % (K), 16 % (K) and 5.9 % (c) at
    # the published values, and the controller excited on to its 90 s limit)
    u = node.session.uncertainty(max_tuples=node.sigma_tuples or 64, at=fitted)
    awaited = u.awaited(tuple(node.trainer.learn or ())) if u is not None else ()
    if u is None or any(n in u.undetermined for n in awaited):
        return verdict("no sigma, or an undetermined value")
    if u.compensating:
        return verdict(f"{', '.join(u.compensating)} pinned at a bound: every value compensates, no sigma to compare")
    sigma = u.published()
    for name in awaited:
        a, b, s = (np.asarray(x, dtype=np.float64) for x in (fitted[name], published[name], sigma[name]))
        if not np.all(np.abs(a - b) <= TIE_SIGMAS * s):
            with np.errstate(divide="ignore", invalid="ignore"):
                far = float(np.nanmax(np.abs(a - b) / s))
            return verdict(f"{name} {far:.1f} sigma from the published value")
        # determined as `not_yet_determined` has it: the estimate's own sigma, which more data
        # narrows (the published one adds the groups' scatter, which it does not)
        own = np.asarray(u.sigma[name], dtype=np.float64)
        if not np.all(own <= node.converged_sigma * np.abs(a)):
            return verdict(f"{name}'s 1-sigma {100 * float(np.max(own / np.abs(a))):.1f} % of the fitted value, "
                           f"over converged_sigma")
    return verdict("")


def not_yet_determined(node, values: dict) -> tuple:
    """Learnt parameters whose 1-sigma at ``values`` is wider than ``converged_sigma`` of
    the value, or that the data does not determine (all of them if no sigma can be had); a
    limit (a winch's top speed) is not waited for (`ParameterUncertainty.awaited`)."""
    if not node.converged_sigma:
        return ()
    u = node.session.uncertainty(max_tuples=node.sigma_tuples or 64, at=values)
    learnt = tuple(node.trainer.learn or ())
    if u is None:
        return learnt
    rel = u.relative(PhysicalParameters(node.robot, values, per_element=[k for k, v in values.items() if len(v) > 1]))
    return tuple(n for n in u.awaited(learnt) if n in u.undetermined or not rel.get(n, math.inf) <= node.converged_sigma)


def clear_uncertainty_flags(node, why: str) -> None:
    """The published values have no sigma (``why``): the flags of an earlier estimate are
    not theirs."""
    node.undetermined = node.at_bound = node.structure_suspect = node.unreached = ()
    node.excite = ""
    node.sigma_state = why


def published_uncertainty(node, params, values: dict):
    """1-sigma at ``values`` per flat name of ``params`` (the same values), or None."""
    if not node.sigma_tuples:
        clear_uncertainty_flags(node, "off (uncertainty_tuples 0)")
        return None
    u = node.session.uncertainty(max_tuples=node.sigma_tuples, at=values)
    if u is None:
        node.diag.count("uncertainty_failed")
        clear_uncertainty_flags(node, "failed")
        return None
    node.sigma_state = ("estimated" if not u.compensating else
                        f"inf: {', '.join(u.compensating)} pinned at a bound, every value compensates")
    node.excite = advice_text(u) if u.undetermined else ""
    if u.undetermined and u.undetermined != node.undetermined:
        node.diag.warn_throttled("undetermined", f"the data does not determine {', '.join(u.undetermined)} yet: "
                                 + (node.excite or "excite the motions they act on"))
    node.undetermined, node.unreached = u.undetermined, u.unreached
    split = getattr(u, "lag_split", None)
    if split is not None and not split.determined:
        node.diag.warn_throttled("lag_split", f"the motors' time constant ({1e3 * split.motor:.1f} ms) and the cables' "
                                 f"lag c/k ({1e3 * split.cable:.1f} ms) are determined as their sum; the data fit the "
                                 "two exchanged about as well, so their sigma reaches that mirror: a bench measurement "
                                 "of either (a motor's step response) fixes the other (set it in the robot YAML and "
                                 "leave it out of learn)")
    if u.at_bound and u.at_bound != node.at_bound:
        hints = "".join(f"; {h}" for h in structure_hints(params, u.at_bound))
        none = ("; every value makes up for it, so they are published with no sigma (inf)" if u.compensating
                else "")
        node.diag.warn_throttled("at_bound", f"{', '.join(u.at_bound)} pinned at a bound of the model's range: the "
                                 "data asks for values the model does not allow (structure the robot has and the "
                                 "model lacks: `tensegrity-identify identify --structure` on a recording; or a "
                                 f"bound too tight: identification bounds){none}{hints}")
    node.at_bound = u.at_bound
    suspect = u.structure_suspect()
    if suspect and suspect != node.structure_suspect:
        node.diag.warn_throttled("structure_suspect", f"{', '.join(suspect)} move with the horizon (fitted over "
                                 "windows twice as long) by more than twice their spread: the model's structure, "
                                 "not the data, sets them (structure_options, or `tensegrity-identify identify "
                                 "--structure` on a recording)")
    node.structure_suspect = suspect
    # the groups' scatter, the horizon shift (mismatch every group shares) and the solver's
    # remaining step included (`ParameterUncertainty.published`); convergence
    # (not_yet_determined) is the estimate's
    return u.flat(params, structure=True)


def main(args=None) -> int:
    return run_node(IdentifierNode, args)


if __name__ == "__main__":
    raise SystemExit(main())
