"""Real-time closed loop bench (issue 12): the sim2sim with a robot that does not wait.

    python bench/realtime.py [--rolling 10] [--seeds 1] [--cases lockstep,realtime,lat30,lat100,busy]
                             [--truth twin] [--out runs/bench_realtime]

Each case is one `tensegrity-sim2sim` run (nodes as processes, identification running)
with MPPI from the first pose on the config's model (``excite_until: never``), so the
cases differ in timing only:

* ``lockstep``: the bridge pauses MuJoCo until each command arrives (a debugging option,
  the reference: the planner gets all the time it needs);
* ``realtime``: the bridge runs in real time (no lockstep), the controller ticks on its
  clock and plans from the predicted state;
* ``lat30`` / ``lat100``: real time with 30 / 100 ms of pose latency;
* ``busy``: real time with one core kept busy by another process;
* ``nocomp``: real time, planning from the newest measurement (no latency compensation);
* ``air0`` / ``air3`` / ``air30``: real time with the airborne cost's weight at 0 (the
  paper's cost), 3, 30 instead of 10: the speed / airborne trade-off on a robot that does
  not wait.
* ``enc`` / ``noenc``: real time, the winches' encoders published (0.2 mm) and planned from,
  or ignored (``use_encoders: false``): on a robot whose winches the config's model gets
  wrong (``--truth zoo/slow_winch``), what a measured actuator state is worth.

Printed per case: achieved speed along the goal (and its ratio to lockstep), command
period jitter p99, late-command rejections, missed ticks, plans over budget, how early
commands reached the robot, airborne fraction. Speeds vary with the CPU load.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from zoo import machine  # noqa: E402

CASES = {          # config/sim2sim.yaml's bridge runs in real time; lockstep is the reference
    "lockstep": ["mujoco_bridge:lockstep:=true"],
    "realtime": [],
    "nocomp": ["mppi_controller:compensate_latency:=false"],
    "lat30": ["mujoco_bridge:latency:=0.03"],
    "lat100": ["mujoco_bridge:latency:=0.1"],
    "busy": [],
    # the gait in real time: the airborne cost's weight (the nodes' default is 10)
    "air0": ["mppi_controller:airborne_weight:=0.0"],
    "air3": ["mppi_controller:airborne_weight:=3.0"],
    "air30": ["mppi_controller:airborne_weight:=30.0"],
    # the winches' encoders (0.2 mm) planned from, or not: the actuator state a robot with a
    # winch speed limit, a dead band or a time constant the model lacks is really in
    "enc": ["mujoco_bridge:rest_length_noise:=0.0002"],
    "noenc": ["mujoco_bridge:rest_length_noise:=0.0002", "mppi_controller:use_encoders:=false"],
}
# the cases differ in timing only: noise-free poses, as before the sim2sim's default robot had
# its mocap's noise (2026-11-29)
BASE = ["mppi_controller:excite_until:=never", "mujoco_bridge:pose_noise_position:=0.0",
        "mujoco_bridge:pose_noise_rotation:=0.0"]


def run_case(name: str, seed: int, args, out: Path) -> dict:
    params = BASE + CASES[name] + [f"mppi_controller:seed:={seed}", f"mujoco_bridge:seed:={seed}",
                                   f"mujoco_bridge:robot_truth:={args.truth}"]
    cmd = [sys.executable, "-m", "tensegrity_ros.sim2sim", "--rolling-duration", str(args.rolling),
           "--output-dir", str(out)] + [x for p in params for x in ("-p", p)]
    busy = None
    if name == "busy":
        busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()
    path = out / "summary.json"
    if not path.exists():
        return {"error": done.stdout[-500:] + done.stderr[-500:]}
    return json.loads(path.read_text())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rolling", type=float, default=10.0)
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--cases", default="lockstep,realtime,nocomp,lat30,lat100,busy")
    ap.add_argument("--truth", default="twin")
    ap.add_argument("--timeout", type=float, default=900.0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    out = Path(args.out or tempfile.mkdtemp(prefix="bench_realtime_"))
    print(machine(), flush=True)
    print(f"robot truth {args.truth}, MPPI 5 x 40 x 1 s (native kernel), {args.rolling:g} s rolling per run, "
          f"identification running", flush=True)
    cols = ("vx", "x lock", "jit p99", "late rej", "missed", "over", "lead min", "airborne")
    print(f"{'case':9s} {'seed':>4s} " + " ".join(f"{c:>9s}" for c in cols), flush=True)
    lock_vx = {}
    for seed in range(args.seeds):
        for name in args.cases.split(","):
            s = run_case(name, seed, args, out / f"{name}_{seed}")
            if "error" in s or "achieved_vx" not in s:
                print(f"{name:9s} {seed:4d} failed: {s.get('error', 'no MPPI phase')[-300:]}", flush=True)
                continue
            vx = s["achieved_vx"]
            if name == "lockstep":
                lock_vx[seed] = vx
            ratio = vx / lock_vx[seed] if lock_vx.get(seed) else float("nan")
            vals = (vx, ratio, s.get("command_period_jitter_p99_ms", float("nan")),
                    s.get("late_command_rejections", float("nan")), s.get("controller_ticks_missed", float("nan")),
                    s.get("controller_commands_late", float("nan")), s.get("command_lead_ms_min", float("nan")),
                    s.get("airborne_fraction", float("nan")))
            fmt = ("{:9.3f}", "{:9.2f}", "{:9.1f}", "{:9.0f}", "{:9.0f}", "{:9.0f}", "{:9.1f}", "{:9.3f}")
            print(f"{name:9s} {seed:4d} " + " ".join(f.format(v) for f, v in zip(fmt, vals)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
