"""The solvers of one identification run, each owning its epoch and its own state:
`AdamSolver` (BPTT, the paper's optimiser), `TupleLevenbergMarquardt` (the fine stage on
tuples) and `WindowLevenbergMarquardt` (pose-only multiple shooting). The trainer hands
each epoch the run (`ProgressiveTrainer`) whose data, parameters and objective it uses."""
from tensegrity_engine.identification.solvers.adam import AdamSolver
from tensegrity_engine.identification.solvers.levenberg_marquardt import TupleLevenbergMarquardt
from tensegrity_engine.identification.solvers.windows import WindowLevenbergMarquardt

__all__ = ["AdamSolver", "TupleLevenbergMarquardt", "WindowLevenbergMarquardt"]
