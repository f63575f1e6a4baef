"""A ground truth that gains energy is refused before anything is measured on it."""
import numpy as np
import pytest

from tensegrity_engine.groundtruth import environments as envs
from tensegrity_engine.groundtruth.mujoco_twin import MujocoTwin
from tensegrity_engine.groundtruth.passivity import (GAIN_TOLERANCE, GroundTruthNotPassive, check_passive,
                                                     energy_gain, mechanical_energy)
from tensegrity_engine.groundtruth.realisation import Contact, Realisation
from tensegrity_engine.groundtruth.zoo import zoo_robot
from tensegrity_engine.identification import dataset as ds


def test_energy_counts_the_cables(three_bar):
    """Hanging, undamped, no floor: MuJoCo's Euler conserves the total closely, while gravity
    and kinetic energy alone swing by far more: the cables' elastic energy is counted."""
    robot = three_bar.replace(cable_damping=np.zeros(three_bar.num_cables))
    s0, a0 = envs.hanging_pose(robot)
    s0 = s0.copy()
    s0[:, 7:10] += np.random.default_rng(0).normal(0.0, 0.3, (robot.num_rods, 3))   # set it swinging
    s0[envs.NONCONTACT_FIXED_ROD, 7:] = 0.0
    cmd = np.broadcast_to(a0, (500, robot.num_actuated))
    with MujocoTwin(robot, floor=False, fixed_rods=[envs.NONCONTACT_FIXED_ROD], nthread=1) as twin:
        states, _ = twin.rollout(s0, a0, cmd, record_every=10)
        e = mechanical_energy(twin, np.concatenate([s0[None], states[0]]), a0)
        no_cables = mechanical_energy(twin.__class__(robot.replace(cable_stiffness=np.zeros(robot.num_cables)),
                                                     floor=False, fixed_rods=[envs.NONCONTACT_FIXED_ROD],
                                                     nthread=1),
                                      np.concatenate([s0[None], states[0]]), a0)
    swing = np.ptp(no_cables)
    assert swing > 0.5, "the run must exchange energy with the cables for this test to mean anything"
    assert np.ptp(e) < 0.05 * swing


def test_energy_gain_measures_rises_not_losses():
    assert energy_gain(np.array([10.0, 8.0, 5.0, 4.0])) == 0.0
    assert energy_gain(np.array([10.0, 6.0, 8.0, 5.0])) == pytest.approx(2.0 / 5.0)


def test_a_spinning_condim3_robot_is_refused_and_condim4_passes(three_bar):
    """The zoo's soft, heavy three-bar on condim-3 contacts spins its rods up about their
    axes and gains joules at constant commands; the same robot with torsional friction
    comes to rest. Recording refuses the first, with the reason."""
    z = zoo_robot("noisy_mocap", three_bar)
    spinning = Realisation(integrator="implicitfast", contact=Contact(condim=3))
    rng = np.random.default_rng(100)
    episodes = [envs.sample_contact_episode(z.truth, rng, 5000, realisation=spinning) for _ in range(5)]
    gains = {}
    for condim in (3, 4):
        real = Realisation(integrator="implicitfast", contact=Contact(condim=condim))
        with MujocoTwin(z.truth, realisation=real, nthread=1) as twin:
            for i, (s0, a0, cmd) in enumerate(episodes):
                states, _ = twin.rollout(s0, a0, cmd, record_every=100)
                run = np.concatenate([s0[None], states[0]])
                gains[condim, i] = energy_gain(mechanical_energy(twin, run, a0))
                if condim == 4:
                    check_passive(twin, run, a0)             # raises if not
    assert max(gains[3, i] for i in range(5)) > GAIN_TOLERANCE, gains
    assert max(gains[4, i] for i in range(5)) < 0.1, gains


def test_recording_refuses_a_robot_that_gains_energy(three_bar, tmp_path):
    z = zoo_robot("noisy_mocap", three_bar)
    bad = z.__class__(**{**z.__dict__, "realisation": Realisation(integrator="implicitfast",
                                                                  contact=Contact(condim=3))})
    with pytest.raises(GroundTruthNotPassive, match="condim"):
        ds.generate_dataset(z.nominal, "contact", tmp_path, counts={"test": 6}, seed=100, dense=False, truth=bad)
    ds.generate_dataset(z.nominal, "contact", tmp_path / "ok", counts={"test": 6}, seed=100, dense=False, truth=z)
