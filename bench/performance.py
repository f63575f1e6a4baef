"""Performance (issue 13): every speed figure side by side in one run, with the machine.

    python bench/performance.py [--robot superball] [--out runs/bench_performance]
                                [--sections epoch,jacobian,identify,planning,rollout]
                                [--seed 0] [--planning-steps 20] [--truth twin,zoo/end_heavy]

Sections (each prints its figures next to the issue's targets; nothing is asserted):
  epoch     one training epoch of 128 tuples x 100 steps (T = 0.1 s at 1 ms), forward +
            backward in float64, with the semi-implicit and the implicit step: on the CPU
            with 1 and 2 torch threads, eager and through a torch.compile'd step
            (`compile_training`; its compile time printed apart), then with the rollouts in
            float32 (`gradient_dtype`: the loss and the parameters float64, as the Adam
            stages run with it), eager on 1 thread and compiled on 2, and, when CUDA is
            present, on the GPU (float64 and float32, eager and compiled) with the GPU / CPU
            ratio. Without CUDA it says the GPU figures are
            unmeasured.
  jacobian  one Levenberg-Marquardt Jacobian (256 tuples, the 9 non-contact parameters):
            central differences in the C kernel (the CPU default), central differences in
            torch, forward-mode AD in torch (the CUDA default), per device.
  identify  `tensegrity-identify` with its defaults, run as a user runs it (a subprocess on
            freshly generated data): non-contact then contact with velocities, and
            non-contact pose-only; wall time of each command, the error of the identified
            values against the true ones with the config's beside it, and the held-out CoM
            error 0.1 / 0.5 / 1 s ahead, hanging and rolling, nominal beside identified.
            ``--truth twin`` (the default: the engine's MuJoCo twin, config = truth) checks
            that the fast schedule still reaches the exact answer; ``--truth zoo/<name>``
            runs it on a robot that is not the engine, with values far from the config's.
  planning  one MPPI control step at the paper's sizes (5 it x 40 samples x 1 s at 1 ms) in
            the C kernel built for this CPU and for x86-64-v3 (AVX2 + FMA, what an AVX2-only
            CPU runs), 1 and 2 threads; on CUDA, 1 000 samples through the torch engine.
  rollout   rollout throughput at batch 40 and 1 000, 1 000 steps of SUPERball rolling:
            mujoco.rollout on all cores beside the C kernel (CPU) and the compiled torch
            engine on CUDA.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from engine_throughput import scenario, time_call  # noqa: E402
from planning import TARGET as PLAN_TARGET, plan_seconds, states as rolling_states  # noqa: E402
from zoo import machine  # noqa: E402

from tensegrity_engine import identification as idf  # noqa: E402
from tensegrity_engine.control.controller import MPPIController  # noqa: E402
from tensegrity_engine.control.planners import PlannerConfig  # noqa: E402
from tensegrity_engine.groundtruth import environments  # noqa: E402
from tensegrity_engine.identification import dataset as ds  # noqa: E402
from tensegrity_engine.identification.evaluation import horizon_errors  # noqa: E402
from tensegrity_engine.identification.solvers.levenberg_marquardt import parameter_jacobian, raw_vector  # noqa: E402
from tensegrity_engine.physics import native  # noqa: E402
from tensegrity_engine.physics.config import load_robot  # noqa: E402
from tensegrity_engine.physics.engine import TensegrityEngine  # noqa: E402
from tensegrity_engine.physics.params import PhysicalParameters  # noqa: E402

SECTIONS = ("epoch", "jacobian", "identify", "planning", "rollout")
CUDA = torch.cuda.is_available()
UNMEASURED = "UNMEASURED (no CUDA device here)"


def _line(*a):
    print(*a, flush=True)


def verdict(ok: bool) -> str:
    return "MET" if ok else "NOT MET"


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def trainer_on(robot, data, device: str, dtype, **cfg):
    tr = idf.ProgressiveTrainer(robot, idf.IdentificationConfig(init="given", schedule="fine_only", **cfg),
                                device=device, dtype=dtype, log=lambda m: None)
    tr.set_data(data["train"], data["val"])
    return tr


# ----------------------------------------------------------------------------- epoch
def epoch_seconds(tr, integrator: str, tuples: int = 128, batch: int = 16, repeats: int = 2) -> float:
    """Forward + backward over ``tuples`` tuples in minibatches (an Adam epoch without the
    optimiser's few vector ops), best of ``repeats`` after a warm-up minibatch."""
    idx_all = torch.arange(tuples, device=tr.device) % len(tr.train)
    steps = tr.full_steps

    def one(idx):
        p = tr.engine.param_values(tr.dtype, tr.device)
        loss = tr.objective.batch_loss(tr.train, idx, p, steps, integrator, use_latent=False)
        loss.backward()

    one(idx_all[:batch])
    best = float("inf")
    for _ in range(repeats):
        _sync(tr.device)
        start = time.perf_counter()
        for b in range(0, tuples, batch):
            one(idx_all[b:b + batch])
        _sync(tr.device)
        best = min(best, time.perf_counter() - start)
    tr.params.zero_grad(set_to_none=True)
    return best


def first_minibatch_seconds(tr, integrator: str, batch: int) -> float:
    """Wall time of one minibatch's forward + backward: with ``compile_training``, the first
    of a batch shape is mostly the step's compilation."""
    start = time.perf_counter()
    p = tr.engine.param_values(tr.dtype, tr.device)
    tr.objective.batch_loss(tr.train, torch.arange(batch, device=tr.device) % len(tr.train), p, tr.full_steps,
                            integrator, use_latent=False).backward()
    _sync(tr.device)
    tr.params.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def section_epoch(robot, data) -> None:
    _line("\n== epoch: 128 tuples x 100 steps (T = 0.1 s at 1 ms), forward + backward, in minibatches of 16 "
          "(the default: 8 optimiser steps) and of 128 (one)")
    rows, cpu_best, compile_s, low_best = [], {}, [], {}
    # float32 rows: the backpropagated rollouts in float32 (`gradient_dtype`), the loss and the
    # parameters float64, as the trainer runs its Adam stages with it
    for threads, compiled, low in ((1, False, False), (2, False, False), (1, True, False), (2, True, False),
                                   (1, False, True), (2, True, True)):
        torch.set_num_threads(threads)
        tr = trainer_on(robot, data, "cpu", torch.float64, compile_training=compiled,
                        gradient_dtype="float32" if low else None)
        for integrator in ("semi_implicit", "implicit"):
            for batch in (16, 128):
                if compiled:         # the first minibatch of a shape compiles the step (timed apart)
                    compile_s.append(first_minibatch_seconds(tr, integrator, batch))
                s = epoch_seconds(tr, integrator, batch=batch)
                key = (integrator, batch)
                best = low_best if low else cpu_best
                best[key] = min(best.get(key, np.inf), s)
                rows.append((f"CPU {'float32' if low else 'float64'}, {threads} thread{'s' if threads > 1 else ''}"
                             + (", compiled step" if compiled else ""), integrator, batch, s))
    if CUDA:
        for dtype in (torch.float64, torch.float32):
            for compiled in (False, True):
                tr = trainer_on(robot, data, "cuda", dtype, compile_training=compiled)
                for integrator in ("semi_implicit", "implicit"):
                    for batch in (16, 128):
                        rows.append((f"CUDA {str(dtype)[6:]}" + (", compiled step" if compiled else ""), integrator,
                                     batch, epoch_seconds(tr, integrator, batch=batch)))
    _line(f"{'device':>36s} {'step':>14s} {'batch':>6s} {'s / epoch':>10s} {'CPU float64 best / this':>24s}")
    for device, integrator, batch, s in rows:
        _line(f"{device:>36s} {integrator:>14s} {batch:6d} {s:10.3f} {cpu_best[(integrator, batch)] / s:24.2f}")
    for batch in (16, 128):
        for label, best in (("float64", cpu_best), ("float32 rollouts", low_best)):
            times = {i: v for (i, b), v in best.items() if b == batch}
            _line(f"TARGET CPU <= 1 s per epoch of 128 tuples, minibatches of {batch}, {label}: "
                  f"{verdict(max(times.values()) <= 1.0)} (" + ", ".join(f"{k} {v:.3f} s" for k, v in times.items())
                  + ")")
    _line(f"(compiling the step, once per integrator and batch shape, first minibatch included: "
          f"{min(compile_s):.0f}-{max(compile_s):.0f} s; inductor's disk cache shortens it in later processes)")
    if CUDA:
        gpu = {k: min(s for d, j, b, s in rows if d.startswith("CUDA") and (j, b) == k) for k in cpu_best}
        ratio = min(cpu_best[k] / gpu[k] for k in gpu)
        _line(f"TARGET GPU >= 10x the CPU: {verdict(ratio >= 10)} ({ratio:.1f}x at worst)")
    else:
        _line(f"TARGET GPU >= 10x the CPU: {UNMEASURED}")
    torch.set_num_threads(1)


# ----------------------------------------------------------------------------- jacobian
def section_jacobian(robot, data) -> None:
    _line("\n== jacobian: one Levenberg-Marquardt Jacobian, 256 tuples x 100 steps, 9 parameters (float64)")
    configs = [("cpu", "central, C kernel (CPU default under the penalty law's floor)", dict(jacobian="central")),
               ("cpu", "forward differences, C kernel (CPU default without a floor)", dict(jacobian="forward_difference")),
               ("cpu", "central, torch", dict(jacobian="central", forward_backend="torch")),
               ("cpu", "forward-mode AD, torch", dict(jacobian="forward"))]
    if CUDA:
        configs += [("cuda", "central, torch", dict(jacobian="central")),
                    ("cuda", "forward-mode AD, torch (CUDA default)", dict(jacobian="forward"))]
    _line(f"{'device':>8s} {'Jacobian':>38s} {'threads':>7s} {'seconds':>8s}")
    reference = None
    for device, label, cfg in configs:
        for threads in ((1, 2) if device == "cpu" else (1,)):
            torch.set_num_threads(threads)
            tr = trainer_on(robot, data, device, torch.float64, **cfg)
            idx = torch.arange(min(256, len(tr.train)), device=tr.device)
            theta0 = raw_vector(tr.params, tr.learn)

            def jac():
                J = parameter_jacobian(
                    tr, theta0, lambda p: tr.objective.residuals(tr.train, idx, p, tr.full_steps, "semi_implicit"))
                _sync(device)
                return J

            J = jac()
            seconds = time_call(jac, 2)
            if reference is None:
                reference = J.cpu()
            # relative to the whole Jacobian: at the truth a non-binding speed limit's column is 0 in
            # forward mode and rounding noise in finite differences
            gap = float((J.cpu() - reference).norm(dim=0).max() / reference.norm())
            _line(f"{device:>8s} {label:>38s} {threads:7d} {seconds:8.3f}   (largest column difference to the "
                  f"first row: {gap:.1e} of its norm)")
    if not CUDA:
        _line(f"GPU Jacobians: {UNMEASURED}")
    torch.set_num_threads(1)


# ----------------------------------------------------------------------------- identify
def _run_cli(args: list[str], log: Path) -> tuple[float, bool]:
    """(wall seconds, whether the fit passed the CLI's hold-out gate: exit 0, identified.yaml;
    exit 1 is a fit refused by it, written as candidate.yaml)."""
    start = time.perf_counter()
    with log.open("w") as f:
        rc = subprocess.call([sys.executable, "-m", "tensegrity_engine.cli.identify", *args], stdout=f,
                             stderr=subprocess.STDOUT)
    if rc not in (0, 1) or (rc == 1 and "NOT written" not in log.read_text()):
        raise SystemExit(f"tensegrity-identify {' '.join(args)} failed (rc {rc}); see {log}")
    return time.perf_counter() - start, rc == 0


def _fit(run: Path) -> Path:
    """The fit a run wrote: identified.yaml, or candidate.yaml when the gate refused it."""
    return run / "identified.yaml" if (run / "identified.yaml").exists() else run / "candidate.yaml"


def _gate(passed: bool) -> str:
    return "passed the hold-out gate" if passed else "REFUSED by the hold-out gate (worse than the start on val)"


def _errors(yaml_path: Path, truth: dict, nominal: dict, names) -> str:
    """Identified (and, in brackets, the config's) relative error against the true values."""
    got = PhysicalParameters(load_robot(yaml_path)).as_dict()
    out = []
    for n in names:
        g, r, c = np.mean(got[n]), np.mean(truth[n]), np.mean(nominal[n])
        out.append(f"{n} {100 * (g - r) / r:+.3f} % ({100 * (c - r) / r:+.0f} %)")
    return ", ".join(out)


def _epoch_summary(history: Path) -> str:
    """Seconds per epoch of each phase a CLI run went through (its history.json)."""
    import json

    epochs = json.loads(history.read_text())["history"]
    parts = []
    for phase, name in (("coarse", "coarse implicit (Adam)"), ("fine", "fine (Levenberg-Marquardt)")):
        sel = [e for e in epochs if e["stage"] == phase]
        if sel:
            parts.append(f"{name} {len(sel)} epochs of {np.mean([e['tuples'] for e in sel]):.0f} tuples, "
                         f"{np.mean([e['seconds'] for e in sel]):.2f} s each (max {max(e['seconds'] for e in sel):.2f})")
    return "; ".join(parts)


def section_identify(robot, out: Path, seed: int, truth: str = "twin") -> None:
    """The CLI's defaults on data from ``truth``: the engine's twin (config = truth: does the
    fast schedule still reach the exact answer?) or a zoo robot, which is not the engine and
    whose values are far from the config's (the nominal model's errors printed beside)."""
    from tensegrity_engine.groundtruth.zoo import ground_truth
    from tensegrity_engine.physics.params import nominal_values

    _line(f"\n== identify ({truth}): `tensegrity-identify` with its defaults (subprocesses, as a user runs "
          f"them; {torch.get_num_threads()} torch thread here, the CLI's default --threads 2 there)")
    played = ground_truth(truth, robot)
    true_values = nominal_values(robot) if truth == "twin" else played.true_values()
    tag = truth.replace("/", "_")
    data = out / f"data_{tag}_seed{seed}"
    if not (data / "contact" / "test").exists():
        for env in ("noncontact", "contact"):
            ds.generate_dataset(robot, env, data, seed=seed, dense=False,
                                truth=None if truth == "twin" else played)
    runs = out / f"runs_{tag}_seed{seed}"
    runs.mkdir(parents=True, exist_ok=True)
    nc, nc_ok = _run_cli(["identify", "--data", str(data / "noncontact"), "--out", str(runs / "nc"), "--quiet"],
                         runs / "nc.log")
    c, c_ok = _run_cli(["identify", "--data", str(data / "contact"), "--initial", str(_fit(runs / "nc")),
                        "--out", str(runs / "c"), "--quiet"], runs / "c.log")
    po, po_ok = _run_cli(["identify", "--data", str(data / "noncontact"), "--out", str(runs / "po"), "--quiet",
                          "--pose-only"], runs / "po.log")
    names = ("cable_stiffness", "cable_damping", "rod_mass", "actuator_time_constant", "actuator_gain")
    nominal = nominal_values(robot)
    _line(f"non-contact, with velocities: {nc:6.1f} s wall, {_gate(nc_ok)}; error vs true (config's): "
          f"{_errors(_fit(runs / 'nc'), true_values, nominal, names)}")
    _line(f"contact (from it):            {c:6.1f} s wall, {_gate(c_ok)}")
    _line(f"non-contact, pose-only:       {po:6.1f} s wall, {_gate(po_ok)}; error vs true (config's): "
          f"{_errors(_fit(runs / 'po'), true_values, nominal, names)}")
    for label, run in (("non-contact", runs / "nc"), ("contact", runs / "c"), ("pose-only", runs / "po")):
        _line(f"  epochs of the default schedule, {label}: " + _epoch_summary(run / "history.json"))
    test = ds.load_split(data / "contact", "test", robot=robot)
    horizons = (0.1, 0.5, 1.0)
    test_nc = ds.load_split(data / "noncontact", "test", robot=robot)
    for label, params in (("nominal (the config)", PhysicalParameters(robot)),
                          ("identified", PhysicalParameters(load_robot(_fit(runs / "c"))))):
        for env, trajs in (("hanging", test_nc), ("rolling", test)):
            e = horizon_errors(params, trajs, horizons)
            _line(f"  held-out CoM error, {env}, {label:>20s}: "
                  + " / ".join(f"{1e3 * np.median(e[h]):.1f}" for h in horizons) + " mm at 0.1 / 0.5 / 1 s (median)")
    _line(f"TARGET non-contact + contact <= 60 s: {verdict(nc + c <= 60)} ({nc + c:.1f} s)")
    _line(f"TARGET pose-only <= 120 s: {verdict(po <= 120)} ({po:.1f} s)")


# ----------------------------------------------------------------------------- planning
def section_planning(robot, steps: int) -> None:
    _line(f"\n== planning: MPPI 5 it x 40 samples x 1 s at {robot.dt * 1e3:g} ms, {steps} control steps each "
          f"(warm-started, from rolling states); target <= {PLAN_TARGET} s per step on 2-core AVX2")
    starts, act = rolling_states(robot, steps + 1)
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    marches = ["native"] + (["x86-64-v3"] if " avx2" in flags else [])
    kept = os.environ.get(native.MARCH_ENV)
    avx2 = None
    _line(f"{'kernel':>24s} {'threads':>7s} {'median s':>9s} {'p90 s':>7s}")
    try:
        for march in marches:
            os.environ[native.MARCH_ENV] = march
            for threads in (1, 2):
                t = plan_seconds(MPPIController(robot, threads=threads), starts, act)
                _line(f"{march + ' (' + native.kernel_isa() + ')':>24s} {threads:7d} {np.median(t):9.4f} "
                      f"{np.percentile(t, 90):7.4f}")
                if march == "x86-64-v3":
                    avx2 = min(avx2 or np.inf, float(np.median(t)))
    finally:
        if kept is None:
            os.environ.pop(native.MARCH_ENV, None)
        else:
            os.environ[native.MARCH_ENV] = kept
    if avx2 is not None:
        _line(f"TARGET AVX2 code <= {PLAN_TARGET} s per control step: {verdict(avx2 <= PLAN_TARGET)} ({avx2:.4f} s)")
    if CUDA:
        gpu = MPPIController(robot, device="cuda", backend="torch", config=PlannerConfig(num_samples=1000))
        t = plan_seconds(gpu, starts, act)
        _line(f"CUDA torch engine, 1 000 samples x 5 it x 1 s: median {np.median(t):.4f} s")
        _line(f"TARGET GPU 1 000 samples <= 0.05 s: {verdict(float(np.median(t)) <= 0.05)}")
    else:
        _line(f"TARGET GPU 1 000 samples <= 0.05 s: {UNMEASURED}")


# ----------------------------------------------------------------------------- rollout
def section_rollout(robot) -> None:
    cores = os.cpu_count() or 1
    _line(f"\n== rollout: SUPERball rolling, held random commands, 1 000 steps of 1 ms; mujoco.rollout on "
          f"{cores} threads")
    twin = environments.contact_twin(robot, nthread=cores)
    steps = 1000
    at40 = {}
    _line(f"{'batch':>6s} {'what':>44s} {'steps/s':>12s} {'x MuJoCo':>9s}")
    for batch in (40, 1000):
        states, acts, commands = scenario(robot, batch, steps)
        total = batch * steps
        mj = total / time_call(lambda: twin.rollout(states, acts, commands, record_every=steps), 2)
        _line(f"{batch:6d} {'mujoco.rollout, float64':>44s} {mj:12,.0f} {1.0:9.2f}")
        engine = TensegrityEngine(robot)
        s, a, c = (torch.tensor(x, dtype=torch.float32) for x in (states, acts, commands))
        fused = native.NativeRollout(engine)
        fused.rollout(s, a, c[:, :2], robot.dt)
        for threads in sorted({1, min(2, cores)}):
            rate = total / time_call(lambda: fused.rollout(s, a, c, robot.dt, record_every=steps, threads=threads), 3)
            _line(f"{batch:6d} {f'C kernel, float32, {threads} thread(s)':>44s} {rate:12,.0f} {rate / mj:9.2f}")
        if CUDA:
            g = TensegrityEngine(robot).to("cuda")
            sg, ag, cg = (x.cuda() for x in (s, a, c))
            p = g.param_values(torch.float32, "cuda")
            with torch.no_grad():
                g.rollout(sg, ag, cg[:, :2], robot.dt, params=p, compile=True)

                def run():
                    g.rollout(sg, ag, cg, robot.dt, params=p, record_every=steps, compile=True)
                    torch.cuda.synchronize()
                rate = total / time_call(run, 2)
            _line(f"{batch:6d} {'CUDA torch.compile, float32':>44s} {rate:12,.0f} {rate / mj:9.2f}")
            if batch == 40:
                at40 = {"gpu": rate, "mujoco": mj}
    if CUDA:
        _line(f"TARGET GPU rollouts at batch 40 >= mujoco.rollout: {verdict(at40['gpu'] >= at40['mujoco'])}")
    else:
        _line(f"TARGET GPU rollouts at batch 40 >= mujoco.rollout: {UNMEASURED}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--robot", default="superball")
    ap.add_argument("--out", default="runs/bench_performance")
    ap.add_argument("--sections", default=",".join(SECTIONS))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--planning-steps", type=int, default=20)
    ap.add_argument("--truth", default="twin",
                    help="identify section: the robot the data come from, twin or zoo/<name> (comma list)")
    args = ap.parse_args(argv)
    sections = [s for s in args.sections.split(",") if s]
    unknown = set(sections) - set(SECTIONS)
    if unknown:
        ap.error(f"unknown sections {sorted(unknown)}; choose from {SECTIONS}")
    torch.set_num_threads(1)
    robot = load_robot(args.robot)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    _line(f"machine: {machine()}; {os.cpu_count()} CPU threads; native kernel for this CPU: "
          f"{native.kernel_isa()}; torch {torch.__version__}")
    if not CUDA:
        _line("no CUDA device: the GPU figures are not measured in this run (the GPU code paths are tested "
              "on the CPU)")
    data = None
    if {"epoch", "jacobian"} & set(sections):
        root = out / "bench_data"
        if not (root / "noncontact" / "val").exists():
            ds.generate_dataset(robot, "noncontact", root, counts={"train": 6, "val": 1, "test": 1}, seed=args.seed,
                                dense=False)
        data = {s: ds.load_split(root / "noncontact", s, robot=robot) for s in ("train", "val")}
    t0 = time.perf_counter()
    for name in sections:
        if name == "epoch":
            section_epoch(robot, data)
        elif name == "jacobian":
            section_jacobian(robot, data)
        elif name == "identify":
            for truth in args.truth.split(","):
                section_identify(robot, out, args.seed, truth)
        elif name == "planning":
            section_planning(robot, args.planning_steps)
        elif name == "rollout":
            section_rollout(robot)
    _line(f"\nbench wall time {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
