"""Rod poses from depth images: Levenberg-Marquardt on rendered-vs-observed depth.

Unknowns: per rod its centre (3) and axis (2, a tangent step about the prior axis; the
length is the robot's), R x 5 in all; the spin about the axis is invisible to a depth
camera and is carried over from the prior. Residuals, per camera:

* depth: rendered (soft, `render.CapsuleRenderer`) minus observed depth on every pixel
  with a return, over sigma_depth, Huber-weighted (occluders, multipath);
* silhouette: rendered rod coverage minus the observed one (a return nearer than the
  floor by ``floor_margin``), over sigma_silhouette: it pulls an edge that is off by more
  than a rod's width;
* points: each observed robot pixel, back-projected, lies on the nearest rod's surface
  (distance to its axis minus its radius, over sigma_depth): model-to-data, it attracts a
  rod from farther than the image terms can see (DART's signed-distance term);
* prior: the prediction (previous estimate, or the identified engine's prediction of this
  frame), per coordinate over its sigma: it keeps what the images cannot see (an occluded
  rod) where the motion model puts it.

Jacobians by forward-mode AD (`torch.func.jacfwd`, one batched pass over the 5R
directions); the covariance of the result is (J^T W J)^-1. Rod identity and end order
come from the prior: the axis is never flipped. The track is reported lost when the
rendered and observed silhouettes overlap less than ``lost_iou`` (intersection over union).
"""
from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import numpy as np
import torch

from tensegrity_engine.perception.camera import PinholeCamera
from tensegrity_engine.perception.render import CapsuleRenderer

__all__ = ["TrackerConfig", "RodPoseEstimate", "RodTracker", "tangent_basis"]


@dataclasses.dataclass(frozen=True)
class TrackerConfig:
    sigma_depth: float = 0.01          # m
    sigma_silhouette: float = 0.5
    huber: float = 3.0                 # in sigmas
    prior_position: float = 0.05       # m, sigma of the prior's centres
    prior_axis: float = 0.1            # rad, sigma of the prior's axes
    floor_margin: float = 0.02         # m: a return this much nearer than the floor is the robot
    max_points: int = 1500             # back-projected robot pixels used by the point term
    iterations: int = 8
    stride: int = 1                    # render every stride-th pixel
    lost_iou: float = 0.3


@dataclasses.dataclass
class RodPoseEstimate:
    ends: np.ndarray                   # [R, 2, 3] world end nodes
    std: np.ndarray                    # [R, 5] one-sigma of (centre xyz, axis tangent 2)
    iou: float                         # silhouette overlap with the observation (mean over cameras)
    rms: float                         # robust rms of the depth residual (m)
    lost: bool
    iterations: int


def _huber(x: torch.Tensor, k: float) -> torch.Tensor:
    """Residuals whose squares are the Huber cost 2 rho(x): x inside k, sqrt(2 k |x| - k^2) out."""
    big = x.abs() > k
    safe = torch.where(big, x.abs(), torch.full_like(x, k))
    return torch.where(big, torch.sign(x) * torch.sqrt(2.0 * k * safe - k * k), x)


