"""IdentifiedParameters from the network: a forged or malformed message never becomes a
planning model; each rejection names its reason (the controller counts it)."""
import dataclasses
import math

import numpy as np
import pytest

pytest.importorskip("tensegrity_ros_interfaces.msg", reason="ROS 2 message packages not importable")

from tensegrity_engine.physics.params import ParameterError, PhysicalParameters  # noqa: E402
from tensegrity_ros import conversions as conv  # noqa: E402


def _msg(robot, **per_element):
    p = PhysicalParameters(robot, per_element=tuple(per_element))
    for name, value in per_element.items():
        p.set_value(name, value)
    return conv.params_to_msg(p, robot.name, 0)


def test_round_trip_keeps_every_value(three_bar):
    k = np.linspace(800.0, 1200.0, three_bar.num_cables)
    got = conv.msg_to_params(_msg(three_bar, cable_stiffness=k), three_bar).as_dict()
    np.testing.assert_allclose(got["cable_stiffness"], k, rtol=1e-12)
    assert got["rod_mass"] == pytest.approx(PhysicalParameters(three_bar).as_dict()["rod_mass"])


def test_the_values_come_in_the_structure_they_were_fitted_in(three_bar):
    """An integrator and a soft-law contact dimensionality adopted online travel with the
    values; a message without them (an older publisher) keeps the consumer's own."""
    import dataclasses

    soft = three_bar.replace(contact=dataclasses.replace(three_bar.contact, law="soft", condim=6))
    fitted = soft.replace(integrator="implicitfast",
                          contact=dataclasses.replace(soft.contact, condim=4))
    msg = conv.params_to_msg(PhysicalParameters(fitted), soft.name, 0)
    assert (msg.integrator, msg.contact_condim) == ("implicitfast", 4)
    got = conv.msg_to_params(msg, soft).robot
    assert (got.integrator, got.contact.soft_condim) == ("implicitfast", 4)
    old = _forge(conv.params_to_msg(PhysicalParameters(fitted), soft.name, 0), integrator="", contact_condim=0)
    got = conv.msg_to_params(old, soft).robot
    assert (got.integrator, got.contact.soft_condim) == (soft.integrator, 6)
    assert conv.params_to_msg(PhysicalParameters(three_bar), three_bar.name, 0).contact_condim == 0


def test_a_soft_law_model_of_a_penalty_law_robot_comes_under_the_soft_law(three_bar):
    """`soft_contact` adopted online: the message's contact dimensionality says the soft
    law, and the consumer plans with its solref (the published values), not the penalty law."""
    from tensegrity_engine.identification.online_structure import structure_robot

    assert three_bar.contact.law == "penalty"
    fitted = PhysicalParameters(structure_robot(three_bar, ("soft_contact",)))
    fitted.set_value("contact_time_constant", 0.013)
    msg = conv.params_to_msg(fitted, three_bar.name, 0)
    assert msg.contact_condim == fitted.robot.contact.soft_condim > 0
    got = conv.msg_to_params(msg, three_bar)
    assert got.robot.contact.law == "soft" and got.robot.contact.soft_condim == msg.contact_condim
    assert got.as_dict()["contact_time_constant"][0] == pytest.approx(0.013)


def _forge(msg, **changes):
    for key, value in changes.items():
        setattr(msg, key, value)
    return msg


def _set(msg, name, value):
    values = list(msg.values)
    values[list(msg.names).index(name)] = value
    msg.values = values
    return msg


def _squeeze(msg, name):
    """Bounds a few ulps wide around a value just above the lower bound: log(hi) == log(lo)."""
    i = list(msg.names).index(name)
    lo = float(msg.lower_bounds[i])
    values, highs = list(msg.values), list(msg.upper_bounds)
    values[i], highs[i] = np.nextafter(lo, np.inf), np.nextafter(np.nextafter(lo, np.inf), np.inf)
    msg.values, msg.upper_bounds = values, highs
    return msg


def _rename(msg, old, new):
    msg.names = [new if n == old else n for n in msg.names]
    return msg


