"""Rod poses from depth: the renderer against MuJoCo's own, its gradients, the tracker."""
import numpy as np
import pytest
import torch

from tensegrity_engine.groundtruth import environments as envs
from tensegrity_engine.groundtruth.depth_camera import DepthNoise, DepthRenderingUnavailable, MujocoDepthCamera
from tensegrity_engine.groundtruth.mujoco_twin import MujocoTwin
from tensegrity_engine.perception.camera import PinholeCamera, look_at
from tensegrity_engine.perception.motion import ConstantVelocityPrior
from tensegrity_engine.perception.render import CapsuleRenderer
from tensegrity_engine.perception.tracker import RodTracker, TrackerConfig
from tensegrity_engine.physics.config import load_robot
from tensegrity_engine.physics.state import end_nodes


@pytest.fixture(scope="module")
def superball_at_rest():
    robot = load_robot("superball")
    state, _ = envs.rest_pose(robot)
    return robot, state


@pytest.fixture(scope="module")
def camera():
    return look_at([3.5, -3.0, 2.5], [0.0, 0.0, 0.5], width=160, height=120)


def _mujoco_depth(robot, state, camera, noise=DepthNoise()):
    twin = MujocoTwin(robot, nthread=1)
    try:
        with MujocoDepthCamera(twin, camera, noise=noise, rng=np.random.default_rng(3)) as sensor:
            return sensor.render(state)
    except DepthRenderingUnavailable as exc:      # says what to install; CI images carry EGL
        pytest.fail(str(exc))
    finally:
        twin.close()


def test_camera_projects_what_it_backprojects(camera):
    depth = np.full((camera.height, camera.width), 3.0)
    pts = camera.backproject(depth)
    uv, z = camera.project(pts)
    v, u = np.meshgrid(np.arange(camera.height), np.arange(camera.width), indexing="ij")
    np.testing.assert_allclose(uv[..., 0], u, atol=1e-9)
    np.testing.assert_allclose(uv[..., 1], v, atol=1e-9)
    np.testing.assert_allclose(z, 3.0)
    with pytest.raises(ValueError):
        PinholeCamera(10, 10, 5, 5, 5, 5, np.diag([1.0, 1.0, -1.0]), np.zeros(3))   # a reflection


def test_rendered_depth_is_mujocos(superball_at_rest, camera):
    """The analytic ray cast against MuJoCo's OpenGL depth of the same robot: equal on the
    rods and the floor up to rasterisation at the silhouettes."""
    robot, state = superball_at_rest
    observed = _mujoco_depth(robot, state, camera).astype(np.float64)
    ends = torch.as_tensor(end_nodes(state, robot.rod_length / 2))
    out = CapsuleRenderer(camera).render(ends, torch.as_tensor(robot.rod_radius))
    hard = out.hit_depth.reshape(camera.height, camera.width).numpy()
    seen = np.isfinite(observed)
    rods = seen & (hard < CapsuleRenderer(camera).floor_depth().reshape(camera.height, camera.width).numpy() - 0.02)
    assert rods.sum() > 200, "the robot must fill part of the image for this to mean anything"
    gap = np.abs(hard - observed)[seen]
    assert np.median(gap) < 1e-5 and np.mean(gap < 1e-3) > 0.98
    assert np.median(np.abs(hard - observed)[rods]) < 1e-3      # MuJoCo draws capsules tessellated


def test_renderer_gradients(camera):
    """Depth and silhouette are differentiable in the end nodes (double-precision gradcheck
    on pixels that see a rod's wall, cap and edge)."""
    ren = CapsuleRenderer(camera, stride=8)
    ends = torch.tensor([[[-0.6, 0.1, 0.3], [0.7, -0.1, 0.5]], [[0.1, -0.7, 0.2], [-0.1, 0.6, 0.9]]],
                        dtype=torch.float64, requires_grad=True)
    radius = torch.tensor([0.05, 0.06], dtype=torch.float64)
    out = ren.render(ends, radius)
    assert (out.silhouette > 0.5).sum() >= 3 and ((out.silhouette > 0.05) & (out.silhouette < 0.95)).any()
    torch.autograd.gradcheck(lambda e: ren.render(e, radius).depth, (ends,), atol=1e-5)
    torch.autograd.gradcheck(lambda e: ren.render(e, radius).silhouette, (ends,), atol=1e-5)


