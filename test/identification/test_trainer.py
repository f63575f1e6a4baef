"""Recurrent identification: exact loss at the truth, actuator reconstruction, rollback,
resume, CLI, and parameter recovery on a small (CI-sized) problem."""
import math

import mujoco
import numpy as np
import pytest
import torch
import yaml

from tensegrity_engine.identification import dataset as ds
from tensegrity_engine import identification as idf
from tensegrity_engine.identification.objective import averaging_matrix
from tensegrity_engine.physics.config import load_robot
from tensegrity_engine.groundtruth.environments import noncontact_twin
from tensegrity_engine.cli.identify import main as cli_main
from tensegrity_engine.physics.params import PhysicalParameters

PERIOD = 0.02   # 20 engine steps per tuple keeps the CI problem small


@pytest.fixture(scope="module", autouse=True)
def _threads():
    old = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(old)


@pytest.fixture(scope="module")
def data(tmp_path_factory, superball):
    # SUPERball: its rods never touch in the non-contact environment, so engine and MuJoCo
    # agree exactly (the 3-bar's driven rods collide, and contact models differ on purpose).
    root = tmp_path_factory.mktemp("ident")
    ds.generate_dataset(superball, "noncontact", root, counts={"train": 2, "val": 1, "test": 1},
                        duration=0.6, period=PERIOD, seed=5, dense=False)
    return {s: ds.load_split(root / "noncontact", s) for s in ("train", "val", "test")} | {"root": root}


def _trainer(robot, data, **kw):
    cfg = dict(period=PERIOD, seed=3, batch_size=16)
    cfg.update(kw)
    tr = idf.ProgressiveTrainer(robot, idf.IdentificationConfig(**cfg))
    tr.set_data(data["train"], data["val"])
    return tr


def test_averaging_matrix_is_exact():
    M = averaging_matrix(100, 64)
    np.testing.assert_allclose(M.sum(1).numpy(), 1.0)
    u = torch.as_tensor(np.random.default_rng(0).normal(size=100))
    # brute force on 6400 sub-steps (divisible by both 100 and 64)
    fine = np.repeat(u.numpy(), 64)
    np.testing.assert_allclose((M @ u).numpy(), fine.reshape(64, 100).mean(1), atol=1e-12)


def test_loss_vanishes_at_the_truth_and_actuator_state_matches_mujoco(superball, data):
    tr = _trainer(superball, data, init="given")
    p = tr.engine.param_values(torch.float64, "cpu")
    idx = torch.arange(len(tr.train))
    assert tr.batch_loss(tr.train, idx, p, integrator="semi_implicit", n_steps=20).item() < 1e-20
    assert tr.batch_loss(tr.train, idx, p, integrator="implicit", n_steps=1).item() > 1e-8
    # act at tuple starts rebuilt from commands equals MuJoCo's activation
    traj = data["train"][0]
    steps = int(round((traj.t[-1] - traj.t[0]) / superball.dt))
    with noncontact_twin(superball) as twin:
        _, acts = twin.rollout(traj.states()[0], traj.act0, traj.command_grid(0, steps, superball.dt),
                               traj.wrench_grid(0, steps, superball.dt), record_every=20)
    rebuilt = tr.act_starts(tr.train, p).detach().numpy()
    np.testing.assert_allclose(rebuilt[1:len(acts[0])], acts[0][:-1][:len(rebuilt) - 1][:29], atol=1e-12)
    # a wrong parameter gives a clearly larger loss
    tr.params.set_value("cable_stiffness", 1.2 * superball.cable_stiffness.mean())
    p = tr.engine.param_values(torch.float64, "cpu")
    assert tr.batch_loss(tr.train, idx, p, integrator="semi_implicit", n_steps=20).item() > 1e-9


def test_rollback_restores_parameters_after_divergence(superball, data, monkeypatch):
    tr = _trainer(superball, data)
    before = tr.params.flat()[1].copy()
    real = tr.batch_loss
    monkeypatch.setattr(tr, "batch_loss", lambda *a, **k: real(*a, **k) * float("nan"))
    m = tr.train_epoch()
    assert m["diverged"] and tr.rollbacks == 1
    np.testing.assert_array_equal(tr.params.flat()[1], before)
    monkeypatch.setattr(tr, "batch_loss", real)
    m = tr.train_epoch()
    assert not m["diverged"] and np.isfinite(m["loss"])
    assert not np.array_equal(tr.params.flat()[1], before)


def test_resume_reproduces_uninterrupted_training(superball, data, tmp_path):
    a = _trainer(superball, data, epoch_tuples=16)
    for _ in range(3):
        a.train_epoch()
    b = _trainer(superball, data, epoch_tuples=16)
    for _ in range(2):
        b.train_epoch()
    b.save_checkpoint(tmp_path / "ck.safetensors")
    c = _trainer(superball, data, epoch_tuples=16)
    c.load_checkpoint(tmp_path / "ck.safetensors")
    c.train_epoch()
    np.testing.assert_allclose(c.params.flat()[1], a.params.flat()[1], rtol=1e-12)
    assert (c.epoch, c.n_steps, c.lr, c.phase) == (a.epoch, a.n_steps, a.lr, a.phase)


def test_a_checkpoint_keeps_the_models_horizon_shift_pool(superball, data, tmp_path):
    """The published sigma pools the horizon shifts of every estimate made for the model
    (`uncertainty.pooled_shift`): a restart from a checkpoint keeps them, so its next sigma
    is not one noisy draw again. From a file the pool is checked like the rest: rows of
    finite, non-negative relative shifts of exactly what is learnt, at most `SHIFT_POOL`."""
    from tensegrity_engine.identification.uncertainty import SHIFT_POOL, pooled_shift

    a = _trainer(superball, data, epoch_tuples=16)
    a.train_epoch()
    first = pooled_shift(a, {n: 0.3 * np.abs(np.asarray(a.parameters.as_dict()[n], dtype=float)) for n in a.learn})
    pooled_shift(a, {n: np.zeros_like(v) for n, v in first.items()})    # a draw near 0 after it
    a.save_checkpoint(tmp_path / "ck.safetensors")
    b = _trainer(superball, data, epoch_tuples=16)
    b.load_checkpoint(tmp_path / "ck.safetensors")
    assert len(b.horizon_shifts) == 2
    resumed = pooled_shift(b, {})
    for n in a.learn:
        np.testing.assert_allclose(resumed[n], first[n] / np.sqrt(2), rtol=1e-9)
    sd = a.state_dict()
    good = sd["horizon_shifts"][0]
    name = a.learn[0]
    for bad in ([{**good, name: np.full_like(good[name], np.nan)}], [{**good, name: -good[name] - 1.0}],
                [{k: v for k, v in good.items() if k != name}], [{**good, "no_such_value": np.ones(1)}],
                [good] * (SHIFT_POOL + 1), "0.3"):
        c = _trainer(superball, data, epoch_tuples=16)
        before = c.params.flat()[1].copy()
        with pytest.raises(ValueError, match="horizon_shifts"):
            c.load_state_dict(dict(sd, horizon_shifts=bad))
        np.testing.assert_array_equal(c.params.flat()[1], before)
        assert not getattr(c, "horizon_shifts", [])


def test_a_saved_state_with_bounds_no_reparameterisation_can_map_is_refused_untouched(superball, data):
    """A checkpoint's bounds are read from a file: a NaN, an infinite or an inverted range
    (or a non-positive one on a log scale) is refused before any bound is changed."""
    a = _trainer(superball, data, epoch_tuples=16)
    a.train_epoch()
    sd = a.state_dict()
    b = _trainer(superball, data, epoch_tuples=16)
    before = dict(b.params.specs)
    for bad in ([float("nan"), 1e5], [1e3, float("inf")], [1e5, 1e3], [0.0, 1e5], ["a", 1e5]):
        forged = dict(sd, param_bounds={**sd["param_bounds"], "cable_damping": [10.0, 1e4],
                                        "cable_stiffness": bad})
        with pytest.raises(ValueError, match="bounds for cable_stiffness"):
            b.load_state_dict(forged)
        assert b.params.specs == before
    b.load_state_dict(sd)                          # its own bounds load
    np.testing.assert_allclose(b.params.flat()[1], a.params.flat()[1], rtol=1e-12)


@pytest.mark.parametrize("field,value", [("n_steps", 0), ("lr", float("nan")), ("best_val", -math.inf),
                                         ("lm_lambda", float("nan")), ("loss_scale", -1.0), ("phase", "warp"),
                                         ("learn", "cable_stiffness"), ("learn", ["cable_stifness"]),
                                         ("bad_epochs", -3), ("start_values", {}),
                                         ("settled_path", [[1.0, 2.0]])])
def test_a_saved_state_whose_schedule_or_solver_values_are_out_of_range_is_refused(superball, data, field, value):
    """A checkpoint's schedule and solver values are read from a file: a step count of 0, a
    NaN rate or damping, a best loss of -inf, a negative loss scale, an unknown phase, a
    learn list that names nothing of this engine, a negative count, start values that are not
    the learnt ones: refused, nothing applied."""
    a = _trainer(superball, data, epoch_tuples=16)
    a.train_epoch()
    sd = a.state_dict()
    b = _trainer(superball, data, epoch_tuples=16)
    before = b.params.flat()[1].copy()
    with pytest.raises(ValueError, match="trainer state"):
        b.load_state_dict(dict(sd, **{field: value}))
    np.testing.assert_array_equal(b.params.flat()[1], before)


