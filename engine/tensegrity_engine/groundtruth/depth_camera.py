"""A depth camera in the MuJoCo ground truth: what an RGB-D sensor would see of the robot.

MuJoCo renders the scene (its own capsules and floor, not this package's renderer) through
an offscreen OpenGL context opened here whatever ``MUJOCO_GL`` chose at import (its
default, GLFW, needs a display): EGL when its library is present, else OSMesa
(``PYOPENGL_PLATFORM`` overrides). Without either library the camera raises
`DepthRenderingUnavailable` saying what to install. The sensor model adds what a real one
has: depth noise growing with range (sigma = noise_at_1m * z^2, structured-light style),
pixels that return nothing (NaN) at random and beyond ``max_range``.

A camera is given as intrinsics + pose (any object with ``width, height, fx, fy, cx, cy,
rotation, position`` in the ROS optical convention: z forward, y down; e.g.
`perception.camera.PinholeCamera`). MuJoCo's cameras have one focal length and a centred
principal point, so fx must equal fy and (cx, cy) be the image centre.
"""
from __future__ import annotations

import dataclasses
import math
import xml.etree.ElementTree as ET
from typing import Optional

import mujoco
import numpy as np

from tensegrity_engine.groundtruth.mujoco_twin import FULLPHYSICS, MujocoTwin

__all__ = ["DepthNoise", "DepthRenderingUnavailable", "MujocoDepthCamera"]


class DepthRenderingUnavailable(RuntimeError):
    """No offscreen OpenGL (EGL or OSMesa) on this machine."""


@dataclasses.dataclass(frozen=True)
class DepthNoise:
    noise_at_1m: float = 0.0      # m, depth noise sigma at 1 m (grows with z^2)
    dropout: float = 0.0          # share of pixels with no return
    max_range: float = 10.0       # m, farther returns are NaN

    def __post_init__(self):
        if not (self.noise_at_1m >= 0 and 0 <= self.dropout < 1 and self.max_range > 0):
            raise ValueError(f"bad depth noise model {self}")


def _gl_backend() -> str:
    """egl or osmesa: the one whose library is here. Only one may be tried per process:
    importing either makes PyOpenGL's platform choice (PYOPENGL_PLATFORM) for good."""
    import ctypes.util
    import os

    chosen = os.environ.get("PYOPENGL_PLATFORM", "").lower()
    if chosen in ("egl", "osmesa"):
        return chosen
    if ctypes.util.find_library("EGL"):
        return "egl"
    if ctypes.util.find_library("OSMesa"):
        return "osmesa"
    raise DepthRenderingUnavailable(
        "offscreen rendering needs EGL or OSMesa: Debian `apt-get install libegl1 libegl-mesa0` (or "
        "`libosmesa6` and PYOPENGL_PLATFORM=osmesa)")


def _gl_context(width: int, height: int):
    backend = _gl_backend()
    try:
        if backend == "egl":
            from mujoco.egl import GLContext
        else:
            from mujoco.osmesa import GLContext
        ctx = GLContext(width, height)
        ctx.make_current()
        return ctx
    except Exception as exc:          # noqa: BLE001 - each backend fails in its own way
        raise DepthRenderingUnavailable(
            f"offscreen rendering through {backend} failed ({type(exc).__name__}: {exc}); Debian: `apt-get "
            "install libegl1 libegl-mesa0`, or `libosmesa6` with PYOPENGL_PLATFORM=osmesa") from exc


