"""What would determine the values the data leaves undetermined (`identifiability`)."""
import dataclasses

import numpy as np
import pytest
import torch

from tensegrity_engine import identification as idf
from tensegrity_engine.identification import dataset as ds
from tensegrity_engine.identification.config import SPEC_BY_NAME
from tensegrity_engine.identification.identifiability import REVEALED_BY, excitation_advice, unfixed_force_scale
from tensegrity_engine.identification.uncertainty import gauss_newton_uncertainty, trainer_uncertainty, value_slopes
from tensegrity_engine.physics.params import PhysicalParameters

PERIOD = 0.02


def _uncertainty(robot, names, J, per_element=()):
    rng = np.random.default_rng(0)
    r = torch.as_tensor(0.01 * rng.standard_normal(J.shape[0]))
    return gauss_newton_uncertainty(PhysicalParameters(robot, per_element=per_element), names, torch.as_tensor(J), r)


def _columns(n=3, rows=200, seed=1):
    return np.random.default_rng(seed).standard_normal((rows, n))


def _per_scale(robot, names, per_element=()):
    """d raw / d log(factor) per raw element of ``names``: the raw step of multiplying each
    value by one factor (columns divided by it cancel along the force scale)."""
    params = PhysicalParameters(robot, per_element=per_element)
    values = torch.cat([params.shared_value(n).detach().reshape(-1) for n in names])
    return (values / value_slopes(params, names)).numpy()


def _scale_null(robot, names, rows=200, seed=1, per_element=()):
    """A Jacobian [rows, raw elements of names] whose only null direction is the force scale."""
    t = _per_scale(robot, names, per_element)
    J = np.random.default_rng(seed).standard_normal((rows, len(t)))
    J[:, -1] = -(J[:, :-1] * t[:-1]).sum(1) / t[-1]
    return J


def _rotated(u, seed):
    """``u`` with its weak basis turned by a random rotation (what eigh may return)."""
    labels = list(dict.fromkeys(lab for d in u.weak_directions for lab in d))
    B = np.array([[d.get(lab, 0.0) for d in u.weak_directions] for lab in labels])
    Q, _ = np.linalg.qr(np.random.default_rng(seed).standard_normal((B.shape[1], B.shape[1])))
    turned = B @ Q
    return dataclasses.replace(u, weak_directions=tuple({lab: float(c) for lab, c in zip(labels, col)}
                                                         for col in turned.T))


def test_every_learnable_parameter_has_the_motion_that_reveals_it():
    assert set(REVEALED_BY) == set(SPEC_BY_NAME)


def test_a_direction_that_scales_masses_and_forces_together_is_the_force_scale(superball):
    """A Jacobian whose only null direction multiplies K, c and m by one factor: the advice
    says that no motion determines it and what does."""
    names = ("cable_stiffness", "cable_damping", "rod_mass")
    u = _uncertainty(superball, names, _scale_null(superball, names))
    assert set(u.undetermined) == set(names)
    assert len(u.weak_directions) == 1
    advice = excitation_advice(u)
    assert len(advice) == 1 and advice[0].force_scale
    assert set(advice[0].names) == set(names)
    assert "weigh the rods" in advice[0].text and "no motion" in advice[0].text
    # stiffness and mass up with damping down is a trade-off that motion can separate
    a, b, _ = _columns().T
    other = _uncertainty(superball, names, np.stack([a, b, b - a], 1))
    advice = excitation_advice(other)
    assert len(other.weak_directions) == 1 and len(advice) == 1 and not advice[0].force_scale
    assert set(advice[0].names) == set(names) and "trade off" in advice[0].text


def test_the_advice_does_not_depend_on_the_basis_of_the_weak_directions(superball):
    """Two exact null directions at once, the force scale and actuator gain against offset:
    whichever basis of them eigh returns, the force scale and the gain / offset trade-off."""
    names = ("cable_stiffness", "cable_damping", "rod_mass", "actuator_gain", "actuator_offset")
    J = np.hstack([_scale_null(superball, names[:3]), _columns(2, seed=3)])
    J[:, 4] = -J[:, 3] * 0.7
    u = _uncertainty(superball, names, J)
    assert len(u.weak_directions) == 2
    for seed in range(5):
        advice = excitation_advice(_rotated(u, seed))
        assert [a.force_scale for a in advice] == [True, False], advice
        assert set(advice[0].names) == set(names[:3])
        assert set(advice[1].names) == {"actuator_gain", "actuator_offset"} and "trade off" in advice[1].text


