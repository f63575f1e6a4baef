"""What leaves the package for other tools: a calibrated MuJoCo model of an identified robot
(`mjcf`), an identification report a roboticist can share (`report`), camera-tracked poses
as a trajectory file (`tracking`)."""
from tensegrity_engine.export.mjcf import MjcfExport, calibrated_mjcf, init_command_history, write_mjcf

__all__ = ["MjcfExport", "calibrated_mjcf", "init_command_history", "write_mjcf"]
