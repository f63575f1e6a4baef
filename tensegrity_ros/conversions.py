"""Message <-> engine translation (thin, no physics).

Conventions (docs/ros_interface.md):

* PoseArray: one pose per rod in config order, rod centre in the world frame, body z axis
  = rod axis (end 0 -> end 1); ROS quaternions are (x, y, z, w), the engine's (w, x, y, z).
* Imu: one message per rod, ``header.frame_id = rod_<i>``; ``angular_velocity`` in the rod
  (body) frame as REP 145 asks; ``orientation`` the rod's world orientation, or
  ``orientation_covariance[0] = -1`` when not provided.
* JointState (cable states): ``name`` the robot YAML's cable names (any subset, any order),
  ``position`` rest lengths (m, a winch's encoder) and ``effort`` tensions (N, a load cell),
  either empty; a NaN is a cable without that sensor.
* Stamps: ``builtin_interfaces/Time`` <-> integer nanoseconds.
"""
from __future__ import annotations

import re
from typing import Optional, Sequence

import numpy as np

from tensegrity_engine.physics.state import ANG_VEL, POS, QUAT, end_nodes, quat_rotate

NS = 1_000_000_000
_ROD_FRAME = re.compile(r"^rod_(\d+)$")


def stamp_ns(stamp) -> int:
    return int(stamp.sec) * NS + int(stamp.nanosec)


def header_problem(header, frame: Optional[str] = None) -> Optional[tuple[str, str]]:
    """(reason, detail) when a measurement's header is unusable: a bad stamp, or a frame
    other than ``frame`` (when given); None when it is fine."""
    if not stamp_valid(header.stamp):
        return "bad_stamp", "stamp before 0 or malformed"
    if frame is not None and header.frame_id != frame:
        return "wrong_frame", f"frame {header.frame_id[:64]!r}, expected {frame!r} (parameter pose_frame)"
    return None


def stamp_valid(stamp) -> bool:
    """A measurement time: not before the epoch (sim time starts at 0) and a normalised
    nanosecond field."""
    return int(stamp.sec) >= 0 and 0 <= int(stamp.nanosec) < NS


def ns_to_stamp(ns: int, stamp=None):
    from builtin_interfaces.msg import Time

    out = Time() if stamp is None else stamp
    ns = int(ns)
    out.sec, out.nanosec = ns // NS, ns % NS
    return out


def pose_array_to_array(msg) -> np.ndarray:
    """PoseArray -> [N, 7] (x, y, z, qw, qx, qy, qz) (no validation: StreamAligner does it)."""
    out = np.empty((len(msg.poses), 7))
    for i, p in enumerate(msg.poses):
        out[i] = (p.position.x, p.position.y, p.position.z,
                  p.orientation.w, p.orientation.x, p.orientation.y, p.orientation.z)
    return out


def array_to_rod_state(arr: np.ndarray) -> np.ndarray:
    """[R, 7] -> [R, 13] rod state with zero velocities (normalised quaternions)."""
    s = np.zeros((arr.shape[0], 13))
    s[:, POS] = arr[:, :3]
    q = arr[:, 3:7]
    s[:, QUAT] = q / np.linalg.norm(q, axis=-1, keepdims=True)
    return s


def rod_state_to_pose_array(rod_state: np.ndarray, stamp_ns_: int, frame_id: str = "world",
                            msg=None):
    from geometry_msgs.msg import Pose, PoseArray

    out = PoseArray() if msg is None else msg
    out.header.frame_id = frame_id
    ns_to_stamp(stamp_ns_, out.header.stamp)
    poses = []
    for s in np.asarray(rod_state, dtype=np.float64):
        p = Pose()
        p.position.x, p.position.y, p.position.z = (float(v) for v in s[POS])
        p.orientation.w, p.orientation.x, p.orientation.y, p.orientation.z = (float(v) for v in s[QUAT])
        poses.append(p)
    out.poses = poses
    return out