def test_values_per_cable_and_per_rod_count_as_one_parameter(superball):
    """24 damping values against one time constant: both named, though each damping element
    holds a small share; the force scale over per-cable stiffness and damping and per-rod
    masses (54 elements) is still the force scale."""
    names = ("cable_damping", "actuator_time_constant", "cable_stiffness")
    per = ("cable_damping",)
    n = superball.num_cables
    J = np.random.default_rng(4).standard_normal((400, n + 2))
    J[:, n] = -J[:, :n].sum(1)
    u = _uncertainty(superball, names, J, per_element=per)
    advice = excitation_advice(u)
    assert len(advice) == 1 and set(advice[0].names) == {"cable_damping", "actuator_time_constant"}, advice
    names = ("cable_stiffness", "cable_damping", "rod_mass")
    per = ("cable_stiffness", "cable_damping", "rod_mass")
    u = _uncertainty(superball, names, _scale_null(superball, names, rows=400, per_element=per), per_element=per)
    assert len(u.weak_directions) == 1 and len(u.weak_directions[0]) == 2 * n + superball.num_rods
    advice = excitation_advice(u)
    assert len(advice) == 1 and advice[0].force_scale and set(advice[0].names) == set(names)


def test_masses_against_forces_or_forces_alone_are_not_the_force_scale(superball):
    """Stiffness up with mass down (columns a, a) is a trade-off the motion can separate,
    and so is stiffness against damping: neither is the force scale."""
    a, b, c = _columns().T
    for names, J in ((("cable_stiffness", "rod_mass", "cable_damping"), np.stack([a, a, b], 1)),
                     (("cable_stiffness", "cable_damping", "actuator_time_constant"), np.stack([a, -a, c], 1))):
        u = _uncertainty(superball, names, J)
        advice = excitation_advice(u)
        assert len(advice) == 1 and not advice[0].force_scale, names
        assert set(advice[0].names) == set(names[:2]), advice
        assert "trade off" in advice[0].text
        for n in names[:2]:
            assert REVEALED_BY[n] in advice[0].text


def test_a_parameter_the_data_never_touches_gets_its_own_motion(superball):
    """A zero column (sliding friction without contact): its own direction, with the motion
    that reveals it; a determined parameter gets no advice."""
    a, b, _ = _columns().T
    J = np.stack([a, b, np.zeros_like(a)], 1)
    u = _uncertainty(superball, ("cable_stiffness", "cable_damping", "friction_sliding"), J)
    assert u.undetermined == ("friction_sliding",)
    advice = excitation_advice(u)
    assert [a.names for a in advice] == [("friction_sliding",)]
    assert "sliding on the floor" in advice[0].text
    full = _uncertainty(superball, ("cable_stiffness", "cable_damping"), np.stack([a, b], 1))
    assert full.weak_directions == () and excitation_advice(full) == ()


@pytest.fixture(scope="module")
def hanging_tuples(tmp_path_factory, superball):
    root = tmp_path_factory.mktemp("identifiability")
    ds.generate_dataset(superball, "noncontact", root, counts={"train": 2}, duration=0.6, period=PERIOD,
                        seed=11, dense=False)
    return ds.tuples_from(ds.load_split(root / "noncontact", "train"), period=PERIOD)


def test_on_real_tuples_the_known_pushes_fix_the_scale_and_without_them_the_advice_says_weigh(
        superball, hanging_tuples):
    """Hanging data with its known pushes determine K, c and the rod mass; the same tuples
    without the pushes leave exactly the force scale undetermined, and the advice says so."""
    assert hanging_tuples.wrenches is not None and np.abs(hanging_tuples.wrenches).max() > 0
    learn = ("cable_stiffness", "cable_damping", "rod_mass")
    cfg = idf.IdentificationConfig(period=PERIOD, learn=learn, schedule="fine_only", init="given", seed=0)
    verdicts = {}
    for label, ts in (("pushed", hanging_tuples), ("unpushed", dataclasses.replace(hanging_tuples, wrenches=None))):
        tr = idf.ProgressiveTrainer(superball, cfg, log=lambda m: None)
        tr.set_data(ts)
        u = trainer_uncertainty(tr)
        verdicts[label] = (u.undetermined, excitation_advice(u))
    assert verdicts["pushed"] == ((), ())
    undetermined, advice = verdicts["unpushed"]
    assert set(undetermined) == set(learn)
    assert len(advice) == 1 and advice[0].force_scale and set(advice[0].names) == set(learn)


