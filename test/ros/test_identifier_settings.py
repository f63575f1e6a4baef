"""What the identifier node identifies: its learn and per_element settings checked at start-up."""
import dataclasses

import pytest

from tensegrity_engine.identification.config import NONCONTACT_PARAMS
from tensegrity_engine.physics.params import PhysicalParameters
from tensegrity_ros.identifier_node import declare_identification, make_session
from tensegrity_ros.params import ConfigurationError, file_declarer


def test_the_identifier_leaves_the_rod_mass_out_of_its_default_learn_and_refuses_it_asked(superball):
    """Without a floor the trainer's default learns the rod mass with the cables (offline
    data carries known pushes); the node's topics carry none, so its session learns the rest
    with the rods as weighed, and an explicit request for all three is a start-up error."""
    assert {"rod_mass", "cable_stiffness", "cable_damping"} <= set(NONCONTACT_PARAMS)
    setting = declare_identification(file_declarer({"floor": False}))
    session = make_session(superball, setting, "cpu", log=lambda m: None)
    assert "rod_mass" not in session.config.learn and "cable_stiffness" in session.config.learn
    setting = declare_identification(file_declarer({"floor": False, "learn": ["cable_stiffness", "cable_damping",
                                                                               "rod_mass"]}))
    with pytest.raises(ConfigurationError, match="scale together"):
        make_session(superball, setting, "cpu", log=lambda m: None)
    # with the cables' load cells fitted, their tensions fix the scale: all three are learnt
    setting = declare_identification(file_declarer({"floor": False, "tension_weight": 5e-4, "learn": [
        "cable_stiffness", "cable_damping", "rod_mass"]}))
    assert "rod_mass" in make_session(superball, setting, "cpu", log=lambda m: None).config.learn


def test_per_element_values_are_learnt_per_cable_and_must_be_learnt(superball):
    """per_element reaches the session's trainer config (one stiffness per cable); a name
    that is not learnt is a start-up error naming it."""
    setting = declare_identification(file_declarer({"learn": ["cable_stiffness", "cable_damping"],
                                                    "per_element": ["cable_stiffness"]}))
    session = make_session(superball, setting, "cpu", log=lambda m: None)
    assert session.config.per_element == ("cable_stiffness",)
    assert declare_identification(file_declarer({}))["config"].per_element == ()
    setting = declare_identification(file_declarer({"learn": ["cable_stiffness"], "per_element": ["cable_damping"]}))
    with pytest.raises(ConfigurationError, match="per_element: cable_damping not learnt"):
        make_session(superball, setting, "cpu", log=lambda m: None)


def test_the_rod_mass_stays_in_the_default_learn_where_a_known_contact_force_may_act(three_bar):
    """A penalty-law robot's contact stiffness (newtons, not learnt) fixes the scale where
    rods may touch, so its default learn keeps the mass; with rod contacts off, nothing does."""
    assert three_bar.contact.law == "penalty" and three_bar.contact.rod_rod
    setting = declare_identification(file_declarer({"floor": False}))
    kept = make_session(three_bar, setting, "cpu", log=lambda m: None).config.learn
    assert kept is None and "rod_mass" in NONCONTACT_PARAMS           # the trainer's default, mass included
    apart = three_bar.replace(contact=dataclasses.replace(three_bar.contact, rod_rod=False))
    learnt = make_session(apart, setting, "cpu", log=lambda m: None).config.learn
    assert "rod_mass" not in learnt and "cable_stiffness" in learnt


def test_per_element_is_checked_against_what_is_learnt_in_the_end(superball):
    """The mass left out of the default learn cannot be split; a value with one entry for
    the whole robot cannot either."""
    setting = declare_identification(file_declarer({"floor": False, "per_element": ["rod_mass"]}))
    with pytest.raises(ConfigurationError, match="per_element: rod_mass not learnt"):
        make_session(superball, setting, "cpu", log=lambda m: None)
    setting = declare_identification(file_declarer({"learn": ["cable_stiffness", "actuator_time_constant"],
                                                    "per_element": ["actuator_time_constant"]}))
    with pytest.raises(ConfigurationError, match="one value for the whole robot"):
        make_session(superball, setting, "cpu", log=lambda m: None)


def test_by_default_a_penalty_law_robot_has_its_ground_law_chosen_by_its_data(superball, three_bar):
    """The node's default structure options give a robot under the penalty law (the schema's
    default) a soft-law challenger once the gate can judge, on the floor only; under the soft
    law, or off the floor, the first challenger is a fresh start of the windowed stage;
    ['none'] keeps the YAML's structure."""
    setting = declare_identification(file_declarer({}))
    assert setting["structure_options"] == ["soft_contact", "long_windows", "fresh_start"]
    for robot, floor, expected in ((three_bar, True, "soft_contact"), (superball, True, "fresh_start"),
                                   (three_bar, False, "fresh_start")):
        session = make_session(robot, declare_identification(file_declarer({"floor": floor})), "cpu",
                               log=lambda m: None)
        assert session.trials.next_option(100, session.robot, session.floor) == expected, (robot.name, floor)
    session = make_session(three_bar, declare_identification(file_declarer({"structure_options": ["none"]})), "cpu",
                           log=lambda m: None)
    assert session.trials.next_option(100, session.robot, session.floor) is None
    # a pin that points to missing structure is followed unless structure_on_pin is off
    pinned = (("actuator_time_constant", "lower"),)
    learnt = ("cable_stiffness", "cable_damping", "actuator_time_constant")
    assert session.trials.next_option(100, superball, True, learnt, pinned=pinned) == "per_cable_stiffness"
    off = make_session(three_bar, declare_identification(file_declarer({"structure_options": ["none"],
                                                                        "structure_on_pin": False})), "cpu",
                       log=lambda m: None)
    assert off.trials.next_option(100, superball, True, learnt, pinned=pinned) is None


