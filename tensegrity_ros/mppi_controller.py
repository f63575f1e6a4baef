"""mppi_controller: MPPI over the identified engine, exploratory commands before that.

Subscribes to rod poses (+ IMU), identified parameters (latched; swaps the planning
model whenever new ones arrive), the goal (desired CoM velocity, world XY) and, where the
winches have encoders, the cable states (the actuator state plans start from). On its own
clock (sim or wall time, per use_sim_time), at every multiple of ``control_period``, a
worker thread plans one command (`tensegrity_engine.control.realtime.RealTimePlanner`):
it takes effect ``plan_budget + command_latency`` after the tick and is stamped so, it is
planned from the state the model predicts for that moment (the newest pose rolled through
the commands already sent), and planning stops at the budget (anytime), so the period
holds on a loaded CPU. Callbacks never block.

Before a model is identified (``excite_until``: the first parameters, or parameters whose
``stage`` contains "converged"/"done"/"final": the identifier finished, by a convergence
test or a limit, with every sigma narrow, or its budget is spent; and at most
``max_excitation_time`` s) it sends
the documented excitation: `tensegrity_engine.control.ExcitationPolicy` smooth random
multi-sines within each cable's command range.

Safety (`tensegrity_engine.control.safety`): every command is clipped to the robot YAML's
ranges and rate (`actuator.max_command_rate`, or the tighter ``max_command_rate``). The
controller *holds* -- publishes ``hold_command`` (the last command sent, or the config's
neutral rest lengths) every period and plans nothing -- when poses are older than
``pose_timeout`` (node clock: sim time in a simulation), when an identified model is
rejected (``hold_on_rejected_model``), when planning fails, or on ``~/hold``
(std_srvs/Trigger); only ``~/resume`` ends a hold, and only with fresh poses.
"""
from __future__ import annotations

import threading
import time
from typing import Optional

import numpy as np
from diagnostic_msgs.msg import DiagnosticStatus
from geometry_msgs.msg import PoseArray, Vector3Stamped
from rclpy.node import Node
from sensor_msgs.msg import Imu, JointState
from std_srvs.srv import Trigger
from visualization_msgs.msg import MarkerArray
from tensegrity_ros_interfaces.msg import CableCommand, IdentifiedParameters

from tensegrity_engine.control.excitation import DEFAULT_BAND as EXCITATION_BAND, KINDS as EXCITATION_KINDS
from tensegrity_engine.control.realtime import TickSchedule
from tensegrity_engine.control.safety import (MODEL_REJECTED, NS, OPERATOR, PLANNING_FAILED, CommandLimits,
                                              HoldLatch)
from tensegrity_engine.groundtruth.mujoco_twin import nominal_commands
from tensegrity_engine.identification.measurements import StampOrder, imu_problem, pose_problem
from tensegrity_engine.identification.streaming import StateEstimator, StreamConfig, cable_reading_verdict
from tensegrity_engine.physics.params import ParameterError

from . import conversions as conv
from .common import (TOPIC_CABLE_STATES, TOPIC_COMMAND, TOPIC_GOAL, TOPIC_IMU, TOPIC_MARKERS, TOPIC_PARAMS, TOPIC_POSES,
                     ConfigurationError, DONE_WORDS, goal_qos, latched_qos, resolve_device, run_node, stream_qos)
from .diagnostics import Diagnostics
from .params import declare, load_robot, refuse_undeclared


def report_inactive_residual(node) -> None:
    """After a model swap: say when the residual (``residual_file``) no longer applies."""
    dyn = node.mpc.dynamics
    if getattr(dyn, "residual", None) is not None and not dyn.residual_active:
        node.diag.count("residual_inactive_swaps")
        node.get_logger().warning("the residual was trained on other physics than the model just swapped in: "
                                  "planning with physics alone until that model returns")


def excitation_band(fmin: float, fmax: float) -> tuple[float, float]:
    """The excitation's (f_min, f_max) from the node's parameters, or a start-up error."""
    if fmin > fmax:
        raise ConfigurationError(f"excitation_fmin ({fmin:g} Hz) is above excitation_fmax ({fmax:g} Hz)")
    return fmin, fmax