def test_saved_values_a_schedule_restores_are_checked_like_the_rest(superball, data):
    """The start values and the stage's best snapshot are restored into the parameters by the
    schedule later: from a file, each must hold exactly the learnt raw values (the snapshot
    its latents too), finite, of their shapes, within max_raw; else the state is refused,
    nothing applied. The state's own values load."""
    a = _trainer(superball, data, epoch_tuples=16)
    for _ in range(6):
        a.train_epoch()
        if a.schedule.best_snapshot is not None:
            break
    sd = a.state_dict()
    assert sd["start_values"] is not None and sd["best_snapshot"] is not None
    b = _trainer(superball, data, epoch_tuples=16)
    before = b.params.flat()[1].copy()
    name = a.learn[0]
    for key, stray in (("start_values", "__latent"), ("best_snapshot", "__anything")):
        base = sd[key]
        good = base[name]
        forged = [{**base, name: torch.full_like(good, math.nan)},
                  {**base, name: torch.zeros(good.numel() + 1, dtype=good.dtype)},
                  {**base, name: torch.full_like(good, 10 * a.config.max_raw)},
                  {k: v for k, v in base.items() if k != name},
                  {**base, stray: torch.zeros(3, dtype=good.dtype)}]    # the start's latents would be restored too
        for bad in forged:
            with pytest.raises(ValueError, match=key):
                b.load_state_dict(dict(sd, **{key: bad}))
            np.testing.assert_array_equal(b.params.flat()[1], before)
    b.load_state_dict(dict(sd, best_snapshot={**sd["best_snapshot"], "__latent": torch.zeros(3)}))   # its latents may be there
    b.load_state_dict(sd)
    assert b.schedule.start_values.keys() == set(a.learn)


def test_a_state_saved_before_the_data_grew_still_rolls_back(superball, data):
    """Online, the last healthy state is older than the data (pose-only: one latent row per
    tuple, grown since): it still loads, its latents left out, so a rollback restores the
    values, the schedule and the damping instead of failing."""
    po = {k: [t.without_velocity() for t in v] for k, v in data.items() if k != "root"}
    tr = _trainer(superball, {"train": po["train"][:1], "val": po["val"]}, init="given", schedule="online",
                  learn=("cable_stiffness", "cable_damping"), lm_tuples=16, lm_max_iters=40, val_tuples=8)
    tr.train_epoch()
    good = tr.state_dict()
    values = tr.params.flat()[1].copy()
    tr.extend_data(po["train"][:2])
    assert tr.train.latent.shape[0] > good["latent"].shape[0]
    tr.params.set_value("cable_stiffness", 123.0)
    tr.load_state_dict(good)
    np.testing.assert_array_equal(tr.params.flat()[1], values)


def test_pose_only_uses_latent_velocities(superball, data):
    po = {k: [t.without_velocity() for t in v] for k, v in data.items() if k != "root"}
    tr = _trainer(superball, po, init="given", schedule="fine_only", learn=("cable_stiffness",),
                  epoch_tuples=16, val_tuples=8, lr0=1e-3, latent_lr_ratio=20.0, fine_optimizer="adam")
    assert tr.latent and tr.train.latent.shape == (len(tr.train), 6, 6)
    first = tr.validate()
    for _ in range(3):
        tr.train_epoch()
    # latents converge towards the true velocities; the loss falls
    assert tr.validate() < 0.5 * first
    with pytest.raises(ValueError, match="no velocities"):
        _trainer(superball, po, latent_velocity=False)


def test_recovers_parameters_on_small_problem(superball, data):
    """Random start (multi-start within broad bounds) -> Alg. 1 (implicit dt = T halving to
    1 ms, then semi-implicit Levenberg-Marquardt) recovers K, c, tau and the rod mass within
    0.1 % (the engine matches MuJoCo exactly without contact). Short stages keep it CI-sized."""
    learn = ("cable_stiffness", "cable_damping", "actuator_time_constant", "rod_mass")
    tr = _trainer(superball, data, learn=learn, max_stage_epochs=1, patience=1, coarse_work=16,
                  coarse_lr_min=0.1, epoch_tuples=32, val_tuples=16,
                  bounds={"cable_stiffness": (2e3, 5e4), "cable_damping": (100.0, 1e4),
                          "actuator_time_constant": (0.005, 0.5), "rod_mass": (1.0, 100.0)})
    start = idf.parameter_errors(tr.parameters, superball, learn)
    assert max(start.values()) > 0.2            # really starts away from the truth
    tr.run()
    err = idf.parameter_errors(tr.parameters, superball, learn)
    assert max(err.values()) < 1e-3, err
    assert any("fine semi_implicit" in s["to"] for s in tr.stage_log)
    assert tr.coarse_params is not None
    r = idf.evaluate(tr.parameters, data["test"])
    assert r["com_error"].shape[0] == 1 and np.nanmax(r["com_error"]) < 5e-3


def test_pose_only_recovers_parameters_from_random_start(superball, data):
    """Velocities removed: finite-difference velocities for the coarse stage and the tuple
    LM, then windowed multiple-shooting LM with latent velocities recovers the parameters
    (finite differences alone stay biased: checked on the intermediate result)."""
    po = {k: [t.without_velocity() for t in v] for k, v in data.items() if k != "root"}
    learn = ("cable_stiffness", "cable_damping", "actuator_time_constant", "rod_mass")
    tr = _trainer(superball, po, learn=learn, max_stage_epochs=1, patience=1, coarse_work=16,
                  coarse_lr_min=0.1, epoch_tuples=32, val_tuples=16, lm_windows=16,
                  bounds={"cable_stiffness": (2e3, 5e4), "cable_damping": (100.0, 1e4),
                          "actuator_time_constant": (0.005, 0.5), "rod_mass": (1.0, 100.0)})
    assert tr.latent
    assert max(idf.parameter_errors(tr.parameters, superball, learn).values()) > 0.2
    before_windows = {}

    def watch(m):
        if tr.pose_stage == "window" and not before_windows:
            before_windows.update(idf.parameter_errors(tr.parameters, superball, learn))

    tr.run(callback=watch)
    assert any("windows, latent velocities" in s["to"] for s in tr.stage_log)
    assert max(before_windows.values()) > 1e-3, before_windows     # FD velocities are biased
    err = idf.parameter_errors(tr.parameters, superball, learn)
    assert max(err.values()) < 1e-3, err
    lm = tr.window_lm
    assert lm.windows.shape[1] == 3 and lm.window_vel.shape == (len(lm.windows), 6, 6)


def test_resume_inside_the_window_stage_reproduces_uninterrupted_training(superball, data, tmp_path):
    """A checkpoint taken during pose-only windowed multiple shooting resumes with the same
    windows, latents and damping (it used to fail on the missing latent columns)."""
    po = {k: [t.without_velocity() for t in v] for k, v in data.items() if k != "root"}
    kw = dict(learn=("cable_stiffness", "cable_damping"), init="given", schedule="fine_only",
              lm_tuples=16, lm_max_iters=3, lm_windows=4, val_tuples=8)
    a = _trainer(superball, po, **kw)
    while a.pose_stage != "window" or a.window_lm.windows is None:
        a.train_epoch()
    a.save_checkpoint(tmp_path / "window.safetensors")
    b = _trainer(superball, po, **kw)
    b.load_checkpoint(tmp_path / "window.safetensors")
    ma, mb = a.train_epoch(), b.train_epoch()
    assert not a.done and mb["stage"] == "fine" and np.isfinite(mb["loss"])
    assert (mb["loss"], mb["lm_lambda"]) == (ma["loss"], ma["lm_lambda"])
    np.testing.assert_array_equal(b.params.flat()[1], a.params.flat()[1])


def test_a_resumed_windowed_stage_keeps_its_values_path_for_the_settle_test(superball, data, tmp_path):
    """The windowed stage ends when the values stop moving in their sigma over the last
    lm_patience accepted steps: a run resumed mid-stage measures that as the uninterrupted
    one does (it started the path afresh and could not pass the test for lm_patience steps)."""
    po = {k: [t.without_velocity() for t in v] for k, v in data.items() if k != "root"}
    kw = dict(learn=("cable_stiffness", "cable_damping"), init="given", schedule="fine_only", lm_tuples=16,
              lm_max_iters=40, lm_windows=4, val_tuples=8, lm_settle_sigmas=0.0)
    a = _trainer(superball, po, **kw)
    for _ in range(30):
        if a.window_lm.windows is not None and len(a.window_lm.settled.path) >= a.config.lm_patience:
            break
        a.train_epoch()
    assert not a.done and len(a.window_lm.settled.path) >= a.config.lm_patience
    a.save_checkpoint(tmp_path / "settle.safetensors")
    b = _trainer(superball, po, **kw)
    b.load_checkpoint(tmp_path / "settle.safetensors")
    ma, mb = a.train_epoch(), b.train_epoch()
    assert ma["lm_accepted"] and np.isfinite(ma["settled_sigmas"])
    assert mb["settled_sigmas"] == ma["settled_sigmas"]
    # a rollback to a state of the same windows taken before any accepted step: no path then
    assert b.window_lm.settled.path
    b.load_state_dict(dict(b.state_dict(), settled_path=None))
    assert b.window_lm.settled.path == []


