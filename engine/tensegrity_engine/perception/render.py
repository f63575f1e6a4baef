"""Differentiable depth and silhouette of capsule rods over a floor, for a pinhole camera.

Per pixel ray o + t d and rod (segment e0-e1, radius r), analytically:

* the first hit: a capsule is the union of a cylinder and two end spheres, so its entry
  is the smallest valid root of three quadratics (cylinder wall within the segment's
  extent, each sphere);
* the ray-segment distance delta (closest approach, the segment parameter clamped), which
  gives a soft coverage alpha = sigmoid((r - delta) / (sharpness * footprint)), footprint =
  the pixel's size at that depth, so edges are smooth over about a pixel at any range.

Occlusion is front-to-back alpha compositing over the rods and the floor (whose coverage
is 1): each candidate's depth counts with alpha_k times the transparency of everything
nearer; for a ray that misses a rod its candidate depth is the closest approach's. The silhouette is
1 - prod_k (1 - alpha_k). Everything is batched over robots [B], differentiable in the
end nodes, on any device and dtype. Depth is the optical z (as a depth image holds).
"""
from __future__ import annotations

import copy
import dataclasses
from typing import Optional

import torch

from tensegrity_engine.perception.camera import PinholeCamera

__all__ = ["CapsuleRenderer", "Rendering"]

FAR = 1e3      # m: depth of a ray that meets nothing (above the horizon, no floor)


@dataclasses.dataclass
class Rendering:
    depth: torch.Tensor         # [B, P] optical z (m)
    silhouette: torch.Tensor    # [B, P] soft rod coverage in [0, 1]
    hit_depth: torch.Tensor     # [B, P] hard z-buffer depth (rods and floor), no soft blend


