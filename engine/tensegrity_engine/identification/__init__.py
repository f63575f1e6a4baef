"""Identification from low-rate data (paper III, Algorithm 1).

Modules: ``dataset`` (trajectory files, tuples, dataset generation on the ground truth),
``streaming`` (live alignment of poses and commands into tuples), ``data`` (tuples as
device tensors), ``objective`` (the recurrent loss and LM residuals), ``schedule``
(Algorithm 1's stage decisions), ``solvers`` (Adam BPTT, Levenberg-Marquardt, windowed
multiple shooting), ``multistart``, ``trainer`` (`ProgressiveTrainer`, the run),
``evaluation`` (CoM error on whole trajectories, YAML export).
Imports physics and groundtruth (dataset generation, ablation c), never control or cli.
"""
from tensegrity_engine.identification.config import IdentificationConfig, default_learnable
from tensegrity_engine.identification.evaluation import evaluate, parameter_errors
from tensegrity_engine.physics.parameter_files import export_yaml
from tensegrity_engine.identification.trainer import ProgressiveTrainer

__all__ = ["IdentificationConfig", "ProgressiveTrainer", "default_learnable", "evaluate", "export_yaml",
           "parameter_errors"]
