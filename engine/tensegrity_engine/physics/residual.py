"""A learned residual on top of the physics: what no parameter and no structure explains.

`ResidualModel` corrects the state the physics predicts one control period T ahead:
x_{t+T} = physics(x_t, u) + Δ(x_t, physics(x_t, u), u). It is applied once per period, so
a rollout of k periods is k physics segments, each followed by the correction (recurrent,
as the identification's tuples are).

Why this shape (issue 19):

* **Rod-local and permutation-aware.** One network per rod with shared weights, fed the
  rod's own features and the sum of messages from the cable ends attached to it (one
  shared edge network). Nothing depends on the number of rods or cables or on their order,
  so the same weights run on a 3-bar and on a 6-bar.
* **Heading frames.** Every vector is expressed in the rod's gravity-aligned heading frame
  (z up, x along the horizontal part of the rod axis) and the correction is rotated back:
  the residual is the same for a robot turned about the vertical, as physics is.
* **Physics first.** The last layer starts at zero (the model starts as the physics), and
  the physics' own predicted change is an input, so the network learns what the physics
  misses rather than the motion itself. ``use_physics=False`` makes the same network a
  purely learned model (constant-velocity extrapolation in place of the physics), the
  baseline it must beat.

Outputs per rod: position, linear and angular velocity corrections and a small rotation
(rotation vector) applied to the predicted orientation. Fixed rods get none.
"""
from __future__ import annotations


import torch
from torch import nn

from tensegrity_engine.physics.config import RobotConfig
from tensegrity_engine.physics.params import SOFT_LAW_PARAMS
from tensegrity_engine.physics.state import (ANG_VEL, LIN_VEL, POS, QUAT, end_nodes, quat_axis, quat_from_rotvec,
                                             quat_multiply)

__all__ = ["ResidualModel", "ROD_FEATURES", "EDGE_FEATURES", "constant_velocity", "physics_fingerprint",
           "save_residual", "load_residual"]

ROD_FEATURES = 21
EDGE_FEATURES = 6