def declare_planner(d) -> tuple[str, dict]:
    """The sampling planner's parameters: its name and `PlannerConfig`'s sizes."""
    planner = d("planner", "mppi", "sampling planner", choices=("mppi", "cem", "rs"))
    sizes = dict(
        horizon=d("horizon", 10, "plan length in knots", range=(1, 100)),
        num_samples=d("num_samples", 40, "rollouts per iteration", range=(1, 100000)),
        iterations=d("iterations", 5, "optimisation iterations per command", range=(1, 100)),
        noise_scale=d("noise_scale", 0.25, "sampling std / command range width", range=(0.0, 1.0)),
        temperature=d("temperature", 0.05, "MPPI temperature lambda (cost units), when target_ess is 0",
                      range=(1e-6, 1e3)),
        target_ess=d("target_ess", 0.2, "MPPI: each iteration's lambda for this effective sample size, a "
                     "share of num_samples (0 = the fixed temperature)", range=(0.0, 1.0)))
    return planner, sizes


class MppiControllerNode(Node):
    def __init__(self, **kwargs):
        super().__init__("mppi_controller", **kwargs)
        d = lambda *a, **k: declare(self, *a, **k)
        robot_name = d("robot", "superball", "robot config: shipped name or YAML path", read_only=True)
        self.period = d("control_period", 0.1, "command period (s); also the MPPI knot length",
                        range=(0.001, 10.0))
        self.device = resolve_device(d("device", "auto", "torch device for planning",
                                       choices=("auto", "cpu", "cuda")))
        planner, sizes = declare_planner(d)
        engine_dt = d("engine_dt", 0.0, "planning step (s); 0 = the robot's step", range=(0.0, 0.1))
        integrator = d("integrator", "model", "engine integrator; model = the identified model's "
                       "(the parameter message's integrator), else the robot config's (engine.integrator)", choices=("model", "semi_implicit", "implicitfast", "rk4", "implicit", "ani"))
        vx = d("goal_vx", 1.0, "initial desired CoM velocity x (m/s) until a goal arrives", range=(-10.0, 10.0))
        vy = d("goal_vy", 0.0, "initial desired CoM velocity y (m/s)", range=(-10.0, 10.0))
        self.pose_frame = d("pose_frame", "world", "frame the rod poses and goals are given in; "
                            "any other is refused")
        self.excite_until = d("excite_until", "converged",
                              "leave excitation at the first identified parameters ('first'), at "
                              "parameters whose stage says converged/done/final ('converged'), or never",
                              choices=("first", "converged", "never"))
        self.max_excitation = d("max_excitation_time", 0.0,
                                "switch to MPPI after this much excitation even without a converged "
                                "model (s, 0 = no limit)", range=(0.0, 1e6))
        kind = d("excitation_kind", "multisine", "excitation signal (steps: random levels held for random "
                 "times, for what acts within a sample interval)", choices=EXCITATION_KINDS)
        amp = d("excitation_amplitude", 0.8, "excitation amplitude / half command range", range=(0.01, 1.0))
        fmin = d("excitation_fmin", EXCITATION_BAND[0], "lowest excitation frequency (Hz)", range=(0.001, 100.0))
        fmax = d("excitation_fmax", EXCITATION_BAND[1], "highest excitation frequency (Hz)", range=(0.001, 100.0))
        seed = d("seed", 0, "excitation / sampling seed", range=(0, 2**31 - 1))
        threads = d("torch_threads", 0, "torch intra-op threads (0 = torch default)", range=(0, 256))
        backend = d("backend", "auto", "planning rollouts: the native C kernel (CPU, semi-implicit), "
                    "torch, or auto (native where it applies)", choices=("auto", "native", "torch"))
        residual_file = d("residual_file", "", "a learned residual (tensegrity_engine.physics.residual, "
                          "safetensors) planned with on top of the physics; empty: physics alone", read_only=True)
        safety = declare_safety(d)
        timing = declare_timing(d, self.period)
        self.marker_period = d("marker_period", 0.5, "seconds (wall) between the planned-model markers: the "
                               "state estimate with the model's cable tensions, the goal, the planned CoM "
                               "path (0 = none)", range=(0.0, 3600.0))

        import torch

        from tensegrity_engine.control import ExcitationPolicy, MPPIController, PlannerConfig
        from tensegrity_engine.control.realtime import RealTimePlanner

        if threads > 0:
            torch.set_num_threads(threads)
        self.robot = load_robot(robot_name)
        self.R, self.A = self.robot.num_rods, self.robot.num_actuated
        cfg = PlannerConfig(control_dt=self.period, seed=seed, **sizes)
        self.mpc = MPPIController(self.robot, planner=planner, config=cfg,
                                  engine_dt=(engine_dt or None),
                                  integrator=None if integrator == "model" else integrator, device=self.device,
                                  backend=None if backend == "auto" else backend)
        if residual_file:       # a file for another robot, or not a residual, fails here and says why
            from tensegrity_engine.physics.residual import load_residual
            self.mpc.dynamics.set_residual(load_residual(self.robot, residual_file))
        self.mpc.cost.w_airborne = timing["airborne_weight"]
        self.mpc.cost.target_velocity = np.array([vx, vy])
        self.mpc.cost.speed = float(np.hypot(vx, vy))
        self.limits = CommandLimits.for_robot(self.robot, safety["max_command_rate"] or None)
        self.latch = HoldLatch(int(safety["pose_timeout"] * NS))
        self.hold_command = safety["hold_command"]
        self.hold_on_rejected_model = safety["hold_on_rejected_model"]
        excitation = ExcitationPolicy(self.robot, seed=seed, kind=kind, amplitude=amp,
                                      freq_range=excitation_band(fmin, fmax), control_dt=self.period)
        self.rt = RealTimePlanner(self.robot, self.mpc, excitation, nominal_commands(self.robot),
                                  period=self.period, plan_budget=timing["plan_budget"],
                                  command_latency=timing["command_latency"], compensate=timing["compensate_latency"])
        self.pose_wait = timing["pose_wait"]
        warm = self.rt.warm_up()                 # the first real tick must not be the slow one
        self.estimator = StateEstimator(self.R)
        self.checks = StreamConfig.for_robot(self.robot)    # the identifier's measurement limits
        self.order = StampOrder(int(5 * NS))
        self.last_command = nominal_commands(self.robot).copy()
        self.last_command_ns = None
        self.last_tick = None                              # TickResult of the newest command
        self.mode = "excitation" if self.excite_until != "never" else "mppi"
        self.model_stage = "nominal"
        self.excite_start_ns = None
        self._pending_params = None
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()     # the worker and the hold service both publish
        self._new_pose = threading.Event()
        self._stop = threading.Event()
        self.pose_count = 0
        self.plans = 0
        self.ticks_missed = 0
        self._last_now: Optional[int] = None    # the worker's clock at its last look (`_check_clock`)

        self.pub = self.create_publisher(CableCommand, TOPIC_COMMAND, stream_qos())
        self.create_subscription(PoseArray, TOPIC_POSES, self._on_pose, stream_qos())
        self.create_subscription(Imu, TOPIC_IMU, lambda msg: on_imu(self, msg), stream_qos(100))
        self._encoders = None               # (stamp, rest lengths [C]) not yet handed to the planner
        if timing["use_encoders"]:
            self.create_subscription(JointState, TOPIC_CABLE_STATES, lambda msg: on_cable_states(self, msg),
                                     stream_qos())
        self.create_subscription(IdentifiedParameters, TOPIC_PARAMS, self._on_params, latched_qos())
        self.create_subscription(Vector3Stamped, TOPIC_GOAL, self._on_goal, goal_qos())
        self.pub_markers = self.create_publisher(MarkerArray, TOPIC_MARKERS, 5)
        self._last_markers = 0.0
        self.create_service(Trigger, "~/hold", self._on_hold)
        self.create_service(Trigger, "~/resume", self._on_resume)
        self.diag = Diagnostics(self, extra=lambda: diag_values(self))
        refuse_undeclared(self)      # all declared by now, Diagnostics' period too
        self._worker = threading.Thread(target=self._run, name="mppi_worker", daemon=True)
        self._worker.start()
        self.get_logger().info(f"MPPI controller on {self.device}: {planner}, H={cfg.horizon}, N={cfg.num_samples}, "
                               f"iters={cfg.iterations}, {self.mpc.dynamics.backend} rollouts (warmed up in {warm:.2f} s); "
                               f"starting in {self.mode}")

    # ------------------------------------------------------------------ callbacks
    def _on_pose(self, msg: PoseArray) -> None:
        self.diag.received("poses")
        problem = conv.header_problem(msg.header, self.pose_frame)
        if problem:
            return self.diag.reject(*problem, topic="poses")
        arr = conv.pose_array_to_array(msg)
        stamp = conv.stamp_ns(msg.header.stamp)
        problem = pose_problem(arr, self.R, max_abs_position=self.checks.max_abs_position,
                               quat_tolerance=self.checks.quat_tolerance)
        if problem:
            return self.diag.reject(problem, "rod poses", topic="poses")
        with self._lock:
            verdict = self.order.verdict("pose", stamp)
            if verdict in ("duplicate", "out_of_order"):
                return self.diag.reject(verdict, "pose stamp not increasing", topic="poses")
            if verdict == "clock_jump":
                self.diag.count("event_clock_jump")
                if stamp < self.order.get("pose"):      # the clock restarted: start over
                    self.estimator = StateEstimator(self.R)
                    self.order.forget()
                    self.last_command_ns = None
            self.order.accept("pose", stamp)
            self.estimator.add_pose(stamp, arr)
            self.pose_count += 1
            self.latch.pose_received(self.get_clock().now().nanoseconds)
        self.diag.accept("poses")
        self._new_pose.set()

    def _on_params(self, msg: IdentifiedParameters) -> None:
        """Swap in identified parameters only after every check (`conv.msg_to_params`);
        a rejected message is counted under its reason and the current model stays."""
        self.diag.received("parameters")
        try:
            params = conv.msg_to_params(msg, self.robot)
        except ParameterError as exc:
            self._model_rejected(str(exc))
            return self.diag.reject(f"parameters_{exc.reason}", str(exc), topic="parameters")
        except Exception as exc:  # noqa: BLE001 - bad message: keep the current model
            self._model_rejected(repr(exc))
            return self.diag.reject("parameters_invalid", repr(exc), topic="parameters")
        with self._lock:
            self._pending_params = (params, msg.stage)
        self.diag.accept("parameters")

    def _on_goal(self, msg: Vector3Stamped) -> None:
        self.diag.received("goals")
        v = np.array([msg.vector.x, msg.vector.y])
        if not np.isfinite(v).all() or np.linalg.norm(v) > 10.0:
            return self.diag.reject("bad_goal", f"goal {v}", topic="goals")
        if msg.header.frame_id not in ("", self.pose_frame):
            return self.diag.reject("wrong_frame", f"goal in {msg.header.frame_id[:64]!r}, expected "
                                    f"{self.pose_frame!r}", topic="goals")
        with self._lock:
            self.mpc.cost.target_velocity = v
            self.mpc.cost.speed = float(np.linalg.norm(v))
        self.diag.accept("goals")

    # ------------------------------------------------------------------ worker
    def _run(self) -> None:
        """Ticks at the multiples of the period on the node clock (sim time: the bridge's
        clock, so a paused simulation pauses the ticks)."""
        clock, schedule = self.get_clock(), TickSchedule(self.period)
        while not self._stop.is_set() and self.context.ok():
            now = clock.now().nanoseconds
            if now <= 0 and self.estimator.stamp is not None:
                now = self.estimator.stamp            # a sim clock held at 0 waits for our first command
            self._check_clock(now)
            tick = schedule.due(now)
            if tick is None:
                self._stop.wait(min(0.002, schedule.wait_s(now)))
                continue
            self.ticks_missed = schedule.missed
            try:
                if not self._watchdog(now) and not self._step(tick):
                    schedule.next = None               # no pose yet: the first tick is the next due
                    self._stop.wait(0.005)
            except Exception as exc:  # noqa: BLE001 - keep the node alive; hold the robot
                if not self.context.ok():
                    break
                hold_after_failure(self, exc)

    def _check_clock(self, now: int) -> bool:
        return restart_if_clock_went_back(self, now)

    def _swap_model(self) -> None:
        with self._lock:
            pending, self._pending_params = self._pending_params, None
        if pending is None:
            return
        params, stage = pending
        try:
            self.mpc.set_params(params)
        except Exception as exc:  # noqa: BLE001 - the planner refused it: keep the current model
            self.diag.count("models_refused_by_planner")
            return self._model_rejected(f"planner refused the model: {exc!r}")
        self.rt.set_model(params)
        self.model_stage = stage or "identified"
        self.diag.count("models_swapped")
        report_inactive_residual(self)
        converged = any(k in (stage or "").lower() for k in DONE_WORDS)
        if self.mode == "excitation" and (self.excite_until == "first" or
                                          (self.excite_until == "converged" and converged)):
            self.mode = "mppi"
            self.mpc.reset()
            self.get_logger().info(f"identified model ({stage}) received: switching to MPPI")

    def _step(self, tick_ns: int) -> bool:
        """The tick's command; False when there is no measured state to plan from yet."""
        self._swap_model()
        if self.latch.holding:
            return True
        if self.estimator.stamp is not None and self.estimator.stamp < tick_ns and self.pose_wait > 0:
            self._new_pose.clear()                   # the tick's own pose may be on its way
            self._new_pose.wait(self.pose_wait)
        with self._lock:
            stamp = self.estimator.stamp
            state = self.estimator.state()
            encoders, self._encoders = self._encoders, None
        if encoders is not None:
            self.rt.measured_rest_lengths(*encoders)
        if state is None:
            return False
        start = self.rt.excite_start_ns
        if (self.mode == "excitation" and self.max_excitation > 0 and start is not None
                and tick_ns - start > self.max_excitation * NS):
            self.mode = "mppi"
            self.mpc.reset()
            self.get_logger().info("max_excitation_time reached: switching to MPPI with the "
                                   f"{self.model_stage} model")
        res = self.rt.tick(tick_ns, stamp, state, self.mode, now_ns=self.get_clock().now().nanoseconds)
        self.last_tick = res
        if not np.isfinite(res.command).all():
            self.diag.count("nonfinite_plan")
            self._trip(PLANNING_FAILED, "the plan has non-finite commands")
            return True
        now = self.get_clock().now().nanoseconds
        if now > res.valid_ns:                       # planning overran: say when it really acts
            self.diag.count("commands_late")
        self._send(res.command, max(res.valid_ns, now))
        if res.planned:                              # after the command: display never delays it
            self.plans += 1
            publish_planned_markers(self, res.state, res.act, res.valid_ns)
        return True

    def _send(self, u, t_cmd: int, holding: bool = False) -> None:
        """Publish ``u`` within the command limits, stamped ``t_cmd`` (after the last one)."""
        with self._send_lock:
            if self.latch.holding and not holding:
                return                   # a hold started while this plan was computed
            dt = 0.0 if self.last_command_ns is None else (t_cmd - self.last_command_ns) / NS
            u, limited = self.limits.apply(u, self.last_command, dt)
            if limited:
                self.diag.count("commands_limited")
            if self.last_command_ns is not None and t_cmd <= self.last_command_ns:
                t_cmd = self.last_command_ns + 1
            self.pub.publish(conv.make_cable_command(u, t_cmd))
            self.rt.sent(t_cmd, u)
            self.last_command, self.last_command_ns = u, t_cmd
            self.diag.count("hold_commands_sent" if holding else "commands_sent")

    # ------------------------------------------------------------------ safety
    def _trip(self, reason: str, detail: str) -> None:
        now = self.get_clock().now().nanoseconds
        if self.latch.trip(reason, detail, now):
            self.diag.count(f"hold_{reason}")
            self.get_logger().error(f"holding ({reason}): {detail}; call ~/resume to continue")
            self._send_hold(now)

    def _model_rejected(self, detail: str) -> None:
        if self.hold_on_rejected_model:
            self._trip(MODEL_REJECTED, detail)

    def _send_hold(self, now_ns: int) -> None:
        u = nominal_commands(self.robot) if self.hold_command == "neutral" else self.last_command
        self._send(u, now_ns, holding=True)

    def _watchdog(self, now: int) -> bool:
        """Stale poses start a hold; while holding, the hold command goes out every tick."""
        if self.latch.check(now):
            self.diag.count("hold_stale_poses")
            self.get_logger().error(f"holding (stale_poses): {self.latch.detail}; call ~/resume to continue")
        if self.latch.holding:
            self._send_hold(now)
        return self.latch.holding

    def _on_hold(self, request, response):
        self._trip(OPERATOR, "hold requested")
        response.success, response.message = True, f"holding ({self.latch.reason})"
        return response

    def _on_resume(self, request, response):
        with self._send_lock:
            was_holding = self.latch.holding
            ok, why = self.latch.resume(self.get_clock().now().nanoseconds)
        if ok and was_holding:
            self.mpc.reset()             # the warm start predates the hold
            self.diag.count("resumed")
            self.get_logger().info(why)
        response.success, response.message = ok, why
        return response

    def close(self) -> None:
        self._stop.set()
        self._worker.join(timeout=30.0)