FORGERIES = {
    "wrong_robot": lambda m, r: _forge(m, robot_name="superball"),
    "negative_stiffness": lambda m, r: _set(m, "cable_stiffness", -1000.0),
    "huge_mass": lambda m, r: _set(m, "rod_mass", 1e30),
    "nan": lambda m, r: _set(m, "cable_damping", float("nan")),
    "inf": lambda m, r: _set(m, "actuator_time_constant", float("inf")),
    "more_names_than_values": lambda m, r: _forge(m, values=list(m.values)[:-1]),
    "unknown_name": lambda m, r: _forge(m, names=list(m.names)[:-1] + ["warp_drive"]),
    "unparsable_name": lambda m, r: _forge(m, names=["cable_stiffness[x]"] + list(m.names)[1:]),
    "duplicate_name": lambda m, r: _forge(m, names=[m.names[1]] + list(m.names)[1:]),
    "index_gap": lambda m, r: _rename(_msg(r, rod_mass=[5.0, 6.0, 7.0]), "rod_mass[1]", "rod_mass[5]"),
    "widened_bounds": lambda m, r: _forge(m, lower_bounds=[-1e40] * len(m.names)),
    "bounds_length": lambda m, r: _forge(m, upper_bounds=[1.0]),
    "degenerate_bounds": lambda m, r: _squeeze(m, "cable_stiffness"),
    "partial_model": lambda m, r: _forge(m, names=list(m.names)[1:], values=list(m.values)[1:],
                                         lower_bounds=list(m.lower_bounds)[1:],
                                         upper_bounds=list(m.upper_bounds)[1:]),
    "empty": lambda m, r: _forge(m, names=[], values=[], lower_bounds=[], upper_bounds=[]),
    "unknown_integrator": lambda m, r: _forge(m, integrator="warp"),
    "unknown_condim": lambda m, r: _forge(m, contact_condim=5),
}
REASON = {"wrong_robot": "wrong_robot", "negative_stiffness": "out_of_bounds", "huge_mass": "out_of_bounds",
          "nan": "non_finite", "inf": "non_finite", "more_names_than_values": "wrong_length",
          "unknown_name": "unknown_name", "unparsable_name": "bad_name", "duplicate_name": "duplicate_name",
          "index_gap": "wrong_length", "widened_bounds": "bad_bounds", "bounds_length": "wrong_length",
          "degenerate_bounds": "bad_bounds", "partial_model": "missing_name", "empty": "missing_name",
          "unknown_integrator": "bad_structure", "unknown_condim": "bad_structure"}


@pytest.mark.parametrize("kind", sorted(FORGERIES))
def test_forged_parameters_are_rejected_with_their_reason(three_bar, kind):
    msg = FORGERIES[kind](_msg(three_bar), three_bar)
    with pytest.raises(ParameterError) as err:
        conv.msg_to_params(msg, three_bar)
    assert err.value.reason == REASON[kind]


def test_per_element_values_need_one_per_element(three_bar):
    from tensegrity_engine.physics.params import checked_parameters

    with pytest.raises(ParameterError, match="expected 1 or 3") as err:
        checked_parameters(three_bar, {"rod_mass": [1.0, 2.0]})
    assert err.value.reason == "wrong_length"
    ok = checked_parameters(three_bar, {"rod_mass": [1.0, 2.0, 3.0]})
    np.testing.assert_allclose(ok.as_dict()["rod_mass"], [1.0, 2.0, 3.0])


def test_weighed_rods_travel_per_rod_and_a_shared_sigma_scales_with_each(three_bar):
    """A config with weighed rods (one twice as heavy): its model is published per rod, the
    consumer's planning model has the same masses, and the mean's 1-sigma reaches each rod
    in proportion to its mass."""
    from tensegrity_engine.identification.uncertainty import ParameterUncertainty
    masses = np.asarray(three_bar.rod_mass, dtype=float).copy()
    masses[0] *= 2.0
    weighed = three_bar.replace(rod_mass=masses)
    p = PhysicalParameters(weighed)
    p.set_value("rod_mass", 1.1 * masses.mean())                      # identified: 10 % heavier
    u = ParameterUncertainty(sigma={"rod_mass": np.array([0.05 * masses.mean()])}, undetermined=(),
                             residual_sigma=1.0, dof=10)
    msg = conv.params_to_msg(p, weighed.name, 0, uncertainty=u.flat(p))
    assert [n for n in msg.names if n.startswith("rod_mass")] == [f"rod_mass[{i}]" for i in range(len(masses))]
    got = conv.msg_to_params(msg, weighed).as_dict()["rod_mass"]
    np.testing.assert_allclose(got, 1.1 * masses, rtol=1e-12)
    np.testing.assert_allclose(conv.msg_to_sigmas(msg)["rod_mass"], 0.05 * masses, rtol=1e-12)
    assert u.relative(p)["rod_mass"] == pytest.approx(0.05 / 1.1)