def test_tracker_recovers_a_displaced_robot(superball_at_rest, camera):
    """From rods displaced by 2 cm and ~4 deg, the tracker lands on MuJoCo's truth within
    a few millimetres and a fraction of a degree, ends in order."""
    robot, state = superball_at_rest
    depth = _mujoco_depth(robot, state, camera)
    truth = end_nodes(state, robot.rod_length / 2)
    rng = np.random.default_rng(1)
    guess = truth.copy()
    for r in range(robot.num_rods):
        axis = truth[r, 1] - truth[r, 0]
        axis = axis / np.linalg.norm(axis) + rng.normal(0.0, 0.07, 3)
        axis /= np.linalg.norm(axis)
        c = truth[r].mean(0) + rng.normal(0.0, 0.02, 3)
        guess[r] = [c - robot.rod_length[r] / 2 * axis, c + robot.rod_length[r] / 2 * axis]
    tracker = RodTracker(robot, [camera], TrackerConfig(time_budget=10.0))
    est = tracker.track([depth], guess)
    before = np.linalg.norm(guess.mean(1) - truth.mean(1), axis=-1)
    after = np.linalg.norm(est.ends.mean(1) - truth.mean(1), axis=-1)
    assert before.min() > 0.01
    assert after.max() < 0.005, after
    cos = np.sum((est.ends[:, 1] - est.ends[:, 0]) * (truth[:, 1] - truth[:, 0]), -1) / robot.rod_length ** 2
    assert np.degrees(np.arccos(np.clip(cos, -1, 1))).max() < 0.5
    assert not est.lost and est.iou > 0.8
    assert np.all(est.std > 0) and np.all(np.isfinite(est.std))


def test_tracker_reports_a_lost_track(superball_at_rest, camera):
    robot, state = superball_at_rest
    depth = _mujoco_depth(robot, state, camera)
    far = end_nodes(state, robot.rod_length / 2) + np.array([3.0, 3.0, 0.0])   # nowhere near the robot
    est = RodTracker(robot, [camera], TrackerConfig(time_budget=0.5)).track([depth], far)
    assert est.lost and est.iou < 0.3
    with pytest.raises(ValueError):
        RodTracker(robot, [camera]).track([depth[:10]], far)


def test_constant_velocity_prior():
    prior = ConstantVelocityPrior(0.1, acceleration=1.0, angular_acceleration=1.0)
    ends0 = np.array([[[0.0, 0.0, 0.0], [1.0, 0.0, 0.0]]])
    prior.reset(ends0)
    guess, sigma = prior.predict()
    np.testing.assert_allclose(guess, ends0)
    prior.update(ends0 + [0.1, 0.0, 0.0], np.full((1, 5), 0.001))
    guess, sigma = prior.predict()
    np.testing.assert_allclose(guess.mean(1), [[0.7, 0.0, 0.0]])       # moving on at 1 m/s
    assert np.all(sigma[:, :3] > 0.01 * 0.99) and np.all(sigma < 0.05)
    guess2, sigma2 = prior.predict(0.3)                                 # a frame dropped: bridged
    np.testing.assert_allclose(guess2.mean(1), [[0.8, 0.0, 0.0]])
    assert np.all(sigma2 > sigma)


def test_rod_poses_keep_the_spin_the_camera_cannot_see():
    from tensegrity_engine.perception.motion import rod_poses_from_ends
    from tensegrity_engine.physics.state import quat_from_z_to, quat_multiply

    spin = np.array([np.cos(0.3), 0.0, 0.0, np.sin(0.3)])                  # 0.6 rad about body z
    q0 = quat_multiply(quat_from_z_to(np.array([[1.0, 0.0, 0.0]])), spin[None])
    ends = np.array([[[0.0, 0.0, 1.0], [0.0, 1.0, 1.0]]])                   # the axis turned to +y
    state = rod_poses_from_ends(ends, q0)
    np.testing.assert_allclose(state[0, 0:3], [0.0, 0.5, 1.0])
    np.testing.assert_allclose(end_nodes(state, np.array([0.5])), ends, atol=1e-12)
    # the same spin about the axis: the body x axis stays as far from the world z as before
    from tensegrity_engine.physics.state import quat_rotate
    before = quat_rotate(q0, np.array([[1.0, 0.0, 0.0]]))
    after = quat_rotate(state[:, 3:7], np.array([[1.0, 0.0, 0.0]]))
    assert abs(before[0, 2] - after[0, 2]) < 1e-9


