"""Whole rollouts replayed as one CUDA graph.

On a GPU a planning rollout is launch-bound: every engine step is dozens of small kernels
(a few after torch.compile), each paying microseconds of launch overhead for microseconds of
work, a thousand steps per rollout. `CapturedRollout` records the whole rollout of one input
shape once (``torch.cuda.CUDAGraph``) and replays it with a single launch; inputs are copied
into the graph's static buffers and outputs copied out, so callers see an ordinary function.

On a device without graphs (the CPU) nothing is captured: the same buffered path runs the
rollout directly, so the CPU tests cover everything but the capture itself.
"""
from __future__ import annotations

from typing import Optional

import torch

# Steps a CUDA graph can hold: the implicit ones call torch.linalg.solve, whose error check
# synchronises with the host, and ANI picks its sub-step count at run time.
GRAPH_INTEGRATORS = ("semi_implicit",)


class CapturedRollout:
    """No-grad ``engine.rollout`` of fixed shapes, replayed from a CUDA graph on CUDA.

    One graph per (shapes, dtype, device, dt, record_every, parameter shapes); parameters
    are inputs like the state (copied in per call), so a new model needs no new capture.
    ``compile_step`` captures the torch.compile'd step (fewer, fused kernels per step).
    """

    WARMUP = 2            # eager runs on a side stream before capture, as torch requires

    def __init__(self, engine, *, integrator: Optional[str] = None, compile_step: bool = False):
        self.engine = engine
        self.integrator = engine.robot.integrator if integrator is None else integrator
        if self.integrator not in GRAPH_INTEGRATORS:
            raise ValueError(f"a CUDA graph holds {GRAPH_INTEGRATORS} rollouts, not {self.integrator!r}")
        self.compile_step = bool(compile_step)
        self._entries: dict = {}
        self.captures = 0      # graphs recorded (tests and diagnostics)

    def _run(self, inputs: dict, dt: float, record_every: int):
        return self.engine.rollout(inputs["state"], inputs["act"], inputs["commands"], dt,
                                   integrator=self.integrator, wrenches=inputs.get("wrenches"),
                                   params=inputs["params"], record_every=record_every, compile=self.compile_step)

    @torch.no_grad()
    def __call__(self, state: torch.Tensor, act: torch.Tensor, commands: torch.Tensor, dt: float, *,
                 params: dict, record_every: int = 1, wrenches: Optional[torch.Tensor] = None):
        """(states [..., S // record_every, R, 13], acts [..., S // record_every, A]) as
        ``engine.rollout`` returns them (fresh tensors, not the graph's buffers)."""
        given = {"state": state, "act": act, "commands": commands}
        if wrenches is not None:
            given["wrenches"] = wrenches
        key = (tuple((k, tuple(v.shape), v.dtype, str(v.device)) for k, v in given.items()),
               tuple((k, tuple(v.shape), v.dtype) for k, v in sorted(params.items())), float(dt), int(record_every))
        entry = self._entries.get(key)
        if entry is None:
            entry = self._entries[key] = self._build(given, params, dt, record_every)
        for name, value in given.items():
            entry["inputs"][name].copy_(value)
        for name, value in params.items():
            entry["inputs"]["params"][name].copy_(value)
        if entry["graph"] is not None:
            entry["graph"].replay()
            outputs = entry["outputs"]
        else:
            outputs = self._run(entry["inputs"], dt, record_every)
        return tuple(o.clone() for o in outputs)

    def _build(self, given: dict, params: dict, dt: float, record_every: int) -> dict:
        inputs = {k: v.detach().clone() for k, v in given.items()}
        inputs["params"] = {k: v.detach().clone() for k, v in params.items()}
        entry = {"inputs": inputs, "graph": None, "outputs": None}
        if given["state"].device.type != "cuda":
            return entry
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(self.WARMUP):
                self._run(inputs, dt, record_every)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            entry["outputs"] = self._run(inputs, dt, record_every)
        entry["graph"] = graph
        self.captures += 1
        return entry