def on_imu(node: MppiControllerNode, msg: Imu) -> None:
    """A rod's IMU: its angular velocity refines the state estimate's."""
    node.diag.received("imu")
    problem = conv.header_problem(msg.header)
    if problem:
        return node.diag.reject(*problem, topic="imu")
    rod, w, q = conv.imu_to_arrays(msg)
    problem = imu_problem(rod, w, q, node.R, max_abs_angular_velocity=node.checks.max_abs_angular_velocity,
                          quat_tolerance=node.checks.quat_tolerance)
    if problem:
        return node.diag.reject(problem, f"IMU {msg.header.frame_id[:64]!r}", topic="imu")
    stamp = conv.stamp_ns(msg.header.stamp)
    with node._lock:
        verdict = node.order.verdict(("imu", rod), stamp)
        if verdict in ("duplicate", "out_of_order"):
            return node.diag.reject(verdict, "IMU stamp not increasing", topic="imu")
        node.order.accept(("imu", rod), stamp)
        node.estimator.add_imu(stamp, rod, w)
    node.diag.accept("imu")


def on_cable_states(node: MppiControllerNode, msg: JointState) -> None:
    """The cables' own sensors (docs/driver_contract.md): the winches' encoders (``position``,
    rest lengths) are kept for the next tick, whose plan then starts from the actuator state
    they measure (`RealTimePlanner.measured_rest_lengths`); load cells alone are accepted and
    not used. Refused as the identifier refuses them, and counted."""
    node.diag.received("cables")
    problem = conv.header_problem(msg.header)
    if problem:
        return node.diag.reject(*problem, topic="cables")
    rest, tension, problem = conv.joint_state_to_cable_states(msg, node.robot.cable_names)
    if problem:
        return node.diag.reject("wrong_length", problem, topic="cables")
    stamp = conv.stamp_ns(msg.header.stamp)
    with node._lock:
        verdict = cable_reading_verdict(node.checks, node.order, stamp, rest, tension)
        if verdict not in (None, "clock_jump"):
            return node.diag.reject(verdict, "cable states", topic="cables")
        node.order.accept("cables", stamp)
        if rest is not None:
            node._encoders = (stamp, rest)
    node.diag.accept("cables")


