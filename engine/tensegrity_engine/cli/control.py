"""``tensegrity-control``: run the rolling task (paper Figs 6-8) closed-loop on MuJoCo.

Plans with RS / CEM / MPPI on a model (MuJoCo itself, or the engine with nominal,
identified-from-file or random parameters), replans every ``control_dt`` from MuJoCo's
state, prints the task metrics and writes under ``--out``: ``<label>.npz`` (trajectory),
``velocity.png``, ``path.png``, ``summary.json`` and, where offscreen rendering works
(MuJoCo with EGL or OSMesa), ``<label>.gif`` (and ``.mp4`` if ffmpeg is on PATH).

Examples::

    tensegrity-control --model mujoco --planner mppi                 # ground-truth policy
    tensegrity-control --model engine --params runs/identify/identified.yaml
    tensegrity-control --model engine --random-params 3 --steps 20
    tensegrity-control --robot three_bar --model engine --steps 10 --samples 16
    tensegrity-control --model engine --backend torch                # torch engine (no C compiler)
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Optional

import numpy as np

_RENDER_WARNED = False


def _choose_gl_backend() -> None:
    """MuJoCo reads MUJOCO_GL when it is first imported: pick EGL or OSMesa (Debian's
    libegl1 / libosmesa6) if their libraries exist, before anything imports mujoco."""
    if "MUJOCO_GL" in os.environ or "mujoco" in sys.modules:
        return
    import ctypes.util
    for backend, lib in (("egl", "EGL"), ("osmesa", "OSMesa")):
        if ctypes.util.find_library(lib):
            os.environ["MUJOCO_GL"] = backend
            return


_choose_gl_backend()


# ----------------------------------------------------------------------------- plotting
def plot_runs(runs: dict, out_dir, *, target_speed: float = 1.0, goal=(5.0, 0.0),
              title: str = "", prefix: str = "") -> list[Path]:
    """Fig 7/8 style plots of several summarised runs {label: summary}: CoM x velocity
    over time (per control step) and the XY path. Returns the written PNG paths."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    fig, ax = plt.subplots(figsize=(7, 3.6))
    for label, m in runs.items():
        ax.plot(m["knot_t"], m["knot_velocity"][:, 0], label=f"{label} (mean {m['mean_vx']:.2f} m/s)")
    ax.axhline(target_speed, color="k", ls="--", lw=1, label="target")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("CoM x velocity (m/s)")
    ax.set_title(title or "CoM velocity")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    paths.append(out_dir / f"{prefix}velocity.png")
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 3.6))
    for label, m in runs.items():
        ax.plot(m["com"][:, 0], m["com"][:, 1], label=f"{label} (d={m['distance']:.2f} m)")
    ax.plot([0], [0], "ko")
    ax.plot([goal[0]], [goal[1]], "r*", ms=12, label="target")
    ax.set_xlabel("x (m)")
    ax.set_ylabel("y (m)")
    ax.set_aspect("equal", adjustable="datalim")
    ax.set_title(title or "CoM path")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    paths.append(out_dir / f"{prefix}path.png")
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)
    return paths


# ----------------------------------------------------------------------------- video
def render_video(robot, traj: dict, path, *, fps: int = 25, width: int = 480, height: int = 320) -> list[Path]:
    """Render a closed-loop trajectory with MuJoCo's offscreen renderer to ``path``.gif
    (Pillow) and .mp4 (if ffmpeg exists). Returns the files written; if offscreen
    rendering is unavailable, says so once (per process) and returns []."""
    global _RENDER_WARNED
    try:
        import mujoco

        from tensegrity_engine.groundtruth.mujoco_twin import MujocoTwin
        twin = MujocoTwin(robot, nthread=1)
        renderer = mujoco.Renderer(twin.model, height, width)
    except Exception as err:  # no EGL/OSMesa, no display, ...
        if not _RENDER_WARNED:
            print(f"[tensegrity-control] offscreen rendering unavailable ({type(err).__name__}: "
                  f"{str(err).splitlines()[0] if str(err) else ''}); skipping videos", flush=True)
            _RENDER_WARNED = True
        return []
    from tensegrity_engine.physics.state import center_of_mass

    m = twin.model
    m.vis.headlight.ambient[:] = 0.45
    m.vis.headlight.diffuse[:] = 0.6
    palette = np.array([[0.85, 0.33, 0.1], [0.0, 0.45, 0.74], [0.47, 0.67, 0.19],
                        [0.93, 0.69, 0.13], [0.49, 0.18, 0.56], [0.3, 0.75, 0.93]])
    for g in range(m.ngeom):
        if m.geom_type[g] == mujoco.mjtGeom.mjGEOM_PLANE:
            m.geom_rgba[g] = [0.82, 0.84, 0.86, 1.0]
        else:
            m.geom_rgba[g, :3] = palette[m.geom_bodyid[g] % len(palette)]
            m.geom_rgba[g, 3] = 1.0
    m.tendon_rgba[:] = [0.1, 0.1, 0.1, 1.0]
    t, states = traj["t"], traj["states"]
    stride = max(1, int(round(1.0 / (fps * (t[1] - t[0])))))
    cam = mujoco.MjvCamera()
    cam.type = mujoco.mjtCamera.mjCAMERA_FREE
    cam.distance, cam.elevation, cam.azimuth = 5.0, -20.0, 90.0
    frames = []
    act = np.asarray(traj["commands"][0])
    for i in range(0, len(states), stride):
        twin.reset(states[i], act)
        com = center_of_mass(states[i], robot.rod_mass)
        cam.lookat[:] = [com[0], com[1], 0.5]
        renderer.update_scene(twin.data, camera=cam)
        frames.append(renderer.render().copy())
    renderer.close()
    twin.close()
    written = []
    path = Path(path)
    from PIL import Image
    imgs = [Image.fromarray(f) for f in frames]
    gif = path.with_suffix(".gif")
    imgs[0].save(gif, save_all=True, append_images=imgs[1:], duration=int(1000 / fps), loop=0)
    written.append(gif)
    if shutil.which("ffmpeg"):
        import subprocess
        mp4 = path.with_suffix(".mp4")
        proc = subprocess.run(
            ["ffmpeg", "-y", "-loglevel", "error", "-f", "rawvideo", "-pix_fmt", "rgb24",
             "-s", f"{width}x{height}", "-r", str(fps), "-i", "-", "-pix_fmt", "yuv420p", str(mp4)],
            input=np.stack(frames).tobytes(), check=False)
        if proc.returncode == 0:
            written.append(mp4)
    return written