def test_add_tuples_keeps_training_with_grown_latents(superball, data):
    """Appending tuples grows the latent-velocity tensor: its stale Adam moments are dropped
    (the parameter moments kept) and the next epoch runs."""
    po = {k: [t.without_velocity() for t in v] for k, v in data.items() if k != "root"}
    tr = _trainer(superball, {"train": po["train"][:1], "val": po["val"]}, init="given",
                  schedule="fine_only", learn=("cable_stiffness",), epoch_tuples=8, lr0=1e-3,
                  fine_optimizer="adam")
    tr.train_epoch()
    n0 = len(tr.train)
    tr.add_tuples(po["train"][1])
    assert len(tr.train) > n0
    raw = tr.params.cable_stiffness
    assert tr.adam.optimizer.state[raw]["exp_avg"].shape == raw.shape       # parameter moments kept
    assert tr.train.latent not in tr.adam.optimizer.state                    # stale latent moments dropped
    m = tr.train_epoch()
    assert np.isfinite(m["loss"])


def test_export_yaml_is_a_robot_config(three_bar, tmp_path):
    p = PhysicalParameters(three_bar)
    p.set_value("cable_stiffness", 1234.5)
    path = idf.export_yaml(p, tmp_path / "id.yaml", comment="test")
    robot = load_robot(path)
    np.testing.assert_allclose(robot.cable_stiffness, 1234.5)
    assert yaml.safe_load(path.read_text())["name"] == "three_bar"


def test_cli_generate_identify_evaluate(tmp_path):
    out = tmp_path / "runs"
    assert cli_main(["generate", "--robot", "three_bar", "--out", str(out), "--env", "noncontact",
                     "--counts", "1,1,1", "--duration", "0.2", "--period", "0.02", "--no-dense"]) == 0
    # two epochs from a random start on the twin's data (whose config is the truth): the hold-out
    # gate refuses the fit, which predicts the val split worse than the config it would replace
    rejected = out / "rejected"
    assert cli_main(["identify", "--data", str(out / "noncontact"), "--out", str(rejected), "--period", "0.02",
                     "--max-epochs", "2", "--quiet", "--learn", "cable_stiffness"]) == 1
    assert (rejected / "candidate.yaml").exists() and (rejected / "report.md").exists()
    assert not (rejected / "identified.yaml").exists() and not (rejected / "identified.xml").exists()
    assert "REJECTED" in (rejected / "candidate.yaml").read_text()
    assert "hold-out gate (val split, 1 s ahead): rejected (worse)" in (rejected / "report.md").read_text()
    ident = out / "id"
    assert cli_main(["identify", "--data", str(out / "noncontact"), "--out", str(ident), "--period", "0.02",
                     "--quiet", "--learn", "cable_stiffness", "--init", "given"]) == 0     # to convergence
    for f in ("identified.yaml", "identified.xml", "report.md", "report_heldout.png", "checkpoint.safetensors",
              "history.json", "loss.png", "params.png"):
        assert (ident / f).exists(), f
    report = (ident / "report.md").read_text()
    header = next(line for line in report.splitlines() if line.startswith("| parameter |"))
    assert "| cable_stiffness | N/m |" in report
    assert header.endswith("| true | error vs true |")   # generated by the twin: the truth is known
    assert cli_main(["identify", "--data", str(out / "noncontact"), "--out", str(ident), "--period", "0.02",
                     "--quiet", "--learn", "cable_stiffness", "--init", "given", "--resume"]) == 0
    assert cli_main(["evaluate", "--robot", str(ident / "identified.yaml"), "--data", str(out / "noncontact"),
                     "--out", str(ident)]) == 0
    assert (ident / "com_error.png").exists()
    xml = tmp_path / "exported.xml"
    assert cli_main(["export", "--params", str(ident / "identified.yaml"), "--mjcf", str(xml), "--no-floor",
                     "--fixed-rods", "0"]) == 0
    model = mujoco.MjModel.from_xml_path(str(xml))
    stiffness = load_robot(str(ident / "identified.yaml")).cable_stiffness
    assert model.actuator_biasprm[0, 1] == pytest.approx(-stiffness[0])   # the identified K, not the config's
    assert model.body("rod0").jntnum == 0 and model.ngeom == 3            # welded, hanging: no floor
    assert cli_main(["identify", "--data", str(tmp_path / "nothing"), "--out", str(ident)]) == 2
    bad = tmp_path / "bad.yaml"
    bad.write_text("cable_stiffness: -5\n")
    assert cli_main(["export", "--params", str(bad), "--robot", "three_bar", "--mjcf", str(xml)]) == 2


def test_force_scale_search_recovers_the_mass_scale_from_known_pushes(superball, data):
    from tensegrity_engine.identification.scale import scale_search
    tr = _trainer(superball, data, init="given", schedule="fine_only")
    assert tr.train.wrenches is not None and float(tr.train.wrenches.abs().max()) > 0   # pushes exist
    truth = {n: np.array(tr.params.as_dict()[n]) for n in ("cable_stiffness", "cable_damping", "rod_mass")}
    for n, v in truth.items():
        tr.params.set_value(n, 3.0 * v)           # K/m and c/m still right: only the scale is off
    s = scale_search(tr)
    assert s == pytest.approx(1 / 3, rel=0.05)
    for n, v in truth.items():
        np.testing.assert_allclose(tr.params.as_dict()[n], v, rtol=0.05)


def test_force_scale_search_is_skipped_without_known_forces(superball, data):
    from tensegrity_engine.identification.scale import scale_search
    tr = _trainer(superball, data, init="given", schedule="fine_only")
    tr.train.wrenches = None                      # pose data without pushes: scale unobservable
    before = tr.params.as_dict()
    tr.params.set_value("rod_mass", 3.0 * np.array(before["rod_mass"]))
    assert scale_search(tr) == 1.0
    assert tr.params.as_dict()["rod_mass"] == pytest.approx(3.0 * np.array(before["rod_mass"]))


def test_contact_identification_is_bounded_to_the_stable_region(three_bar, tmp_path):
    from tensegrity_engine.physics.stability import contact_upper_bounds
    from tensegrity_engine.physics.topology import Topology
    ds.generate_dataset(three_bar, "contact", tmp_path, counts={"train": 1}, duration=0.3, period=0.1,
                        seed=2, dense=False)
    lines = []
    tr = idf.ProgressiveTrainer(three_bar, idf.IdentificationConfig(seed=1, n_starts=4), log=lines.append)
    tr.set_data(ds.load_split(tmp_path / "contact", "train"))
    limits = contact_upper_bounds(Topology(three_bar), PhysicalParameters(three_bar).values(), three_bar.dt)
    for name in ("contact_stiffness", "contact_damping"):
        assert tr.params.bounds_of(name)[1] == pytest.approx(min(limits[name], 1e7))
    assert any("semi-implicit stability" in line for line in lines)
    # an ANI fine stage sub-steps by itself: no bound
    ani = idf.ProgressiveTrainer(three_bar, idf.IdentificationConfig(seed=1, n_starts=1, fine_integrator="ani"))
    ani.set_data(ds.load_split(tmp_path / "contact", "train"))
    assert ani.params.bounds_of("contact_damping")[1] == 1e5


def test_given_plus_random_init_scores_the_given_values_among_the_random_starts(superball, data):
    tr = _trainer(superball, data, init="given+random", n_starts=6)
    assert len(tr.start_losses) == 6
    assert tr.start_losses[0] == min(tr.start_losses)     # the config (here the truth) wins...
    got, truth = tr.params.as_dict(), PhysicalParameters(superball).as_dict()
    # ... and is kept up to the force scale (the scale search may rescale K, c, m together)
    ratio = np.array(got["rod_mass"]) / np.array(truth["rod_mass"])
    for n in ("cable_stiffness", "cable_damping"):
        np.testing.assert_allclose(np.array(got[n]) / np.array(truth[n]), ratio, rtol=1e-9)
    np.testing.assert_allclose(got["actuator_time_constant"], truth["actuator_time_constant"], rtol=1e-9)
    with pytest.raises(ValueError, match="init must be one of"):
        idf.IdentificationConfig(init="truth")


def test_a_winch_speed_limit_is_found_from_a_start_where_it_does_not_bind(superball, tmp_path):
    """Winches limited to 0.3 m/s (the config says nothing: 1e3, never binding, no gradient):
    the speed-limit search finds the basin and Levenberg-Marquardt the value."""
    import dataclasses

    truth = superball.replace(actuator=dataclasses.replace(superball.actuator, max_speed=0.3))
    ds.generate_dataset(truth, "noncontact", tmp_path, counts={"train": 2, "val": 1, "test": 1},
                        duration=0.6, period=PERIOD, seed=8, dense=False)
    data = {s: ds.load_split(tmp_path / "noncontact", s, robot=superball) for s in ("train", "val")}
    learn = ("actuator_max_speed", "actuator_time_constant")
    tr = _trainer(superball, data, learn=learn, init="given", schedule="fine_only", lm_max_iters=8,
                  val_tuples=16)
    assert superball.actuator.max_speed == 1e3
    tr.run()
    got = tr.parameters.as_dict()
    assert got["actuator_max_speed"][0] == pytest.approx(0.3, rel=0.02), got
    assert got["actuator_time_constant"][0] == pytest.approx(superball.actuator.time_constant, rel=0.02)


