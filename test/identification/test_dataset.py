"""Trajectory file format: round trip, validation errors, tuples, generation."""

import numpy as np
import pytest

from tensegrity_engine.identification import dataset as ds
from tensegrity_engine.physics.config import load_robot, robot_from_dict, robot_to_dict
from tensegrity_engine.groundtruth.environments import noncontact_twin


@pytest.fixture(scope="module")
def generated(tmp_path_factory, superball):
    root = tmp_path_factory.mktemp("data")
    ds.generate_dataset(superball, "noncontact", root, counts={"train": 2, "val": 1}, duration=0.5, seed=3)
    return root


def _traj(robot, n=6, velocity=True, **kw):
    rng = np.random.default_rng(0)
    R = robot.num_rods
    q = rng.normal(size=(n, R, 4))
    args = dict(robot=robot, t=0.1 * np.arange(n), position=rng.normal(size=(n, R, 3)),
                quaternion=q / np.linalg.norm(q, axis=-1, keepdims=True),
                command_time=np.array([0.0, 0.25]), command=np.stack([robot.command_low, robot.command_high]),
                environment={"name": "x", "floor": True, "fixed_rods": []})
    if velocity:
        args.update(linear_velocity=rng.normal(size=(n, R, 3)), angular_velocity=rng.normal(size=(n, R, 3)))
    args.update(kw)
    return ds.Trajectory(**args)


def test_robot_dict_round_trip():
    for name in ("superball", "three_bar"):
        robot = load_robot(name)
        again = robot_from_dict(robot_to_dict(robot))
        for field in ("rod_end_nodes", "rod_mass", "cable_ends", "cable_rest_length", "cable_stiffness",
                      "cable_damping", "cable_actuated", "cable_command_range"):
            np.testing.assert_array_equal(getattr(again, field), getattr(robot, field))
        assert again.actuator == robot.actuator and again.contact == robot.contact


@pytest.mark.parametrize("velocity", [True, False])
def test_save_load_round_trip(tmp_path, superball, velocity):
    wr = np.zeros((2, superball.num_rods, 6))
    wr[1, 2, 0] = 5.0
    traj = _traj(superball, velocity=velocity, wrench_time=np.array([0.0, 0.3]), wrench=wr,
                 act0=superball.command_low + 0.01)
    path = traj.save(tmp_path / "a.npz")
    back = ds.load_trajectory(path, superball)
    assert back.has_velocity == velocity
    np.testing.assert_array_equal(back.position, traj.position)
    np.testing.assert_array_equal(back.quaternion, traj.quaternion)
    np.testing.assert_array_equal(back.wrench, wr)
    np.testing.assert_array_equal(back.act0, traj.act0)
    # zero-order hold of commands and wrenches on the engine grid
    grid = back.command_grid(0.0, 400, 0.001)
    np.testing.assert_array_equal(grid[249], superball.command_low)
    np.testing.assert_array_equal(grid[250], superball.command_high)
    assert back.wrench_grid(0.0, 400, 0.001)[300, 2, 0] == 5.0


def _corrupt(tmp_path, robot, **changes):
    path = _traj(robot).save(tmp_path / "ok.npz")
    with np.load(path) as d:
        data = dict(d)
    for k, v in changes.items():
        if v is None:
            data.pop(k)
        else:
            data[k] = v
    bad = tmp_path / "bad.npz"
    with open(bad, "wb") as f:
        np.savez(f, **data)
    return bad


@pytest.mark.parametrize("changes, match", [
    ({"position": None}, "missing required field 'position'"),
    ({"format": np.array("something")}, "format"),
    ({"quaternion": np.ones((6, 6, 4))}, "not unit quaternions"),
    ({"position": np.zeros((6, 5, 3))}, r"position: expected shape \(6, 6, 3\)"),
    ({"t": np.array([0, 0.1, 0.1, 0.3, 0.4, 0.5])}, "strictly increasing"),
    ({"command_time": np.array([0.05, 0.25])}, "comes after the first sample"),
    ({"command": np.zeros((2, 3))}, r"command: expected shape \(2, 24\)"),
    ({"linear_velocity": None}, "both linear_velocity and angular_velocity"),
    ({"environment": np.array("{")}, "not valid JSON"),
    ({"position": np.full((6, 6, 3), np.nan)}, "NaN"),
])
def test_broken_files_give_clear_errors(tmp_path, superball, changes, match):
    with pytest.raises(ds.DatasetError, match=match):
        ds.load_trajectory(_corrupt(tmp_path, superball, **changes))


def test_mismatched_robot_and_garbage(tmp_path, superball):
    path = _traj(superball).save(tmp_path / "a.npz")
    with pytest.raises(ds.DatasetError, match="does not match robot 'three_bar'"):
        ds.load_trajectory(path, load_robot("three_bar"))
    junk = tmp_path / "junk.npz"
    junk.write_text("not a zip")
    with pytest.raises(ds.DatasetError, match="not a readable"):
        ds.load_trajectory(junk)
    with pytest.raises(ds.DatasetError, match="no such file"):
        ds.load_trajectory(tmp_path / "missing.npz")


