"""Robots nobody tuned for: zoo entries drawn at random from a seed.

The zoo's nine robots have been looked at by everyone who changed the identifier; a change
that helps them can be fitted to them. A drawn robot (``random/<seed>``, `random_entry`) is
a zoo entry of the same form, every value far from the config's (each scale factor at least
`FAR` away, by up to `FARTHEST`, either way), its realisation and mocap drawn from the
mismatches the zoo knows (integrator, slack-cable damping, end-heavy rods, winch limits,
spring-driven rest lengths, contact dimensions and softness, payload, cable spread, mocap
noise, latency and lost frames), so a bench over seeds judges the product on robots that
nobody has seen. The same seed draws the same robot on every machine (numpy's PCG64).
"""
from __future__ import annotations

import math

import numpy as np

__all__ = ["RANDOM_PREFIX", "FAR", "FARTHEST", "random_entry"]

RANDOM_PREFIX = "random/"
FAR = 1.25          # every scaled value at least this factor from the config's
FARTHEST = 2.5      # and at most this
MASS_FARTHEST = 1.5  # rod mass: weighed by the user (the bench's default), so a milder range
SALT = 0x7E5E      # keeps these draws apart from other uses of small seeds
# the most cable damping per unit rod mass (over the config's) each explicit stepper is given,
# without and with slack-cable damping: the last that ran where the next diverged (below)
EXPLICIT_DAMPING_LIMIT = {False: {"Euler": 1.25, "RK4": 3.0}, True: {"Euler": 1.0, "RK4": 1.5}}


def _far(rng: np.random.Generator, farthest: float = FARTHEST) -> float:
    """A factor in [FAR, farthest] or its inverse range, log-uniform, either way at even odds."""
    magnitude = float(np.exp(rng.uniform(np.log(FAR), np.log(farthest))))
    return magnitude if rng.random() < 0.5 else 1.0 / magnitude


def random_entry(seed: int) -> dict:
    """A zoo entry (`config/zoo.yaml`'s form) drawn from ``seed``: every field the zoo knows,
    each mismatch present at the odds below, never the engine's twin."""
    rng = np.random.default_rng([SALT, int(seed)])
    entry: dict = {"scale": {"cable_stiffness": _far(rng), "cable_damping": _far(rng),
                             "rod_mass": _far(rng, MASS_FARTHEST), "actuator_time_constant": _far(rng)},
                   "friction_sliding": float(rng.uniform(0.4, 1.2))}
    if rng.random() < 0.3:
        entry["cable_spread"] = float(rng.uniform(0.05, 0.2))
    if rng.random() < 0.2:
        entry["payload"] = {"rod": int(rng.integers(0, 1 << 16)), "mass_fraction": float(rng.uniform(0.2, 0.8))}
    if rng.random() < 0.3:
        entry["radius_scale"] = float(rng.uniform(0.6, 1.3))
    realisation: dict = {"integrator": str(rng.choice(["Euler", "implicitfast", "RK4"])),
                         "slack_damping": bool(rng.random() < 0.4)}
    if rng.random() < 0.4:
        realisation["end_mass_fraction"] = float(rng.uniform(0.2, 0.6))
    kind = str(rng.choice(["filter", "filter", "motor", "spring_length"]))
    if kind == "motor":
        realisation["actuation"] = {"kind": "motor", "max_speed": float(rng.uniform(0.2, 1.0)),
                                    "deadband": float(rng.uniform(0.0, 0.002))}
    elif kind == "spring_length":
        realisation["actuation"] = {"kind": "spring_length"}
        realisation["slack_damping"] = True        # the tendon's damping acts always (`Actuation`)
    # MuJoCo steps tendon damping explicitly with Euler and RK4: a robot they cannot step is
    # no robot, so past their limit the draw takes a stabler stepper. Measured on the
    # SUPERball (5 s of random commands on the floor, the config's rod mass): Euler diverged
    # at 1.5x the config's cable damping (1.25x with slack-cable damping), RK4 at 4x (2x);
    # the zoo's Euler robot (end_heavy) has 0.43x per unit mass, the first draws that
    # diverged had 2.2x and 3.0x.
    limits = EXPLICIT_DAMPING_LIMIT[realisation["slack_damping"]]
    damping_per_mass = entry["scale"]["cable_damping"] / entry["scale"]["rod_mass"]
    if damping_per_mass > limits.get(realisation["integrator"], math.inf):
        realisation["integrator"] = "RK4" if damping_per_mass <= limits["RK4"] else "implicitfast"
    if realisation == {"integrator": "Euler", "slack_damping": False} and kind == "filter":
        # the engine's own equations: never the twin (its stepping is the mismatch left to draw)
        realisation["integrator"] = str(rng.choice(["implicitfast", "RK4"]))
    contact: dict = {}
    condim = int(rng.choice([3, 4, 6]))
    if condim != 3:
        contact["condim"] = condim
        contact["cone"] = str(rng.choice(["pyramidal", "elliptic"]))
    if rng.random() < 0.5:
        contact["solref"] = [float(rng.uniform(0.005, 0.04)), float(rng.uniform(0.6, 1.2))]
    if contact:
        realisation["contact"] = contact
    entry["realisation"] = realisation
    entry["sensing"] = {"position_noise": float(rng.uniform(0.0005, 0.003)), "rotation_noise": 0.0087,
                        "latency": float(rng.uniform(0.0, 0.03)), "jitter": float(rng.uniform(0.0, 0.003)),
                        "drop_rate": float(rng.uniform(0.0, 0.1))}
    parts = [f"{k} x{v:.2f}" for k, v in entry["scale"].items()]
    parts += [realisation["integrator"], f"{kind} actuation"]
    parts += [k for k in ("cable_spread", "payload", "radius_scale") if k in entry]
    parts += ["slack_damping"] if realisation["slack_damping"] else []
    parts += [f"end mass {realisation['end_mass_fraction']:.2f}"] if "end_mass_fraction" in realisation else []
    parts += [f"condim {condim}"] + (["solref " + "/".join(f"{v:.3g}" for v in contact["solref"])]
                                     if "solref" in contact else [])
    entry["description"] = "drawn: " + ", ".join(parts)
    return entry