def test_online_schedule_resumes_on_new_data_with_the_old_windows_latents(superball, data):
    """Schedule "online": it ends like fine_only, but `reopen` after new data goes on with
    the windowed stage on all of it; windows seen before keep their latent velocities."""
    po = {k: [t.without_velocity() for t in v] for k, v in data.items() if k != "root"}
    tr = _trainer(superball, {"train": po["train"][:1], "val": po["val"]}, init="given", schedule="online",
                  learn=("cable_stiffness", "cable_damping"), lm_tuples=16, lm_max_iters=4, val_tuples=8)
    tr.run()
    assert tr.done and tr.pose_stage == "window"
    lm = tr.window_lm
    old = {tuple(w): v.clone() for w, v in zip(lm.windows.tolist(), lm.window_vel)}
    tr.add_tuples(po["train"][1])
    assert tr.done and len(lm.windows) == len(old)           # a running stage keeps its problem
    tr.reopen("new data")
    assert not tr.done and tr.schedule.windows and len(lm.windows) > len(old)
    kept = [v for w, v in zip(lm.windows.tolist(), lm.window_vel) if tuple(w) in old]
    assert len(kept) == len(old)
    for w, v in zip(lm.windows.tolist(), lm.window_vel):
        if tuple(w) in old:
            assert torch.equal(v, old[tuple(w)])
    assert np.isfinite(tr.train_epoch()["loss"])
    with pytest.raises(RuntimeError, match="online"):
        _trainer(superball, po, init="given", schedule="fine_only").reopen("x")


def test_new_training_data_mid_stage_starts_the_stage_afresh(superball, data):
    """Data set anew while a stage runs (an online window that slid): the stage's best loss,
    values and latents were the old data's; they are dropped with its patience, so the
    stage neither ends on the old best nor restores values and latents from before."""
    po = {k: [t.without_velocity() for t in v] for k, v in data.items() if k != "root"}
    tr = _trainer(superball, {"train": po["train"][:1], "val": po["val"]}, init="given", schedule="online",
                  learn=("cable_stiffness", "cable_damping"), lm_tuples=16, lm_max_iters=40, val_tuples=8)
    for _ in range(3):
        tr.train_epoch()
    assert not tr.done and tr.schedule.best_snapshot is not None and np.isfinite(tr.schedule.best_val)
    tr.set_data(po["train"][1:2])
    assert (tr.schedule.best_val, tr.schedule.best_snapshot, tr.schedule.bad_epochs) == (math.inf, None, 0)
    assert tr.stage_log[-1]["why"] == "new training data" and not tr.done


def test_a_running_windowed_stage_restarts_once_its_data_has_doubled(superball, data):
    """Online, the first windows come from the first seconds: a running windowed stage
    takes the new windows once the data has grown ``window_refresh`` times, keeps the old
    windows' latents and starts its stage afresh; below that, or with 0, it keeps its problem."""
    po = {k: [t.without_velocity() for t in v] for k, v in data.items() if k != "root"}
    for growth, redrawn in ((2.0, True), (0.0, False), (3.0, False)):
        tr = _trainer(superball, {"train": po["train"][:1], "val": po["val"]}, init="given", schedule="online",
                      learn=("cable_stiffness", "cable_damping"), lm_max_iters=50, val_tuples=8,
                      window_refresh=growth)
        for _ in range(30):
            if tr.schedule.windows:
                break
            tr.train_epoch()
        tr.train_epoch()
        lm = tr.window_lm
        assert not tr.done and lm.drawn_from == len(tr.train)
        old = {tuple(w): v.clone() for w, v in zip(lm.windows.tolist(), lm.window_vel)}
        stages = len(tr.stage_log)
        tr.add_tuples(po["train"][1])                       # twice the tuples
        assert (len(lm.windows) > len(old)) is redrawn
        assert (len(tr.stage_log) == stages + 1) is redrawn
        if redrawn:
            assert tr.stage_log[-1]["from"] == tr.stage_log[-1]["to"] and tr.schedule.stage_epochs == 0
            # a resumed run knows when its windows were drawn (else it would redraw at once)
            again = _trainer(superball, {"train": po["train"][:2], "val": po["val"]}, init="given",
                             schedule="online", learn=("cable_stiffness", "cable_damping"), window_refresh=growth)
            again.load_state_dict(tr.state_dict())
            assert again.window_lm.drawn_from == lm.drawn_from == len(tr.train)
            for w, v in zip(lm.windows.tolist(), lm.window_vel):
                if tuple(w) in old:
                    assert torch.equal(v, old[tuple(w)])
        assert np.isfinite(tr.train_epoch()["loss"])
    with pytest.raises(ValueError, match="window_refresh"):
        idf.IdentificationConfig(window_refresh=0.5)


@pytest.mark.parametrize("reuse", [0, -2, 2.5, True, float("nan"), "4"])
def test_a_latent_jacobian_reuse_below_one_or_not_a_count_is_refused(reuse):
    """The windowed solver reuses a latent block for latent_jacobian_reuse iterations: 0 or
    a fraction means nothing it could do, and is refused where the setting is made."""
    with pytest.raises(ValueError, match="latent_jacobian_reuse"):
        idf.IdentificationConfig(latent_jacobian_reuse=reuse)
    assert idf.IdentificationConfig(latent_jacobian_reuse=2.0).latent_jacobian_reuse == 2
    assert type(idf.IdentificationConfig(latent_jacobian_reuse=np.int64(3)).latent_jacobian_reuse) is int


def test_native_and_torch_residuals_agree(superball, data):
    """The Levenberg-Marquardt residuals run in the C kernel by default: the same numbers
    as the torch engine (tuples and multiple-shooting windows)."""
    po = {k: [t.without_velocity() for t in v] for k, v in data.items() if k != "root"}
    kw = dict(init="given", schedule="fine_only", learn=("cable_stiffness",))
    a, b = _trainer(superball, po, **kw), _trainer(superball, po, forward_backend="torch", **kw)
    assert a.objective.native is not None and b.objective.native is None
    idx = torch.arange(len(a.train))
    with torch.no_grad():
        p = a.engine.param_values(torch.float64, "cpu")
        ra = a.objective.residuals(a.train, idx, p, a.full_steps, "semi_implicit")
        rb = b.objective.residuals(b.train, idx, p, b.full_steps, "semi_implicit")
        torch.testing.assert_close(ra, rb, rtol=1e-9, atol=1e-12)
        assert float(ra.abs().max()) > 1e-6                       # a real residual, not zeros
        windows = torch.tensor([[0, 1, 2], [3, 4, 5]])
        vel = a.train.x0[windows[:, 0]][..., 7:] * 1.01
        torch.testing.assert_close(a.objective.window_residual(a.train, windows, vel, p),
                                   b.objective.window_residual(b.train, windows, vel, p), rtol=1e-9, atol=1e-12)


def test_native_threads_change_no_result(superball, data):
    """The C kernel's rollouts run on ``native_threads`` (one by default: the identifier node
    shares its cores with a controller), and a fit on two threads ends at exactly the
    values of a fit on one (threads take whole chunks of samples); a count that is not a
    positive integer is refused."""
    kw = dict(init="given", schedule="fine_only", learn=("cable_stiffness", "cable_damping"), lm_max_iters=3,
              epoch_tuples=32, val_tuples=16)
    start = PhysicalParameters(superball, values={"cable_stiffness": 0.8 * superball.cable_stiffness})
    fits = {}
    for threads in (1, 2):
        tr = idf.ProgressiveTrainer(superball, idf.IdentificationConfig(period=PERIOD, seed=3, native_threads=threads,
                                                                         **kw), initial=start)
        tr.set_data(data["train"], data["val"])
        assert tr.objective.native.threads == threads
        tr.run()
        fits[threads] = tr.parameters.as_dict()
    assert fits[1]["cable_stiffness"] != pytest.approx(list(0.8 * superball.cable_stiffness[:1]))   # it moved
    assert fits[1] == fits[2]
    assert _trainer(superball, data, init="given", schedule="fine_only").objective.native.threads == 1
    for bad in (0, 1.5):
        with pytest.raises(ValueError, match="native_threads"):
            idf.IdentificationConfig(native_threads=bad)


