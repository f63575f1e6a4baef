"""Screening a structure option before a challenger is fitted for it (`online_structure`).

A challenger takes one epoch in two from the solver while it runs, and one that explains
nothing is refused only after `online_structure.FUTILE_LOOKS` looks (15 of its epochs).
Measured (README, "Structure while the robot works"): on the engine's own twin those epochs
cost the solver the fit that brought a seed within 5 %, and on slow_winch the winch speed
waited behind an integrator challenger until the minute was over. So an option that changes
the model's *structure* (its integrator, the soft ground's contact dimensionality) is first
screened on the solver's own windows: the windowed objective (latents eliminated, polished
in each structure) that one bounded Gauss-Newton step from the solver's values predicts, in
the option's structure against the same in the solver's. Only an option predicted to lower
it by `SCREEN_MIN_GAIN` gets a challenger. Value options (inertia, slack damping, winch
speed) are not screened: at a winch limit that does not bind the objective is flat (no
Gauss-Newton step sees it: `scale.speed_limit_search`), so the look-ahead would refuse the
option where it pays most.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Optional

import torch

from tensegrity_engine.identification.solvers.levenberg_marquardt import bounded_step, raw_vector, set_raw_vector
from tensegrity_engine.identification.uncertainty import gauss_newton_step

__all__ = ["SCREEN_MIN_GAIN", "Screen", "look_ahead", "screen_structure"]

# The least predicted gain that earns a challenger: the held-out gain the gate will ask of
# it (`online_structure.STRUCTURE_MIN_GAIN`).
SCREEN_MIN_GAIN = 0.05


@torch.no_grad()
def look_ahead(trainer, lm, theta: torch.Tensor) -> Optional[tuple[float, float]]:
    """(now, one bounded Gauss-Newton step ahead): the windowed objective of ``lm``'s windows
    at the raw values ``theta`` (of ``trainer.learn``) and as that step predicts it, every
    window's latents eliminated (`WindowLevenbergMarquardt.information_at`: "now" after the
    latents' linearised step); None where it is not finite. The trainer's
    values and the solver's state are left as they were."""
    set_at = raw_vector(trainer.params, trainer.learn)
    try:
        set_raw_vector(trainer.params, trainer.learn, theta)
        with trainer.objective.stepped_for(trainer.engine.param_values(trainer.dtype, trainer.device)):
            info = lm.information_at(trainer, theta)
    finally:
        set_raw_vector(trainer.params, trainer.learn, set_at)
    if info is None:
        return None
    H = info["H"].detach().double().cpu()
    g = info["G"].sum(0).detach().double().cpu()
    step = bounded_step(gauss_newton_step(H, g))
    if not bool(torch.isfinite(step).all()):
        return None
    predicted = float(info["rss"]) + float(2.0 * g @ step + step @ H @ step)
    return float(info["rss"]), max(predicted, 0.0)


@dataclasses.dataclass(frozen=True)
class Screen:
    """A screen's objectives on the solver's windows: the solver's now and one bounded
    Gauss-Newton step ahead, and the option's one step ahead from the solver's values (None
    while the solver is still moving: not evaluated)."""
    solver_now: float
    solver_ahead: float
    option_ahead: Optional[float] = None

    @property
    def solver_moving(self) -> bool:
        """The solver's own next step is predicted to gain `SCREEN_MIN_GAIN` or more: from
        values still that far from the solver's optimum, the option's look-ahead tells
        nothing (measured, the three-bar test's Euler robot: implicitfast predicted 45 %
        better at 4 iterations, the solver's own step 67 %; 65 % worse at 16, its own 1 %)."""
        return self.solver_now - self.solver_ahead >= SCREEN_MIN_GAIN * self.solver_now

    @property
    def gain(self) -> float:
        """The option's predicted gain over the solver's look-ahead, relative."""
        if self.option_ahead is None or not self.solver_ahead > 0:
            return 0.0
        return (self.solver_ahead - self.option_ahead) / self.solver_ahead


def screen_structure(solver, make_challenger: Callable[[], object]) -> Optional[Screen]:
    """`Screen` of the option whose trainer ``make_challenger()`` builds (learning the
    solver's values, set to them here and given the solver's training data, windows, latents
    and loss scale), on the solver's windows; the option is not evaluated while the solver
    is still moving. None where the solver has no windows yet (the caller waits for them);
    FloatingPointError where a look-ahead is not finite."""
    lm = solver.window_lm
    if lm.windows is None or lm.window_vel is None:
        return None
    base = look_ahead(solver, lm, raw_vector(solver.params, solver.learn))
    if base is None:
        raise FloatingPointError("the solver's look-ahead is not finite")
    screen = Screen(*base)
    if screen.solver_moving:
        return screen
    challenger = make_challenger()
    challenger.set_data(solver.train.ts)
    challenger.objective.loss_scale = solver.objective.loss_scale      # set from its first data: one scale
    values = solver.parameters.as_dict()
    for name in challenger.learn:
        challenger.params.set_value(name, values[name])
    challenger.window_lm.take_windows(challenger, lm.windows, lm.window_vel)
    option = look_ahead(challenger, challenger.window_lm, raw_vector(challenger.params, challenger.learn))
    if option is None:
        raise FloatingPointError("not finite in the option's structure")
    return dataclasses.replace(screen, option_ahead=option[1])