def test_generated_data_matches_twin_and_tuples(generated, superball):
    sparse = ds.load_split(generated / "noncontact", "train")
    dense = ds.load_split(generated / "noncontact", "train", "dense")
    assert len(sparse) == 2 and sparse[0].num_samples == 6 and dense[0].num_samples == 501
    assert sparse[0].environment == {"name": "noncontact", "floor": False, "fixed_rods": [0]}
    np.testing.assert_array_equal(dense[0].subsample(0.1).position, sparse[0].position)
    # replaying the file's commands and wrenches in MuJoCo reproduces the file
    traj = sparse[0]
    cmd = traj.command_grid(0.0, 500, superball.dt)
    wr = traj.wrench_grid(0.0, 500, superball.dt)
    with noncontact_twin(superball) as twin:
        states, _ = twin.rollout(traj.states()[0], traj.act0, cmd, wr, record_every=100)
    np.testing.assert_allclose(states[0, :, :, 0:7], traj.states()[1:, :, 0:7], atol=1e-12)
    ts = ds.tuples_from(sparse)
    assert len(ts) == 10 and ts.commands.shape == (10, 100, 24) and ts.wrenches.shape == (10, 100, 6, 6)
    assert ts.data_points == 12
    np.testing.assert_array_equal(ts.x1[0], ts.x0[1])
    np.testing.assert_array_equal(ts.commands[1], cmd[100:200])
    assert ts.prev.tolist()[:3] == [-1, 0, 1] and ts.next.tolist()[4:6] == [-1, 6]
    assert ts.traj.tolist() == [0] * 5 + [1] * 5


def test_tuples_skip_missing_samples(superball):
    traj = _traj(superball, n=6)
    keep = [0, 1, 2, 4, 5]                      # sample at 0.3 s lost
    gap = ds.Trajectory(**{**{f.name: getattr(traj, f.name) for f in traj.__dataclass_fields__.values()},
                           "t": traj.t[keep], "position": traj.position[keep],
                           "quaternion": traj.quaternion[keep],
                           "linear_velocity": traj.linear_velocity[keep],
                           "angular_velocity": traj.angular_velocity[keep]})
    ts = ds.to_tuples(gap, 0.1)
    assert ts.start_step.tolist() == [0, 100, 400]
    assert ts.next.tolist() == [1, -1, -1]
    with pytest.raises(ds.DatasetError, match="whole number"):
        ds.to_tuples(gap, 0.1005)


def test_generated_motions_actuated_rolling_and_fast_holds(tmp_path, three_bar):
    """The held-out motions the residual bench uses: contact episodes with random commands
    (the nominal ones by default) and random holds within ``hold_range``."""
    ds.generate_dataset(three_bar, "contact", tmp_path / "passive", counts={"test": 1}, duration=1.0, seed=1,
                        dense=False)
    ds.generate_dataset(three_bar, "contact", tmp_path / "actuated", counts={"test": 1}, duration=1.0, seed=1,
                        dense=False, contact_commands="random", hold_range=(0.02, 0.05))
    passive = ds.load_split(tmp_path / "passive" / "contact", "test")[0]
    actuated = ds.load_split(tmp_path / "actuated" / "contact", "test")[0]
    assert len(passive.command_time) == 1 and passive.meta["contact_commands"] == "nominal"
    holds = np.diff(actuated.command_time)
    assert len(actuated.command_time) >= 20 and holds.max() <= 0.05 + 1e-9
    assert actuated.meta["contact_commands"] == "random" and actuated.meta["hold_range"] == [0.02, 0.05]
    assert actuated.command.min() >= three_bar.command_low.min() - 1e-12
    # the commands act: the same launch ends elsewhere
    assert np.abs(actuated.position[-1] - passive.position[-1]).max() > 0.01
    with pytest.raises(ValueError, match="contact_commands"):
        ds.generate_dataset(three_bar, "contact", tmp_path / "x", counts={"test": 1}, contact_commands="some")
    with pytest.raises(ValueError, match="hold_range"):
        ds.generate_dataset(three_bar, "contact", tmp_path / "x", counts={"test": 1}, hold_range=(0.2, 0.1))


def test_noncontact_data_says_where_rods_touched_each_other(tmp_path, superball, capsys):
    """Held in the air, the four-bar folds its rods into each other under random commands
    within a second (where the engine's and MuJoCo's rod-rod contact models part); the
    SUPERball does not. Each file counts its steps with rods overlapping, and the progress
    line says so."""
    from tensegrity_engine.physics.collision import rods_overlapping

    four = load_robot("four_bar")
    paths = ds.generate_dataset(four, "noncontact", tmp_path / "four", counts={"train": 2}, duration=2.0, seed=0,
                                progress=True)["train"]
    out = capsys.readouterr().out
    dense = [p for p in paths if str(p).endswith(".dense.npz")]
    counts = [ds.load_trajectory(p).meta["rod_contact_steps"] for p in dense]
    assert sum(counts) > 0 and "rods touched each other in" in out
    for path, count in zip(dense, counts):           # the count is the states' own overlaps
        assert int(rods_overlapping(four, ds.load_trajectory(path).states()).sum()) == count
    paths = ds.generate_dataset(superball, "noncontact", tmp_path / "ball", counts={"train": 1}, duration=1.0,
                                seed=0, progress=True)["train"]
    assert "rods touched" not in capsys.readouterr().out
    assert all(ds.load_trajectory(p).meta["rod_contact_steps"] == 0 for p in paths)
