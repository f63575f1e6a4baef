"""Rod poses from depth images: Levenberg-Marquardt on rendered-vs-observed depth.

Unknowns: per rod its centre (3) and axis (2, a tangent step about the prior axis; the
length is the robot's), R x 5 in all; the spin about the axis is invisible to a depth
camera and is carried over from the prior. Residuals, per camera:

* depth: the exact ray cast (`render.CapsuleRenderer`, hard z-buffer: a depth image
  samples each ray at one point) minus the observed depth on every pixel with a return,
  over the pixel's sigma (the sensor's noise at that depth), bounded at ``robust`` sigmas;
* silhouette: rendered soft rod coverage minus the observed robot mask (returns nearer
  than the floor by ``floor_margin`` or 3 sigma; the rendering applies the same rule),
  over sigma_silhouette: it moves the edges;
* points: each observed robot pixel, back-projected, lies on the nearest rod's surface
  (distance to its axis minus its radius, over the pixel's sigma, Cauchy-robust):
  model-to-data, it attracts a rod from farther than the image terms can see (DART's
  signed-distance term);
* prior: the prediction (previous estimate, or the identified engine's prediction of this
  frame), per coordinate over its sigma: it keeps what the images cannot see (an occluded
  rod) where the motion model puts it;
* floor (with a floor): no rod's surface more than ``FLOOR_SINK`` (a soft contact's
  sink) below the ground, one-sided: under the floor a rod is hidden from the
  camera, and nothing else would stop it sinking there.

Jacobians: each rod's image layers depend on its own pose only, so one batched
evaluation along 5 shared directions gives all R blocks (`_layer_jacobians`); the
covariance of the result is (J^T J)^-1 of the whitened residuals. Rod identity and end order
come from the prior: the axis is never flipped. The track is reported lost when the
rendered and observed silhouettes overlap less than ``lost_iou`` (intersection over union),
or when a camera contradicts a rod: the rod is in view in front of everything else, and
the camera sees past it on most of its pixels (a rod that ran off while the others fit).
"""
from __future__ import annotations

import dataclasses
import time
from typing import Optional, Sequence

import numpy as np
import torch

from tensegrity_engine.perception.camera import PinholeCamera
from tensegrity_engine.perception.render import CapsuleRenderer
from tensegrity_engine.physics.state import quat_from_rotvec, quat_to_matrix

__all__ = ["TrackerConfig", "RodPoseEstimate", "RodTracker", "tangent_basis"]

FLOOR_SINK = 0.01      # m a rod's surface may sink into the floor (soft contact) before it costs
SIGMA_FLOOR = 0.005    # m, the floor term's sigma beyond that


@dataclasses.dataclass(frozen=True)
class TrackerConfig:
    sigma_depth: float = 0.01          # m
    sigma_silhouette: float = 0.5
    robust: float = 3.0                # sigmas: the depth term bounds at it, the point term (Cauchy) scales by it
    prior_position: float = 0.05       # m, sigma of the prior's centres
    prior_axis: float = 0.1            # rad, sigma of the prior's axes
    floor_margin: float = 0.02         # m: a return this much nearer than the floor is the robot
    noise_at_1m: float = 0.0           # m, the sensor's depth sigma at 1 m (grows with z^2)
    max_points: int = 1500             # back-projected robot pixels used by the point term
    max_pixels: int = 100000           # pixels of the region of interest the image terms use
    iterations: int = 30               # at most, per frame
    time_budget: float = 0.08          # s per frame: stop iterating (anytime) past it
    tolerance: float = 1e-4            # m / rad: converged when no step moves more
    stride: int = 1                    # render every stride-th pixel
    lost_iou: float = 0.3


@dataclasses.dataclass
class RodPoseEstimate:
    ends: np.ndarray                   # [R, 2, 3] world end nodes
    std: np.ndarray                    # [R, 5] one-sigma of (centre xyz, axis tangent 2)
    iou: float                         # silhouette overlap with the observation (mean over cameras)
    rms: float                         # robust rms of the depth residual (m)
    lost: bool                         # overlap below lost_iou, or a rod the images contradict
    iterations: int
    contradicted: Optional[np.ndarray] = None   # [R] rods seen where the camera sees past them