def test_masses_learnt_with_every_acting_force_have_no_scale_without_a_known_force():
    """The cables' values with the mass: unfixed; a cable value kept (a data sheet's) fixes
    it; under the penalty law its contact stiffness and damping (newtons) do too where
    contact can act, unless they are learnt; the soft law's contact values (per unit mass)
    never do."""
    km = ("cable_stiffness", "cable_damping", "rod_mass")
    assert unfixed_force_scale(km + ("actuator_time_constant", "cable_slack_damping"), "soft") == km
    assert unfixed_force_scale(km + ("contact_time_constant",), "soft") == km
    assert unfixed_force_scale(km, "penalty") == ()
    assert unfixed_force_scale(km, "penalty", contact_acts=False) == km       # no floor, rods never touch
    penalty = km + ("contact_stiffness", "contact_damping")
    assert unfixed_force_scale(penalty, "penalty") == penalty
    assert unfixed_force_scale(("cable_stiffness", "rod_mass"), "soft") == ()
    assert unfixed_force_scale(("cable_stiffness", "cable_damping"), "soft") == ()
    # a load cell's tension is a known force
    assert unfixed_force_scale(km, "soft", measured_force=True) == ()
    assert unfixed_force_scale(penalty, "penalty", measured_force=True) == ()



@pytest.mark.parametrize("per_element", [(), ("rod_mass", "cable_stiffness")])
def test_the_force_scale_direction_is_one_factor_on_every_mass_and_force(superball, per_element):
    """`force_scale` against a finite difference: every learnt mass, stiffness and damping
    times 1 + eps, the raw step in the column-scaled units; rods weighed unequal (one shared
    raw value scaled per rod) and values per element alike, the time constant untouched."""
    from tensegrity_engine.identification.solvers.levenberg_marquardt import raw_vector
    from tensegrity_engine.identification.uncertainty import element_labels, force_scale_direction

    masses = np.linspace(8.0, 12.0, superball.num_rods)
    names = ("cable_stiffness", "rod_mass", "actuator_time_constant", "cable_damping")
    params = PhysicalParameters(superball, {"rod_mass": masses}, per_element=per_element)
    d = torch.as_tensor(np.random.default_rng(5).uniform(0.5, 2.0, raw_vector(params, names).numel()))
    before = raw_vector(params, names)
    eps = 1e-6
    for n in ("cable_stiffness", "rod_mass", "cable_damping"):
        params.set_value(n, np.asarray(params.as_dict()[n]) * (1 + eps))
    step = (d * (raw_vector(params, names) - before)).numpy()
    params = PhysicalParameters(superball, {"rod_mass": masses}, per_element=per_element)
    f = force_scale_direction(params, names, d)
    labels = element_labels(params, names)
    expected = step / np.linalg.norm(step)
    got = np.array([f.get(lab, 0.0) for lab in labels])
    np.testing.assert_allclose(got, expected, atol=1e-5)
    assert not any(lab.startswith("actuator") for lab in f)


def test_a_time_constant_pinned_at_its_lower_bound_points_to_cables_that_differ(superball):
    """`structure_hints`: the motors' time constant at its lower bound (as a shared stiffness
    fitted to cables that spread drives it) names per-cable values; at its upper bound, or
    another value at a bound, nothing is claimed; a value inside its range gives none."""
    from tensegrity_engine.identification.identifiability import BOUND_HINTS, structure_hints
    from tensegrity_engine.identification.uncertainty import bound_sides

    spec = PhysicalParameters(superball).specs["actuator_time_constant"]
    names = ("actuator_time_constant", "cable_stiffness")
    low = PhysicalParameters(superball, {"actuator_time_constant": [spec.lower * 1.0001]})
    assert bound_sides(low, "actuator_time_constant") == ("lower",)
    hints = structure_hints(low, names)
    assert hints == (BOUND_HINTS[("actuator_time_constant", "lower")],) and "per_element" in hints[0]
    high = PhysicalParameters(superball, {"actuator_time_constant": [spec.upper * 0.9999]})
    assert bound_sides(high, "actuator_time_constant") == ("upper",) and structure_hints(high, names) == ()
    stiff = PhysicalParameters(superball, {"cable_stiffness": [PhysicalParameters(superball).specs["cable_stiffness"]
                                                               .lower * 1.0001]})
    assert bound_sides(stiff, "cable_stiffness") == ("lower",) and structure_hints(stiff, names) == ()
    assert structure_hints(PhysicalParameters(superball), names) == ()