def test_heldout_com_error_is_zero_for_the_true_model_and_grows_with_a_wrong_one(superball, data):
    """The gate's 1 s CoM error: chains of held-out tuples rolled out open loop."""
    tr = _trainer(superball, data, init="given", schedule="fine_only", learn=("cable_stiffness",))
    truth = PhysicalParameters(superball).as_dict()
    loss, com = tr.heldout_loss(data["test"], truth, chain=3)
    assert loss < 1e-12 and 0.0 <= com < 1e-8
    wrong = {**truth, "cable_stiffness": [2.0 * v for v in truth["cable_stiffness"]]}
    loss_w, com_w = tr.heldout_loss(data["test"], wrong, chain=3)
    assert loss_w > 1e-4 and com_w > 1e-3
    assert np.isnan(tr.heldout_loss(data["test"], truth, chain=1000)[1])     # no chain that long
    # poses only: each chain's start velocity is fitted with the model being judged, so the
    # true model is exact again (finite differences would blame it for their own error)
    po = [t.without_velocity() for t in data["test"]]
    loss_p, com_p = tr.heldout_loss(po, truth, chain=6)
    loss_pw, com_pw = tr.heldout_loss(po, wrong, chain=6)
    assert loss_p < 1e-10 and com_p < 1e-5, (loss_p, com_p)
    assert loss_pw > 1e3 * loss_p and com_pw > 1e-3
    # per block (what the gate pairs): one loss and one CoM error per chain, their means the above
    blocks, coms = tr.heldout_loss(po, wrong, chain=6, per_block=True)
    assert len(blocks) == len(coms) > 1 and (blocks > 0).all()
    assert blocks.mean() == pytest.approx(loss_pw, rel=1e-9) and coms.mean() == pytest.approx(com_pw, rel=1e-9)


def test_a_command_delay_is_a_parameter_of_the_fit_not_a_bias_in_tau(superball, data):
    """Commands that act 30 ms after their stamps (a mocap's latency, a motor's dead time):
    the loss at the true values is exact only with ``actuator_delay``, and Levenberg-Marquardt
    from no delay and a 2x wrong tau finds both."""
    import dataclasses

    lag = 0.03                                            # 30 engine steps: the shift is exact
    late = {k: [dataclasses.replace(t, command_time=t.command_time - lag) for t in v]
            for k, v in data.items() if k in ("train", "val")}
    tr = _trainer(superball, late, init="given", learn=("actuator_time_constant", "actuator_delay"),
                  schedule="fine_only", lm_max_iters=10, val_tuples=16)
    idx = torch.arange(len(tr.train))

    def loss(delay, tau):
        tr.params.set_value("actuator_delay", delay)
        tr.params.set_value("actuator_time_constant", tau)
        p = tr.engine.param_values(torch.float64, "cpu")
        return tr.batch_loss(tr.train, idx, p, integrator="semi_implicit", n_steps=20).item()

    tau = superball.actuator.time_constant
    assert loss(lag, tau) < 1e-20
    assert loss(0.0, tau) > 1e-6
    # a fractional delay is interpolated: the loss is continuous across a step boundary
    assert abs(loss(lag + 0.5e-3, tau) - 0.5 * (loss(lag, tau) + loss(lag + 1e-3, tau))) \
        < 0.5 * loss(lag + 1e-3, tau)
    loss(0.0, 2.0 * tau)
    tr.run()
    got = tr.parameters.as_dict()
    assert got["actuator_delay"][0] == pytest.approx(lag, abs=1e-3), got
    assert got["actuator_time_constant"][0] == pytest.approx(tau, rel=0.02), got


def test_rate_limited_actuator_starts_match_a_step_by_step_filter(superball, data):
    """With a binding winch speed the filter state at every tuple start runs over each
    trajectory's own stretches of constant command: the same as the filter stepped over
    every engine step, where the trajectories' commands change at different times."""
    from tensegrity_engine.physics.actuators import actuator_update, speed_limit_binds

    tr = _trainer(superball, data, init="given", schedule="fine_only")
    tr.params.set_value("actuator_max_speed", 0.2)
    p = {k: v.detach() for k, v in tr.engine.param_values(torch.float64, "cpu").items()}
    grid = tr.train.cmd_grid
    traj, chunks, S, A = grid.shape
    flat = torch.maximum(torch.minimum(grid.reshape(traj, chunks * S, A), tr.objective.cmd_high),
                         tr.objective.cmd_low)
    changes = (flat[:, 1:] != flat[:, :-1]).any(-1)
    assert not bool((changes == changes[:1]).all())             # trajectories change at different steps
    tau, speed = p["actuator_time_constant"], p["actuator_max_speed"]
    assert speed_limit_binds(tau, speed, tr.objective.cmd_high - tr.objective.cmd_low)
    a, starts = tr.train.traj_act0, []
    for step in range(chunks * S):
        if step % S == 0:
            starts.append(a)
        a = actuator_update(a, flat[:, step], tau, superball.dt, speed)[0]
    expected = torch.stack(starts, 1)[tr.train.traj, tr.train.chunk]
    got = tr.objective.act_starts(tr.train, p)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)
    unlimited = dict(p, actuator_max_speed=torch.full_like(speed, 1e3))
    assert float((tr.objective.act_starts(tr.train, unlimited) - got).abs().max()) > 1e-3   # the limit acts


def test_forward_mode_jacobians_equal_central_differences_and_identify(superball, data):
    """Forward-mode Jacobians (every column in one torch pass: the GPU's Levenberg-Marquardt)
    equal the C kernel's central differences, for tuples and for pose-only windows, and a
    fine stage run on them recovers the parameters. Default on the CPU without a floor:
    forward differences (P rollouts), within O(eps) of the slope, and a fine stage run on
    them recovers the parameters too."""
    from tensegrity_engine.identification.solvers.levenberg_marquardt import (jacobian_mode, parameter_jacobian,
                                                                              raw_vector)

    learn = ("cable_stiffness", "cable_damping", "actuator_time_constant", "rod_mass", "actuator_max_speed")
    off = {"cable_stiffness": 13000.0, "cable_damping": 700.0, "actuator_time_constant": 0.07, "rod_mass": 9.0,
           "actuator_max_speed": 0.5}                                  # a binding winch speed too
    kw = dict(init="given", schedule="fine_only", learn=learn)
    central, forward = _trainer(superball, data, jacobian="central", **kw), _trainer(superball, data,
                                                                                    jacobian="forward", **kw)
    default = _trainer(superball, data, **kw)
    assert jacobian_mode(default.config, default.objective) == "forward_difference"
    assert jacobian_mode(central.config, central.objective) == "central"
    assert jacobian_mode(forward.config, forward.objective) == "forward"
    for tr in (central, forward, default):
        for name, value in off.items():
            tr.params.set_value(name, value)
    idx = torch.arange(len(central.train))

    def tuple_jacobian(tr):
        theta0 = raw_vector(tr.params, tr.learn)
        return parameter_jacobian(
            tr, theta0, lambda p: tr.objective.residuals(tr.train, idx, p, tr.full_steps, "semi_implicit"))

    Jc, Jf, Jd = tuple_jacobian(central), tuple_jacobian(forward), tuple_jacobian(default)
    assert Jf.shape == Jc.shape == Jd.shape == (Jc.shape[0], len(learn))
    scale = Jc.norm(dim=0)
    assert bool((scale > 1e-6).all())                                   # every column is alive
    assert float(((Jf - Jc).norm(dim=0) / scale).max()) < 1e-6
    gap = float(((Jd - Jf).norm(dim=0) / scale).max())
    assert 0 < gap < 1e-4                          # a difference (measured 5.7e-6), within O(eps)
    # pose-only windows (latent velocities held): forward differences against forward mode
    po = {k: [t.without_velocity() for t in v] for k, v in data.items() if k != "root"}
    wc, wf = _trainer(superball, po, **kw), _trainer(superball, po, jacobian="forward", **kw)
    windows = torch.tensor([[0, 1, 2], [3, 4, 5], [6, 7, 8]])
    Jw = []
    for tr in (wc, wf):
        for name, value in off.items():
            tr.params.set_value(name, value)
        theta0 = raw_vector(tr.params, tr.learn)
        vel = tr.train.x0[windows[:, 0]][..., 7:]
        with torch.no_grad():
            r0 = tr.objective.window_residual(tr.train, windows, vel, tr.engine.param_values(torch.float64, "cpu"))
        Jw.append(tr.window_lm._param_jacobian(tr, theta0, windows, vel, r0))
    scale = Jw[0].flatten(0, 1).norm(dim=0)
    assert float(((Jw[1] - Jw[0]).flatten(0, 1).norm(dim=0) / scale).max()) < 1e-3   # forward differences: O(eps)
    # the fine stage on forward-mode Jacobians identifies
    for tr in (forward, default):
        tr.run()
        err = idf.parameter_errors(tr.parameters, superball, learn[:4])
        assert max(err.values()) < 1e-6, err


def test_compiled_training_rollouts_give_the_eager_loss_and_gradient(superball, data):
    """``compile_training`` (the GPU default) steps training rollouts through a torch.compile'd
    engine step, its backward compiled too: the same loss and parameter gradient as eager."""
    kw = dict(init="given", schedule="fine_only", learn=("cable_stiffness", "cable_damping", "actuator_time_constant"))
    eager, compiled = _trainer(superball, data, **kw), _trainer(superball, data, compile_training=True, **kw)
    assert not eager.objective.compile_training and compiled.objective.compile_training
    idx = torch.arange(8)
    results = []
    from torch._dynamo.utils import counters

    graphs = counters["stats"]["unique_graphs"]
    for tr in (eager, compiled):
        tr.params.set_value("cable_stiffness", 12000.0)
        p = tr.engine.param_values(torch.float64, "cpu")
        loss = tr.objective.batch_loss(tr.train, idx, p, 2, "semi_implicit", use_latent=False)   # 2 steps of 10 ms
        loss.backward()
        results.append((loss.detach(), [getattr(tr.params, n).grad.clone() for n in tr.learn]))
    assert "semi_implicit" in compiled.objective.engine._compiled_steps and not eager.objective.engine._compiled_steps
    assert counters["stats"]["unique_graphs"] > graphs        # a graph was compiled and ran
    torch.testing.assert_close(results[1][0], results[0][0], rtol=1e-10, atol=0)
    assert float(results[0][0]) > 1e-6                                    # away from the truth
    for g_compiled, g_eager in zip(results[1][1], results[0][1]):
        assert float(g_eager.abs().max()) > 0
        torch.testing.assert_close(g_compiled, g_eager, rtol=1e-8, atol=0)


