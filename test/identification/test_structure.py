"""Model-structure selection (issue 19): the integrator a robot was built around is found from
its data, and an option that does not pay for itself on held-out data is left out."""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from tensegrity_engine.groundtruth.realisation import Realisation
from tensegrity_engine.groundtruth.sensors import SensorModel
from tensegrity_engine.groundtruth.zoo import ZooRobot
from tensegrity_engine.identification import dataset as ds
from tensegrity_engine.identification.acceptance import with_estimated_velocity
from tensegrity_engine.identification.config import IdentificationConfig
from tensegrity_engine.identification.evaluation import horizon_errors
from tensegrity_engine.identification.structure import select_structure, structure_options
from tensegrity_engine.physics.config import load_robot

torch.set_num_threads(2)


@pytest.mark.parametrize("truth_integrator", ["implicitfast", "Euler"])
def test_selection_finds_the_robots_integrator(tmp_path, truth_integrator):
    """A three-bar with 2.5x the config's cable damping and 0.7x its stiffness, simulated by
    MuJoCo with implicitfast (or Euler). From hanging data, selection keeps implicitfast
    exactly when the robot has it (measured: 11.1 -> 0.37 mm 1 s ahead on held-out
    trajectories; with Euler the implicitfast fit is 5.3 mm against 0.18), and never keeps
    slack damping the robot does not have."""
    base = load_robot("three_bar")
    truth = base.replace(cable_damping=base.cable_damping * 2.5, cable_stiffness=base.cable_stiffness * 0.7)
    robot = ZooRobot("test", "", base, truth, Realisation(integrator=truth_integrator), SensorModel())
    ds.generate_dataset(base, "noncontact", tmp_path, counts={"train": 4, "val": 3}, seed=1, dense=False,
                        truth=robot, duration=3.0)
    train, heldout = (ds.load_split(tmp_path / "noncontact", s, robot=base) for s in ("train", "val"))
    cfg = IdentificationConfig(init="given", schedule="fine_only", epoch_tuples=128,
                               batch_size=16, val_tuples=32, patience=2, max_stage_epochs=2)
    sel = select_structure(base, train, heldout, cfg, options=("implicitfast", "slack_damping"))
    assert len(sel.tried) >= 2                     # both options were fitted and judged
    assert "slack_damping" not in sel.chosen.options
    fast = [c for _, c, _ in sel.tried if c.options == ("implicitfast",)][0]
    true_c = float(truth.cable_damping.mean())
    if truth_integrator == "implicitfast":
        assert sel.chosen.options == ("implicitfast",)
        assert sel.params.robot.integrator == "implicitfast"
        assert sel.chosen.error < 0.4 * sel.base.error
        # here both structures find the damping (within 1 %): the step is what predicts
        got = float(np.mean(sel.params.as_dict()["cable_damping"]))
        assert abs(got - true_c) < 0.05 * true_c
    else:
        assert sel.chosen.options == () and sel.params.robot.integrator == "semi_implicit"
        assert fast.error > 2.0 * sel.base.error


def test_options_depend_on_the_model():
    robot = load_robot("three_bar")
    assert "implicitfast" in structure_options(robot)
    assert "implicitfast" not in structure_options(robot.replace(integrator="implicitfast"))
    assert {"implicitfast", "rk4"} <= set(structure_options(robot))
    assert "rk4" not in structure_options(robot.replace(integrator="rk4"))
    with pytest.raises(ValueError, match="unknown structure options"):
        select_structure(robot, [object()], [object()], IdentificationConfig(), options=("rk45",))