def test_engine_prior_bridges_a_gap_a_constant_velocity_cannot(superball_at_rest):
    """Across half a second of rolling, the engine (the config's values, the twin's truth)
    rolled from the last two estimates predicts the rods far better than moving them on
    at their last velocity: gravity and the floor act in between."""
    from tensegrity_engine.perception.motion import EnginePrior
    from tensegrity_engine.physics.params import PhysicalParameters

    robot, _ = superball_at_rest
    rng = np.random.default_rng(4)
    s0, a0, cmd = envs.sample_contact_episode(robot, rng, 1000)
    with MujocoTwin(robot, nthread=1) as twin:
        states, _ = twin.rollout(s0, a0, cmd, record_every=100)
    states = np.concatenate([s0[None], states[0]])                      # 10 Hz, 0 ... 1 s
    ends = end_nodes(states, robot.rod_length / 2)
    commands = lambda times: cmd[np.clip(np.floor(times / robot.dt + 1e-9).astype(int), 0, len(cmd) - 1)]
    engine = EnginePrior(PhysicalParameters(robot))
    engine.reset(s0, a0)
    cv = ConstantVelocityPrior(0.1)
    cv.reset(ends[0])
    for f in (1, 2):                                                    # two frames seen ...
        engine.update(ends[f], np.full((robot.num_rods, 5), 1e-3), 0.1 * f, commands)
        cv.update(ends[f], np.full((robot.num_rods, 5), 1e-3), 0.1 * f)
    target = ends[7]                                                    # ... then 0.5 s unseen
    err = lambda e: np.linalg.norm(e - target, axis=-1).mean()
    by_engine = err(engine.predict(0.7, commands)[0])
    by_velocity = err(cv.predict(0.7)[0])
    assert by_engine < 0.5 * by_velocity, (by_engine, by_velocity)


def test_cauchy_residual_slope_matches_its_derivative():
    from tensegrity_engine.perception.tracker import _cauchy

    x = torch.tensor([-20.0, -3.0, -1.0, -0.2, 0.3, 1.0, 4.0, 25.0], dtype=torch.float64)
    r, slope = _cauchy(x, 3.0)
    h = 1e-6
    numeric = (_cauchy(x + h, 3.0)[0] - _cauchy(x - h, 3.0)[0]) / (2 * h)
    torch.testing.assert_close(slope, numeric, rtol=1e-6, atol=1e-8)
    torch.testing.assert_close(r * r, 9.0 * torch.log1p((x / 3.0) ** 2))
    assert slope[0] < slope[3] and slope[-1] < slope[4]          # far outliers pull less (redescending)


def test_reacquire_finds_a_robot_the_rod_by_rod_fit_has_lost(superball_at_rest, camera):
    """The last good shape half a metre and 25 deg away: fitting rod by rod from there
    does not find the robot; moving the whole shape as one body onto what the camera sees
    first does, every rod and end in order."""
    robot, state = superball_at_rest
    depth = _mujoco_depth(robot, state, camera)
    truth = end_nodes(state, robot.rod_length / 2)
    c = truth.reshape(-1, 3).mean(0)
    a = np.radians(25.0)
    turn = np.array([[np.cos(a), -np.sin(a), 0.0], [np.sin(a), np.cos(a), 0.0], [0.0, 0.0, 1.0]])
    last = (truth - c) @ turn.T + c + np.array([0.5, -0.3, 0.0])
    tracker = RodTracker(robot, [camera], TrackerConfig(time_budget=10.0))
    rod_by_rod = tracker.track([depth], last)
    assert np.linalg.norm(rod_by_rod.ends - truth, axis=-1).max() > 0.1
    found = tracker.reacquire([depth], last)
    err = np.linalg.norm(found.ends - truth, axis=-1)
    assert err.max() < 0.01 and not found.lost, np.round(err, 3)


def test_moved_mujoco_camera_renders_as_a_new_one(superball_at_rest, camera):
    robot, state = superball_at_rest
    moved = look_at(camera.position + [0.7, 0.4, 0.0], [0.7, 0.4, 0.5], width=160, height=120)
    twin = MujocoTwin(robot, nthread=1)
    try:
        with MujocoDepthCamera(twin, camera) as sensor:
            before = sensor.exact(state)
            sensor.move(moved)
            after = sensor.exact(state)
        with MujocoDepthCamera(twin, moved) as fresh:
            reference = fresh.exact(state)
    finally:
        twin.close()
    seen = np.isfinite(reference)
    assert np.nanmax(np.abs(after - before)) > 0.1                      # it did move
    np.testing.assert_allclose(after[seen], reference[seen], atol=1e-5)


def _observed(superball_at_rest, camera):
    """(robot, a noisy depth image of it at rest, its end nodes, a tracker, its view having
    taken the image)."""
    robot, state = superball_at_rest
    depth = _mujoco_depth(robot, state, camera, DepthNoise(0.001, 0.02))
    tracker = RodTracker(robot, [camera], TrackerConfig(noise_at_1m=0.001, time_budget=10.0))
    tracker.views[0].observe(depth, np.random.default_rng(0))
    return robot, depth, end_nodes(state, robot.rod_length / 2), tracker, tracker.views[0]