def test_cli_compile_flag_reaches_the_trainer(tmp_path, monkeypatch):
    """``--compile on|off|auto`` sets ``compile_training`` (auto: the config's device default)."""
    import tensegrity_engine.identification as identification

    out = tmp_path / "runs"
    assert cli_main(["generate", "--robot", "three_bar", "--out", str(out), "--env", "noncontact",
                     "--counts", "1,1,0", "--duration", "0.2", "--period", "0.02", "--no-dense"]) == 0
    seen = []

    class Stop(Exception):
        pass

    def trainer(robot, cfg, **kw):
        seen.append(cfg.compile_training)
        raise Stop

    monkeypatch.setattr(identification, "ProgressiveTrainer", trainer)
    for flag in ("on", "off", "auto"):
        with pytest.raises(Stop):
            cli_main(["identify", "--data", str(out / "noncontact"), "--out", str(tmp_path / flag), "--period",
                      "0.02", "--quiet", "--learn", "cable_stiffness", "--compile", flag])
    assert seen == [True, False, None]


def test_window_latents_are_polished_per_window_and_trials_judged_on_the_better_latents(superball, data, monkeypatch):
    """The windowed LM fits each window's latent velocities alone between joint steps
    (cached Jacobian blocks, a window keeps only a step that lowers its own residual), and
    judges a trial parameter step with, per window, the better of the joint step's latents
    and the current ones: no window's residual ever rises, and latents knocked off the truth
    come back most of the way."""
    from tensegrity_engine.identification.solvers.levenberg_marquardt import raw_vector

    po = {k: [t.without_velocity() for t in v] for k, v in data.items() if k != "root"}
    tr = _trainer(superball, po, init="given", schedule="fine_only", lm_windows=8,
                  learn=("cable_stiffness", "cable_damping"))
    lm = tr.window_lm
    lm.setup(tr)
    theta = raw_vector(tr.params, tr.learn)
    p = tr.engine.param_values(torch.float64, "cpu")
    with torch.no_grad():
        r_fd = tr.objective.window_residual(tr.train, lm.windows, lm.window_vel, p)
    from tensegrity_engine.identification.solvers.windows import latent_normal

    normal = latent_normal(lm._latent_blocks(tr, theta, r_fd))
    vel, r = lm._polish_latents(tr, theta, normal, lm.window_vel, r_fd)
    f_fd, f_pol = (r_fd ** 2).sum(-1), (r ** 2).sum(-1)
    assert bool((f_pol <= f_fd).all())
    assert float(f_pol.sum()) < 0.2 * float(f_fd.sum())        # finite-difference starts are far off
    # a trial: a "joint" latent step that overshoots on half of the windows
    kick = vel.clone()
    kick[::2] += 0.05
    v_new, r_new = lm._trial_latents(tr, theta, normal, vel, kick)
    with torch.no_grad():
        f_kick = (tr.objective.window_residual(tr.train, lm.windows, kick, p) ** 2).sum(-1)
    f_new = (r_new ** 2).sum(-1)
    assert bool((f_new <= torch.minimum(f_kick, f_pol) * (1 + 1e-12)).all())
    moved = (v_new[1::2] != vel[1::2]).flatten(1).any(1)
    assert bool((f_new[1::2][moved] < f_pol[1::2][moved]).all())
    assert float(f_new[::2].sum()) < 0.5 * float(f_kick[::2].sum())
    # inside an iteration: with the joint step damped to nothing, the latents still move and
    # the loss the stage reports is the polished one, and the uncertainty's residual sum
    # (latents polished again at these values) no larger
    lm.setup(tr)
    with torch.no_grad():
        f_start = float((tr.objective.window_residual(tr.train, lm.windows, lm.window_vel, p) ** 2).sum())
    start_vel = lm.window_vel.clone()
    lm.lm_lambda = 1e12
    out = lm.epoch(tr)
    assert float((raw_vector(tr.params, tr.learn) - theta).abs().max()) < 1e-9
    assert not torch.equal(lm.window_vel, start_vel)
    assert out["loss"] < 0.2 * f_start
    here, vel_here = raw_vector(tr.params, tr.learn), lm.window_vel.clone()
    kept = (lm.latent_jac.clone(), lm.jac_age.clone(), lm.lm_lambda)
    info = lm.information_at(tr, here)
    assert info["rss"] <= out["loss"] * (1 + 1e-12)
    assert torch.equal(raw_vector(tr.params, tr.learn), here) and torch.equal(lm.window_vel, vel_here)
    assert torch.equal(lm.latent_jac, kept[0]) and torch.equal(lm.jac_age, kept[1]) and lm.lm_lambda == kept[2]
    # the polish takes the solver's cached blocks (all computed this iteration): one latent
    # Jacobian, at the polished latents; with every block due, the polish computes its own
    from tensegrity_engine.identification.solvers import windows as W

    rows, real = [], W.latent_jacobian
    monkeypatch.setattr(W, "latent_jacobian", lambda residual, windows, *a, **k: rows.append(len(windows))
                        or real(residual, windows, *a, **k))
    assert lm.information_at(tr, here)["rss"] == pytest.approx(info["rss"], rel=1e-12)
    assert rows == [len(lm.windows)]
    rows.clear()
    lm.jac_age[:] = tr.config.latent_jacobian_reuse
    due = lm.information_at(tr, here)
    assert rows == [len(lm.windows)] * 2
    sigma = [(torch.linalg.pinv(i["H"]).diagonal() * i["rss"] / i["dof"]).sqrt() for i in (info, due)]
    torch.testing.assert_close(sigma[0], sigma[1], rtol=0.05, atol=0.0)


def test_latent_blocks_kept_when_windows_are_added_are_rescaled_to_the_new_count(superball, data):
    """Window residuals weigh 1 / sqrt(number of windows): when new data adds windows, the
    latent blocks kept for the old ones equal blocks computed afresh over the new count."""
    from tensegrity_engine.identification.solvers import windows as W
    from tensegrity_engine.identification.solvers.levenberg_marquardt import raw_vector

    po = [t.without_velocity() for t in data["train"]]
    tr = idf.ProgressiveTrainer(superball, idf.IdentificationConfig(
        period=PERIOD, seed=3, init="given", schedule="fine_only", lm_windows=1000, window_refresh=0,
        learn=("cable_stiffness", "cable_damping")))
    tr.set_data(po[:1])
    lm = tr.window_lm
    lm.setup(tr, chain=False)
    theta = raw_vector(tr.params, tr.learn)
    residual = lambda w, v: lm._residual(tr, theta, w, v)                 # noqa: E731
    lm._latent_blocks(tr, theta, residual(lm.windows, lm.window_vel))
    old = lm.windows.shape[0]
    tr.extend_data(po)
    lm.setup(tr, chain=False)
    kept = (lm.jac_age < tr.config.latent_jacobian_reuse).nonzero()[:, 0]
    assert len(kept) == old and lm.windows.shape[0] >= 2 * old
    r0 = residual(lm.windows, lm.window_vel)
    fresh = W.latent_jacobian(residual, lm.windows[kept], lm.window_vel[kept], r0[kept], lm.latent_cols,
                              lm.windows.shape[0], step=W.LATENT_STEP)
    scale = float(fresh.abs().max())
    torch.testing.assert_close(lm.latent_jac[kept], fresh, rtol=1e-6, atol=1e-9 * scale)


def test_learn_lists_follow_the_contact_law(superball, data):
    """'contact' names the ground contact's values under the robot's law; the soft law's
    solref under the penalty law is refused (it would be learnt while acting on nothing)."""
    import dataclasses

    from tensegrity_engine.identification.config import resolve_learn

    soft = superball.replace(contact=dataclasses.replace(superball.contact, law="soft"))
    assert resolve_learn(("cable_stiffness", "contact"), "soft") == (
        "cable_stiffness", "contact_time_constant", "contact_damping_ratio", "friction_sliding")
    assert resolve_learn(("contact", "friction_sliding"), "penalty") == (
        "contact_stiffness", "contact_damping", "friction_sliding")
    with pytest.raises(ValueError, match="soft contact law"):
        resolve_learn(("contact_time_constant",), "penalty")
    with pytest.raises(ValueError, match="penalty contact law"):         # rod pairs are soft there too
        resolve_learn(("contact_stiffness",), "soft")
    with pytest.raises(ValueError, match="unknown"):
        resolve_learn(("cable_stifness",), "soft")
    tr = _trainer(soft, data, learn=("cable_stiffness", "contact"), schedule="implicit_only", max_epochs=1)
    tr._setup(data["train"])
    learnt = {n for n, raw in tr.params.named_parameters() if raw.requires_grad}
    assert learnt == {"cable_stiffness", "contact_time_constant", "contact_damping_ratio", "friction_sliding"}