# ----------------------------------------------------------------------------- runner
def build_policy(robot, args, *, params=None, label: str = ""):
    """Controller for ``args.model`` ('mujoco' or 'engine')."""
    from tensegrity_engine import control as mpc
    from tensegrity_engine.groundtruth.environments import contact_twin

    cfg = mpc.PlannerConfig(horizon=args.horizon, control_dt=args.control_dt, num_samples=args.samples,
                            iterations=args.iterations, noise_scale=args.noise, temperature=args.temperature,
                            target_ess=args.target_ess, seed=args.seed)
    cost = mpc.LocomotionCost(robot, target_velocity=(args.speed, 0.0), goal=args.goal,
                              speed=args.speed, control_dt=args.control_dt)
    if args.model == "mujoco":
        dyn = mpc.MujocoDynamics(contact_twin(robot, nthread=args.mj_threads), control_dt=args.control_dt)
        return mpc.MPPIController(robot, dynamics=dyn, cost=cost, planner=args.planner, config=cfg)
    backend = getattr(args, "backend", None)
    # --eager: the torch engine without torch.compile; otherwise the backend's default
    compile = False if getattr(args, "eager", False) else None
    return mpc.MPPIController(robot, params=params, cost=cost, planner=args.planner, config=cfg,
                              engine_dt=args.engine_dt, integrator=args.integrator, device=args.device,
                              compile=compile, backend=backend, threads=getattr(args, "threads", 1) or 1)


def run_task(robot, policy, *, steps: int, control_dt: float, label: str = "", verbose: bool = True,
             goal=(5.0, 0.0)) -> tuple[dict, dict]:
    """Closed-loop run on a fresh MuJoCo twin from the task start; (trajectory, summary)."""
    from tensegrity_engine import control as mpc
    from tensegrity_engine.groundtruth.environments import contact_twin

    s0, a0 = mpc.task_start(robot)
    twin = contact_twin(robot, nthread=1)

    def progress(k, info):
        if verbose and ((k + 1) % 10 == 0 or k + 1 == steps):
            com = info["state"][:, 0:3].T @ (robot.rod_mass / robot.rod_mass.sum())
            print(f"  [{label}] step {k + 1:3d}/{steps}  CoM ({com[0]:+.2f}, {com[1]:+.2f})  "
                  f"plan {info['plan_time']:.2f} s", flush=True)

    traj = mpc.run_closed_loop(policy, twin, s0, a0, num_steps=steps, control_dt=control_dt,
                               progress=progress)
    twin.close()
    return traj, mpc.summarize(robot, traj, goal=goal)


