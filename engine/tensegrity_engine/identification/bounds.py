"""Bounds a run narrows before it learns: where its fine-stage integrator stays stable."""
from __future__ import annotations

from tensegrity_engine.physics.config import MODEL_INTEGRATORS
from tensegrity_engine.physics.stability import contact_upper_bounds
from tensegrity_engine.physics.topology import Topology


def bound_for_stability(run, ts) -> None:
    """Contact stiffness and damping that ``run`` (a `ProgressiveTrainer`) learns for the
    semi-implicit fine stage stay where that integrator is stable at the engine step, given
    the cables and masses the run starts from (`stability.contact_upper_bounds`). Without the bound the implicit
    coarse phase settles on plastic contacts (damping ~5e4 N s/m) that fit 100 ms
    tuples and diverge within a second of semi-implicit rollout."""
    learnt = [n for n in ("contact_stiffness", "contact_damping") if n in run.learn]
    if not (ts.floor and learnt and run.config.fine_integrator in MODEL_INTEGRATORS):
        return
    limits = contact_upper_bounds(Topology(run.robot, ts.fixed_rods), run.params.values(), run.robot.dt,
                                  integrator=run.config.fine_integrator)
    for name in learnt:
        lower = run.params.bounds_of(name)[0]
        if limits.get(name, 0.0) <= lower * 1.01:
            run.log(f"{name}: the cables and masses leave no stable range above {lower:g}; "
                    "not bounded for stability")
            continue
        moved = run.params.narrow_upper_bound(name, limits[name])
        run.log(f"{name} bounded to <= {run.params.bounds_of(name)[1]:.4g} (semi-implicit "
                f"stability at dt={run.robot.dt * 1e3:g} ms)" + ("; start value moved inside" if moved else ""))