def hold_after_failure(node: MppiControllerNode, exc: Exception) -> None:
    """Hold the robot after a failed tick; a hold that fails too is counted and logged,
    never raised: a worker that dies sends nothing ever again."""
    try:
        node._trip(PLANNING_FAILED, f"planning failed: {exc!r}")
    except Exception as hold_exc:  # noqa: BLE001
        node.diag.count("hold_failed")
        node.diag.warn_throttled("hold_failed", f"cannot send the hold command: {hold_exc!r}")
        node._stop.wait(0.01)


def restart_if_clock_went_back(node: MppiControllerNode, now: int) -> bool:
    """A node clock that went back more than two periods (a restarted simulation: its
    /clock and its pose stamps start over) restarts what the old clock stamped: the
    commands sent, the actuator estimate, the excitation, the pose stream, and the stale-
    pose watchdog's timer (it counts from now). True if it did."""
    last, node._last_now = node._last_now, now
    if last is None or now >= last - 2 * int(round(node.period * NS)):
        return False
    with node._lock, node._send_lock:
        node.rt.restart()
        node.last_command_ns = None
        node.estimator = StateEstimator(node.R)
        node._encoders = None
        node.order.forget()
        if node.latch.last_pose_ns is not None:
            node.latch.pose_received(now)
    node.diag.count("event_clock_restart")
    node.get_logger().warning(f"the clock went back {(last - now) / NS:.3f} s: planner, commands and "
                              "pose stream start over")
    return True