def _cauchy(x: torch.Tensor, c: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Residuals whose squares are the Cauchy cost c^2 log(1 + (x/c)^2), and their slope.
    It redescends: a far outlier (a noisy floor pixel taken for the robot, a flying pixel
    at an edge) pulls with a vanishing force, where Huber would pull with a constant one."""
    u = x / c
    root = torch.sqrt(torch.log1p(u * u))
    r = c * torch.sign(x) * root
    slope = u.abs() / ((1.0 + u * u) * root.clamp_min(1e-12))
    return r, torch.where(u.abs() < 1e-6, torch.ones_like(x), slope)


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
        v, u = np.meshgrid(np.arange(0, camera.height, cfg.stride), np.arange(0, camera.width, cfg.stride),
                           indexing="ij")                      # the rendered grid's pixel centres
        self.pixel_uv = torch.as_tensor(np.stack([u.ravel(), v.ravel()], -1), dtype=dtype)

    def sigma(self, z):
        """The sensor's depth sigma at depth z (never below the config's floor on it)."""
        return np.maximum(self.cfg.sigma_depth, self.cfg.noise_at_1m * z * z)

    def observe(self, depth: np.ndarray, rng: np.random.Generator):
        self.rng = rng
        """Take a depth image: its returns, per-pixel sigmas, the robot mask (nearer than
        the floor by the margin or 3 sigma, whichever is more) and robot points."""
        s, cfg = self.cfg.stride, self.cfg
        full = np.asarray(depth, dtype=np.float64)
        valid = np.isfinite(full)
        obs = np.where(valid, full, 0.0)
        margin = np.maximum(cfg.floor_margin, 3.0 * self.sigma(obs))
        robot = valid & (obs < self.full_floor - margin)
        t = lambda a: torch.as_tensor(np.ascontiguousarray(a[::s, ::s]).reshape(-1), dtype=self.dtype)
        self.all_observed, self.all_valid, self.all_robot = t(obs), t(valid), t(robot)
        self.all_sigma, self.all_margin = t(self.sigma(obs)), t(margin)
        pts, z = self.camera.backproject(full)[robot], obs[robot]
        if len(pts) > cfg.max_points:
            pick = rng.choice(len(pts), cfg.max_points, replace=False)
            pts, z = pts[pick], z[pick]
        self.points = torch.as_tensor(pts, dtype=self.dtype)
        self.point_sigma = torch.as_tensor(self.sigma(z), dtype=self.dtype)

    def focus(self, ends: torch.Tensor, radius: torch.Tensor, margin: int = 2) -> None:
        """Restrict the image terms to the pixels the robot covers, observed or predicted
        at ``ends``, grown by ``margin`` pixels: elsewhere both show the floor."""
        predicted = self._projected_cover(ends, radius)
        near = (predicted | (self.all_robot > 0)).reshape(self.renderer.shape).to(self.dtype)
        grown = torch.nn.functional.max_pool2d(near[None, None], 2 * margin + 1, stride=1, padding=margin)[0, 0]
        index = torch.nonzero(grown.reshape(-1) > 0).squeeze(-1)
        self.whole_robot = len(index) <= self.cfg.max_pixels     # every robot pixel is in the region
        if not self.whole_robot:                 # a random share of the region: cost bounded, edges kept
            pick = torch.as_tensor(self.rng.choice(len(index), self.cfg.max_pixels, replace=False))
            index = index[torch.sort(pick).values]
        self.roi_index = index
        self.roi = self.renderer.with_pixels(index)
        self.observed, self.valid = self.all_observed[index], self.all_valid[index]
        self.robot_mask, self.floor_z_roi = self.all_robot[index], self.floor_z[index]
        self.pixel_sigma, self.margin = self.all_sigma[index], self.all_margin[index]

    def _projected_cover(self, ends: torch.Tensor, radius: torch.Tensor) -> torch.Tensor:
        """[P] bool: pixels within a rod's projected outline (its axis drawn in the image,
        widened by its radius at the nearer end, 1.3x for the obliquity off the optical
        axis, plus 2 pixels of soft edge): a superset of the rendered silhouette, from 2-D geometry (a
        full rendering costs 8x more). A rod reaching behind the camera is rendered."""
        cam = self.camera
        e = ends.detach().numpy().reshape(-1, 3)
        uv, z = cam.project(e)
        if np.any(z < 1e-3):
            with torch.no_grad():
                return self.renderer.render(ends, radius).silhouette > 1e-3
        uv, z = torch.as_tensor(uv.reshape(-1, 2, 2), dtype=self.dtype), torch.as_tensor(z.reshape(-1, 2))
        # the soft edge (render.py: sigmoid over half a pixel) is above 0.05 within 1.5 px of it
        reach = 1.3 * cam.fx * torch.as_tensor(radius, dtype=self.dtype) / z.min(-1).values + 2.0   # [R] px
        a, seg = uv[:, 0], uv[:, 1] - uv[:, 0]                                        # [R, 2]
        rel = self.pixel_uv[:, None, :] - a[None]                                     # [P, R, 2]
        s = ((rel * seg).sum(-1) / (seg * seg).sum(-1).clamp_min(1e-12)).clamp(0.0, 1.0)
        gap = torch.linalg.norm(rel - s[..., None] * seg, dim=-1)                     # [P, R]
        return (gap <= reach).any(-1)

    def quality(self, ends: torch.Tensor, radius: torch.Tensor, robust: float
                ) -> tuple[float, torch.Tensor, torch.Tensor]:
        """(silhouette overlap with the observed robot, the bounded depth residual of every
        return, per rod whether the image contradicts it [R]) at ``ends``, rendering the
        region only (outside it the model shows the floor) unless a rod reaches out of it. A
        rod is contradicted where it is in view in front of everything else but the camera
        sees past it on most of those pixels that returned a depth (at least 4): it is not
        there, whatever the other rods' overlap says."""
        whole = self.whole_robot
        if whole:          # a rod the fit moved off the region is scored on the whole image
            outside = self._projected_cover(ends, radius)
            outside[self.roi_index] = False
            whole = not bool(outside.any())
        renderer = self.roi if whole else self.renderer
        robot = (self.robot_mask if whole else self.all_robot) > 0.5
        valid = (self.valid if whole else self.all_valid) > 0.5
        floor_z = self.floor_z_roi if whole else self.floor_z
        with torch.no_grad():
            hit_z, _, alpha = renderer.rod_layers(ends.unsqueeze(0), radius, self.margin if whole else self.all_margin)
        hit_z, alpha = hit_z[0], alpha[0]                                              # [R, P]
        sil = (1.0 - torch.prod(1.0 - alpha, 0)) > 0.5
        cand = torch.cat([hit_z, floor_z.unsqueeze(0)], 0)
        front = cand.argmin(0)
        hard = cand.gather(0, front.unsqueeze(0))[0]
        R = len(hit_z)
        # a pixel with no return says nothing (a dark, thin or shiny rod may return none)
        shows = torch.nn.functional.one_hot(front, R + 1)[:, :R].T.bool() & (sil & valid).unsqueeze(0)   # [R, P]
        shown = shows.sum(-1)
        supported = (shows & robot.unsqueeze(0)).sum(-1)
        contradicted = (shown >= 4) & (supported < 0.25 * shown)
        inter = (sil & robot).sum()
        if whole:
            union = sil.sum() + (self.all_robot > 0.5).sum() - inter
            full = self.floor_z.clone()
            full[self.roi_index] = hard
            hard = full
        else:
            union = (sil | robot).sum()
        overlap = float(inter) / float(union) if union else 0.0        # nothing seen: no fit
        returns = self.all_valid > 0
        bound = robust * self.all_sigma[returns]
        d = (hard - self.all_observed)[returns]
        return overlap, torch.maximum(torch.minimum(d, bound), -bound), contradicted


