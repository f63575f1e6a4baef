"""A camera track over time (perception.session) and the offline tool on a recording folder
(cli.track): the poses the node would have published, from files."""
import numpy as np
import pytest
import transforms3d
import yaml

from tensegrity_engine.cli import track as track_cli
from tensegrity_engine.groundtruth.depth_camera import DepthNoise, DepthRenderingUnavailable, MujocoDepthCamera
from tensegrity_engine.identification.dataset import load_trajectory
from tensegrity_engine.perception.camera import look_at
from tensegrity_engine.perception.overlay import ROD_COLOURS, overlay_image
from tensegrity_engine.perception.session import TrackingSession
from tensegrity_engine.perception.tracker import TrackerConfig
from tensegrity_engine.physics.state import end_nodes

from camera_scenes import rolling_three_bar

NOISE = 0.0005


@pytest.fixture(scope="module")
def recorded():
    """A three-bar rolling on the floor under switching commands, 2 s, seen at 10 Hz by a
    MuJoCo depth camera: (robot, camera, true states [F, R, 13], images [F, H, W], times,
    per-step commands)."""
    robot, twin, rng, cmd, states = rolling_three_bar(5)
    try:
        start = states[0, :, 0:3].mean(0)
        camera = look_at(start + [1.8, -1.8, 1.4], start + [0.2, 0.2, 0.2], width=160, height=120)
        try:
            with MujocoDepthCamera(twin, camera, noise=DepthNoise(NOISE, 0.02), rng=rng) as sensor:
                images = np.stack([sensor.render(s) for s in states])
        except DepthRenderingUnavailable as exc:      # says what to install; CI images carry EGL
            pytest.fail(str(exc))
    finally:
        twin.close()
    return robot, camera, states, images, 0.1 * np.arange(len(states)), cmd


def _held(robot, cmd):
    return lambda times: cmd[np.clip(np.floor(np.asarray(times) / robot.dt + 1e-9).astype(int), 0, len(cmd) - 1)]


def test_session_tracks_rejects_and_ends_a_track(recorded):
    robot, camera, states, images, times, cmd = recorded
    commands = _held(robot, cmd)
    session = TrackingSession(robot, [camera], TrackerConfig(noise_at_1m=NOISE, time_budget=1.0),
                              max_lost=2, max_gap=1.0)
    assert session.frame(0.1, [images[1]], commands).reason == "no_track"
    session.start(states[0], 0.0, commands)
    half = robot.rod_length / 2
    errors = []
    for i in range(1, 8):
        out = session.frame(times[i], [images[i]], commands)
        assert out.status == "tracked", (i, out.reason, out.detail)
        errors.append(np.linalg.norm(end_nodes(out.state, half) - end_nodes(states[i], half), axis=-1).max())
    moved = np.linalg.norm(states[7, :, 0:3] - states[0, :, 0:3], axis=-1).min()
    assert moved > 0.05, "the robot must roll for this to test tracking"
    assert max(errors) < 0.03, np.round(errors, 3)          # every end, in order
    old = session.frame(times[5], [images[5]], commands)     # older than the track
    assert old.status == "rejected" and old.reason == "out_of_order" and session.tracking
    blank = np.full_like(images[8], np.nan)                  # the robot out of view: nothing to find
    first = session.frame(times[8], [blank], commands)
    assert first.status == "lost" and not first.track_ended and session.tracking
    second = session.frame(times[9], [blank], commands)
    assert second.status == "lost" and second.track_ended and not session.tracking
    session.start(states[10], times[10], commands)          # a new announcement: tracking again
    assert session.frame(times[11], [images[11]], commands).good
    late = session.frame(times[11] + 1.5, [images[12]], commands)   # beyond max_gap: cannot predict
    assert late.reason == "gap" and late.track_ended and not session.tracking


def _write_recording(folder, robot, camera, states, images, times, cmd):
    (folder / "depth").mkdir(parents=True)
    q = transforms3d.quaternions.mat2quat(camera.rotation)
    (folder / "camera.yaml").write_text(yaml.safe_dump({
        "width": camera.width, "height": camera.height, "fx": float(camera.fx), "fy": float(camera.fy),
        "cx": float(camera.cx), "cy": float(camera.cy), "position": [float(v) for v in camera.position],
        "orientation": [float(v) for v in q], "depth_scale": 0.001}))
    from PIL import Image

    for i, d in enumerate(images):          # the first half as float metres, the rest as 16-bit millimetres
        if i < len(images) // 2:
            np.save(folder / "depth" / f"{i:04d}.npy", d.astype(np.float32))
        else:
            mm = np.where(np.isfinite(d), np.round(d * 1000.0), 0).astype(np.uint16)
            Image.fromarray(mm).save(folder / "depth" / f"{i:04d}.png")
    np.savetxt(folder / "times.txt", times)
    (folder / "first_pose.yaml").write_text(yaml.safe_dump({"rods": states[0, :, 0:7].tolist()}))
    change = np.concatenate([[0], np.flatnonzero(np.any(np.diff(cmd, axis=0) != 0, axis=1)) + 1])
    rows = np.concatenate([(change * robot.dt)[:, None], cmd[change]], 1)
    np.savetxt(folder / "commands.csv", rows, delimiter=",", header="t," + ",".join(
        f"u{i}" for i in range(robot.num_actuated)))