def test_uncertainty_travels_with_the_values_and_bad_sigmas_are_refused(three_bar):
    p = PhysicalParameters(three_bar, per_element=("cable_stiffness",))
    names, _ = p.flat()
    sigma = [12.0 if n.startswith("cable_stiffness[") else float("nan") for n in names]
    sigma[names.index("rod_mass")] = float("inf")                      # undetermined
    msg = conv.params_to_msg(p, three_bar.name, 0, uncertainty=sigma)
    got = conv.msg_to_sigmas(msg)
    np.testing.assert_array_equal(got["cable_stiffness"], np.full(three_bar.num_cables, 12.0))
    assert np.isinf(got["rod_mass"]).all() and np.isnan(got["cable_damping"]).all()
    assert conv.msg_to_sigmas(conv.params_to_msg(p, three_bar.name, 0)) == {}   # none published
    with pytest.raises(ValueError):
        conv.params_to_msg(p, three_bar.name, 0, uncertainty=sigma[:-1])
    for forged in (sigma[:-1], [-1.0] * len(sigma)):
        msg.uncertainty = forged
        with pytest.raises(ParameterError):
            conv.msg_to_sigmas(msg)


def test_converged_is_published_only_when_every_sigma_is_narrow(three_bar):
    """A solver that converged on too little excitation says "fitted ...: keep exciting",
    naming the parameters still too uncertain (the controller keeps exciting)."""
    from types import SimpleNamespace

    from tensegrity_engine.identification.uncertainty import ParameterUncertainty
    from tensegrity_ros.identifier_node import not_yet_determined

    values = PhysicalParameters(three_bar).as_dict()
    k, c = float(values["cable_stiffness"][0]), float(values["cable_damping"][0])

    def node(sigma_k, sigma_c, undetermined=(), converged_sigma=0.05):
        u = ParameterUncertainty(sigma={"cable_stiffness": np.array([sigma_k]), "cable_damping": np.array([sigma_c])},
                                 undetermined=undetermined, residual_sigma=1.0, dof=10)
        session = SimpleNamespace(uncertainty=lambda max_tuples, at: u)
        return SimpleNamespace(converged_sigma=converged_sigma, sigma_tuples=64, session=session, robot=three_bar,
                               trainer=SimpleNamespace(learn=("cable_stiffness", "cable_damping")))

    assert not_yet_determined(node(0.01 * k, 0.01 * c), values) == ()
    assert not_yet_determined(node(0.2 * k, 0.01 * c), values) == ("cable_stiffness",)
    assert not_yet_determined(node(0.01 * k, np.inf, ("cable_damping",)), values) == ("cable_damping",)
    assert not_yet_determined(node(0.2 * k, 0.2 * c, converged_sigma=0.0), values) == ()   # test off
    none = node(0, 0)
    none.session = SimpleNamespace(uncertainty=lambda max_tuples, at: None)                 # no sigma: not sure
    assert not_yet_determined(none, values) == ("cable_stiffness", "cable_damping")
    # a winch limit is not waited for, reached or not (its sigma is one-sided); the others are
    limited = node(0.01 * k, 0.01 * c)
    limited.trainer.learn += ("actuator_max_speed",)
    u = limited.session.uncertainty(64, values)
    for sigma_k, unreached, undetermined, expected in ((0.01 * k, (), (), ()),
                                                       (0.01 * k, ("actuator_max_speed",), (), ()),
                                                       (0.01 * k, (), ("actuator_max_speed",), ()),
                                                       (0.2 * k, ("actuator_max_speed",), (), ("cable_stiffness",))):
        limited.session.uncertainty = (lambda v: lambda max_tuples, at: v)(dataclasses.replace(
            u, sigma={**u.sigma, "cable_stiffness": np.array([sigma_k]), "actuator_max_speed": np.array([np.inf])},
            unreached=unreached, undetermined=undetermined))
        assert not_yet_determined(limited, values) == expected, (unreached, undetermined)