def test_a_latent_column_across_a_jump_takes_the_other_side():
    """Window latents: a residual linear in the latents except for one window, where a jump
    sits within the difference step of one component (a contact opening a step earlier):
    its column is the slope from the other side, every other column the forward difference."""
    from tensegrity_engine.identification.solvers import windows as W

    gen = torch.Generator().manual_seed(0)
    N, R, M = 12, 2, 9
    A = torch.randn(N, M, R * 6, dtype=torch.float64, generator=gen)
    vel = torch.randn(N, R, 6, dtype=torch.float64, generator=gen)
    jump_window, jump_comp = 5, 4
    edge = float(vel[jump_window].flatten()[jump_comp]) + 0.5 * W.EPS

    def residual(windows, v):
        rows = windows[:, 0]
        r = (A[rows] @ v.flatten(1).unsqueeze(-1)).squeeze(-1)
        crossed = (rows == jump_window) & (v.flatten(1)[:, jump_comp] > edge)
        r = r + 3.0 * crossed[:, None].to(r.dtype)                      # the jump
        return r / math.sqrt(len(windows))

    windows = torch.arange(N)[:, None].repeat(1, 3)
    r0 = residual(windows, vel) * math.sqrt(N / N)
    cols = torch.arange(R * 6)
    B = W.latent_jacobian(residual, windows, vel, r0, cols, N)
    torch.testing.assert_close(B, A / math.sqrt(N), rtol=0, atol=1e-6)
    naive = W.JUMP_RATIO
    try:
        W.JUMP_RATIO = math.inf                                          # no check: the jump is the column
        assert float(W.latent_jacobian(residual, windows, vel, r0, cols, N)[jump_window, :, jump_comp].abs().max()) > 1e5
    finally:
        W.JUMP_RATIO = naive


def test_the_joint_solvers_latent_blocks_see_the_trend_through_kinks():
    """A window's residual that is linear in its latents plus a sawtooth with kinks 1e-4
    apart (the contacts' per-step states on the floor): the fine default step reads one
    piece's slope (the trend plus the sawtooth's), the joint solver's blocks (`LATENT_STEP`)
    the trend, on which its Schur-reduced step can move the latents with the parameters."""
    from tensegrity_engine.identification.solvers import windows as W

    gen = torch.Generator().manual_seed(1)
    N, R, M = 6, 2, 9
    A = torch.randn(N, M, R * 6, dtype=torch.float64, generator=gen)
    vel = torch.randn(N, R, 6, dtype=torch.float64, generator=gen)
    period, tooth = 1e-4, 2.0              # the sawtooth's slope within a piece
    ripple = torch.randn(M, dtype=torch.float64, generator=gen)

    def residual(windows, v):
        flat = v.flatten(1)
        saw = tooth * period * torch.remainder(flat / period, 1.0).sum(-1, keepdim=True)
        return ((A[windows[:, 0]] @ flat.unsqueeze(-1)).squeeze(-1) + saw * ripple) / math.sqrt(len(windows))

    class Solver(W.WindowLevenbergMarquardt):
        def _residual(self, run, theta, windows, v):
            return residual(windows, v)

    windows = torch.arange(N)[:, None].repeat(1, 3)
    r0 = residual(windows, vel)
    cols = torch.arange(R * 6)
    trend = A / math.sqrt(N)
    fine = W.latent_jacobian(residual, windows, vel, r0, cols, N)
    piece = trend + tooth * ripple[None, :, None] / math.sqrt(N)
    torch.testing.assert_close(fine, piece, rtol=0, atol=1e-5)          # one piece's slope
    solver = Solver(idf.IdentificationConfig(latent_jacobian_reuse=1))
    solver.windows, solver.window_vel, solver.latent_cols = windows, vel, cols
    blocks = solver._latent_blocks(None, None, r0)
    # the secant over 100 teeth: the trend within one tooth's rise over the step
    assert float((blocks - trend).abs().max()) <= 1.01 * tooth * period / W.LATENT_STEP * float(ripple.abs().max()) / math.sqrt(N)
    assert float((fine - trend).abs().max()) > 20 * float((blocks - trend).abs().max())


@pytest.fixture(scope="module")
def floor_poses(tmp_path_factory, superball):
    """Pose-only 10 Hz data of the SUPERball twin rolling on the floor under random commands."""
    root = tmp_path_factory.mktemp("floor_poses")
    ds.generate_dataset(superball, "contact", root, counts={"train": 2}, duration=3.0, period=0.1, seed=4,
                        dense=True, contact_commands="random")
    return ds.load_split(root / "contact", "train"), root


def test_start_velocities_on_the_floor_come_near_the_true_ones(superball, floor_poses):
    """The start velocity the held-out gate fits per window, with the exact model, on the
    floor: from finite differences, every window falls far below their residual (each
    window's damping adapts; with a fixed damping a window whose step was refused never moved
    again: measured here, the windows' sum 0.65x the finite differences', the worst window
    not moved at all, where the true start velocities give 1e-29)."""
    from tensegrity_engine.identification.solvers.windows import chain_windows, fit_start_velocities

    trajs, root = floor_poses
    tr = idf.ProgressiveTrainer(superball, idf.IdentificationConfig(period=0.1, init="given",
                                                                     learn=("cable_stiffness",)))
    tr.set_data([t.without_velocity() for t in trajs])
    data = tr.train
    chains, width = chain_windows(data.ts.next, 3)
    assert width == 3 and len(chains) >= 15
    windows = torch.as_tensor(chains)
    # the true start velocities: the state in the window's own dense trajectory at its first pose
    dense = [d.states() for d in ds.load_split(root / "contact", "train", kind="dense")]
    x0 = data.x0[windows[:, 0]].numpy()
    true_vel = []
    for i, first in enumerate(chains[:, 0]):
        states = dense[int(data.ts.traj[first])]
        gap = np.abs(states[:, :, :3] - x0[i][None, :, :3]).max(axis=(1, 2))
        assert gap.min() < 1e-9
        true_vel.append(states[gap.argmin(), :, 7:13])
    true_vel = torch.as_tensor(np.stack(true_vel))
    p = tr.engine.param_values(torch.float64, "cpu")
    with torch.no_grad(), tr.objective.stepped_for(p):
        loss = lambda vel: (tr.objective.window_residual(data, windows, vel, p) ** 2).sum(-1)    # noqa: E731
        f_true, f_fd = loss(true_vel), loss(data.x0[windows[:, 0]][..., 7:])
        f_fit = loss(fit_start_velocities(tr.objective, data, windows, p))
    assert float(f_true.max()) < 1e-15                          # the model is exact
    assert float(f_fit.sum()) < 0.05 * float(f_fd.sum()), (f_fit.sum(), f_fd.sum())
    # every window moved (at most 0.16x its finite differences' here)
    assert bool((f_fit < 0.5 * f_fd).all()), (f_fit / f_fd)


def test_window_fit_scores_two_value_sets_on_the_same_training_windows(superball, floor_poses):
    """`acceptance.window_fit`: the solver's objective per window with each window's start
    velocity fitted to the values: the exact model fits the floor's windows 200x better than
    a stiffness 30 % off does (measured), both scored on the same windows."""
    from tensegrity_engine.identification.acceptance import window_fit

    trajs, _ = floor_poses
    tr = idf.ProgressiveTrainer(superball, idf.IdentificationConfig(period=0.1, init="given",
                                                                     learn=("cable_stiffness",)))
    tr.set_data([t.without_velocity() for t in trajs])
    exact = tr.parameters.as_dict()
    off = dict(exact, cable_stiffness=[1.3 * k for k in exact["cable_stiffness"]])
    fit_exact, fit_off = window_fit(tr, exact, 3), window_fit(tr, off, 3)
    assert fit_exact.shape == fit_off.shape and len(fit_exact) >= 10
    assert float(fit_exact.sum()) < 0.02 * float(fit_off.sum()), (fit_exact.sum(), fit_off.sum())
    assert len(window_fit(tr, exact, 3, max_windows=4)) == 4          # an even subset


