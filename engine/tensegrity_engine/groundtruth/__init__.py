"""MuJoCo as the ground-truth robot: the model built from the robot YAML (``mujoco_twin``)
and the paper's environments and excitation (``environments``). Imports only physics."""
