"""Pinhole depth camera: intrinsics, pose in the world, and the ray of every pixel.

Frames follow ROS (REP 103 / ``sensor_msgs/CameraInfo``): the *optical* frame has z
forward, x right, y down; a depth image (32FC1, metres) holds each pixel's z in that frame,
not its distance along the ray; NaN marks no return. ``world_from_camera`` maps optical
frame points to the world.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch

__all__ = ["PinholeCamera", "look_at", "tripods"]


@dataclasses.dataclass(frozen=True)
class PinholeCamera:
    width: int
    height: int
    fx: float
    fy: float
    cx: float
    cy: float
    rotation: np.ndarray         # [3, 3] world_from_camera rotation (columns: optical x, y, z in the world)
    position: np.ndarray         # [3] optical centre in the world

    def __post_init__(self):
        R = np.asarray(self.rotation, dtype=np.float64)
        if R.shape != (3, 3) or not np.allclose(R @ R.T, np.eye(3), atol=1e-6) or np.linalg.det(R) < 0:
            raise ValueError("camera rotation must be a proper 3x3 rotation matrix")
        p = np.asarray(self.position, dtype=np.float64)
        if p.shape != (3,) or not np.isfinite(p).all():
            raise ValueError("camera position must be 3 finite numbers")
        if self.width < 1 or self.height < 1 or not (self.fx > 0 and self.fy > 0):
            raise ValueError("camera needs a positive size and focal lengths")
        object.__setattr__(self, "rotation", R)
        object.__setattr__(self, "position", p)

    @staticmethod
    def from_camera_info(k: np.ndarray, width: int, height: int, rotation, position) -> "PinholeCamera":
        """From a CameraInfo ``k`` (row-major 3x3) and the optical frame's world pose."""
        k = np.asarray(k, dtype=np.float64).reshape(3, 3)
        return PinholeCamera(int(width), int(height), float(k[0, 0]), float(k[1, 1]), float(k[0, 2]),
                             float(k[1, 2]), np.asarray(rotation), np.asarray(position))

    def same_as(self, other: "PinholeCamera") -> bool:
        """The same image geometry: size, intrinsics and pose (to round-off)."""
        return (self.width, self.height) == (other.width, other.height) and np.allclose(self.k, other.k) \
            and np.allclose(self.rotation, other.rotation) and np.allclose(self.position, other.position)

    @property
    def k(self) -> np.ndarray:
        return np.array([[self.fx, 0.0, self.cx], [0.0, self.fy, self.cy], [0.0, 0.0, 1.0]])

    @property
    def pixel_angle(self) -> float:
        """Angle (rad) one pixel subtends at the centre: a point's footprint is z * this."""
        return 1.0 / max(self.fx, self.fy)

    def rays(self, dtype=torch.float64, device="cpu", stride: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        """Unit world directions [P, 3] of the pixel centres (row-major, every ``stride``-th
        row and column) and each ray's z per unit length [P] (depth = distance * that)."""
        v, u = np.meshgrid(np.arange(0, self.height, stride), np.arange(0, self.width, stride), indexing="ij")
        local = np.stack([(u.ravel() - self.cx) / self.fx, (v.ravel() - self.cy) / self.fy,
                          np.ones(u.size)], -1)
        norm = np.linalg.norm(local, axis=-1, keepdims=True)
        local = local / norm
        world = local @ self.rotation.T
        return (torch.as_tensor(world, dtype=dtype, device=device),
                torch.as_tensor(local[:, 2], dtype=dtype, device=device))

    def project(self, points: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """World points [..., 3] -> (pixel coordinates [..., 2] (u, v), depth z [...])."""
        local = (np.asarray(points, dtype=np.float64) - self.position) @ self.rotation
        z = local[..., 2]
        with np.errstate(divide="ignore", invalid="ignore"):
            uv = np.stack([self.fx * local[..., 0] / z + self.cx, self.fy * local[..., 1] / z + self.cy], -1)
        return uv, z

    def backproject(self, depth: np.ndarray) -> np.ndarray:
        """Depth image [H, W] -> world points [H, W, 3] (NaN where the depth is)."""
        v, u = np.meshgrid(np.arange(self.height), np.arange(self.width), indexing="ij")
        z = np.asarray(depth, dtype=np.float64)
        local = np.stack([(u - self.cx) / self.fx * z, (v - self.cy) / self.fy * z, z], -1)
        return local @ self.rotation.T + self.position


def look_at(eye, target, *, width: int = 160, height: int = 120, fov_y: float = math.radians(60.0),
            up=(0.0, 0.0, 1.0)) -> PinholeCamera:
    """A camera at ``eye`` looking at ``target`` with a vertical field of view ``fov_y``."""
    eye, target, up = (np.asarray(x, dtype=np.float64) for x in (eye, target, up))
    z = target - eye
    if np.linalg.norm(z) < 1e-9:
        raise ValueError("camera eye and target coincide")
    z = z / np.linalg.norm(z)
    x = np.cross(z, up)
    if np.linalg.norm(x) < 1e-9:                 # looking straight along up: any x will do
        x = np.cross(z, [1.0, 0.0, 0.0] if abs(z[0]) < 0.9 else [0.0, 1.0, 0.0])
    x = x / np.linalg.norm(x)
    y = np.cross(z, x)
    f = 0.5 * height / math.tan(0.5 * fov_y)
    return PinholeCamera(width, height, f, f, 0.5 * (width - 1), 0.5 * (height - 1),
                         np.stack([x, y, z], -1), eye)


def tripods(base, offset, target, count: int, spacing_deg: float, **look_at_kwargs) -> list:
    """``count`` cameras looking at ``target``, the k-th at ``base`` + ``offset`` turned by k
    ``spacing_deg`` degrees about the vertical (a rig of tripods around a robot)."""
    base, offset = (np.asarray(x, dtype=np.float64) for x in (base, offset))
    out = []
    for k in range(count):
        a = math.radians(spacing_deg) * k
        turn = np.array([[math.cos(a), -math.sin(a), 0.0], [math.sin(a), math.cos(a), 0.0], [0.0, 0.0, 1.0]])
        out.append(look_at(base + turn @ offset, target, **look_at_kwargs))
    return out