def _heading(q: torch.Tensor, axis: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin) [...] of the yaw of a rod's axis' horizontal part; for a rod within 1e-6
    rad of vertical, where that yaw is undefined, of its body x axis (which turns with the
    robot, so the correction stays the same for a robot turned about the vertical). ``axis``
    is `quat_axis(q)`."""
    w, x, y, z = q.unbind(-1)
    body_x = torch.stack([1 - 2 * (y * y + z * z), 2 * (x * y + w * z)], -1)
    n2 = axis[..., 0] ** 2 + axis[..., 1] ** 2
    h = torch.where((n2 < 1e-12)[..., None], body_x, axis[..., :2])
    norm = torch.sqrt((h * h).sum(-1)).clamp_min(1e-300)
    return h[..., 0] / norm, h[..., 1] / norm


def _to_frame(v: torch.Tensor, c: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """World vectors [..., 3] into the heading frame of yaw (c, s)."""
    return torch.stack([c * v[..., 0] + s * v[..., 1], -s * v[..., 0] + c * v[..., 1], v[..., 2]], -1)


def _from_frame(v: torch.Tensor, c: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    return torch.stack([c * v[..., 0] - s * v[..., 1], s * v[..., 0] + c * v[..., 1], v[..., 2]], -1)


class ResidualModel(nn.Module):
    """Δ(x_t, x̂_{t+T}, rest lengths, tensions) per rod (see the module docstring).

    ``scale`` [12] is the typical size of each output component (position m, velocity
    m/s, angular velocity rad/s, rotation rad), set by the training from its data, so the
    network works on O(1) numbers."""

    def __init__(self, robot: RobotConfig, *, hidden: int = 32, use_physics: bool = True,
                 fixed_rods: tuple = (), ground_height: float = 0.0, period: float = 0.1):
        super().__init__()
        self.use_physics = bool(use_physics)
        self.period = float(period)        # s: the control period it corrects, and only that
        # `physics_fingerprint` of the model it was trained on top of (None: not recorded): a
        # correction means nothing on top of other physics
        self.physics = None
        self.hidden = int(hidden)
        R = robot.num_rods
        ends = torch.as_tensor(robot.cable_ends, dtype=torch.long)          # [C, 2, 2] (rod, end)
        self.register_buffer("cable_rod", ends[..., 0].reshape(-1))          # [2C]: end k of cable k // 2
        self.register_buffer("cable_end", ends[..., 1].reshape(-1))
        self.register_buffer("other", (torch.arange(2 * robot.num_cables) ^ 1))
        self.register_buffer("half_length", torch.as_tensor(robot.rod_length / 2.0, dtype=torch.float64))
        free = torch.ones(R, dtype=torch.float64)
        free[list(fixed_rods)] = 0.0
        self.register_buffer("free", free)
        self.register_buffer("scale", torch.ones(12, dtype=torch.float64))
        self.register_buffer("feature_scale", torch.ones(ROD_FEATURES, dtype=torch.float64))
        self.ground_height = float(ground_height)
        self.num_rods = R
        act = nn.SiLU
        self.edge = nn.Sequential(nn.Linear(EDGE_FEATURES, hidden), act(), nn.Linear(hidden, hidden), act())
        self.node = nn.Sequential(nn.Linear(ROD_FEATURES + hidden, hidden), act(), nn.Linear(hidden, hidden), act(),
                                  nn.Linear(hidden, 12))
        nn.init.zeros_(self.node[-1].weight)
        nn.init.zeros_(self.node[-1].bias)
        self.double()

    def config(self) -> dict:
        return {"hidden": self.hidden, "use_physics": self.use_physics, "period": self.period}

    # ------------------------------------------------------------------ features
    def features(self, x0: torch.Tensor, x_hat: torch.Tensor, rest: torch.Tensor, tension: torch.Tensor,
                 period: float):
        """(rod features [..., R, F], edge features [..., 2C, E], heading (c, s) [..., R])."""
        axis = quat_axis(x0[..., QUAT])
        c, s = _heading(x0[..., QUAT], axis)
        v0, w0 = x0[..., LIN_VEL], x0[..., ANG_VEL]
        ends0 = end_nodes(x0, self.half_length.to(x0.dtype))
        if self.use_physics:
            dv, dw = x_hat[..., LIN_VEL] - v0, x_hat[..., ANG_VEL] - w0
            dp = x_hat[..., POS] - x0[..., POS] - period * v0
            z_hat = end_nodes(x_hat, self.half_length.to(x_hat.dtype))[..., 2] - self.ground_height
        else:
            dv = dw = dp = torch.zeros_like(v0)
            z_hat = ends0[..., 2] - self.ground_height
        axis_f = _to_frame(axis, c, s)
        rod = torch.cat([_to_frame(v0, c, s), _to_frame(w0, c, s), _to_frame(dv, c, s), _to_frame(dw, c, s),
                         _to_frame(dp, c, s), axis_f[..., [0, 2]], ends0[..., 2] - self.ground_height, z_hat], -1)
        # cable ends: the direction to the other end, stretch, rate-free geometry, tension
        nodes = ends0[..., self.cable_rod, self.cable_end, :]                 # [..., 2C, 3]
        d = nodes[..., self.other, :] - nodes
        length = torch.sqrt((d * d).sum(-1, keepdim=True) + 1e-12)
        u = d / length
        rest2 = rest.repeat_interleave(2, dim=-1)[..., None]
        tension2 = tension.repeat_interleave(2, dim=-1)[..., None] if self.use_physics else torch.zeros_like(rest2)
        sign = (2.0 * self.cable_end.to(x0.dtype) - 1.0)[:, None].expand_as(rest2)
        cr, sr = c[..., self.cable_rod], s[..., self.cable_rod]
        edge = torch.cat([_to_frame(u, cr, sr), length - rest2, tension2 * 1e-3, sign], -1)
        return rod / self.feature_scale.to(x0.dtype), edge, (c, s)

    # ------------------------------------------------------------------ correction
    def delta(self, x0, x_hat, rest, tension, period: float) -> torch.Tensor:
        """Per-rod correction [..., R, 12] in world frame (Δp, Δv, Δω, rotation vector)."""
        rod, edge, (c, s) = self.features(x0, x_hat, rest, tension, period)
        msg = self.edge(edge)                                                  # [..., 2C, H]
        pooled = torch.zeros(*msg.shape[:-2], self.num_rods, msg.shape[-1], dtype=msg.dtype, device=msg.device)
        pooled = pooled.index_add(-2, self.cable_rod, msg)
        out = self.node(torch.cat([rod, pooled], -1)) * self.scale.to(x0.dtype)
        out = torch.cat([_from_frame(out[..., 3 * i:3 * i + 3], c, s) for i in range(4)], -1)
        return out * self.free.to(x0.dtype)[:, None]

    def forward(self, x0, x_hat, rest, tension, period: float) -> torch.Tensor:
        """The corrected state [..., R, 13]."""
        d = self.delta(x0, x_hat, rest, tension, period)
        q = quat_multiply(quat_from_rotvec(d[..., 9:12]), x_hat[..., QUAT])
        q = q / q.norm(dim=-1, keepdim=True)
        return torch.cat([x_hat[..., POS] + d[..., 0:3], q, x_hat[..., LIN_VEL] + d[..., 3:6],
                          x_hat[..., ANG_VEL] + d[..., 6:9]], -1)


def constant_velocity(x0: torch.Tensor, period: float) -> torch.Tensor:
    """The purely learned model's base: every rod keeps its velocity and spin for a period."""
    q = quat_multiply(quat_from_rotvec(period * x0[..., ANG_VEL]), x0[..., QUAT])
    return torch.cat([x0[..., POS] + period * x0[..., LIN_VEL], q, x0[..., 7:13]], -1)