def test_a_refused_fit_is_never_published_as_done():
    """The schedule ended but the gate kept the model in use: its stage must not end the
    controller's excitation (it would plan with a model that is not the one that converged)."""
    from tensegrity_ros.common import DONE_WORDS
    from tensegrity_ros.identifier_node import refused_stage

    for status in ("converged", "final (Levenberg-Marquardt iteration limit)", "Converged"):
        stage = refused_stage(status)
        assert "refused by the hold-out gate" in stage and "keep exciting" in stage
        assert not any(w in stage.lower() for w in DONE_WORDS), stage


def test_a_refused_fit_that_is_the_published_model_again_is_done(three_bar):
    """The finished fit lost to the published model on held-out data and sits within 2 sigma
    of it: the published model is the converged one. Anything else (an unstable fit, one
    outside 2 sigma, a wide sigma, nothing published yet) keeps exciting."""
    from types import SimpleNamespace

    from tensegrity_engine.identification.uncertainty import ParameterUncertainty
    from tensegrity_ros.identifier_node import ties_published

    published = PhysicalParameters(three_bar).as_dict()
    k, c = (float(published[n][0]) for n in ("cable_stiffness", "cable_damping"))

    def node(sigma_k=0.01 * k, sigma_c=0.01 * c, undetermined=()):
        u = ParameterUncertainty(sigma={"cable_stiffness": np.array([sigma_k]), "cable_damping": np.array([sigma_c])},
                                 undetermined=undetermined, residual_sigma=1.0, dof=10)
        session = SimpleNamespace(uncertainty=lambda max_tuples, at: u, robot=three_bar, incumbent_robot=three_bar,
                                  config_robot=three_bar.replace(cable_damping=three_bar.cable_damping * 1.5))
        return SimpleNamespace(converged_sigma=0.05, sigma_tuples=64, session=session,
                               trainer=SimpleNamespace(learn=("cable_stiffness", "cable_damping")))

    def fit(dk, dc):
        return {**published, "cable_stiffness": np.array([k * (1 + dk)]), "cable_damping": np.array([c * (1 + dc)])}

    tie = SimpleNamespace(reason="not_significant")
    assert ties_published(node(), tie, fit(0.015, -0.01), published)
    off = node()
    assert not ties_published(off, tie, fit(0.03, 0.0), published)                    # 3 sigma off
    assert off.tie_verdict == "cable_stiffness 3.0 sigma from the published value"
    wide = node(sigma_c=0.06 * c)
    assert not ties_published(wide, tie, fit(0.0, 0.0), published)
    assert wide.tie_verdict.startswith("cable_damping's 1-sigma 6.0 %")
    # the groups' scatter widens the published sigma (closeness), not the test of determined
    scatter = node()
    u = scatter.session.uncertainty(64, published)
    spread = {**u.sigma, "cable_damping": np.array([0.08 * c])}
    scatter.session.uncertainty = lambda max_tuples, at: dataclasses.replace(u, sigma_spread=spread)
    assert ties_published(scatter, tie, fit(0.0, 0.1), published), scatter.tie_verdict   # 1.25 published sigma
    assert not ties_published(scatter, tie, fit(0.0, 0.2), published)
    assert scatter.tie_verdict == "cable_damping 2.5 sigma from the published value"
    # a value pinned at a bound voids the published sigma: nothing to be close in
    pinned = node()
    pinned.session.uncertainty = lambda max_tuples, at: dataclasses.replace(u, at_bound=("cable_stiffness",))
    assert not ties_published(pinned, tie, fit(0.0, 0.0), published)
    assert pinned.tie_verdict.startswith("cable_stiffness pinned at a bound")
    assert ties_published(node(), SimpleNamespace(reason="worse"), fit(0.01, 0.01), published)
    assert not ties_published(node(), SimpleNamespace(reason="unstable"), fit(0.0, 0.0), published)
    assert not ties_published(node(), SimpleNamespace(reason="worse"), fit(0.0, 0.03), published)
    config_in_use = node()
    assert not ties_published(config_in_use, tie, fit(0.0, 0.0), None)
    assert config_in_use.tie_verdict == "nothing published yet"
    assert not ties_published(node(sigma_c=0.2 * c), tie, fit(0.0, 0.0), published)   # not determined yet
    assert not ties_published(node(undetermined=("cable_damping",)), tie, fit(0.0, 0.0), published)
    # the sigma is the converged fit's, not the published values' (an earlier candidate's,
    # which carries their distance to the current optimum)
    at_fit = node()
    narrow, broad = at_fit.session.uncertainty(64, published), node(sigma_k=0.3 * k).session.uncertainty(64, published)
    fitted = fit(0.01, 0.0)
    at_fit.session.uncertainty = lambda max_tuples, at: narrow if at is fitted else broad
    assert ties_published(at_fit, tie, fitted, published)
    at_fit.session.uncertainty = lambda max_tuples, at: broad if at is fitted else narrow
    assert not ties_published(at_fit, tie, fitted, published)
    assert at_fit.tie_verdict.startswith("cable_stiffness's 1-sigma 29.7 % of the fitted value")
    # a winch limit (sigma one-sided: here inf) does not stand in the way; the others still do
    limited = node()
    limited.trainer.learn += ("actuator_max_speed",)
    u = limited.session.uncertainty(64, published)
    inf_speed = {**u.sigma, "actuator_max_speed": np.array([np.inf])}
    limited.session.uncertainty = lambda max_tuples, at: dataclasses.replace(u, sigma=inf_speed)
    assert ties_published(limited, tie, fit(0.015, -0.01), published)
    assert not ties_published(limited, tie, fit(0.03, 0.0), published)
    limited.session.uncertainty = lambda max_tuples, at: dataclasses.replace(u, sigma=inf_speed,
                                                                             undetermined=("actuator_max_speed",))
    assert ties_published(limited, tie, fit(0.015, -0.01), published)
    # the config's values, published with an earlier refused finish, are not a converged model
    n = node()
    n.session.config_robot = three_bar
    assert not ties_published(n, tie, fit(0.0, 0.0), published)