def add_planner_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--robot", default="superball", help="robot config name or YAML path")
    p.add_argument("--planner", default="mppi", choices=("mppi", "cem", "rs"))
    p.add_argument("--steps", type=int, default=50, help="control steps (default 50 = 5 s)")
    p.add_argument("--control-dt", type=float, default=0.1, help="s per control step")
    p.add_argument("--horizon", type=int, default=10, help="knots in the plan (10 x 0.1 s = 1 s)")
    p.add_argument("--samples", type=int, default=40)
    p.add_argument("--iterations", type=int, default=5)
    p.add_argument("--noise", type=float, default=0.25, help="sampling std / command range")
    p.add_argument("--temperature", type=float, default=0.05, help="MPPI lambda, when --target-ess is 0")
    p.add_argument("--target-ess", type=float, default=0.2,
                   help="MPPI: each iteration's lambda for this effective sample size / samples (0: fixed)")
    p.add_argument("--speed", type=float, default=1.0, help="target CoM speed (m/s)")
    p.add_argument("--goal", type=float, nargs=2, default=(5.0, 0.0), help="target CoM xy (m)")
    p.add_argument("--engine-dt", type=float, default=None,
                   help="engine planning step (s; default the robot's step, 1 ms)")
    p.add_argument("--integrator", default=None, choices=("semi_implicit", "implicitfast", "rk4", "implicit", "ani"),
                   help="default: the robot config's engine.integrator")
    p.add_argument("--device", default="cpu")
    p.add_argument("--backend", choices=("native", "torch"), default=None,
                   help="engine rollouts in the fused C kernel (native: the model integrators on CPU, needs a C "
                        "compiler, the default there) or in torch (any integrator or device; "
                        "torch.compile'd unless --eager)")
    p.add_argument("--eager", action="store_true",
                   help="torch backend without torch.compile (default: compiled; the first "
                        "planning call of a process then takes ~15-25 s to compile)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads, and the native kernel's threads (default 1)")
    p.add_argument("--mj-threads", type=int, default=2, help="mujoco.rollout threads")
    p.add_argument("--seed", type=int, default=0)


def main(argv: Optional[list] = None) -> int:
    p = argparse.ArgumentParser(prog="tensegrity-control", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    add_planner_args(p)
    p.add_argument("--model", default="engine", choices=("engine", "mujoco"),
                   help="what the planner rolls out (the robot is always MuJoCo)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--params", help="engine parameters: identified robot YAML or parameter mapping")
    g.add_argument("--random-params", type=int, metavar="SEED",
                   help="engine with random parameters (PhysicalParameters.randomize)")
    p.add_argument("--label", default=None)
    p.add_argument("--out", default="runs/control", help="output directory")
    p.add_argument("--no-video", action="store_true")
    args = p.parse_args(argv)

    import torch

    from tensegrity_engine.physics.config import ConfigError
    from tensegrity_engine.physics.native import NativeBuildError
    from tensegrity_engine.physics.params import ParameterError, PhysicalParameters, load_representable
    from tensegrity_engine.physics.parameter_files import params_from_file

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    try:                 # a robot or a parameter file it cannot use: one line, exit 2
        robot = load_representable(args.robot)
        params, what = None, "nominal-parameter engine"
        if args.model == "engine" and args.params:
            params, what = params_from_file(robot, args.params), f"engine, parameters from {args.params}"
    except (ConfigError, ParameterError, ValueError, OSError) as exc:
        print(f"tensegrity-control: {exc}", file=sys.stderr)
        return 2
    if args.model == "engine" and not args.params and args.random_params is not None:
        params = PhysicalParameters(robot)
        params.randomize(np.random.default_rng(args.random_params))
        what = f"engine, random parameters (seed {args.random_params})"
    elif args.model != "engine":
        what = "MuJoCo (ground truth)"
    label = args.label or f"{args.planner}-{args.model}"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(f"{label}: {args.planner.upper()} planning on {what}; {args.iterations} it x {args.samples} "
          f"samples, horizon {args.horizon} x {args.control_dt} s"
          + ("" if args.model == "mujoco" else
             f", engine {args.integrator or robot.integrator} dt {args.engine_dt or robot.dt} s"), flush=True)
    try:
        policy = build_policy(robot, args, params=params, label=label)
    except NativeBuildError as err:
        print(err, file=sys.stderr)
        return 2
    t0 = time.time()
    traj, m = run_task(robot, policy, steps=args.steps, control_dt=args.control_dt, label=label,
                       goal=args.goal)
    print(f"{label}: mean x velocity {m['mean_vx']:.3f} m/s, final CoM ({m['final_xy'][0]:.2f}, "
          f"{m['final_xy'][1]:.2f}), distance to ({args.goal[0]:g}, {args.goal[1]:g}) "
          f"{m['distance']:.2f} m, planning {m['plan_time_mean']:.3f} s/step "
          f"(wall {time.time() - t0:.0f} s)")
    np.savez_compressed(out / f"{label}.npz", **{k: v for k, v in traj.items()})
    written = plot_runs({label: m}, out, target_speed=args.speed, goal=args.goal, prefix=f"{label}_")
    if params is not None:
        (out / f"{label}_params.json").write_text(json.dumps(params.as_dict(), indent=1))
    summary = {"label": label, "model": what, "planner": args.planner, "mean_vx": m["mean_vx"],
               "final_xy": m["final_xy"].tolist(), "distance": m["distance"],
               "plan_time_mean_s": m["plan_time_mean"], "args": vars(args)}
    (out / f"{label}_summary.json").write_text(json.dumps(summary, indent=1, default=str))
    if not args.no_video:
        written += render_video(robot, traj, out / label)
    print("wrote " + ", ".join(str(w) for w in written))
    return 0


if __name__ == "__main__":
    sys.exit(main())
