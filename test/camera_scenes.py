"""Scenes the camera tests share: a robot rolling in MuJoCo, recorded at 10 Hz."""
import numpy as np

from tensegrity_engine.groundtruth import environments as envs
from tensegrity_engine.physics.config import load_robot


def rolling_three_bar(seed: int, seconds: float = 2.0, speed_range=(0.3, 0.6)):
    """A three-bar launched rolling under switching commands: (robot, twin, rng, per-step
    commands, states [F, R, 13] every 0.1 s from the start). The caller renders with the
    twin and closes it."""
    robot = load_robot("three_bar")
    rng = np.random.default_rng(seed)
    steps = int(round(seconds / robot.dt))
    s0, a0, cmd = envs.sample_contact_episode(robot, rng, steps, randomize_commands=True, speed_range=speed_range)
    twin = envs.contact_twin(robot, nthread=1)
    states, _ = twin.rollout(s0, a0, cmd, record_every=int(round(0.1 / robot.dt)))
    return robot, twin, rng, cmd, np.concatenate([s0[None], states[0]])
