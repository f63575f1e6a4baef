"""Cable actuators: command -> rest length (first-order filter, gain/offset calibration)."""
from __future__ import annotations

import torch

from tensegrity_engine.physics.topology import Topology

TIMINGS = ("start", "mean")


def actuator_update(act: torch.Tensor, command: torch.Tensor, tau: torch.Tensor, h):
    """Exact first-order filter over a step with held command.

    Returns (act at the end of the step, act averaged over the step).
    """
    decay = torch.exp(-h / tau)
    gap = act - command
    end = command + gap * decay
    mean = command + gap * (tau / h) * (1.0 - decay)
    return end, mean


class CableActuators:
    """Filtered commands ``act`` [..., A] and the rest lengths [..., C] they set.

    ``timing`` "start": a step's force uses the activation at the start of the step, like a
    motor loop and MuJoCo (actearly=false). "mean": the exact average of the filter over the
    step, better for coarse steps.
    """

    def __init__(self, topology: Topology, timing: str = "start"):
        if timing not in TIMINGS:
            raise ValueError(f"actuator_timing must be 'start' or 'mean', got {timing!r}")
        self.topology = topology
        self.timing = timing

    def initial_act(self, like: torch.Tensor) -> torch.Tensor:
        """Filtered commands that reproduce the config rest lengths (nominal calibration)."""
        robot = self.topology.robot
        act = torch.as_tensor(robot.cable_rest_length[robot.actuated_indices],
                              dtype=like.dtype, device=like.device)
        return act.expand(*like.shape[:-2], act.shape[-1]).clone()

    def clamp_command(self, command: torch.Tensor) -> torch.Tensor:
        k = self.topology.constants(command.dtype, command.device)
        return torch.maximum(torch.minimum(command, k["command_high"]), k["command_low"])

    def rest_lengths(self, act: torch.Tensor, p: dict) -> torch.Tensor:
        """[..., C] rest lengths from filtered commands [..., A]."""
        k = self.topology.constants(act.dtype, act.device)
        actuated = p["actuator_gain"] * act + p["actuator_offset"]
        passive = k["passive_rest"].expand(*act.shape[:-1], -1)
        return torch.cat([actuated, passive], -1).index_select(-1, k["rest_gather"])

    def advance(self, act: torch.Tensor, command: torch.Tensor, p: dict, h):
        """Filter ``act`` over a step h under the held (clamped) command.

        Returns (act at the end of the step, the rest lengths the step's forces use).
        """
        act_end, act_mean = actuator_update(act, command, p["actuator_time_constant"], h)
        return act_end, self.rest_lengths(act if self.timing == "start" else act_mean, p)