def test_cli_identify_with_structure(tmp_path):
    """`tensegrity-identify identify --structure` selects, writes what it tried, and exports
    the chosen structure (its integrator in the robot YAML and the MJCF)."""
    import yaml

    from tensegrity_engine.cli.identify import main as cli_main

    out = tmp_path / "runs"
    assert cli_main(["generate", "--robot", "three_bar", "--out", str(out), "--env", "noncontact",
                     "--counts", "2,2,1", "--duration", "1.0", "--no-dense"]) == 0
    ident = out / "id"
    # two epochs after the selection: the hold-out gate refuses the fit against the config (the
    # twin's truth), so it is written as candidate.yaml, not identified.yaml (no MJCF either)
    assert cli_main(["identify", "--data", str(out / "noncontact"), "--out", str(ident), "--max-epochs", "2",
                     "--quiet", "--learn", "cable_stiffness", "--structure"]) == 1
    assert not (ident / "identified.yaml").exists()
    text = (ident / "structure.txt").read_text()
    assert "base (semi_implicit)" in text and "implicitfast" in text and "chosen:" in text
    chosen = text.strip().splitlines()[-1]
    exported = yaml.safe_load((ident / "candidate.yaml").read_text())
    integrator = exported["engine"].get("integrator", "semi_implicit")
    assert (integrator == "implicitfast") == ("implicitfast" in chosen)
    xml = ident / "candidate.xml"
    assert cli_main(["export", "--params", str(ident / "candidate.yaml"), "--mjcf", str(xml), "--no-floor",
                     "--fixed-rods", "0"]) == 0
    assert f'integrator="{"Euler" if integrator == "semi_implicit" else integrator}"' in xml.read_text()


def test_cli_identify_with_structure_on_floor_data(tmp_path):
    """On floor data `--structure` chooses the contact law (and the options only contact data
    shows) from the config's values, writes what it tried and exports the law it chose."""
    import yaml

    from tensegrity_engine.cli.identify import main as cli_main

    out = tmp_path / "runs"
    assert cli_main(["generate", "--robot", "three_bar", "--out", str(out), "--env", "contact",
                     "--counts", "2,2,1", "--duration", "1.0", "--no-dense"]) == 0
    ident = out / "id"
    code = cli_main(["identify", "--data", str(out / "contact"), "--out", str(ident), "--max-epochs", "2",
                     "--quiet", "--structure"])
    assert code in (0, 1)                     # 1: the gate kept the config (the twin's truth)
    text = (ident / "structure.txt").read_text()
    assert "soft_contact" in text and "per_rod_mass" in text and "chosen:" in text
    chosen = text.strip().splitlines()[-1]
    exported = yaml.safe_load((ident / ("identified.yaml" if code == 0 else "candidate.yaml")).read_text())
    assert (exported["contact"].get("law", "penalty") == "soft") == ("soft_contact" in chosen)


def test_a_stable_option_beats_a_diverging_structure():
    from tensegrity_engine.identification.structure import _paired_verdict

    ok, why = _paired_verdict(np.array([0.01, 0.02]), np.array([0.01, np.inf]), 0.05, 2.0, 0.0)
    assert ok and "diverges" in why
    ok, why = _paired_verdict(np.array([0.01, np.inf]), np.array([0.01, 0.02]), 0.05, 2.0, 0.0)
    assert not ok and why == "unstable"


def test_contact_law_selection_finds_mujocos_contact(tmp_path):
    """A three-bar rolling in MuJoCo (its default soft contacts, condim 6 as the engine's
    default for this config: condims 3 and 4 are tried and refused), the soft law's values
    started off (time constant 0.04 s, damping ratio 0.7): fitting the contact values under
    the penalty law leaves the held-out prediction 1 s ahead 76 mm off; the soft law fits
    it to 19 mm (the three-bar's own chaos is 12 mm there) and is kept, with MuJoCo's time
    constant and damping ratio found (measured: 0.0201 s, 1.009)."""
    from tensegrity_engine.identification.structure import select_contact_law
    from tensegrity_engine.physics.params import PhysicalParameters

    base = load_robot("three_bar")
    robot = ZooRobot("test", "", base, base, Realisation(), SensorModel())
    ds.generate_dataset(base, "contact", tmp_path, counts={"train": 3, "val": 2}, seed=2, dense=False,
                        truth=robot, duration=2.0, contact_commands="random")
    train, heldout = (ds.load_split(tmp_path / "contact", s, robot=base) for s in ("train", "val"))
    start = PhysicalParameters(base, values={"contact_time_constant": 0.04, "contact_damping_ratio": 0.7})
    cfg = IdentificationConfig(init="given", schedule="fine_only", lm_max_iters=6, max_seconds=120)
    sel = select_contact_law(start, train, heldout, cfg)
    assert sel.base.params.robot.contact.law == "penalty"
    assert sel.chosen.options == ("soft_contact",) and sel.params.robot.contact.law == "soft"
    assert {c.options for _, c, _ in sel.tried if "condim3" in c.options or "condim4" in c.options} == {
        ("soft_contact", "condim3"), ("soft_contact", "condim4")}
    assert sel.chosen.error < 0.4 * sel.base.error
    values = sel.params.as_dict()
    assert abs(values["contact_time_constant"][0] - 0.02) < 0.001
    assert abs(values["contact_damping_ratio"][0] - 1.0) < 0.05