class CapsuleRenderer:
    """Renders rods (end nodes [B, R, 2, 3], radii [R]) seen by ``camera``.

    ``floor_height``: the z of the ground plane, or None for no floor. ``stride``: render
    every stride-th row and column (a cheaper, coarser image). ``sharpness``: edge width in
    pixels."""

    def __init__(self, camera: PinholeCamera, *, floor_height: Optional[float] = 0.0, stride: int = 1,
                 sharpness: float = 0.5, dtype=torch.float64, device="cpu"):
        self.camera = camera
        self.stride = int(stride)
        self.shape = (len(range(0, camera.height, self.stride)), len(range(0, camera.width, self.stride)))
        self.dirs, self.zf = camera.rays(dtype, device, self.stride)           # [P, 3], [P]
        self.origin = torch.as_tensor(camera.position, dtype=dtype, device=device)
        self.floor_height = floor_height
        self.edge = sharpness * camera.pixel_angle * self.stride
        self.dtype, self.device = dtype, device

    def with_pixels(self, index: torch.Tensor) -> "CapsuleRenderer":
        """This renderer restricted to the pixels ``index`` (flat, into the rendered grid):
        a region of interest around the robot costs a fraction of the image."""
        sub = copy.copy(self)
        sub.dirs, sub.zf = self.dirs[index], self.zf[index]
        sub.shape = (len(index),)
        return sub

    def floor_depth(self) -> torch.Tensor:
        """[P] optical z of the floor along every ray (FAR where a ray does not meet it)."""
        if self.floor_height is None:
            return torch.full_like(self.zf, FAR)
        dz = self.dirs[:, 2]
        t = (self.floor_height - self.origin[2]) / torch.where(dz < -1e-9, dz, torch.full_like(dz, -1e-9))
        return torch.where((dz < -1e-9) & (t > 0), t * self.zf, torch.full_like(t, FAR))

    def _rod_terms(self, ends: torch.Tensor, radius: torch.Tensor):
        """Per pixel and rod: (hit distance along the ray or inf [B, R, P], closest-approach
        distance along the ray [B, R, P], ray-segment distance [B, R, P]).

        Written with the scalar products only (unit ray d, unit axis u, w0 = origin - e0):
        every quantity below is a polynomial in d.u, w0.d, w0.u and |w0|^2, so the per-pixel
        work is a few elementwise ops on [B, R, P], not reductions over xyz."""
        dx, dy, dz = self.dirs[:, 0], self.dirs[:, 1], self.dirs[:, 2]          # [P]
        e0 = ends[..., 0, :]
        axis = ends[..., 1, :] - e0                                               # [B, R, 3]
        L = torch.linalg.norm(axis, dim=-1, keepdim=True)                         # [B, R, 1]
        u = axis / L
        w0 = self.origin - e0
        b = dx * u[..., 0:1] + dy * u[..., 1:2] + dz * u[..., 2:3]                # d.u   [B, R, P]
        dd = dx * w0[..., 0:1] + dy * w0[..., 1:2] + dz * w0[..., 2:3]            # w0.d
        e = (w0 * u).sum(-1, keepdim=True)                                        # w0.u  [B, R, 1]
        ww = (w0 * w0).sum(-1, keepdim=True)                                      # |w0|^2
        r2 = (radius * radius).view(*([1] * (ends.dim() - 3)), -1, 1)
        # closest approach of the ray to the segment (segment parameter clamped to [0, L])
        one_minus_b2 = (1.0 - b * b).clamp_min(1e-12)
        t_line = (b * e - dd) / one_minus_b2
        s = (e + t_line * b).clamp(torch.zeros_like(L), L)
        t_close = (s * b - dd).clamp_min(0.0)
        gap2 = ww + t_close * t_close + s * s + 2.0 * (t_close * dd - s * e - t_close * s * b)
        delta = torch.sqrt(gap2.clamp_min(1e-18))
        inf = torch.full_like(b, float("inf"))
        # cylinder wall: |w_perp + t d_perp|^2 = r^2
        Bh = dd - e * b
        C = ww - e * e - r2
        disc = Bh * Bh - one_minus_b2 * C
        t_cyl = (-Bh - torch.sqrt(disc.clamp_min(1e-18))) / one_minus_b2
        axial = e + t_cyl * b
        hit = torch.where((disc > 0) & (axial >= 0) & (axial <= L) & (t_cyl > 0), t_cyl, inf)
        # the two end spheres: w = w0 - k L u for k = 0, 1
        for bs, cs in ((dd, ww - r2), (dd - L * b, ww - 2.0 * L * e + L * L - r2)):
            ds = bs * bs - cs
            ts = -bs - torch.sqrt(ds.clamp_min(1e-18))
            hit = torch.minimum(hit, torch.where((ds > 0) & (ts > 0), ts, inf))
        return hit, t_close, delta

    def rod_layers(self, ends: torch.Tensor, radius: torch.Tensor, floor_margin: Optional[float] = None):
        """Each rod on its own: (hard hit depth, inf where missed; depth of its nearest
        approach where missed; coverage alpha), each [B, R, P]. A rod's layers depend on
        its own end nodes only. ``floor_margin``: see `render`."""
        radius = torch.as_tensor(radius, dtype=self.dtype, device=ends.device)
        hit, t_close, delta = self._rod_terms(ends, radius)
        hit_z = hit * self.zf
        proxy_z = torch.where(torch.isfinite(hit), hit, t_close) * self.zf
        footprint = self.edge * proxy_z.clamp_min(1e-3)
        alpha = torch.sigmoid((radius.view(1, -1, 1) - delta) / footprint)
        if floor_margin is not None:
            alpha = alpha * torch.sigmoid((self.floor_depth() - floor_margin - proxy_z) / (0.25 * floor_margin))
        return hit_z, proxy_z, alpha

    def render(self, ends: torch.Tensor, radius: torch.Tensor, floor_margin: Optional[float] = None) -> Rendering:
        """``ends`` [B, R, 2, 3] (or [R, 2, 3]) world end nodes; ``radius`` [R].
        ``floor_margin`` (m): the silhouette counts a rod only where it is nearer than the
        floor by about this much (softly), the rule a depth image's robot mask is made by;
        the soft depth uses the ungated coverage."""
        squeeze = ends.dim() == 3
        if squeeze:
            ends = ends.unsqueeze(0)
        ends = ends.to(self.dtype)
        hit_z, proxy_z, alpha = self.rod_layers(ends, radius)
        floor_z = self.floor_depth().expand(ends.shape[0], 1, -1)                     # [B, 1, P]
        z = torch.cat([proxy_z, floor_z], 1)
        cover = torch.cat([alpha, torch.ones_like(floor_z)], 1)
        # front-to-back "over" compositing: each candidate shows through what is nearer
        order = torch.argsort(z.detach(), dim=1)
        z, cover = z.gather(1, order), cover.gather(1, order)
        through = torch.cumprod(torch.cat([torch.ones_like(cover[:, :1]), 1.0 - cover[:, :-1]], 1), 1)
        depth = (cover * through * z).sum(1)
        if floor_margin is not None:
            alpha = alpha * torch.sigmoid((floor_z - floor_margin - proxy_z) / (0.25 * floor_margin))
        silhouette = 1.0 - torch.prod(1.0 - alpha, dim=1)
        hard = torch.minimum(hit_z.min(1).values, floor_z[:, 0])
        out = Rendering(depth, silhouette, hard)
        if squeeze:
            out = Rendering(depth[0], silhouette[0], hard[0])
        return out

    def image(self, values: torch.Tensor) -> torch.Tensor:
        """[..., P] -> [..., H, W] (the rendered grid)."""
        return values.reshape(*values.shape[:-1], *self.shape)