def rod_imu_messages(rod_state: np.ndarray, stamp_ns_: int, with_orientation: bool = True,
                     noise_std: float = 0.0, rng: Optional[np.random.Generator] = None):
    """One sensor_msgs/Imu per rod (body-frame angular velocity)."""
    from sensor_msgs.msg import Imu

    rs = np.asarray(rod_state, dtype=np.float64)
    q = rs[:, QUAT]
    conj = q * np.array([1.0, -1.0, -1.0, -1.0])
    w_body = quat_rotate(conj, rs[:, ANG_VEL])
    if noise_std > 0 and rng is not None:
        w_body = w_body + rng.normal(0.0, noise_std, w_body.shape)
    out = []
    for i in range(rs.shape[0]):
        m = Imu()
        m.header.frame_id = f"rod_{i}"
        ns_to_stamp(stamp_ns_, m.header.stamp)
        m.angular_velocity.x, m.angular_velocity.y, m.angular_velocity.z = (float(v) for v in w_body[i])
        if with_orientation:
            m.orientation.w, m.orientation.x, m.orientation.y, m.orientation.z = (float(v) for v in q[i])
        else:
            m.orientation_covariance[0] = -1.0
        m.linear_acceleration_covariance[0] = -1.0   # not provided
        out.append(m)
    return out


def imu_to_arrays(msg):
    """Imu -> (rod index or None, omega_body [3], quat_wxyz [4] or None)."""
    m = _ROD_FRAME.match(msg.header.frame_id or "")
    rod = int(m.group(1)) if m else None
    w = np.array([msg.angular_velocity.x, msg.angular_velocity.y, msg.angular_velocity.z])
    q = None
    if msg.orientation_covariance[0] != -1.0:
        o = msg.orientation
        q = np.array([o.w, o.x, o.y, o.z])
        if not np.any(q):
            q = None
    return rod, w, q


def joint_state_to_cable_states(msg, cable_names: Sequence[str]
                                ) -> tuple[Optional[np.ndarray], Optional[np.ndarray], str]:
    """JointState -> (rest lengths [C] or None, tensions [C] or None, problem): config order of
    every cable (``cable_names``), NaN for a cable the message does not name. ``problem`` is ''
    or why the message cannot be mapped (the caller counts it as ``wrong_length``)."""
    names = list(msg.name)
    index = {n: i for i, n in enumerate(cable_names)}
    if not names or len(set(names)) != len(names) or any(n not in index for n in names):
        return None, None, "joint names must be distinct cable names of the robot YAML"
    out = []
    for field in (msg.position, msg.effort):
        if len(field) == 0:
            out.append(None)
            continue
        if len(field) != len(names):
            return None, None, f"{len(field)} values for {len(names)} named cables"
        values = np.full(len(cable_names), np.nan)
        values[[index[n] for n in names]] = np.asarray(field, dtype=np.float64)
        out.append(values)
    if out[0] is None and out[1] is None:
        return None, None, "neither position (rest length) nor effort (tension) given"
    return out[0], out[1], ""


def cable_states_message(rest_lengths, tensions, stamp_ns_: int, cable_names: Sequence[str]):
    """A JointState of every cable (``cable_names``, config order): rest lengths as position
    and tensions as effort, either None (left empty); NaN where a cable has no such sensor."""
    from sensor_msgs.msg import JointState

    m = JointState()
    ns_to_stamp(stamp_ns_, m.header.stamp)
    m.name = list(cable_names)
    if rest_lengths is not None:
        m.position = [float(v) for v in rest_lengths]
    if tensions is not None:
        m.effort = [float(v) for v in tensions]
    return m


def cable_command_to_array(msg, cable_names: Sequence[str]) -> Optional[np.ndarray]:
    """CableCommand -> [A] targets in config order of the actuated cables, or None if the
    message cannot be mapped (wrong length / unknown names): the caller counts it."""
    vals = np.asarray(msg.target_rest_lengths, dtype=np.float64)
    names = list(msg.cable_names)
    if not names:
        return vals  # length checked by the caller (wrong_length)
    if len(names) != len(vals):
        return None
    index = {n: i for i, n in enumerate(cable_names)}
    if len(names) != len(cable_names) or set(names) != set(index):
        return None        # unknown, missing or repeated names
    out = np.empty(len(cable_names))
    out[[index[n] for n in names]] = vals
    return out