def test_an_option_the_model_cannot_be_fitted_in_is_refused_not_raised(three_bar):
    """The default soft_contact option on a penalty-law robot whose schedule takes only
    implicit steps (the soft law's ground needs the fine step): its challenger cannot be
    built; that refuses the option (tried again on twice the held-out data) instead of
    failing the session's step at every epoch."""
    import types

    session = make_session(three_bar, declare_identification(file_declarer({"schedule": "implicit_only"})), "cpu",
                           log=lambda m: None)
    trials, logged = session.trials, []

    def factory(*args):
        raise ValueError("this model cannot take the schedule's steps")

    fake = types.SimpleNamespace(
        trainer=types.SimpleNamespace(learn=("cable_stiffness",), config=session.config,
                                      parameters=PhysicalParameters(session.robot)),
        can_judge=True, heldout_total=40, robot=session.robot, floor=True, fixed_rods=(), config=session.config,
        config_robot=session.robot, trainer_factory=factory, device="cpu", log=logged.append,
        window_tuples=lambda: None)
    trials.maybe_start(fake)
    assert not trials.active and trials.refused == {"soft_contact": 40}
    assert trials.log[-1][0] == "soft_contact" and "failed to start" in trials.log[-1][1]
    # (no fresh start: an implicit-only schedule has no windowed stage)
    assert trials.next_option(79, session.robot, True, windows_from=None) is None
    assert trials.next_option(80, session.robot, True, windows_from=None) == "soft_contact"


def test_the_settle_test_reaches_the_solver_and_a_bad_value_is_refused(superball):
    """lm_settle_sigmas (the windowed solver's convergence in its values' sigma) is the
    engine's default unless set, set reaches the session's trainer config, and a negative
    value is a start-up error naming it."""
    from tensegrity_engine.identification import IdentificationConfig

    assert declare_identification(file_declarer({}))["config"].lm_settle_sigmas == IdentificationConfig().lm_settle_sigmas
    setting = declare_identification(file_declarer({"lm_settle_sigmas": 0.0}))
    assert make_session(superball, setting, "cpu", log=lambda m: None).config.lm_settle_sigmas == 0.0
    with pytest.raises(ConfigurationError, match="lm_settle_sigmas"):
        declare_identification(file_declarer({"lm_settle_sigmas": -0.5}))


def test_the_latent_jacobian_reuse_reaches_the_solver_and_zero_is_refused(superball):
    """latent_jacobian_reuse is the engine's default unless set, set reaches the session's
    trainer config, and a reuse below one iteration is a start-up error naming it."""
    from tensegrity_engine.identification import IdentificationConfig

    default = declare_identification(file_declarer({}))["config"].latent_jacobian_reuse
    assert default == IdentificationConfig().latent_jacobian_reuse
    setting = declare_identification(file_declarer({"latent_jacobian_reuse": 1}))
    assert make_session(superball, setting, "cpu", log=lambda m: None).config.latent_jacobian_reuse == 1 != default
    with pytest.raises(ConfigurationError, match="latent_jacobian_reuse"):
        declare_identification(file_declarer({"latent_jacobian_reuse": 0}))


def test_latent_restarts_are_off_unless_set_and_a_set_count_reaches_the_solver(superball):
    """latent_restart_every is the engine's default (0: never) unless set, set reaches the
    session's trainer config, and a negative count is a start-up error naming it."""
    from tensegrity_engine.identification import IdentificationConfig

    default = declare_identification(file_declarer({}))["config"].latent_restart_every
    assert default == IdentificationConfig().latent_restart_every == 0
    setting = declare_identification(file_declarer({"latent_restart_every": 3}))
    assert make_session(superball, setting, "cpu", log=lambda m: None).config.latent_restart_every == 3
    with pytest.raises(ConfigurationError, match="latent_restart_every"):
        declare_identification(file_declarer({"latent_restart_every": -1}))


def test_the_held_out_store_is_sized_in_blocks_and_a_store_too_small_to_judge_is_refused(superball):
    """By default the gate keeps 20 blocks of 1 s at any pose rate (100 Hz poses: 2 000
    tuples); a count that cannot hold the 3 blocks the gate needs is a start-up error."""
    fast = declare_identification(file_declarer({"interval": 0.01}))
    assert make_session(superball, fast, "cpu", log=lambda m: None).max_holdout == 2000
    setting = declare_identification(file_declarer({"interval": 0.01, "max_holdout": 200}))
    with pytest.raises(ConfigurationError, match="keep at least 300"):
        make_session(superball, setting, "cpu", log=lambda m: None)
    setting = declare_identification(file_declarer({"max_holdout": 200}))
    assert make_session(superball, setting, "cpu", log=lambda m: None).max_holdout == 200
