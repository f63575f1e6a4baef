"""What would determine the values the data leaves undetermined (`identifiability`)."""
import dataclasses

import numpy as np
import pytest
import torch

from tensegrity_engine import identification as idf
from tensegrity_engine.identification import dataset as ds
from tensegrity_engine.identification.config import SPEC_BY_NAME
from tensegrity_engine.identification.identifiability import REVEALED_BY, excitation_advice, unfixed_force_scale
from tensegrity_engine.identification.uncertainty import gauss_newton_uncertainty, trainer_uncertainty
from tensegrity_engine.physics.params import PhysicalParameters

PERIOD = 0.02


def _uncertainty(robot, names, J):
    rng = np.random.default_rng(0)
    r = torch.as_tensor(0.01 * rng.standard_normal(J.shape[0]))
    return gauss_newton_uncertainty(PhysicalParameters(robot), names, torch.as_tensor(J), r)


def _columns(n=3, rows=200, seed=1):
    return np.random.default_rng(seed).standard_normal((rows, n))


def test_every_learnable_parameter_has_the_motion_that_reveals_it():
    assert set(REVEALED_BY) == set(SPEC_BY_NAME)


def test_a_direction_that_scales_masses_and_forces_together_is_the_force_scale(superball):
    """Columns a, b, -(a + b): only K, c and m moving up together leave the residuals
    unchanged. The advice says that no motion determines it and what does."""
    a, b, _ = _columns().T
    J = np.stack([a, b, -(a + b)], 1)
    u = _uncertainty(superball, ("cable_stiffness", "cable_damping", "rod_mass"), J)
    assert set(u.undetermined) == {"cable_stiffness", "cable_damping", "rod_mass"}
    assert len(u.weak_directions) == 1
    advice = excitation_advice(u.weak_directions)
    assert len(advice) == 1 and advice[0].force_scale
    assert set(advice[0].names) == {"cable_stiffness", "cable_damping", "rod_mass"}
    assert "weigh the rods" in advice[0].text and "no motion" in advice[0].text


def test_masses_against_forces_or_forces_alone_are_not_the_force_scale(superball):
    """Stiffness up with mass down (columns a, a) is a trade-off the motion can separate,
    and so is stiffness against damping: neither is the force scale."""
    a, b, c = _columns().T
    for names, J in ((("cable_stiffness", "rod_mass", "cable_damping"), np.stack([a, a, b], 1)),
                     (("cable_stiffness", "cable_damping", "actuator_time_constant"), np.stack([a, -a, c], 1))):
        u = _uncertainty(superball, names, J)
        advice = excitation_advice(u.weak_directions)
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
    advice = excitation_advice(u.weak_directions)
    assert [a.names for a in advice] == [("friction_sliding",)]
    assert "sliding on the floor" in advice[0].text
    full = _uncertainty(superball, ("cable_stiffness", "cable_damping"), np.stack([a, b], 1))
    assert full.weak_directions == () and excitation_advice(full.weak_directions) == ()


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
        verdicts[label] = (u.undetermined, excitation_advice(u.weak_directions))
    assert verdicts["pushed"] == ((), ())
    undetermined, advice = verdicts["unpushed"]
    assert set(undetermined) == set(learn)
    assert len(advice) == 1 and advice[0].force_scale and set(advice[0].names) == set(learn)


def test_masses_learnt_with_every_acting_force_have_no_scale_without_a_known_force():
    """The cables' values with the mass: unfixed; a cable value kept (a data sheet's) fixes
    it; on a floor under the penalty law its contact stiffness and damping (newtons) do too,
    unless they are learnt; the soft law's contact values (per unit mass) never do."""
    km = ("cable_stiffness", "cable_damping", "rod_mass")
    assert unfixed_force_scale(km + ("actuator_time_constant",), "soft", True) == km
    assert unfixed_force_scale(km + ("contact_time_constant",), "soft", True) == km
    assert unfixed_force_scale(km, "penalty", False) == km
    assert unfixed_force_scale(km, "penalty", True) == ()
    assert unfixed_force_scale(km + ("contact_stiffness", "contact_damping"), "penalty", True) \
        == km + ("contact_stiffness", "contact_damping")
    assert unfixed_force_scale(("cable_stiffness", "rod_mass"), "soft", True) == ()
    assert unfixed_force_scale(("cable_stiffness", "cable_damping"), "soft", True) == ()