def checked_command(msg, cable_names: Sequence[str]) -> tuple[Optional[np.ndarray], Optional[str]]:
    """CableCommand -> (targets [A] in config order, None), or (None or the values, the
    reason to reject it: ``wrong_length`` or `command_problem`'s)."""
    from tensegrity_engine.identification.measurements import command_problem

    u = cable_command_to_array(msg, cable_names)
    return u, ("wrong_length" if u is None else command_problem(u, len(cable_names)))


def make_cable_command(values: np.ndarray, stamp_ns_: int, cable_names: Sequence[str] = (),
                       frame_id: str = ""):
    from tensegrity_ros_interfaces.msg import CableCommand

    m = CableCommand()
    ns_to_stamp(stamp_ns_, m.header.stamp)
    m.header.frame_id = frame_id
    m.cable_names = list(cable_names)
    m.target_rest_lengths = [float(v) for v in np.asarray(values).reshape(-1)]
    return m


def params_to_msg(params, robot_name: str, stamp_ns_: int, *, train_loss=float("nan"),
                  validation_loss=float("nan"), stage: str = "", engine_dt: float = 0.001,
                  epoch: int = 0, tuples_used: int = 0, uncertainty=None,
                  heldout_com_error: float = float("nan"), replaced_com_error: float = float("nan")):
    """PhysicalParameters -> IdentifiedParameters (flat names like cable_stiffness[3]);
    ``uncertainty``: a 1-sigma per flat name (NaN: not identified, inf: undetermined, a
    limit such as a winch's top speed that the data never reach, or every value while one
    compensates for missing structure: `ParameterUncertainty.compensating`)."""
    from tensegrity_ros_interfaces.msg import IdentifiedParameters

    names, values = params.flat()
    lo, hi = [], []
    for n in names:
        l, h = params.bounds_of(n.split("[")[0])
        lo.append(float(l))
        hi.append(float(h))
    m = IdentifiedParameters()
    ns_to_stamp(stamp_ns_, m.header.stamp)
    m.header.frame_id = "world"
    m.robot_name = robot_name
    m.names = list(names)
    m.values = [float(v) for v in values]
    m.lower_bounds, m.upper_bounds = lo, hi
    if uncertainty is not None:
        if len(uncertainty) != len(names):
            raise ValueError(f"{len(uncertainty)} sigmas for {len(names)} parameters")
        m.uncertainty = [float(v) for v in uncertainty]
    m.train_loss = float(train_loss)
    m.validation_loss = float(validation_loss)
    m.heldout_com_error, m.replaced_com_error = float(heldout_com_error), float(replaced_com_error)
    m.integrator = params.robot.integrator
    contact = params.robot.contact
    m.contact_condim = int(contact.soft_condim) if contact.law == "soft" else 0
    m.stage = stage
    m.engine_dt = float(engine_dt)
    m.epoch = int(max(0, epoch))
    m.tuples_used = int(max(0, min(tuples_used, 2**32 - 1)))
    return m


_PARAM_NAME = re.compile(r"([a-z_]+)(?:\[(\d{1,6})\])?")


def msg_to_param_values(msg) -> dict:
    """IdentifiedParameters -> {name: np.array of values} (per-element names merged).

    Raises `ParameterError` (with a counter ``reason``) on names that do not parse,
    duplicates, gaps in the element indices and names/values of different lengths."""
    return _grouped(msg.names, msg.values, "values")


def msg_to_sigmas(msg) -> dict:
    """IdentifiedParameters -> {name: 1-sigma array} ({} when the message carries none).
    NaN: not identified; inf: the data cannot determine it yet (or a limit they never reach);
    a negative sigma is refused."""
    from tensegrity_engine.physics.params import ParameterError

    if not len(msg.uncertainty):
        return {}
    sigma = np.asarray(msg.uncertainty, dtype=np.float64)
    if (sigma < 0).any():
        raise ParameterError("bad_uncertainty", "a negative standard deviation")
    return _grouped(msg.names, sigma, "uncertainty")