def test_the_published_sigma_includes_the_groups_scatter_and_convergence_does_not(three_bar):
    """The message carries sigma_spread where there is one (the groups disagree: model
    mismatch that varies with the motion), sigma otherwise; the convergence test judges the
    estimate's own sigma."""
    from types import SimpleNamespace

    from tensegrity_engine.identification.uncertainty import ParameterUncertainty
    from tensegrity_ros.identifier_node import not_yet_determined, published_uncertainty

    params = PhysicalParameters(three_bar)
    values = params.as_dict()
    k = float(values["cable_stiffness"][0])
    names, _ = params.flat()
    for spread, expected in (({"cable_stiffness": np.array([0.3 * k])}, 0.3 * k), ({}, 0.01 * k)):
        u = ParameterUncertainty(sigma={"cable_stiffness": np.array([0.01 * k])}, undetermined=(), residual_sigma=1.0,
                                 dof=10, sigma_spread=spread)
        node = SimpleNamespace(sigma_tuples=64, session=SimpleNamespace(uncertainty=lambda max_tuples, at: u),
                               diag=SimpleNamespace(count=lambda *a: None, warn_throttled=lambda *a: None),
                               undetermined=(), converged_sigma=0.05, robot=three_bar,
                               trainer=SimpleNamespace(learn=("cable_stiffness",)))
        flat = published_uncertainty(node, params, values)
        assert flat[names.index("cable_stiffness")] == pytest.approx(expected)
        assert np.isnan(flat[names.index("cable_damping")])
        assert not_yet_determined(node, values) == ()                  # 1 %: converged either way


def _warning_node(robot):
    """(the robot's config parameters, their values, their flat names, a stand-in identifier
    node for `published_uncertainty`, the warnings it gives)."""
    from types import SimpleNamespace

    params = PhysicalParameters(robot)
    warnings = []
    node = SimpleNamespace(sigma_tuples=64, undetermined=(), at_bound=(), robot=robot,
                           diag=SimpleNamespace(count=lambda *a: None, warn_throttled=lambda *a: warnings.append(a)))
    return params, params.as_dict(), params.flat()[0], node, warnings