def diag_values(node: MppiControllerNode) -> dict:
    """The controller's state for /diagnostics (and its ERROR status while holding)."""
    if node.latch.holding:
        node.diag.set_status(DiagnosticStatus.ERROR, f"holding ({node.latch.reason}): {node.latch.detail}")
    else:
        node.diag.set_status(DiagnosticStatus.OK, node.mode)
    r = node.last_tick
    return {"mode": "hold" if node.latch.holding else node.mode, "hold_reason": node.latch.reason or "",
            "model": node.model_stage, "poses": node.pose_count, "plans": node.plans,
            "last_plan_time_s": round(r.plan_s, 4) if r else "n/a",
            "last_iterations": r.iterations if r else "n/a",
            "last_predicted_ahead_s": round(r.predicted_s, 4) if r else "n/a",
            "ticks_missed": node.ticks_missed, "actuator_from_encoders": node.rt.encoder_readings,
            "goal": str(node.mpc.cost.target_velocity.tolist())}


def publish_planned_markers(node: MppiControllerNode, state, act, t_ns: int) -> None:
    """What the planner believes (every ``marker_period`` s): the estimated state with the
    model's cable tensions, the goal velocity (1 s long) from the CoM, and the CoM path
    the newest plan predicts."""
    now = time.monotonic()
    if node.marker_period <= 0 or now - node._last_markers < node.marker_period:
        return
    node._last_markers = now
    tensions = node.mpc.model_tensions(state, act)
    path = node.mpc.planned_path(state, act)
    arr = MarkerArray()
    arr.markers = conv.rod_cable_markers(node.robot, state, t_ns, "planned", (0.2, 0.8, 0.2, 0.5),
                                         cable_colors=None if tensions is None else conv.tension_colors(tensions))
    if path is not None:
        arr.markers.append(conv.path_marker(path, t_ns, "planned/com_path", (1.0, 0.8, 0.0, 1.0)))
        goal = np.array([*node.mpc.cost.target_velocity, 0.0])
        arr.markers.append(conv.arrow_marker(path[0], goal, t_ns, "planned/goal", (1.0, 0.2, 0.8, 1.0)))
    node.pub_markers.publish(arr)