class MujocoDepthCamera:
    """Depth images (float32 [H, W], metres, NaN = no return) of a twin's robot."""

    def __init__(self, twin: MujocoTwin, camera, *, noise: DepthNoise = DepthNoise(),
                 rng: Optional[np.random.Generator] = None):
        if abs(camera.fx - camera.fy) > 1e-6 * camera.fx or abs(camera.cx - 0.5 * (camera.width - 1)) > 1e-6 \
                or abs(camera.cy - 0.5 * (camera.height - 1)) > 1e-6:
            raise ValueError("a MuJoCo camera needs fx == fy and a centred principal point")
        self.twin, self.camera, self.noise = twin, camera, noise
        self.rng = rng if rng is not None else np.random.default_rng(0)
        root = ET.fromstring(twin.xml)
        R = np.asarray(camera.rotation, dtype=np.float64)
        fovy = math.degrees(2.0 * math.atan(0.5 * camera.height / camera.fy))
        # MuJoCo's camera looks along its -z with y up: x stays, y and z flip.
        ET.SubElement(root.find("worldbody"), "camera", name="depth",
                      pos=" ".join(repr(float(v)) for v in camera.position),
                      xyaxes=" ".join(repr(float(v)) for v in np.concatenate([R[:, 0], -R[:, 1]])),
                      fovy=repr(fovy))
        visual = root.find("visual")
        if visual is None:
            visual = ET.SubElement(root, "visual")
        ET.SubElement(visual, "global", offwidth=str(camera.width), offheight=str(camera.height))
        self.model = mujoco.MjModel.from_xml_string(ET.tostring(root, encoding="unicode"))
        extent = self.model.stat.extent
        self.model.vis.map.znear = 0.01 / extent           # 1 cm ... 2 * max range
        self.model.vis.map.zfar = 2.0 * noise.max_range / extent
        self.data = mujoco.MjData(self.model)
        self._ctx = _gl_context(camera.width, camera.height)
        self._scene = mujoco.MjvScene(self.model, maxgeom=1000)
        self._context = mujoco.MjrContext(self.model, mujoco.mjtFontScale.mjFONTSCALE_150.value)
        mujoco.mjr_setBuffer(mujoco.mjtFramebuffer.mjFB_OFFSCREEN.value, self._context)
        self._context.readDepthMap = mujoco.mjtDepthMap.mjDEPTH_ZEROFAR
        self._rect = mujoco.MjrRect(0, 0, camera.width, camera.height)
        self._cam = mujoco.MjvCamera()
        self._cam.type = mujoco.mjtCamera.mjCAMERA_FIXED
        self._cam.fixedcamid = self.model.camera("depth").id
        self._option = mujoco.MjvOption()
        self._option.flags[mujoco.mjtVisFlag.mjVIS_TENDON] = False      # cables: 5 mm, unseen at this range
        self._option.sitegroup[:] = 0                                    # end-node markers are not matter

    def move(self, camera) -> None:
        """Put the camera at another pose (same intrinsics): a tripod carried along."""
        R = np.asarray(camera.rotation, dtype=np.float64)
        mj = np.stack([R[:, 0], -R[:, 1], -R[:, 2]], -1)          # MuJoCo's camera: x, y up, looking along -z
        cid = self.model.camera("depth").id
        self.model.cam_pos[cid] = np.asarray(camera.position, dtype=np.float64)
        quat = np.empty(4)
        mujoco.mju_mat2Quat(quat, mj.ravel())
        self.model.cam_quat[cid] = quat
        self.camera = camera

    def exact(self, rod_state: np.ndarray) -> np.ndarray:
        """Noise-free depth [H, W] (float64, metres; NaN beyond range) of rod states [R, 13]."""
        mujoco.mj_setState(self.model, self.data, self.twin.mj_state_from(rod_state, np.zeros(self.twin.num_actuated))[0],
                           FULLPHYSICS)
        mujoco.mj_forward(self.model, self.data)
        self._ctx.make_current()
        mujoco.mjv_updateScene(self.model, self.data, self._option, None, self._cam,
                               mujoco.mjtCatBit.mjCAT_ALL.value, self._scene)
        self._scene.flags[mujoco.mjtRndFlag.mjRND_SEGMENT] = True     # depth only: no lights, no shadows
        mujoco.mjr_render(self._rect, self._scene, self._context)
        raw = np.empty((self.camera.height, self.camera.width), dtype=np.float32)
        mujoco.mjr_readPixels(None, raw, self._rect, self._context)
        extent = self.model.stat.extent
        near = np.float32(self.model.vis.map.znear * extent)
        far = np.float32(self.model.vis.map.zfar * extent)
        # Invert MuJoCo's reversed-z perspective depth buffer (window z 1 at near, 0 at far).
        c = np.float32(0.5) * (far + near) / (far - near) - np.float32(0.5)
        d = np.float32(far * near / (far - near))
        z = d / (raw.astype(np.float64) + c)
        z = np.flipud(z)                                   # OpenGL rows run bottom-up
        z[z > self.noise.max_range] = np.nan
        return np.ascontiguousarray(z)

    def render(self, rod_state: np.ndarray) -> np.ndarray:
        """A sensor's depth image: float32 [H, W], noisy, with dropped pixels as NaN."""
        z = self.exact(rod_state)
        n = self.noise
        if n.noise_at_1m > 0:
            z = z + self.rng.normal(0.0, 1.0, z.shape) * n.noise_at_1m * z * z
        if n.dropout > 0:
            z[self.rng.random(z.shape) < n.dropout] = np.nan
        return z.astype(np.float32)

    def close(self) -> None:
        if getattr(self, "_context", None) is not None:
            self._ctx.make_current()
            self._context.free()
            self._context = None
            self._ctx.free()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