def test_boxed_step_holds_a_saturating_component_on_the_face_and_solves_the_rest():
    from tensegrity_engine.identification.solvers.levenberg_marquardt import RAW_STEP_LIMIT, boxed_step

    rng = np.random.default_rng(0)
    J = torch.as_tensor(rng.normal(size=(20, 4)))
    system, g = J.T @ J, J.T @ torch.as_tensor(rng.normal(size=20))
    free_step = -torch.linalg.solve(system, g)
    assert float(free_step.abs().max()) < RAW_STEP_LIMIT
    # far inside the box: the plain Gauss-Newton step
    torch.testing.assert_close(boxed_step(system, g, torch.zeros(4, dtype=torch.float64), 12.0), free_step)
    # component 1 starts just inside the face its step points to
    theta0 = torch.zeros(4, dtype=torch.float64)
    theta0[1] = torch.sign(free_step[1]) * (12.0 - 0.5 * float(free_step[1].abs()))
    delta = boxed_step(system, g, theta0, 12.0)
    assert float((theta0 + delta).abs().max()) <= 12.0 + 1e-12
    assert float((theta0 + delta)[1].abs()) == pytest.approx(12.0)
    free = torch.tensor([True, False, True, True])
    # the others are the exact minimiser with component 1 held there, not the free step
    torch.testing.assert_close((system @ delta + g)[free], torch.zeros(3, dtype=torch.float64), atol=1e-10, rtol=0)
    assert float((delta - free_step)[free].abs().max()) > 1e-3
    # a float32 system (a float32 trainer) with float64 raw values: the face exactly, in float64
    low = boxed_step(system.float(), g.float(), theta0, 12.0)
    assert low.dtype == torch.float64 and float((theta0 + low)[1].abs()) == 12.0
    torch.testing.assert_close(low, delta, rtol=1e-4, atol=1e-5)
    # every component pushed out: all on their faces, each stays inside
    edge = torch.sign(free_step) * (12.0 - 1e-3)
    torch.testing.assert_close(edge + boxed_step(system, g, edge, 12.0), torch.sign(free_step) * 12.0)


def test_a_parameter_saturated_at_its_bound_does_not_freeze_the_others(superball, data):
    """The damping's upper bound is its true value: its raw value sits near the saturating
    face and every Gauss-Newton step pushes it out. The stiffness, 30 % off, must still be
    fitted (a solver that refused any step leaving the raw box froze both: fully on the zoo's
    noisy_mocap, here its trust region collapsed after two steps)."""
    true_c = float(np.mean(superball.cable_damping))
    learn = ("cable_stiffness", "cable_damping")
    start = PhysicalParameters(superball).as_dict()
    start["cable_stiffness"] = 0.7 * np.asarray(start["cable_stiffness"])
    start["cable_damping"] = np.full_like(np.asarray(start["cable_damping"], dtype=float), 0.5 * true_c)
    tr = idf.ProgressiveTrainer(superball, idf.IdentificationConfig(
        period=PERIOD, seed=3, init="given", schedule="fine_only", fine_optimizer="lm", learn=learn,
        lm_tuples=32, bounds={"cable_damping": (100.0, true_c)}), initial=start)
    tr.set_data(data["train"], data["val"])
    with torch.no_grad():
        tr.params.cable_damping.fill_(tr.config.max_raw - 0.02)   # saturated (the start margin keeps it off)
    metrics = [tr.train_epoch() for _ in range(4)]
    assert all(m["lm_accepted"] for m in metrics)
    # no trust region shrunk by steps refused for the damping's sake (that run: 5e4 by epoch 4,
    # the stiffness stuck 0.2 % off)
    assert metrics[-1]["lm_lambda"] < 1.0
    assert float(tr.params.cable_damping.detach().abs().max()) <= tr.config.max_raw
    err = idf.parameter_errors(tr.parameters, superball, learn)
    assert max(err.values()) < 1e-3, err                    # the damping on its face: at the truth


def test_gradient_dtype_float32_steps_the_backpropagated_rollouts_only(superball, data):
    """``gradient_dtype="float32"``: the Adam stages' rollouts run in float32 (at the truth the
    loss is float32's rounding, not float64's), their loss and gradient agree with float64's
    to float32 precision, and the Levenberg-Marquardt residuals stay float64 to the bit."""
    learn = ("cable_stiffness", "cable_damping", "actuator_time_constant")
    runs = {gd: _trainer(superball, data, init="given", learn=learn, gradient_dtype=gd) for gd in (None, "float32")}
    idx = torch.arange(16)
    out = {}
    for gd, tr in runs.items():
        for integrator in ("semi_implicit", "implicit"):
            p = tr.engine.param_values(tr.dtype, tr.device)
            loss = tr.objective.batch_loss(tr.train, idx, p, tr.full_steps, integrator, use_latent=False)
            loss.backward()
            grad = torch.cat([getattr(tr.params, n).grad.reshape(-1) for n in learn]).clone()
            tr.params.zero_grad(set_to_none=True)
            out[gd, integrator] = (loss.detach(), grad)
        with torch.no_grad():
            out[gd, "lm"] = tr.objective.residuals(tr.train, idx, tr.engine.param_values(tr.dtype, tr.device),
                                                   tr.full_steps, "semi_implicit")
    exact, low = out[None, "semi_implicit"][0], out["float32", "semi_implicit"][0]
    assert low.dtype == torch.float64
    assert float(exact) < 1e-24 and 1e-20 < float(low) < 1e-8          # float32 rounding: it ran in float32
    # away from the truth (the implicit step at T/dt steps is not MuJoCo's): the same loss and gradient
    (l64, g64), (l32, g32) = out[None, "implicit"], out["float32", "implicit"]
    assert float(l64) > 1e-6
    assert abs(float(l32 - l64)) < 1e-4 * float(l64)
    assert float((g32 - g64).norm()) < 1e-3 * float(g64.norm())
    torch.testing.assert_close(out["float32", "lm"], out[None, "lm"], rtol=0, atol=0)
    with pytest.raises(ValueError, match="gradient_dtype"):
        idf.IdentificationConfig(gradient_dtype="float16")


def test_the_tuple_stage_reports_its_own_reduction_and_online_its_stall_follows_it(superball, data, monkeypatch):
    """The tuple LM's relative decrease of its own tuples' objective reaches the metrics; online
    the schedule is given it (its validation tuples grow), offline it is not."""
    po = {k: [t.without_velocity() for t in v] for k, v in data.items() if k != "root"}
    for schedule in ("online", "fine_only"):
        tr = _trainer(superball, {"train": po["train"], "val": po["val"]}, init="given", schedule=schedule,
                      learn=("cable_stiffness", "cable_damping"), lm_tuples=16, val_tuples=8)
        given = []
        original = tr.schedule.after_lm_iteration
        monkeypatch.setattr(tr.schedule, "after_lm_iteration",
                            lambda *a, **k: (given.append(a[4]), original(*a, **k)))
        m = tr.train_epoch()
        assert not tr.schedule.windows                  # the finite-difference (tuple) stage ran
        assert m["lm_accepted"] and 0.0 < m["reduction"] < 1.0      # the config's values are off: a step helps
        assert given == ([m["reduction"]] if schedule == "online" else [None])


def test_latent_restarts_take_a_fresh_fit_only_where_it_fits_better_and_only_on_their_turn(superball,
                                                                                           floor_poses):
    """`restart_latents`: windows on their turn (index = turn mod every) fit their start
    velocity afresh and keep it only where it fits better: on the floor, windows whose
    latents were thrown onto another piece come back, windows at their true start velocity
    (the exact model: residual ~0) keep it; the residuals it returns are the solver's,
    weighed for all windows."""
    from tensegrity_engine.identification.solvers.windows import chain_windows, restart_latents

    trajs, _ = floor_poses
    tr = idf.ProgressiveTrainer(superball, idf.IdentificationConfig(period=0.1, init="given",
                                                                     learn=("cable_stiffness",)))
    tr.set_data([t.without_velocity() for t in trajs])
    data = tr.train
    windows = torch.as_tensor(chain_windows(data.ts.next, 3)[0])
    N = len(windows)
    p = tr.engine.param_values(torch.float64, "cpu")
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad(), tr.objective.stepped_for(p):
        residual = lambda vel: tr.objective.window_residual(data, windows, vel, p)      # noqa: E731
        from tensegrity_engine.identification.solvers.windows import fit_start_velocities
        good = fit_start_velocities(tr.objective, data, windows, p, iterations=15)    # a restart runs 6
        bad = good + 0.5 * torch.randn(good.shape, generator=gen, dtype=good.dtype)    # m/s, rad/s
        vel = torch.where((torch.arange(N) % 2 == 1)[:, None, None], bad, good)
        r0 = residual(vel)
        f0 = (r0 ** 2).sum(-1)
        for turn in (0, 1):
            new_vel, new_r, restarted = restart_latents(tr.objective, data, windows, vel, r0, p, 2, turn)
            off_turn = torch.arange(N) % 2 != turn
            assert not bool(restarted[off_turn].any())
            assert torch.equal(new_vel[off_turn], vel[off_turn]) and torch.equal(new_r[off_turn], r0[off_turn])
            torch.testing.assert_close(new_r, residual(new_vel), rtol=1e-9, atol=1e-12)
            f = (new_r ** 2).sum(-1)
            assert bool((f <= f0).all())
            assert bool((f[restarted] < f0[restarted]).all())
            if turn == 1:       # the thrown latents: nearly all come back, the objective falls 10x
                assert int(restarted.sum()) >= 0.8 * int((~off_turn).sum())
                assert float(f[~off_turn].sum()) < 0.1 * float(f0[~off_turn].sum())
            else:               # fitted longer than a restart fits: mostly kept
                assert int(restarted.sum()) <= 0.5 * int((~off_turn).sum())
        # fewer windows than ``every``: a turn past the last window restarts none
        few = windows[:2]
        out = restart_latents(tr.objective, data, few, vel[:2], residual(vel)[:2], p, 8, 5)
        assert torch.equal(out[0], vel[:2]) and not bool(out[2].any())
    with pytest.raises(ValueError, match="latent_restart_every"):
        idf.IdentificationConfig(latent_restart_every=-1)