def tangent_basis(axis: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Two unit vectors [R, 3] orthogonal to each unit ``axis`` [R, 3] and to each other."""
    helper = torch.zeros_like(axis)
    pick = axis[:, 0].abs() < 0.9
    helper[pick, 0] = 1.0
    helper[~pick, 1] = 1.0
    t1 = torch.linalg.cross(axis, helper)
    t1 = t1 / torch.linalg.norm(t1, dim=-1, keepdim=True)
    return t1, torch.linalg.cross(axis, t1)


class _View:
    """One camera's renderer and its observation, prepared for the residuals."""

    def __init__(self, camera: PinholeCamera, floor: Optional[float], cfg: TrackerConfig, dtype):
        self.renderer = CapsuleRenderer(camera, floor_height=floor, stride=cfg.stride, dtype=dtype)
        self.floor_z = self.renderer.floor_depth()
        self.full_floor = CapsuleRenderer(camera, floor_height=floor, dtype=dtype).floor_depth().reshape(
            camera.height, camera.width).numpy()
        self.camera, self.cfg, self.dtype = camera, cfg, dtype

    def observe(self, depth: np.ndarray, rng: np.random.Generator):
        s = self.cfg.stride
        z = torch.as_tensor(np.asarray(depth, dtype=np.float64)[::s, ::s].reshape(-1), dtype=self.dtype)
        valid = torch.isfinite(z)
        self.all_observed = torch.where(valid, z, torch.zeros_like(z))
        self.all_valid = valid.to(self.dtype)
        self.all_robot = (valid & (self.all_observed < self.floor_z - self.cfg.floor_margin)).to(self.dtype)
        full = np.asarray(depth, dtype=np.float64)
        with np.errstate(invalid="ignore"):
            near = np.isfinite(full) & (full < self.full_floor - self.cfg.floor_margin)
        pts = self.camera.backproject(full)
        pts = pts[near]
        if len(pts) > self.cfg.max_points:
            pts = pts[rng.choice(len(pts), self.cfg.max_points, replace=False)]
        self.points = torch.as_tensor(pts, dtype=self.dtype)


    def focus(self, ends: torch.Tensor, radius: torch.Tensor, margin: int = 2) -> None:
        """Restrict the image terms to the pixels the robot covers, observed or predicted
        at ``ends``, grown by ``margin`` pixels: elsewhere both show the floor."""
        with torch.no_grad():
            predicted = self.renderer.render(ends, radius).silhouette > 1e-3
        near = (predicted | (self.all_robot > 0)).reshape(self.renderer.shape).to(self.dtype)
        grown = torch.nn.functional.max_pool2d(near[None, None], 2 * margin + 1, stride=1, padding=margin)[0, 0]
        index = torch.nonzero(grown.reshape(-1) > 0).squeeze(-1)
        self.roi = self.renderer.with_pixels(index)
        self.observed, self.valid = self.all_observed[index], self.all_valid[index]
        self.robot_mask = self.all_robot[index]


class RodTracker:
    """Tracks a robot's rods (lengths and radii from its config) in depth images."""

    def __init__(self, robot, cameras: Sequence[PinholeCamera], config: TrackerConfig = TrackerConfig(),
                 *, dtype=torch.float64, seed: int = 0):
        if not cameras:
            raise ValueError("the tracker needs at least one camera")
        self.config = config
        self.dtype = dtype
        self.half = torch.as_tensor(0.5 * np.asarray(robot.rod_length, dtype=np.float64), dtype=dtype)
        self.radius = torch.as_tensor(np.asarray(robot.rod_radius, dtype=np.float64), dtype=dtype)
        self.num_rods = len(self.half)
        floor = robot.contact.ground_height
        self.views = [_View(c, floor, config, dtype) for c in cameras]
        self.rng = np.random.default_rng(seed)

    # ------------------------------------------------------------------ model
    def _ends(self, theta, centre0, axis0, t1, t2):
        th = theta.reshape(self.num_rods, 5)
        centre = centre0 + th[:, 0:3]
        axis = axis0 + th[:, 3:4] * t1 + th[:, 4:5] * t2
        axis = axis / torch.linalg.norm(axis, dim=-1, keepdim=True)
        h = self.half.unsqueeze(-1)
        return torch.stack([centre - h * axis, centre + h * axis], -2)           # [R, 2, 3]

    def _point_residual(self, ends, points):
        if len(points) == 0:
            return points.new_zeros(0)
        e0, e1 = ends[:, 0], ends[:, 1]                                           # [R, 3]
        seg = e1 - e0
        rel = points[:, None, :] - e0[None]                                       # [N, R, 3]
        s = ((rel * seg).sum(-1) / (seg * seg).sum(-1)).clamp(0.0, 1.0)
        gap = torch.linalg.norm(rel - s[..., None] * seg, dim=-1) - self.radius
        return gap.min(-1).values

    def _residuals(self, theta, frame):
        ends = self._ends(theta, *frame)
        cfg = self.config
        bound = cfg.huber
        parts = []
        for view in self.views:
            out = view.roi.render(ends, self.radius, cfg.floor_margin)
            # The depth image samples each ray at a point: compare it with the exact ray cast
            # (hard z-buffer), bounded: a pixel that shows a rod where the model shows floor
            # says "wrong", not how far; the silhouette and point terms move the edges.
            x = (out.hit_depth - view.observed) / cfg.sigma_depth
            parts.append(view.valid * bound * torch.tanh(x / bound))
            parts.append(view.valid * (out.silhouette - view.robot_mask) / cfg.sigma_silhouette)
            parts.append(_huber(self._point_residual(ends, view.points) / cfg.sigma_depth, bound))
        th = theta.reshape(self.num_rods, 5)
        parts.append((th / self.prior_sigma).reshape(-1))
        return torch.cat(parts)

    # ------------------------------------------------------------------ solve
    def track(self, depths: Sequence[np.ndarray], prior_ends: np.ndarray,
              prior_std: Optional[np.ndarray] = None) -> RodPoseEstimate:
        """Fit the rods to one depth image per camera, starting from ``prior_ends`` [R, 2, 3]
        (the prediction; its rod and end order is kept). ``prior_std`` [R, 5] overrides the
        config's prior sigmas (e.g. the motion model's own uncertainty)."""
        if len(depths) != len(self.views):
            raise ValueError(f"{len(self.views)} camera(s), {len(depths)} depth image(s)")
        for view, depth in zip(self.views, depths):
            if np.shape(depth) != (view.camera.height, view.camera.width):
                raise ValueError(f"depth image {np.shape(depth)} is not the camera's "
                                 f"{(view.camera.height, view.camera.width)}")
            view.observe(depth, self.rng)
        prior = torch.as_tensor(np.asarray(prior_ends, dtype=np.float64), dtype=self.dtype)
        centre0 = prior.mean(1)
        axis0 = prior[:, 1] - prior[:, 0]
        axis0 = axis0 / torch.linalg.norm(axis0, dim=-1, keepdim=True)
        t1, t2 = tangent_basis(axis0)
        frame = (centre0, axis0, t1, t2)
        cfg = self.config
        sig = np.tile([cfg.prior_position] * 3 + [cfg.prior_axis] * 2, (self.num_rods, 1))
        self.prior_sigma = torch.as_tensor(sig if prior_std is None else prior_std, dtype=self.dtype)
        theta = torch.zeros(5 * self.num_rods, dtype=self.dtype)
        lam, it = 1e-3, 0
        for view in self.views:
            view.focus(self._ends(theta, *frame), self.radius)
        f = lambda th: self._residuals(th, frame)
        r = f(theta)
        cost = float(r @ r)
        for it in range(1, cfg.iterations + 1):
            J = torch.func.jacfwd(f)(theta)
            A, g = J.T @ J, J.T @ r
            improved = False
            for _ in range(6):
                step = torch.linalg.solve(A + lam * torch.diag(A.diagonal().clamp_min(1e-9)), -g)
                trial = theta + step
                r_new = f(trial)
                c_new = float(r_new @ r_new)
                if np.isfinite(c_new) and c_new < cost:
                    theta, r, cost, lam, improved = trial, r_new, c_new, max(lam / 3.0, 1e-7), True
                    break
                lam *= 10.0
            if not improved or float(step.abs().max()) < 1e-6:
                break
        J = torch.func.jacfwd(f)(theta)
        cov = torch.linalg.pinv(J.T @ J)
        ends = self._ends(theta, *frame).detach()
        return RodPoseEstimate(ends=ends.numpy(), std=np.sqrt(np.clip(np.diag(cov.numpy()), 0, None)).reshape(-1, 5),
                               iou=self._iou(ends), rms=self._rms(ends), lost=self._iou(ends) < cfg.lost_iou,
                               iterations=it)

    def _iou(self, ends) -> float:
        vals = []
        for view in self.views:
            sil = view.renderer.render(ends, self.radius, self.config.floor_margin).silhouette > 0.5
            obs = view.all_robot > 0.5
            union = (sil | obs).sum()
            vals.append(float((sil & obs).sum()) / float(union) if union else 1.0)
        return float(np.mean(vals))

    def _rms(self, ends) -> float:
        res = []
        for view in self.views:
            d = (view.renderer.render(ends, self.radius).hit_depth - view.all_observed)[view.all_valid > 0]
            res.append(d.clamp(-self.config.huber * self.config.sigma_depth, self.config.huber * self.config.sigma_depth))
        r = torch.cat(res)
        return float(torch.sqrt((r * r).mean())) if len(r) else float("nan")