def test_contact_data_reveals_a_payload_on_the_hung_rod(tmp_path):
    """A three-bar whose rod 0 carries an 80 % payload, rolling in MuJoCo, its model started
    from the true values but one mean rod mass (what hanging data gives when the payload rod
    is the hung one): under the soft law the contact fit alone stays far off, the fit with a
    mass per rod finds the payload and is kept; the option is not offered again once the
    masses are per rod."""
    from tensegrity_engine.identification.structure import contact_options, select_contact_law, with_contact_law
    from tensegrity_engine.physics.params import PhysicalParameters

    base = with_contact_law(PhysicalParameters(load_robot("three_bar")), "soft").robot
    masses = base.rod_mass * np.array([1.8, 1.0, 1.0])
    truth = base.replace(rod_mass=masses)
    robot = ZooRobot("payload_test", "", base, truth, Realisation(), SensorModel())
    ds.generate_dataset(base, "contact", tmp_path, counts={"train": 3, "val": 2}, seed=4, dense=False,
                        truth=robot, duration=2.0, contact_commands="random")
    train, heldout = (ds.load_split(tmp_path / "contact", s, robot=base) for s in ("train", "val"))
    start = PhysicalParameters(base, values={"rod_mass": float(masses.mean())})
    assert contact_options(start) == ("per_rod_mass", "slack_damping")
    assert contact_options(start, chosen=("slack_damping",)) == ("per_rod_mass",)
    cfg = IdentificationConfig(init="given", schedule="fine_only", lm_max_iters=6, max_seconds=120)
    sel = select_contact_law(start, train, heldout, cfg, laws=("soft",), condims=(), chosen=("slack_damping",))
    assert sel.base.options == ("soft_contact",)
    assert sel.chosen.options == ("soft_contact", "per_rod_mass")
    assert sel.chosen.error < 0.3 * sel.base.error
    found = sel.params.as_dict()["rod_mass"]
    np.testing.assert_allclose(found, masses, rtol=0.05)
    assert contact_options(sel.params) == ("slack_damping",)
    # the same data with the masses right: a mass per rod has nothing to add and is refused
    right = PhysicalParameters(base, values={"rod_mass": masses}, per_element=("rod_mass",))
    assert contact_options(right) == ("slack_damping",)
    even = select_contact_law(right, train, heldout, cfg, laws=("soft",), condims=(), options=("per_rod_mass",))
    assert even.chosen.options == ("soft_contact",)


def test_contact_data_reveals_the_contacts_dimensionality(tmp_path):
    """A three-bar rolling in MuJoCo on condim-4 contacts (sliding and torsional friction, no
    rolling friction), its model the true values under the soft law at the engine's default
    for a config with rolling friction (condim 6): the condim-6 fit is off (its normal force
    at rest differs), the condim-4 fit is kept and predicts 1 s ahead far better; condim 3
    (no torsional friction) is no better than 4 (measured 1 s ahead: condim 6 3.3 mm, 4 at
    round-off, 3 94 mm). With ``condims=()`` the robot's own stays."""
    from tensegrity_engine.groundtruth.realisation import Contact
    from tensegrity_engine.identification.structure import select_contact_law, with_contact_law
    from tensegrity_engine.physics.params import PhysicalParameters

    base = with_contact_law(PhysicalParameters(load_robot("three_bar")), "soft").robot
    assert base.contact.soft_condim == 6
    robot = ZooRobot("condim_test", "", base, base, Realisation(contact=Contact(condim=4)), SensorModel())
    ds.generate_dataset(base, "contact", tmp_path, counts={"train": 3, "val": 2}, seed=5, dense=False,
                        truth=robot, duration=2.0, contact_commands="random")
    train, heldout = (ds.load_split(tmp_path / "contact", s, robot=base) for s in ("train", "val"))
    start = PhysicalParameters(base)
    cfg = IdentificationConfig(init="given", schedule="fine_only", lm_max_iters=6, max_seconds=120)
    sel = select_contact_law(start, train, heldout, cfg, laws=("soft",), options=())
    labels = [c.options for _, c, _ in sel.tried]
    assert sel.base.options == ("soft_contact",) and set(labels) == {("soft_contact", "condim3"),
                                                                   ("soft_contact", "condim4")}
    assert sel.chosen.options == ("soft_contact", "condim4")
    assert sel.params.robot.contact.soft_condim == 4
    assert sel.chosen.error < 0.5 * sel.base.error
    assert sel.chosen.error <= min(c.error for _, c, _ in sel.tried)
    kept = select_contact_law(start, train, heldout, cfg, laws=("soft",), condims=(), options=())
    assert not kept.tried and kept.params.robot.contact.soft_condim == 6