def _grouped(names, numbers, field: str) -> dict:
    from tensegrity_engine.physics.params import ParameterError

    if len(names) != len(numbers):
        raise ParameterError("wrong_length", f"{len(names)} names but {len(numbers)} {field}")
    groups: dict = {}
    for n, v in zip(names, numbers):
        match = _PARAM_NAME.fullmatch(n)
        if match is None:
            raise ParameterError("bad_name", f"parameter name {n[:64]!r}")
        base, idx = match.group(1), int(match.group(2) or 0)
        items = groups.setdefault(base, {})
        if idx in items:
            raise ParameterError("duplicate_name", f"{n!r} given twice")
        items[idx] = float(v)
    for base, items in groups.items():
        if sorted(items) != list(range(len(items))):
            raise ParameterError("wrong_length", f"{base}: element indices are not 0..{len(items) - 1}")
    return {k: np.array([items[i] for i in range(len(items))]) for k, items in groups.items()}


def msg_to_params(msg, robot):
    """IdentifiedParameters -> PhysicalParameters after every check a consumer needs: the
    robot name, the message's shape (`msg_to_param_values`) and the values against the
    project's bounds (`checked_parameters`; the message's own bounds may only narrow
    them); a model message names every parameter, so a partial one is refused. The values
    come on ``robot`` built in the message's structure (integrator, soft-law condim: what
    they were fitted in). Raises `ParameterError` whose ``reason`` names what was wrong."""
    from tensegrity_engine.physics.params import ParameterError, checked_parameters

    if msg.robot_name != robot.name:
        raise ParameterError("wrong_robot", f"parameters for robot {msg.robot_name[:64]!r}, not {robot.name!r}")
    robot = in_message_structure(robot, str(msg.integrator), int(msg.contact_condim))
    values = msg_to_param_values(msg)
    n = len(msg.names)
    if len(msg.lower_bounds) not in (0, n) or len(msg.upper_bounds) not in (0, n):
        raise ParameterError("wrong_length", "bounds do not match the names")
    bounds = {}
    for name, lo, hi in zip(msg.names, msg.lower_bounds, msg.upper_bounds):
        base = name.split("[")[0]
        if not (np.isfinite(lo) and np.isfinite(hi)):
            raise ParameterError("non_finite", f"bounds of {name}")
        if bounds.setdefault(base, (float(lo), float(hi))) != (float(lo), float(hi)):
            raise ParameterError("bad_bounds", f"{base}: different bounds for its elements")
    return checked_parameters(robot, values, bounds=bounds, complete=True)


def in_message_structure(robot, integrator: str, condim: int):
    """``robot`` with a message's ``integrator`` and ``contact_condim`` (checked; empty / 0:
    the robot's own; a dimensionality under a penalty-law config: the soft law, which the
    identifier adopted online, `soft_contact`)."""
    from tensegrity_engine.identification.online_structure import robot_in_structure
    from tensegrity_engine.physics.params import ParameterError

    law = "soft" if condim else robot.contact.law
    try:
        return robot_in_structure(robot, (integrator or robot.integrator, law, condim or None))
    except ValueError as exc:
        raise ParameterError("bad_structure", f"{exc} (robot under the {robot.contact.law} ground law)") from None


# ----------------------------------------------------------------------------- markers
def tension_colors(tensions, full_scale: Optional[float] = None) -> np.ndarray:
    """[C, 4] RGBA per cable: slack grey, taut from blue (low) to red (``full_scale``,
    default the largest tension)."""
    t = np.asarray(tensions, dtype=np.float64)
    scale = float(full_scale) if full_scale else max(float(t.max(initial=0.0)), 1e-9)
    x = np.clip(t / scale, 0.0, 1.0)[:, None]
    taut = (1.0 - x) * np.array([0.1, 0.3, 1.0, 1.0]) + x * np.array([1.0, 0.1, 0.1, 1.0])
    return np.where(t[:, None] > 0.0, taut, np.array([0.6, 0.6, 0.6, 0.6]))


