"""An identification report a roboticist can share: one Markdown page and its PNG figures.

`write_report(out_dir, ...)` writes ``report.md`` with

* the data: trajectories, duration, rate, what was measured (velocities, known pushes), and
  per cable how much of its command range the data visited and how often it was taut (a
  cable that never went taut, or never moved, cannot reveal its values);
* identified vs nominal (vs true when the caller knows the truth) with 1-sigma, and the
  correlation of the estimates (``report_correlation.png``, the strongly coupled pairs named);
* held-out prediction for the nominal and the identified model side by side: CoM error
  0.1 / 0.5 / 1 s ahead, restarted from the measured state (data with velocities), and open
  loop over each held-out trajectory (``report_heldout.png``: every trajectory's CoM error
  over time, the per-trajectory residuals);
* what the data could not determine: undetermined parameters, those not learnt (kept at
  the nominal values), and what the exported MJCF cannot represent.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from tensegrity_engine.identification.dataset import Trajectory
from tensegrity_engine.identification.evaluation import evaluate, horizon_errors
from tensegrity_engine.identification.identifiability import excitation_advice
from tensegrity_engine.physics.config import RobotConfig
from tensegrity_engine.physics.params import SPEC_BY_NAME, PhysicalParameters, nominal_values
from tensegrity_engine.physics.state import end_nodes

__all__ = ["write_report", "cable_coverage", "STRONG_CORRELATION"]

HORIZONS = (0.1, 0.5, 1.0)
STRONG_CORRELATION = 0.9


def cable_coverage(params: PhysicalParameters, trajs: Sequence[Trajectory]) -> dict:
    """Per cable: ``span`` (share of its command range between the 5th and 95th percentile
    of the commands sent; NaN for a passive cable) and ``taut`` (share of the samples in
    which the measured cable was longer than the rest length the model gives it)."""
    robot = params.to_robot_config()
    C = robot.num_cables
    act_of = np.full(C, -1)
    act_of[robot.actuated_indices] = np.arange(robot.num_actuated)
    commands = np.concatenate([t.command for t in trajs], 0)
    lo, hi = robot.command_low, robot.command_high
    span = np.full(C, math.nan)
    q5, q95 = np.percentile(commands, [5, 95], axis=0)
    span[robot.actuated_indices] = np.clip((q95 - q5) / np.maximum(hi - lo, 1e-12), 0, 1)
    taut, total = np.zeros(C), 0
    half = 0.5 * robot.rod_length
    for t in trajs:
        nodes = end_nodes(t.states(), half)                       # [K, R, 2, 3]
        a, b = robot.cable_ends[:, 0], robot.cable_ends[:, 1]
        length = np.linalg.norm(nodes[:, a[:, 0], a[:, 1]] - nodes[:, b[:, 0], b[:, 1]], axis=-1)
        held = Trajectory._hold(t.command_time, t.command, t.t)   # [K, A] the command in force
        rest = np.broadcast_to(robot.cable_rest_length, length.shape).copy()
        act = act_of >= 0
        rest[:, act] = robot.actuator.gain * np.clip(held[:, act_of[act]], lo, hi) + robot.actuator.offset
        taut += (length > rest).sum(0)
        total += len(length)
    return {"span": span, "taut": taut / max(total, 1)}


def _fmt(x) -> str:
    x = np.atleast_1d(np.asarray(x, dtype=np.float64))
    one = lambda v: "inf" if v == math.inf else ("—" if not np.isfinite(v) else f"{v:.4g}")
    if x.size == 1 or np.ptp(x) == 0:
        return one(x[0])
    return f"{one(x.mean())} (per element {one(x.min())} … {one(x.max())})"


def _relative(got: np.ndarray, ref: np.ndarray, unit: str) -> str:
    """The largest change over the elements, signed; absolute where the reference is 0."""
    diff = got - ref
    if np.max(np.abs(ref)) < 1e-12:
        i = int(np.argmax(np.abs(diff)))
        return f"{diff[i]:+.4g} {unit}"
    rel = diff / np.maximum(np.abs(ref), 1e-12)
    return f"{100 * rel[int(np.argmax(np.abs(rel)))]:+.1f} %"


def _parameter_rows(params, nominal, learn, uncertainty, truth) -> list[str]:
    got, nom = params.as_dict(), nominal.as_dict()
    true = nominal_values(truth) if truth is not None else None        # the config's own numbers
    shifts = uncertainty.sigma_structure if uncertainty is not None else {}
    head = "| parameter | unit | nominal | identified | 1-sigma |" + (" horizon shift |" if shifts else "")
    head += " change vs nominal |" + (" true | error vs true |" if true else "")
    rows = [head, "|" + "---|" * (6 + bool(shifts) + 2 * bool(true))]
    for name in learn:
        unit = SPEC_BY_NAME[name].unit
        size = max(np.size(got[name]), np.size(nom[name]), np.size(true[name]) if true else 1)
        g, n = (np.broadcast_to(np.asarray(x[name], dtype=np.float64), (size,)) for x in (got, nom))
        sigma = uncertainty.sigma.get(name) if uncertainty is not None else None
        row = f"| {name} | {unit} | {_fmt(n)} | {_fmt(g)} | {_fmt(sigma) if sigma is not None else '—'} |"
        if shifts:
            row += f" {_fmt(shifts[name]) if name in shifts else '—'} |"
        row += f" {_relative(g, n, unit)} |"
        if true:
            t = np.broadcast_to(np.asarray(true[name], dtype=np.float64), (size,))
            row += f" {_fmt(t)} | {_relative(g, t, unit)} |"
        rows.append(row)
    return rows


def _plot_correlation(uncertainty, path: Path) -> Optional[Path]:
    if uncertainty is None or uncertainty.correlation is None or len(uncertainty.labels) < 2:
        return None
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    P = len(uncertainty.labels)
    fig, ax = plt.subplots(figsize=(min(2 + 0.35 * P, 14), min(1.6 + 0.35 * P, 13)))
    cmap = plt.get_cmap("coolwarm").copy()
    cmap.set_bad("0.8")
    im = ax.imshow(np.ma.masked_invalid(uncertainty.correlation), vmin=-1, vmax=1, cmap=cmap)
    if P <= 40:
        ax.set_xticks(range(P), uncertainty.labels, rotation=90, fontsize=7)
        ax.set_yticks(range(P), uncertainty.labels, fontsize=7)
    fig.colorbar(im, ax=ax, label="correlation of the estimates (grey: undetermined)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _strong_pairs(uncertainty) -> list[str]:
    if uncertainty is None or uncertainty.correlation is None:
        return []
    c, labels = uncertainty.correlation, uncertainty.labels
    pairs = [(abs(c[i, j]), i, j) for i in range(len(labels)) for j in range(i + 1, len(labels))
             if np.isfinite(c[i, j]) and abs(c[i, j]) >= STRONG_CORRELATION]
    return [f"{labels[i]} ~ {labels[j]}: {c[i, j]:+.3f}" for _, i, j in sorted(pairs, reverse=True)[:12]]


def _plot_heldout(models: dict, path: Path) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    colours = {"nominal": "tab:grey", "identified": "tab:blue", "true values": "tab:green"}
    for label, r in models.items():
        for i, err in enumerate(r["com_error"]):
            ax.plot(r["times"], 1e3 * err, color=colours.get(label, "tab:orange"), lw=1,
                    ls="--" if label == "nominal" else "-", alpha=0.7, label=label if i == 0 else None)
    ax.set_xlabel("time from the trajectory's start (s)")
    ax.set_ylabel("CoM error (mm)")
    ax.set_title("held-out trajectories, open loop: every trajectory's residual over time")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _prediction_rows(models: dict, heldout: Sequence[Trajectory]) -> list[str]:
    rows = ["| model | " + " | ".join(f"{h:g} s ahead (mm)" for h in HORIZONS)
            + " | open loop at the end (mm) | relative to the path |", "|---" * (len(HORIZONS) + 3) + "|"]
    with_velocity = all(t.has_velocity for t in heldout)
    missing = False
    for label, (params, r) in models.items():
        try:
            ahead = horizon_errors(params, heldout, HORIZONS) if with_velocity else None
        except ValueError:                   # trajectories shorter than the longest horizon
            ahead = None
        missing = missing or ahead is None
        cells = [f"{1e3 * np.mean(ahead[h]):.3g}" if ahead else "—" for h in HORIZONS]
        rows.append(f"| {label} | " + " | ".join(cells)
                    + f" | {1e3 * np.mean(r['final_error']):.3g} | {100 * np.mean(r['relative']):.3g} % |")
    if missing:
        rows += ["", "—: " + ("the held-out data has no velocities to restart from" if not with_velocity
                              else f"the held-out trajectories are shorter than {max(HORIZONS):g} s")]
    return rows


def write_report(out_dir, *, params: PhysicalParameters, nominal: PhysicalParameters, learn: Sequence[str],
                 train: Sequence[Trajectory], heldout: Sequence[Trajectory], heldout_label: str = "held out",
                 uncertainty=None, truth: Optional[RobotConfig] = None, notes: Sequence[str] = (),
                 title: str = "", wall_seconds: float = math.nan) -> Path:
    """Write ``report.md`` and its figures into ``out_dir`` (see the module docstring);
    returns the page's path. ``truth``: the robot's true values, when a simulation knows them."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    robot = params.robot
    lines = [f"# Identification report: {title or robot.name}", ""]
    duration = sum(float(t.t[-1] - t.t[0]) for t in train)
    period = float(np.median(np.concatenate([np.diff(t.t) for t in train])))
    first = train[0]
    lines += ["## Data", "",
              f"- {len(train)} training trajectories ({duration:.1f} s, poses every {1e3 * period:.0f} ms), "
              f"{len(heldout)} {heldout_label} trajectories for the figures below (not trained on)",
              f"- measured: poses{', velocities' if first.has_velocity else ' only (no velocities)'}"
              f"{', known external pushes' if first.wrench is not None else ''}; "
              f"{'floor' if first.floor else 'no floor'}, rods welded to the world: {list(first.fixed_rods) or 'none'}",
              f"- identification wall time {wall_seconds:.1f} s" if math.isfinite(wall_seconds) else "", ""]
    cover = cable_coverage(params, train)
    lines += ["Excitation per cable: the share of its command range the commands visited (5th–95th "
              "percentile) and the share of samples in which it was taut. A cable that never moved or "
              "never went taut cannot reveal its values.", "",
              "| cable | command range visited | taut |", "|---|---|---|"]
    for c, name in enumerate(robot.cable_names):
        span = "passive" if math.isnan(cover["span"][c]) else f"{100 * cover['span'][c]:.0f} %"
        lines.append(f"| {name} | {span} | {100 * cover['taut'][c]:.0f} % |")
    lines += ["", "## Parameters", ""] + _parameter_rows(params, nominal, learn, uncertainty, truth)
    lines += ["", "1-sigma: Gauss-Newton at the identified values (residual scale standing in for the noise); "
              "model mismatch is not noise, so treat it as a lower bound. inf: the data cannot determine it."
              + (" Horizon shift: how far the value moves when the same data is fitted over windows twice as "
                 "long; a model whose structure is the robot's has the same values at any horizon, so a shift "
                 "beyond the 1-sigma is mismatch the sigma cannot see (the identifier node publishes the groups' "
                 "spread and the shift in quadrature)." if uncertainty is not None
                 and uncertainty.sigma_structure else ""), ""]
    corr = _plot_correlation(uncertainty, out / "report_correlation.png")
    if corr is not None:
        strong = _strong_pairs(uncertainty)
        lines += [f"![correlation]({corr.name})", "",
                  f"Strongly coupled estimates (|correlation| ≥ {STRONG_CORRELATION}): "
                  + ("; ".join(strong) if strong else "none"), ""]
    models = {"nominal": nominal, "identified": params}
    if truth is not None:
        try:
            models["true values"] = PhysicalParameters.keeping_elements(truth)
        except ValueError as err:             # a truth outside the engine's parameter bounds
            notes = [*notes, f"no 'true values' model: {err}"]
    runs = {label: (p, evaluate(p, heldout)) for label, p in models.items()}
    lines += [f"## Prediction on {heldout_label} data", "",
              "CoM error k seconds ahead, restarted from the measured state every 0.5 s (needs "
              "velocities), and open loop over each whole trajectory:", ""]
    lines += _prediction_rows(runs, heldout)
    lines += ["", f"![held-out residuals]({_plot_heldout({k: r for k, (_, r) in runs.items()}, out / 'report_heldout.png').name})", ""]
    lines += ["## What the data could not determine", ""]
    undetermined = tuple(uncertainty.undetermined) if uncertainty is not None else ()
    lines.append("- undetermined by these data: " + (", ".join(undetermined) or "none" if uncertainty is not None
                                                     else "unknown (no uncertainty estimate was made)"))
    if undetermined:
        lines += [f"  - {a.text}" for a in excitation_advice(uncertainty)]
    if uncertainty is not None and uncertainty.unreached:
        lines.append(f"- limits these data never reach (any value above predicts them alike): "
                     f"{', '.join(uncertainty.unreached)}")
    fixed = [n for n in SPEC_BY_NAME if n not in learn]
    lines.append(f"- not identified (kept at the values it started from): {', '.join(fixed)}")
    idle = [robot.cable_names[c] for c in range(robot.num_cables)
            if cover["taut"][c] < 0.05 or (not math.isnan(cover["span"][c]) and cover["span"][c] < 0.05)]
    if idle:
        lines.append(f"- cables the data barely excited (taut < 5 % or < 5 % of the range visited): {', '.join(idle)}")
    lines += [f"- {n}" for n in notes]
    path = out / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path