def test_hanging_values_are_refitted_around_a_payload_found_on_contact_data(tmp_path):
    """The contact stage found a mass per rod (a payload on the hung rod) on a model whose
    hanging values were fitted with one mean mass (here: cable stiffness and damping 20 %
    off, the free rods 5 % light): the refit on hanging data keeps the masses per rod,
    leaves the hung rod's (which the data cannot move) and the contact values alone, moves
    the other values to the robot's and predicts the hanging data better."""
    from tensegrity_engine.identification.structure import Candidate, StructureSelection, refit_noncontact
    from tensegrity_engine.physics.params import PhysicalParameters

    base = load_robot("three_bar")
    masses = base.rod_mass * np.array([1.8, 1.0, 1.0])
    truth = base.replace(rod_mass=masses)
    robot = ZooRobot("payload_test", "", base, truth, Realisation(), SensorModel())
    ds.generate_dataset(base, "noncontact", tmp_path, counts={"train": 3, "val": 2}, seed=5, dense=False,
                        truth=robot, duration=2.0)
    train, heldout = (ds.load_split(tmp_path / "noncontact", s, robot=base) for s in ("train", "val"))
    friction = 0.55
    start_masses = masses * np.array([1.0, 0.95, 0.95])
    found = PhysicalParameters(base, values={"rod_mass": start_masses, "cable_stiffness": 1.2 * base.cable_stiffness,
                                             "cable_damping": 0.8 * base.cable_damping,
                                             "friction_sliding": friction}, per_element=("rod_mass",))
    cand = Candidate(("per_rod_mass",), found, np.ones(4), 0.0)
    nothing = StructureSelection(chosen=dataclasses.replace(cand, options=()), base=cand, tried=[], horizon=1.0)
    cfg = IdentificationConfig(init="given", schedule="fine_only", lm_max_iters=8, max_seconds=120)
    assert refit_noncontact(nothing, train, heldout, cfg) is None          # the contact stage added nothing
    refit = refit_noncontact(StructureSelection(chosen=cand, base=cand, tried=[], horizon=1.0), train, heldout, cfg)
    values = refit.params.as_dict()
    assert values["rod_mass"][0] == pytest.approx(start_masses[0], rel=1e-12)       # the hung rod
    assert values["friction_sliding"] == pytest.approx([friction], rel=1e-12)
    # hanging data fixes stiffness and damping per mass well, their common scale (gravity
    # against the pushes) less so: the ratios to 2 %, each value to 5 %
    free_mass = np.mean(values["rod_mass"][1:])
    assert np.mean(values["cable_stiffness"]) / free_mass == pytest.approx(
        np.mean(base.cable_stiffness) / masses[1], rel=0.02)
    assert np.mean(values["cable_damping"]) / free_mass == pytest.approx(
        np.mean(base.cable_damping) / masses[1], rel=0.02)
    np.testing.assert_allclose(values["rod_mass"][1:], masses[1:], rtol=0.05)
    assert np.mean(values["cable_stiffness"]) == pytest.approx(np.mean(base.cable_stiffness), rel=0.05)
    before = horizon_errors(found, [with_estimated_velocity(t) for t in heldout], (1.0,), stride=0.5)[1.0]
    assert refit.error < 0.5 * float(np.mean(before))