def test_a_value_pinned_at_its_bound_is_warned_about_once_and_in_the_diagnostics(three_bar):
    """The data pushed a value against its bound: the node says so (a warning naming it and
    what to do, once while it stays so; the `at_bound` diagnostic). A motor's, cable's or
    rod's value pinned makes every value a compensation: published with no sigma (inf), the
    `uncertainty` diagnostic saying why; a ground contact value pinned keeps the sigma."""
    from types import SimpleNamespace

    from tensegrity_engine.identification.uncertainty import ParameterUncertainty
    from tensegrity_ros.identifier_node import published_uncertainty

    params, values, names, node, warnings = _warning_node(three_bar)
    for at_bound, sigma in ((("actuator_time_constant",), math.inf), (("actuator_time_constant",), math.inf),
                            ((), 0.001), (("contact_damping",), 0.001)):
        u = ParameterUncertainty(sigma={"actuator_time_constant": np.array([0.001])}, undetermined=(),
                                 residual_sigma=1.0, dof=10, at_bound=at_bound)
        node.session = SimpleNamespace(uncertainty=lambda max_tuples, at: u)
        flat = published_uncertainty(node, params, values)
        assert flat[names.index("actuator_time_constant")] == pytest.approx(sigma)
        assert node.at_bound == at_bound
        assert node.sigma_state == ("estimated" if sigma < math.inf else
                                    "inf: actuator_time_constant pinned at a bound, every value compensates")
    assert len(warnings) == 2 and warnings[0][0] == warnings[1][0] == "at_bound"
    assert "published with no sigma (inf)" in warnings[0][1] and "no sigma" not in warnings[1][1]
    assert "actuator_time_constant" in warnings[0][1] and "--structure" in warnings[0][1]
    assert "per_element" not in warnings[0][1]             # the config's time constant is inside its range
    # published at its lower bound: the warning says which structure does that
    lower = params.specs["actuator_time_constant"].lower
    low = PhysicalParameters(three_bar, {"actuator_time_constant": [lower * 1.0001]})
    pinned = SimpleNamespace(**{**vars(node), "at_bound": ()})
    u = ParameterUncertainty(sigma={"actuator_time_constant": np.array([0.001])}, undetermined=(),
                             residual_sigma=1.0, dof=10, at_bound=("actuator_time_constant",))
    pinned.session = SimpleNamespace(uncertainty=lambda max_tuples, at: u)
    published_uncertainty(pinned, low, low.as_dict())
    assert "per_element: [cable_stiffness]" in warnings[-1][1]
    # pinned again, then the estimate for newer values fails: its flags are not theirs
    node.session = SimpleNamespace(uncertainty=lambda max_tuples, at: u)
    u = ParameterUncertainty(sigma={"actuator_time_constant": np.array([0.001])}, undetermined=("cable_damping",),
                             residual_sigma=1.0, dof=10, at_bound=("actuator_time_constant",),
                             sigma_structure={"actuator_time_constant": np.array([0.01])})     # moves with the horizon
    published_uncertainty(node, params, values)
    assert node.at_bound and node.undetermined and node.structure_suspect and node.sigma_state.startswith("inf")
    node.session = SimpleNamespace(uncertainty=lambda max_tuples, at: None)
    assert published_uncertainty(node, params, values) is None
    assert node.at_bound == node.undetermined == node.structure_suspect == () and node.sigma_state == "failed"
    node.session = SimpleNamespace(uncertainty=lambda max_tuples, at: u)   # flags again, then sigma turned off
    published_uncertainty(node, params, values)
    assert node.structure_suspect
    node.sigma_tuples = 0
    assert published_uncertainty(node, params, values) is None
    assert node.at_bound == node.structure_suspect == () and node.sigma_state.startswith("off")


def test_an_undetermined_value_is_warned_about_with_what_would_determine_it(three_bar):
    """The warning and the `excite` diagnostic say which motion determines an undetermined
    value (`identifiability`), that no motion determines the force scale, and are cleared
    with the estimate."""
    from types import SimpleNamespace

    from tensegrity_engine.identification.identifiability import REVEALED_BY
    from tensegrity_engine.identification.uncertainty import ParameterUncertainty
    from tensegrity_ros.identifier_node import published_uncertainty

    params = PhysicalParameters(three_bar)
    values = params.as_dict()
    warnings = []
    node = SimpleNamespace(sigma_tuples=64, undetermined=(), at_bound=(), structure_suspect=(), robot=three_bar,
                           diag=SimpleNamespace(count=lambda *a: None, warn_throttled=lambda *a: warnings.append(a)))
    inf = np.array([np.inf])
    friction = ParameterUncertainty(sigma={"friction_sliding": inf}, undetermined=("friction_sliding",),
                                    residual_sigma=1.0, dof=10, weak_directions=({"friction_sliding": 1.0},))
    node.session = SimpleNamespace(uncertainty=lambda max_tuples, at: friction)
    published_uncertainty(node, params, values)
    assert node.excite.startswith("friction_sliding") and REVEALED_BY["friction_sliding"] in node.excite
    assert len(warnings) == 1 and warnings[0][0] == "undetermined" and node.excite in warnings[0][1]
    third = 1.0 / np.sqrt(3.0)
    scale = ParameterUncertainty(sigma={n: inf for n in ("cable_stiffness", "cable_damping", "rod_mass")},
                                 undetermined=("cable_stiffness", "cable_damping", "rod_mass"), residual_sigma=1.0,
                                 dof=10, weak_directions=({"cable_stiffness": third, "cable_damping": third,
                                                           "rod_mass": third},),
                                 force_scale={"cable_stiffness": third, "cable_damping": third, "rod_mass": third})
    node.session = SimpleNamespace(uncertainty=lambda max_tuples, at: scale)
    published_uncertainty(node, params, values)
    assert "weigh the rods" in node.excite and "weigh the rods" in warnings[-1][1]
    node.session = SimpleNamespace(uncertainty=lambda max_tuples, at: None)
    assert published_uncertainty(node, params, values) is None
    assert node.excite == "" and node.undetermined == ()


