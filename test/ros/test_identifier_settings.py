"""What the identifier node identifies: its learn and per_element settings checked at start-up."""
import pytest

from tensegrity_engine.identification.config import NONCONTACT_PARAMS
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