def declare_timing(d, period: float) -> dict:
    """When commands take effect, how long planning may take, how gently the robot may
    move (node parameters)."""
    out = {
        "plan_budget": d("plan_budget", 0.8 * period, "wall seconds planning may take per command "
                         "(anytime: iterations stop there); part of the lead", range=(1e-4, 10.0)),
        "command_latency": d("command_latency", 0.01, "expected transport delay of a command to the robot "
                             "(s); a command is stamped tick + plan_budget + command_latency",
                             range=(0.0, 1.0)),
        "compensate_latency": d("compensate_latency", True, "plan from the state the model predicts for "
                                "the command's stamp (else from the newest measurement)"),
        "use_encoders": d("use_encoders", True, "plan from the actuator state the winches' encoders measure "
                          "(JointState position on the cable_states topic) where every actuated cable has one; "
                          "else from the model's response to the commands sent"),
        "airborne_weight": d("airborne_weight", 10.0, "cost per metre the robot's lowest point is above "
                             "1 cm (a robot in the air lands on its motors; 0 = the paper's cost; 10: "
                             "airborne 0-1.2 % in real time at the same speed, bench/realtime.py air*)",
                             range=(0.0, 1e4)),
        "pose_wait": d("pose_wait", 0.005, "wall seconds a tick waits for its own pose when the newest is "
                       "older than the tick", range=(0.0, 1.0)),
    }
    if not out["plan_budget"] < period:
        raise ConfigurationError(f"plan_budget ({out['plan_budget']:g} s) must be below the control period "
                                 f"({period:g} s): a tick plans within its own period")
    return out


def declare_safety(d) -> dict:
    """The controller's safety settings (node parameters)."""
    return {
        "pose_timeout": d("pose_timeout", 1.0, "hold when the newest pose is older than this (s, node "
                          "clock; 0 = no watchdog)", range=(0.0, 3600.0)),
        "hold_command": d("hold_command", "last", "what a hold sends: the last command or the config's "
                          "neutral rest lengths", choices=("last", "neutral")),
        "hold_on_rejected_model": d("hold_on_rejected_model", True, "hold when an identified model is "
                                    "rejected (malformed, out of bounds, refused by the planner)"),
        "max_command_rate": d("max_command_rate", 0.0, "fastest change of a commanded rest length (m/s); "
                              "0 = the robot YAML's actuator.max_command_rate", range=(0.0, 1e3)),
    }


def main(args=None) -> int:
    return run_node(MppiControllerNode, args)


if __name__ == "__main__":
    raise SystemExit(main())