def test_region_of_interest_and_quality_without_a_full_rendering(superball_at_rest, camera):
    """The region comes from the rods' projected outlines, not a rendering: it must hold
    every pixel a rendering shows a rod on (here and 0.3 m / 20 deg off), and the fit's
    overlap and depth rms from the region alone must equal those of a full rendering."""
    robot, depth, truth, tracker, view = _observed(superball_at_rest, camera)
    c = truth.reshape(-1, 3).mean(0)
    a = np.radians(20.0)
    turn = np.array([[np.cos(a), 0.0, np.sin(a)], [0.0, 1.0, 0.0], [-np.sin(a), 0.0, np.cos(a)]])
    for ends in (truth, (truth - c) @ turn.T + c + [0.3, -0.2, 0.1]):
        e = torch.as_tensor(ends)
        soft = view.renderer.render(e, tracker.radius).silhouette
        cover = view._projected_cover(e, tracker.radius)
        assert (soft > 0.05).sum() > 50 and not ((soft > 0.05) & ~cover).any()    # the outline, edges in
        assert cover.sum() < 3 * (soft > 0.5).sum()                             # and not much more
        view.focus(e, tracker.radius)                  # the region (grown 2 pixels): the soft tails too
        outside = torch.ones_like(cover)
        outside[view.roi_index] = False
        assert float(soft[outside].max()) < 2e-3
    est = tracker.track([depth], truth + 0.02)
    full = view.renderer.render(torch.as_tensor(est.ends), tracker.radius, view.all_margin)
    sil, obs = full.silhouette > 0.5, view.all_robot > 0.5
    valid = view.all_valid > 0
    bound = 3.0 * view.all_sigma[valid]
    d = (full.hit_depth - view.all_observed)[valid].clamp(-1e9, 1e9)
    rms = float(torch.sqrt((torch.maximum(torch.minimum(d, bound), -bound) ** 2).mean()))
    assert est.iou == pytest.approx(float((sil & obs).sum()) / float((sil | obs).sum()), abs=1e-12)
    assert est.rms == pytest.approx(rms, rel=1e-12)


def test_a_rod_the_images_contradict_or_below_the_floor(superball_at_rest, camera):
    """One rod moved onto bare floor: the others still overlap well, but the camera sees
    past that rod, so the frame is not trusted. A rod the prior puts under the floor, out
    of the camera's sight, is lifted back above it by the floor term."""
    robot, depth, truth, tracker, view = _observed(superball_at_rest, camera)
    view.focus(torch.as_tensor(truth), tracker.radius)
    overlap, _, bad = view.quality(torch.as_tensor(truth), tracker.radius, 3.0)
    assert overlap > 0.7 and not bad.any()
    moved = truth.copy()
    moved[2] += [1.2, 0.8, 0.0]                          # onto the floor beside the robot ...
    overlap, _, bad = view.quality(torch.as_tensor(moved), tracker.radius, 3.0)   # ... out of the region
    assert overlap > 0.5 and bad.tolist() == [i == 2 for i in range(robot.num_rods)]
    view.focus(torch.as_tensor(moved), tracker.radius)
    assert view.quality(torch.as_tensor(moved), tracker.radius, 3.0)[2].tolist() == bad.tolist()
    # a rod the sensor returns no depth for (dark, thin, shiny) is not contradicted by that
    holes = depth.copy()
    on_rod = view.renderer.render(torch.as_tensor(truth[[1]]), tracker.radius[[1]]).silhouette.reshape(
        holes.shape).numpy() > 0.05
    holes[on_rod] = np.nan
    view.observe(holes, np.random.default_rng(0))
    view.focus(torch.as_tensor(truth), tracker.radius)
    assert not view.quality(torch.as_tensor(truth), tracker.radius, 3.0)[2].any()
    sunk = truth.copy()
    sunk[4] += [1.5, 0.0, -0.6]                          # under the floor, away from the robot: unseen
    sigma = np.tile([0.05] * 3 + [0.1] * 2, (robot.num_rods, 1))
    sigma[4] = [5.0] * 3 + [1.0] * 2                     # a prior that does not hold it
    est = tracker.track([depth], sunk, sigma)
    from tensegrity_engine.perception.tracker import FLOOR_SINK
    lowest = est.ends[4, :, 2].min() - robot.rod_radius[4]
    assert lowest > robot.contact.ground_height - FLOOR_SINK - 0.01, lowest
    free = RodTracker(robot, [camera], TrackerConfig(noise_at_1m=0.001, time_budget=10.0))
    free.floor = None                                    # the same images without the floor term: stays sunk
    assert free.track([depth], sunk, sigma).ends[4, :, 2].min() < -0.3