def test_offline_tool_tracks_a_recording_folder(recorded, tmp_path):
    robot, camera, states, images, times, cmd = recorded
    folder = tmp_path / "rec"
    _write_recording(folder, robot, camera, states, images, times, cmd)
    rc = track_cli.main([str(folder), "--robot", "three_bar", "--noise", str(NOISE), "--budget", "1.0",
                         "--overlay", str(tmp_path / "overlay"), "--overlay-every", "5",
                         "--trajectory", str(tmp_path / "traj.npz")])
    assert rc == 0
    out = np.load(folder / "tracked.npz")                 # plain arrays: no pickle needed
    assert len(out["t"]) == len(images)                   # the announced instant's image is fitted too
    good = out["status"] <= 1
    assert good.mean() >= 0.9, out["reason"]
    half = robot.rod_length / 2
    truth = end_nodes(states, half)
    err = np.linalg.norm(out["ends"][good] - truth[good], axis=-1)
    assert np.median(err) < 0.02 and err.max() < 0.05, np.round(err.max(axis=(1, 2)), 3)
    pngs = sorted((tmp_path / "overlay").glob("*.png"))
    assert len(pngs) >= 3
    import matplotlib.pyplot as plt

    picture = (plt.imread(pngs[0])[..., :3] * 255).round().astype(np.uint8)
    for colour in ROD_COLOURS[: robot.num_rods]:           # every rod drawn in its colour
        assert np.all(picture == colour, axis=-1).sum() > 5
    traj = load_trajectory(tmp_path / "traj.npz", robot)
    assert traj.num_samples == int(good.sum())
    np.testing.assert_allclose(traj.position, out["position"][good], atol=1e-9)


def test_offline_tool_refuses_a_malformed_recording(recorded, tmp_path, capsys):
    robot, camera, states, images, times, cmd = recorded
    folder = tmp_path / "rec"
    _write_recording(folder, robot, camera, states[:4], images[:4], times[:4], cmd)
    (folder / "times.txt").write_text("0.0\n0.1\n")
    assert track_cli.main([str(folder), "--robot", "three_bar"]) == 2
    assert "2 times for 4 images" in capsys.readouterr().err
    np.savetxt(folder / "times.txt", times[:4])
    (folder / "first_pose.yaml").write_text(yaml.safe_dump({"rods": states[0, :2, 0:7].tolist()}))
    assert track_cli.main([str(folder), "--robot", "three_bar"]) == 2
    assert "3 rows" in capsys.readouterr().err
    (folder / "first_pose.yaml").write_text(yaml.safe_dump({"rods": states[0, :, 0:7].tolist()}))
    (folder / "depth" / "0000.npy").unlink()
    np.save(folder / "depth" / "0000.npy", np.zeros((3, 4, 5)))
    (folder / "times.txt").unlink()
    assert track_cli.main([str(folder), "--robot", "three_bar", "--rate", "10"]) == 2
    assert "2-D" in capsys.readouterr().err
    np.save(folder / "depth" / "0000.npy", np.zeros((12, 16)))          # not the camera's size
    assert track_cli.main([str(folder), "--robot", "three_bar", "--rate", "10"]) == 2
    assert "16x12 pixels, the camera's are 160x120" in capsys.readouterr().err
    (folder / "depth" / "0000.npy").write_bytes(b"not an array")
    assert track_cli.main([str(folder), "--robot", "three_bar", "--rate", "10"]) == 2
    assert "0000.npy" in capsys.readouterr().err


def test_overlay_draws_each_rod_where_it_is(recorded):
    """The overlay's rod colours sit on the rods' projected centres; a rod moved away moves
    its colour with it."""
    robot, camera, states, images, _, _ = recorded
    ends = end_nodes(states[0], robot.rod_length / 2)
    img = overlay_image(camera, images[0], ends, robot.rod_radius, floor=0.0)
    uv, _ = camera.project(ends.mean(1))
    for i, (u, v) in enumerate(np.rint(uv).astype(int)):
        patch = img[max(v - 2, 0):v + 3, max(u - 2, 0):u + 3].reshape(-1, 3).astype(int)
        assert np.any(np.abs(patch - ROD_COLOURS[i]).sum(-1) < 60), i       # its axis line or its tint
    with pytest.raises(ValueError):
        overlay_image(camera, images[0][:10], ends, robot.rod_radius)