class RodTracker:
    """Tracks a robot's rods (lengths and radii from its config) in depth images."""

    def __init__(self, robot, cameras: Sequence[PinholeCamera], config: TrackerConfig = TrackerConfig(),
                 *, floor: Optional[float] | str = "robot", dtype=torch.float64, seed: int = 0):
        """``floor``: the ground plane's height behind the robot, "robot" (its config's
        ground height) or None (no floor: every return is the robot, e.g. hanging)."""
        if not cameras:
            raise ValueError("the tracker needs at least one camera")
        self.config = config
        self.dtype = dtype
        self.half = torch.as_tensor(0.5 * np.asarray(robot.rod_length, dtype=np.float64), dtype=dtype)
        self.radius = torch.as_tensor(np.asarray(robot.rod_radius, dtype=np.float64), dtype=dtype)
        self.num_rods = len(self.half)
        floor = robot.contact.ground_height if floor == "robot" else floor
        self.floor = None if floor is None else float(floor)
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

    def _gaps(self, ends, points):
        """[N, R] distance of every point to every rod's surface."""
        e0, e1 = ends[:, 0], ends[:, 1]                                           # [R, 3]
        seg = e1 - e0
        rel = points[:, None, :] - e0[None]                                       # [N, R, 3]
        s = ((rel * seg).sum(-1) / (seg * seg).sum(-1)).clamp(0.0, 1.0)
        return torch.linalg.norm(rel - s[..., None] * seg, dim=-1) - self.radius

    def _layers(self, theta, frame, shifts):
        """Per view: each rod's hard depth and coverage [K, R, P] and point gaps [K, N, R],
        with every rod moved by the same local shift, one per row of ``shifts`` [K, 5]."""
        base = theta.reshape(self.num_rods, 5)
        ends = torch.stack([self._ends(base + sh, *frame) for sh in shifts])      # [K, R, 2, 3]
        out = []
        for view in self.views:
            hit_z, _, alpha = view.roi.rod_layers(ends, self.radius, view.margin)
            gaps = torch.stack([self._gaps(e, view.points) for e in ends])
            out += [hit_z, alpha, gaps]
        return out + [ends[..., 2]]                                                # end heights [K, R, 2]

    def _layer_jacobians(self, theta, frame):
        """Values of `_layers` at ``theta`` and their derivatives [.., 5] along the five local
        directions. A rod's layers depend on its own pose only, so moving every rod at once
        along a direction yields all R Jacobian blocks together (5 directions, not 5R).
        Forward differences (float64, step 1e-6) of one batched evaluation: torch.func's
        forward mode costs 17x the evaluation here (dispatch over many small ops), this 6x. A pixel
        whose ray starts or stops hitting a rod between the two sides has no derivative
        (the hit depth jumps): it is given none, as forward mode would."""
        h = 1e-6
        shifts = torch.cat([torch.zeros(1, 5, dtype=theta.dtype), h * torch.eye(5, dtype=theta.dtype)])
        vals = self._layers(theta, frame, shifts)
        centre, grads = [], []
        for i, v in enumerate(vals):
            g = (v[1:] - v[:1]) / h
            if i % 3 == 0 and i < len(vals) - 1:                   # hit depth: jumps at silhouettes
                g = torch.where(torch.isfinite(v[1:]) & torch.isfinite(v[:1]), g, torch.zeros_like(g))
            centre.append(v[0])
            grads.append(torch.movedim(g, 0, -1))
        return centre, grads

    def _linearise(self, theta, frame, jacobian: bool = True):
        """Residual vector r and, with ``jacobian``, dr/dtheta [len(r), 5R]."""
        cfg, R = self.config, self.num_rods
        b = cfg.robust
        if jacobian:
            vals, grads = self._layer_jacobians(theta, frame)
        else:
            vals = [v[0] for v in self._layers(theta, frame, theta.new_zeros(1, 5))]
        res, jac = [], []
        for i, view in enumerate(self.views):
            hit_z, alpha, gaps = vals[3 * i: 3 * i + 3]
            # depth: the exact ray cast (a depth image samples each ray at one point), bounded:
            # a pixel showing a rod where the model shows floor says "wrong", not how far
            cand = torch.cat([hit_z, view.floor_z_roi.unsqueeze(0)], 0)
            front = cand.argmin(0)                                                # R = the floor
            sd = view.pixel_sigma
            x = (cand.gather(0, front.unsqueeze(0))[0] - view.observed) / sd
            res.append(view.valid * b * torch.tanh(x / b))
            # silhouette (the observation's rule: nearer than the floor by the margin)
            keep = 1.0 - alpha
            sil = 1.0 - keep.prod(0)
            res.append(view.valid * (sil - view.robot_mask) / cfg.sigma_silhouette)
            # points: each observed robot point on its nearest rod's surface (Cauchy)
            near = gaps.argmin(1) if len(gaps) else gaps.new_zeros(0, dtype=torch.long)
            g = gaps.gather(1, near.unsqueeze(1))[:, 0] / view.point_sigma if len(gaps) else gaps.new_zeros(0)
            r_pt, slope = _cauchy(g, b)
            res.append(r_pt)
            if not jacobian:
                continue
            j_hit, j_alpha, j_gap = grads[3 * i: 3 * i + 3]
            P = len(view.observed)
            jd = torch.zeros(P, R + 1, 5, dtype=theta.dtype)
            scale = view.valid / torch.cosh(x / b) ** 2 / sd
            rows = torch.arange(P)
            on_rod = front < R
            jd[rows[on_rod], front[on_rod]] = scale[on_rod, None] * j_hit[front[on_rod], rows[on_rod]]
            jac.append(jd[:, :R].reshape(P, 5 * R))
            others = torch.stack([torch.cat([keep[:k], keep[k + 1:]]).prod(0) for k in range(R)])   # [R, P]
            js = (view.valid / cfg.sigma_silhouette * others).unsqueeze(-1) * j_alpha          # [R, P, 5]
            jac.append(js.permute(1, 0, 2).reshape(P, 5 * R))
            N = len(g)
            jp = torch.zeros(N, R, 5, dtype=theta.dtype)
            if N:
                jp[torch.arange(N), near] = (slope / view.point_sigma).unsqueeze(-1) * j_gap[torch.arange(N), near]
            jac.append(jp.reshape(N, 5 * R))
        if self.floor is not None:
            # no rod below the floor (beyond a soft contact's sink): a rod the images have lost
            # sight of must not sink out of view
            below = self.floor + self.radius.unsqueeze(-1) - FLOOR_SINK - vals[-1]             # [R, 2]
            active = (below > 0).to(theta.dtype)
            res.append((active * below / SIGMA_FLOOR).reshape(-1))
            if jacobian:
                jf = torch.zeros(R, 2, R, 5, dtype=theta.dtype)
                rods = torch.arange(R)
                jf[rods, :, rods] = -(active / SIGMA_FLOOR).unsqueeze(-1) * grads[-1]
                jac.append(jf.reshape(2 * R, 5 * R))
        res.append(theta / self.prior_sigma.reshape(-1))
        r = torch.cat(res)
        if not jacobian:
            return r, None
        jac.append(torch.diag(1.0 / self.prior_sigma.reshape(-1)))
        return r, torch.cat(jac)

    # ------------------------------------------------------------------ solve
    def track(self, depths: Sequence[np.ndarray], prior_ends: np.ndarray,
              prior_std: Optional[np.ndarray] = None, *, rigid: bool = False) -> RodPoseEstimate:
        """Fit the rods to one depth image per camera, starting from ``prior_ends`` [R, 2, 3]
        (the prediction; its rod and end order is kept). ``prior_std`` [R, 5] overrides the
        config's prior sigmas (e.g. the motion model's own uncertainty). ``rigid``: move the
        prior's shape as one body instead (6 unknowns: far wider convergence, no change of
        shape; `reacquire`)."""
        if len(depths) != len(self.views):
            raise ValueError(f"{len(self.views)} camera(s), {len(depths)} depth image(s)")
        for view, depth in zip(self.views, depths):
            if np.shape(depth) != (view.camera.height, view.camera.width):
                raise ValueError(f"depth image {np.shape(depth)} is not the camera's "
                                 f"{(view.camera.height, view.camera.width)}")
            view.observe(depth, self.rng)
        prior = torch.as_tensor(np.asarray(prior_ends, dtype=np.float64), dtype=self.dtype)
        if prior.shape != (self.num_rods, 2, 3) or not torch.isfinite(prior).all():
            raise ValueError(f"prior_ends must be finite [{self.num_rods}, 2, 3]")
        centre0 = prior.mean(1)
        axis0 = prior[:, 1] - prior[:, 0]
        axis0 = axis0 / torch.linalg.norm(axis0, dim=-1, keepdim=True)
        t1, t2 = tangent_basis(axis0)
        frame = (centre0, axis0, t1, t2)
        cfg = self.config
        sig = np.tile([cfg.prior_position] * 3 + [cfg.prior_axis] * 2, (self.num_rods, 1))
        self.prior_sigma = torch.as_tensor(sig if prior_std is None else prior_std, dtype=self.dtype)
        theta = torch.zeros(5 * self.num_rods, dtype=self.dtype)
        for view in self.views:
            view.focus(self._ends(theta, *frame), self.radius)
        to_theta = self._rigid_map(frame) if rigid else (lambda q: q)

        def linearise(q, jacobian=True):
            r_, J_ = self._linearise(to_theta(q), frame, jacobian)
            if jacobian and rigid:                          # chain rule through the rigid motion
                eye = torch.eye(6, dtype=self.dtype)
                D = torch.stack([(to_theta(q + 1e-7 * eye[i]) - to_theta(q)) / 1e-7 for i in range(6)], -1)
                J_ = J_ @ D
            return r_, J_

        q = torch.zeros(6 if rigid else 5 * self.num_rods, dtype=self.dtype)
        lam, it = 1e-3, 0
        deadline = time.perf_counter() + cfg.time_budget
        r, J = linearise(q)
        cost = float(r @ r)
        for it in range(1, cfg.iterations + 1):
            A, g = J.T @ J, J.T @ r
            improved = False
            for _ in range(6):
                step = torch.linalg.solve(A + lam * torch.diag(A.diagonal().clamp_min(1e-9)), -g)
                r_new, _ = linearise(q + step, jacobian=False)
                c_new = float(r_new @ r_new)
                if np.isfinite(c_new) and c_new < cost:
                    q, cost, lam, improved = q + step, c_new, max(lam / 3.0, 1e-7), True
                    break
                lam *= 10.0
            if not improved:
                break
            r, J = linearise(q)
            if float(step.abs().max()) < cfg.tolerance or time.perf_counter() > deadline:
                break
        theta = to_theta(q)
        if rigid:
            r, J = self._linearise(theta, frame)
        cov = torch.linalg.pinv(J.T @ J)
        ends = self._ends(theta, *frame).detach()
        iou, rms, contradicted = self._quality(ends)
        return RodPoseEstimate(ends=ends.numpy(), std=np.sqrt(np.clip(np.diag(cov.numpy()), 0, None)).reshape(-1, 5),
                               iou=iou, rms=rms, lost=bool(iou < cfg.lost_iou or contradicted.any()),
                               iterations=it, contradicted=contradicted)

    def _rigid_map(self, frame):
        """q [6] (translation, rotation vector about the rods' centroid) -> theta [5R]."""
        centre0, axis0, t1, t2 = frame
        c = centre0.mean(0)

        def to_theta(q):
            rot = quat_to_matrix(quat_from_rotvec(q[3:]))
            centre = (centre0 - c) @ rot.T + c + q[:3]
            axis = axis0 @ rot.T
            along = (axis * axis0).sum(-1, keepdim=True)          # _ends normalises axis0 + a t1 + b t2
            return torch.cat([centre - centre0, (axis * t1).sum(-1, keepdim=True) / along,
                              (axis * t2).sum(-1, keepdim=True) / along], -1).reshape(-1)
        return to_theta

    def reacquire(self, depths: Sequence[np.ndarray], last_ends: np.ndarray) -> RodPoseEstimate:
        """After a lost track: the last good shape ``last_ends`` [R, 2, 3] moved as one body
        onto the robot the images show (from where it was and from the observed points'
        median, the better kept), then fitted rod by rod. Rod identity is the last
        estimate's: a robot that turned past its symmetry meanwhile comes back with rods
        swapped, which no depth image can tell."""
        for view, depth in zip(self.views, depths):
            view.observe(depth, self.rng)
        points = torch.cat([v.points for v in self.views])
        if len(points) < 10:
            raise ValueError(f"{len(points)} robot points: too few to find the robot")
        last = np.asarray(last_ends, dtype=np.float64)
        shift = points.median(0).values.numpy() - last.reshape(-1, 3).mean(0)
        wide = np.tile([1.0] * 3 + [1.0] * 2, (self.num_rods, 1))
        rigid = [self.track(depths, start, wide, rigid=True) for start in (last, last + shift)]
        best = max(rigid, key=lambda e: e.iou)
        return self.track(depths, best.ends, np.tile([0.03] * 3 + [0.1] * 2, (self.num_rods, 1)))

    def _quality(self, ends) -> tuple[float, float, np.ndarray]:
        """(silhouette overlap with the observed robot, mean over cameras; robust rms (m) of
        the depth residual over every return; per rod, whether a camera contradicts it)."""
        overlaps, res, contradicted = [], [], np.zeros(self.num_rods, dtype=bool)
        for view in self.views:
            overlap, r, bad = view.quality(ends, self.radius, self.config.robust)
            overlaps.append(overlap)
            res.append(r)
            contradicted |= bad.numpy()
        r = torch.cat(res)
        rms = float(torch.sqrt((r * r).mean())) if len(r) else float("nan")
        return float(np.mean(overlaps)), rms, contradicted