def test_hanging_values_are_refitted_under_a_law_that_acts_between_rods(tmp_path):
    """The contact stage chose the soft law; its rod pairs act in hanging data too (thick
    rods that touch while they hang): the hanging values, fitted under the penalty law's
    pairs (here: stiffness 10 % off), are refitted under the soft law and predict the
    hanging data better. A stage that kept the law and added nothing refits nothing."""
    from tensegrity_engine.identification.structure import Candidate, StructureSelection, refit_noncontact
    from tensegrity_engine.physics.params import PhysicalParameters

    thin = load_robot("three_bar")
    base = thin.replace(rod_radius=3.0 * thin.rod_radius)
    soft = base.replace(contact=dataclasses.replace(base.contact, law="soft"))
    robot = ZooRobot("thick_test", "", base, soft, Realisation(), SensorModel())
    ds.generate_dataset(base, "noncontact", tmp_path, counts={"train": 3, "val": 2}, seed=5, dense=False,
                        truth=robot, duration=2.0)
    train, heldout = (ds.load_split(tmp_path / "noncontact", s, robot=base) for s in ("train", "val"))
    penalty = Candidate((), PhysicalParameters(base, values={"cable_stiffness": 1.1 * base.cable_stiffness}),
                        np.ones(4), 0.0)
    found = Candidate(("soft_contact",), PhysicalParameters(soft, values={"cable_stiffness": 1.1 * base.cable_stiffness}),
                      np.ones(4), 0.0)
    cfg = IdentificationConfig(init="given", schedule="fine_only", lm_max_iters=8, max_seconds=120)
    assert refit_noncontact(StructureSelection(chosen=penalty, base=penalty, tried=[], horizon=1.0),
                            train, heldout, cfg) is None
    refit = refit_noncontact(StructureSelection(chosen=found, base=penalty, tried=[], horizon=1.0), train, heldout, cfg)
    assert refit.params.robot.contact.law == "soft"
    assert np.mean(refit.params.as_dict()["cable_stiffness"]) == pytest.approx(np.mean(base.cable_stiffness), rel=0.02)
    before = horizon_errors(found.params, [with_estimated_velocity(t) for t in heldout], (1.0,), stride=0.5)[1.0]
    assert refit.error < 0.5 * float(np.mean(before))


@pytest.fixture(scope="module")
def rolling_three_bar(tmp_path_factory):
    """Tuples of a three-bar rolling in MuJoCo (its default soft contacts)."""
    root = tmp_path_factory.mktemp("rolling")
    base = load_robot("three_bar")
    robot = ZooRobot("test", "", base, base, Realisation(), SensorModel())
    ds.generate_dataset(base, "contact", root, counts={"train": 2}, seed=4, dense=False,
                        truth=robot, duration=2.0, contact_commands="random")
    return ds.load_split(root / "contact", "train", robot=base)


def test_soft_law_training_starts_at_the_fine_step(rolling_three_bar):
    """Algorithm 1's coarse implicit stages apply the soft ground with the wrong mass at
    100 ms (and hold its time constant at two coarse steps): with the soft law on the floor
    the progressive schedule starts at the fine step (the stage change's searches see the
    data: mass with the cables, a winch speed), with the penalty law it does not; the
    schedules that are only coarse stages are refused."""
    from tensegrity_engine.identification.solvers.levenberg_marquardt import jacobian_mode
    from tensegrity_engine.identification.trainer import ProgressiveTrainer

    base = load_robot("three_bar")
    learn = ("cable_stiffness", "rod_mass", "actuator_max_speed", "contact")
    phases = {}
    for law in ("penalty", "soft"):
        robot = base.replace(contact=dataclasses.replace(base.contact, law=law))
        logs = []
        tr = ProgressiveTrainer(robot, IdentificationConfig(init="random", schedule="progressive", learn=learn),
                                log=logs.append)
        tr.set_data(rolling_three_bar, rolling_three_bar)
        phases[law] = (tr.schedule.phase, tr.schedule.dt, any("fine stage from the start" in m for m in logs),
                       jacobian_mode(tr.config, tr.objective))
    # the floor's Levenberg-Marquardt Jacobians: central differences over the penalty law's
    # kinks, one-sided ones over the soft law's jumps (without a floor: forward differences)
    assert phases["penalty"] == ("coarse", 0.1, False, "central")
    assert phases["soft"] == ("fine", base.dt, True, "one_sided")
    for schedule in ("implicit_only", "feedforward"):
        tr = ProgressiveTrainer(robot, IdentificationConfig(init="given", schedule=schedule))
        with pytest.raises(ValueError, match="penalty contact law"):
            tr.set_data(rolling_three_bar, rolling_three_bar)


