"""Small robots built in code for tests (the configs in config/ are the real robots)."""
from tensegrity_engine.physics.config import robot_from_dict


def two_rod_robot(gap: float, height: float = 0.6):
    """Two capsules crossing at right angles, axes ``gap`` apart (the lower one at ``height``),
    joined by two actuated cables."""
    return robot_from_dict({
        "name": "two_rods", "gravity": [0, 0, -9.81],
        "rod_defaults": {"mass": 2.0, "radius": 0.05},
        "rods": [{"end_nodes": [[-0.5, 0, height], [0.5, 0, height]]},
                 {"end_nodes": [[0, -0.5, height + gap], [0, 0.5, height + gap]]}],
        "cable_defaults": {"stiffness": 500.0, "damping": 5.0, "rest_length": 0.6,
                           "actuated": True, "command_range": [0.3, 0.9]},
        "cables": [{"ends": [[0, 0], [1, 0]]}, {"ends": [[0, 1], [1, 1]]}],
        "actuator": {"time_constant": 0.05},
        "contact": {"stiffness": 5e3, "damping": 20.0,
                    "friction": {"sliding": 0.5, "torsional": 0.01, "rolling": 0.005}},
    })