def physics_fingerprint(params) -> str:
    """What a residual is trained on top of: a `PhysicalParameters`' integrator, its ground
    contact law and every value that law uses (10 significant digits, so a round trip
    through YAML keeps it; the soft law's solref values are left out under the penalty
    law, where they are inert and a file does not carry them)."""
    import hashlib
    import json

    contact = params.robot.contact
    inert = () if contact.law == "soft" else SOFT_LAW_PARAMS
    values = {name: [float(f"{float(x):.10g}") for x in v] for name, v in sorted(params.as_dict().items())
              if name not in inert}
    # "soft_pairs": since the soft law covers the rod pairs too, a residual trained on the soft
    # ground with penalty pairs is on other physics
    structure = [params.robot.integrator] + ([contact.law, list(contact.solimp), contact.soft_condim, "soft_pairs"]
                                              if contact.law == "soft" else [])
    return hashlib.sha1(json.dumps([structure, values]).encode()).hexdigest()[:16]


def save_residual(model: ResidualModel, robot: RobotConfig, path) -> None:
    """One safetensors file: the weights and scales, the network's shape, the topology
    fingerprint and the physics it was trained on (metadata, JSON); nothing is pickled."""
    import json

    from safetensors.torch import save_file

    from tensegrity_engine.physics.config import topology_fingerprint

    tensors = {k: v.detach().contiguous() for k, v in model.state_dict().items()
               if k not in ("cable_rod", "cable_end", "other", "half_length", "free")}
    meta = {"format": "tensegrity_residual/1", "topology": topology_fingerprint(robot),
            "config": json.dumps(model.config()), "ground_height": repr(model.ground_height),
            "physics": model.physics or ""}
    save_file(tensors, str(path), metadata=meta)


def load_residual(robot: RobotConfig, path, fixed_rods: tuple = (), *, any_topology: bool = False) -> ResidualModel:
    """A residual saved by `save_residual`, for this robot's topology. The weights are
    topology-free (per rod and per cable end), but a file meant for another robot is usually
    a mistake: it is refused unless ``any_topology`` (a deliberate transfer, 3-bar to 6-bar)."""
    import json

    from safetensors import safe_open

    from tensegrity_engine.physics.config import topology_fingerprint

    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
        if meta.get("format") != "tensegrity_residual/1":
            raise ValueError(f"{path}: not a residual model file (format {meta.get('format')!r})")
        if meta.get("topology") != topology_fingerprint(robot) and not any_topology:
            raise ValueError(f"{path}: trained on another topology than {robot.name}")
        config = json.loads(meta["config"])
        model = ResidualModel(robot, hidden=int(config["hidden"]), use_physics=bool(config["use_physics"]),
                              fixed_rods=fixed_rods, ground_height=float(meta.get("ground_height", "0.0")),
                              period=float(config["period"]))
        state = {k: f.get_tensor(k) for k in f.keys()}
    missing = set(model.state_dict()) - set(state) - {"cable_rod", "cable_end", "other", "half_length", "free"}
    if missing:
        raise ValueError(f"{path}: missing tensors {sorted(missing)}")
    model.load_state_dict({**model.state_dict(), **state})
    model.physics = meta.get("physics") or None
    return model.eval()