def test_one_sided_differences_step_over_the_soft_laws_jumps(rolling_three_bar):
    """Soft-law tuples of a three-bar rolling in MuJoCo: central differences read the jumps
    where a contact opens within the step as slopes (some tuples' columns far off the
    forward-mode derivative), the default one-sided differences agree with forward mode on
    every tuple; so do they with the backward side taken only for the tuples whose forward
    difference looks like a jump (the solvers' way; here the jumps are on the backward
    side), at little more than half the rows."""
    from tensegrity_engine.identification.solvers.levenberg_marquardt import (jacobian_mode, parameter_jacobian,
                                                                              raw_vector)
    from tensegrity_engine.identification.trainer import ProgressiveTrainer

    base = load_robot("three_bar")
    train = rolling_three_bar
    soft = base.replace(contact=dataclasses.replace(base.contact, law="soft"))
    learn = ("cable_stiffness", "actuator_time_constant", "contact_time_constant", "contact_damping_ratio",
             "friction_sliding")
    jacobians = {}
    for mode in (None, "central", "forward"):
        tr = ProgressiveTrainer(soft, IdentificationConfig(init="given", schedule="fine_only", learn=learn, jacobian=mode))
        tr.set_data(train, train)
        if mode is None:
            assert jacobian_mode(tr.config, tr.objective) == "one_sided"
        idx = torch.arange(len(tr.train))
        theta0 = raw_vector(tr.params, tr.learn)
        residual_of = lambda p: tr.objective.residuals(tr.train, idx, p, tr.full_steps, "semi_implicit")  # noqa: E731
        with torch.no_grad():
            r0 = residual_of(tr.engine.param_values(torch.float64, "cpu"))
        J = parameter_jacobian(tr, theta0, residual_of, r0=r0, units=len(idx))
        jacobians[mode] = J.reshape(len(idx), -1, len(learn))
        if mode is None:
            rows = []

            def units_of(p, sub):
                rows.append(len(sub))
                r = tr.objective.residuals(tr.train, idx[sub], p, tr.full_steps, "semi_implicit")
                return r.reshape(len(sub), -1) * math.sqrt(len(sub) / len(idx))
            J = parameter_jacobian(tr, theta0, residual_of, r0=r0, units=len(idx), units_of=units_of)
            jacobians["checked"] = J.reshape(len(idx), -1, len(learn))
    exact = jacobians["forward"].norm(dim=1)                       # [tuples, P]
    off = lambda J: ((J - jacobians["forward"]).norm(dim=1) / exact.clamp(min=1e-12))   # noqa: E731
    assert float(off(jacobians[None]).max()) < 1e-2
    assert int((off(jacobians["central"]) > 1.0).sum()) >= 1
    assert float(off(jacobians["checked"]).max()) < 1e-2
    assert sum(rows) < 0.2 * len(idx) * len(learn)                # suspects' rows only, not all


def test_the_paired_verdict_reads_ratios_not_heavy_tailed_differences():
    """A candidate ~10x better on every window, with one window where the incumbent is far
    off: its absolute differences are heavy-tailed (the old test called it chance), the
    per-window log ratios are not. A candidate whose mean gain is one window's luck, worse
    on the others, is refused."""
    from tensegrity_engine.identification.structure import _paired_verdict

    rng = np.random.default_rng(0)
    best = rng.uniform(0.005, 0.015, 18)
    best[3] = 1.0                                       # one window far off for the incumbent
    cand = best / rng.uniform(8.0, 14.0, 18)
    cand[3] = 0.02
    ok, why = _paired_verdict(cand, best, 0.05, 2.0)
    assert ok, why
    diff = best - cand
    assert diff.mean() <= 2.0 * diff.std(ddof=1) / np.sqrt(len(diff))   # the differences alone: not significant
    lucky = best * rng.uniform(1.1, 1.5, 18)            # worse everywhere ...
    lucky[3] = 0.01                                     # ... but on the far-off window
    ok, why = _paired_verdict(lucky, best, 0.05, 2.0)
    assert not ok and "standard errors" in why, why