def test_a_schedule_ended_by_a_limit_keeps_the_excitation_while_sigma_is_wide(three_bar):
    """An iteration or time limit ends the schedule with "final (...)", a word the controller
    takes for done: said only when every sigma is narrow; otherwise "keep exciting"."""
    from types import SimpleNamespace

    from tensegrity_engine.identification.uncertainty import ParameterUncertainty
    from tensegrity_ros.identifier_node import end_stage

    values = PhysicalParameters(three_bar).as_dict()
    k = float(values["cable_stiffness"][0])

    def node(rel):
        u = ParameterUncertainty(sigma={"cable_stiffness": np.array([rel * k])}, undetermined=(),
                                 residual_sigma=1.0, dof=10)
        return SimpleNamespace(converged_sigma=0.05, sigma_tuples=64, robot=three_bar,
                               session=SimpleNamespace(uncertainty=lambda max_tuples, at: u),
                               trainer=SimpleNamespace(learn=("cable_stiffness",)))

    done_words = ("converged", "done", "final")
    for status in ("final (Levenberg-Marquardt iteration limit)", "converged"):
        wide = end_stage(node(0.2), status, values)
        assert "keep exciting" in wide and not any(w in wide for w in done_words), wide
        assert end_stage(node(0.01), status, values) == status
    assert end_stage(node(0.2), "training", values) == "training"
    # a spent budget, or a session that never resumes: more excitation buys nothing
    spent = "final (epoch/time limit reached)"
    assert end_stage(node(0.2), spent, values) == spent
    closed = node(0.2)
    closed.session.reopen_tuples = 0
    assert end_stage(closed, "final (Levenberg-Marquardt iteration limit)", values).startswith("final")


def test_an_undetermined_lag_split_is_warned_about_and_published_with_the_mirrors_sigma(three_bar):
    """The training windows cannot tell the motors' time constant from the cables' lag c/k
    (`lag_split`): the node warns, naming both lags and what fixes them, and publishes the
    sigma that reaches the mirror; a determined split adds neither."""
    from types import SimpleNamespace

    from tensegrity_engine.identification.lag_split import LagSplit
    from tensegrity_engine.identification.uncertainty import ParameterUncertainty
    from tensegrity_ros.identifier_node import published_uncertainty

    params, values, names, node, warnings = _warning_node(three_bar)
    base = ParameterUncertainty(sigma={"actuator_time_constant": np.array([0.001])}, undetermined=(),
                                residual_sigma=1.0, dof=10)
    for t, sigma in ((0.5, 0.03), (6.0, 0.0)):
        split = LagSplit(0.05, 0.02, {}, 0.01, t, 30)
        u = dataclasses.replace(base, lag_split=split,
                                sigma_split={"actuator_time_constant": np.array([sigma])} if sigma else {})
        node.session = SimpleNamespace(uncertainty=lambda max_tuples, at: u)
        flat = published_uncertainty(node, params, values)
        assert flat[names.index("actuator_time_constant")] == pytest.approx(np.hypot(0.001, sigma))
    assert len(warnings) == 1 and warnings[0][0] == "lag_split"
    assert "50.0 ms" in warnings[0][1] and "20.0 ms" in warnings[0][1] and "step response" in warnings[0][1]