def path_marker(points, stamp_ns_: int, ns: str, rgba, *, frame_id: str = "world", marker_id: int = 0,
                width: float = 0.02):
    """LINE_STRIP through ``points`` [K, 3] (e.g. a planned centre-of-mass path)."""
    from geometry_msgs.msg import Point
    from visualization_msgs.msg import Marker

    m = Marker()
    m.header.frame_id = frame_id
    ns_to_stamp(stamp_ns_, m.header.stamp)
    m.ns, m.id, m.type, m.action = ns, marker_id, Marker.LINE_STRIP, Marker.ADD
    m.pose.orientation.w = 1.0
    m.scale.x = width
    m.color.r, m.color.g, m.color.b, m.color.a = (float(c) for c in rgba)
    pts = []
    for q in np.asarray(points, dtype=np.float64):
        pt = Point()
        pt.x, pt.y, pt.z = (float(v) for v in q)
        pts.append(pt)
    m.points = pts
    return m


def arrow_marker(start, vector, stamp_ns_: int, ns: str, rgba, *, frame_id: str = "world", marker_id: int = 0):
    """ARROW from ``start`` along ``vector`` (e.g. the goal velocity x 1 s)."""
    from geometry_msgs.msg import Point
    from visualization_msgs.msg import Marker

    m = Marker()
    m.header.frame_id = frame_id
    ns_to_stamp(stamp_ns_, m.header.stamp)
    m.ns, m.id, m.type, m.action = ns, marker_id, Marker.ARROW, Marker.ADD
    m.pose.orientation.w = 1.0
    m.scale.x, m.scale.y, m.scale.z = 0.04, 0.08, 0.1        # shaft, head diameter, head length
    m.color.r, m.color.g, m.color.b, m.color.a = (float(c) for c in rgba)
    a, b = Point(), Point()
    a.x, a.y, a.z = (float(v) for v in start)
    b.x, b.y, b.z = (float(v) for v in np.asarray(start) + np.asarray(vector))
    m.points = [a, b]
    return m


def rod_cable_markers(robot, rod_state: np.ndarray, stamp_ns_: int, ns: str, rgba, *,
                      frame_id: str = "world", id_offset: int = 0, lifetime_s: float = 0.0,
                      cable_colors: Optional[np.ndarray] = None):
    """visualization_msgs/Marker list: one LINE_LIST for the rods, one for the cables
    (coloured per cable by ``cable_colors`` [C, 4], e.g. `tension_colors`)."""
    from geometry_msgs.msg import Point
    from visualization_msgs.msg import Marker

    nodes = end_nodes(np.asarray(rod_state), 0.5 * robot.rod_length)   # [R, 2, 3]
    flat = nodes.reshape(-1, 3)
    out = []
    for k, (kind, width, pairs) in enumerate((
            ("rods", float(2 * robot.rod_radius.mean()), [(2 * r, 2 * r + 1) for r in range(robot.num_rods)]),
            ("cables", 0.01, [tuple(int(v) for v in c) for c in robot.cable_node_index]))):
        m = Marker()
        m.header.frame_id = frame_id
        ns_to_stamp(stamp_ns_, m.header.stamp)
        m.ns = f"{ns}/{kind}"
        m.id = id_offset + k
        m.type = Marker.LINE_LIST
        m.action = Marker.ADD
        m.pose.orientation.w = 1.0
        m.scale.x = width if kind == "rods" else 0.01
        m.color.r, m.color.g, m.color.b, m.color.a = (float(c) for c in rgba)
        m.lifetime.sec = int(lifetime_s)
        pts = []
        for a, b in pairs:
            for idx in (a, b):
                p = Point()
                p.x, p.y, p.z = (float(v) for v in flat[idx])
                pts.append(p)
        m.points = pts
        if kind == "cables" and cable_colors is not None:
            from std_msgs.msg import ColorRGBA

            colors = []
            for c in np.asarray(cable_colors, dtype=np.float64):
                col = ColorRGBA(r=float(c[0]), g=float(c[1]), b=float(c[2]), a=float(c[3]))
                colors += [col, col]                     # both ends of the segment
            m.colors = colors
        out.append(m)
    return out
