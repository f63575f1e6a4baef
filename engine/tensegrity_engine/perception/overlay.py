"""What a person looks at to trust a camera track: the tracked rods drawn over the depth image.

`overlay_image` returns an RGB image (uint8 [H, W, 3]): the observed depth in grey (near is
light, no return is dark red), each tracked rod's outline and axis in its own colour (the
rod's index in the robot's config, so a swapped rod shows as a swapped colour), and the
observed robot pixels the fit leaves uncovered tinted magenta (what the model misses).
Pure numpy + the package's renderer; saving the picture is the caller's (e.g.
``matplotlib.pyplot.imsave``).
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import numpy as np
import torch

from tensegrity_engine.perception.camera import PinholeCamera
from tensegrity_engine.perception.render import CapsuleRenderer

__all__ = ["overlay_image", "overlay_writer", "ROD_COLOURS"]

# distinguishable on grey (matplotlib's tab10 without its grey)
ROD_COLOURS = np.array([[31, 119, 180], [255, 127, 14], [44, 160, 44], [214, 39, 40], [148, 103, 189],
                        [140, 86, 75], [227, 119, 194], [188, 189, 34], [23, 190, 207]], dtype=np.uint8)


def _grey(depth: np.ndarray) -> np.ndarray:
    seen = np.isfinite(depth)
    out = np.zeros(depth.shape + (3,), dtype=np.uint8)
    out[~seen] = (90, 0, 0)
    if seen.any():
        lo, hi = np.percentile(depth[seen], [1, 99])
        level = 1.0 - np.clip((depth - lo) / max(hi - lo, 1e-6), 0.0, 1.0)
        g = (40 + 200 * level[seen]).astype(np.uint8)
        out[seen] = np.stack([g, g, g], -1)
    return out


def overlay_image(camera: PinholeCamera, depth: np.ndarray, ends: np.ndarray, radius,
                  floor: Optional[float] = 0.0, robot_mask: Optional[np.ndarray] = None) -> np.ndarray:
    """RGB [H, W, 3] of ``depth`` [H, W] (m, NaN = no return) with the rods at ``ends``
    [R, 2, 3] drawn over it. ``robot_mask`` [H, W]: the observed robot pixels (e.g. the
    tracker's); those the rods do not cover are tinted."""
    depth = np.asarray(depth, dtype=np.float64)
    if depth.shape != (camera.height, camera.width):
        raise ValueError(f"depth image {depth.shape} is not the camera's {(camera.height, camera.width)}")
    ends_t = torch.as_tensor(np.asarray(ends, dtype=np.float64))
    renderer = CapsuleRenderer(camera, floor_height=floor)
    with torch.no_grad():
        hit_z, _, _ = renderer.rod_layers(ends_t[None], radius)
    hit_z = hit_z[0].numpy()                                               # [R, P]
    nearest = np.where(np.isfinite(hit_z).any(0), np.argmin(np.where(np.isfinite(hit_z), hit_z, np.inf), 0), -1)
    rod = nearest.reshape(camera.height, camera.width)
    out = _grey(depth)
    if robot_mask is not None:
        missed = np.asarray(robot_mask, dtype=bool) & (rod < 0)
        out[missed] = (230, 0, 230)
    inside = rod >= 0
    edge = np.zeros_like(inside)          # a rod pixel with a neighbour that is another rod or none
    for axis in (0, 1):
        for shift in (1, -1):
            edge |= inside & (np.roll(rod, shift, axis) != rod)
    colours = ROD_COLOURS[np.maximum(rod, 0) % len(ROD_COLOURS)]
    out[inside] = (0.65 * out[inside] + 0.35 * colours[inside]).astype(np.uint8)    # a see-through fill
    out[edge] = colours[edge]
    _draw_axes(out, camera, np.asarray(ends, dtype=np.float64))
    return out


def _draw_axes(out: np.ndarray, camera: PinholeCamera, ends: np.ndarray) -> None:
    """Each rod's axis as a line of its colour, its first end node as a white dot: the end
    order is visible."""
    h, w = out.shape[:2]
    for i, (a, b) in enumerate(ends):
        pts = a + np.linspace(0.0, 1.0, 4 * max(h, w))[:, None] * (b - a)
        uv, z = camera.project(pts)
        ok = (z > 0) & (uv[:, 0] > -0.5) & (uv[:, 0] < w - 0.5) & (uv[:, 1] > -0.5) & (uv[:, 1] < h - 0.5)
        u, v = np.rint(uv[ok, 0]).astype(int), np.rint(uv[ok, 1]).astype(int)
        out[v, u] = ROD_COLOURS[i % len(ROD_COLOURS)]
        if ok[0]:
            out[max(v[0] - 1, 0):v[0] + 2, max(u[0] - 1, 0):u[0] + 2] = 255


def overlay_writer(folder, every: int, robot, session):
    """An ``on_frame`` for `offline.track_frames`: every ``every``-th frame (and every one
    not tracked) saved as ``folder/<frame>_<status>.png``, the rods over the first camera's
    depth image with the robot pixels the tracker saw (matplotlib writes the PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    count = [0]

    def draw(frame, out):
        i = count[0]
        count[0] += 1
        if out.estimate is None or (i % max(every, 1) and out.good):
            return
        view = session.tracker.views[0]
        mask = view.all_robot.numpy().reshape(view.renderer.shape) > 0 if view.renderer.stride == 1 else None
        img = overlay_image(session.cameras[0], frame.depths[0], out.estimate.ends, robot.rod_radius,
                            floor=view.renderer.floor_height, robot_mask=mask)
        plt.imsave(folder / f"{i:06d}_{out.status}.png", img)
    return draw
