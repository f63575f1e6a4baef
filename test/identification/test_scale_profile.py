"""The cables' force-scale profile (`identification.scale_profile`) behind the published sigma."""
import dataclasses
import math

import numpy as np
import pytest
import torch

import rolling_records
from tensegrity_engine.identification import acceptance, scale_profile, uncertainty
from tensegrity_engine.identification.scale_profile import PROFILE_FACTORS, PROFILE_SIGNIFICANCE


@pytest.fixture(scope="module")
def runs(superball):
    """The twin rolling (pose-only with 2 mm and 0.01 rad of mocap noise, at its true values)
    learning the cables and the motors' lag, and learning the cables and the rods' mass:
    scaling all three moves nothing. Noise-free, the rungs' held-out residuals are near zero
    and a refit's last digits decide their ratios (a true symmetry was rejected at 1 / 1.5
    by windows 0.6 % worse, t 2.05)."""
    out = {}
    for key, learn in (("lag", ("cable_stiffness", "cable_damping", "actuator_time_constant")),
                       ("mass", ("cable_stiffness", "cable_damping", "rod_mass"))):
        out[key], _ = rolling_records.rolling_twin_run(superball, seconds=6.0, pose_noise=(0.002, 0.01),
                                                       config=dict(learn=learn, scale_profile=True))
    return out


def test_a_scale_the_windows_determine_is_not_widened_and_a_symmetry_reaches_the_last_rung(runs, monkeypatch):
    """The motors' lag learnt beside the cables: the first rung each side fits the held-out
    windows significantly worse, so the profile adds nothing to the published sigma. The rods' mass
    learnt instead: the curvature's sigma is infinite already, so no profile is made; made
    all the same, every rung refits as well as the published values (forces and inertia
    scale together), the reach is the last rung each side and the published 2-sigma of every
    scaled value spans it; the trainer's values are left as they were."""
    lag = runs["lag"]
    before = lag.parameters.as_dict()
    u = uncertainty.trainer_uncertainty(lag)
    p = u.scale_profile
    assert p is not None and p.windows >= 3 and p.refit_windows >= 3
    assert p.factors == (1.0 / PROFILE_FACTORS[0], PROFILE_FACTORS[0])
    assert min(p.t) >= PROFILE_SIGNIFICANCE and p.reach == (1.0, 1.0) and p.spread == 1.0
    assert all(np.all(s == 0.0) for s in u.sigma_scale.values())
    assert lag.parameters.as_dict() == before and lag.learn == ("cable_stiffness", "cable_damping",
                                                                 "actuator_time_constant")

    mass = runs["mass"]
    values = {n: np.asarray(v) for n, v in mass.parameters.as_dict().items()}
    # the curvature flags the symmetry already (sigma inf): no profile could widen it
    u = uncertainty.trainer_uncertainty(mass)
    assert "cable_stiffness" in u.undetermined and np.all(np.isinf(u.published()["cable_stiffness"]))
    assert u.scale_profile is None and u.sigma_scale == {} and mass.scale_profile is None
    # made all the same, it finds the symmetry
    monkeypatch.setattr(uncertainty, "may_widen", lambda published, values: True)
    monkeypatch.setattr(mass, "scale_profile", None)        # the profile made below is dropped after the test
    u = uncertainty.trainer_uncertainty(mass)
    p = u.scale_profile
    top = PROFILE_FACTORS[-1]
    assert len(p.factors) == 2 * len(PROFILE_FACTORS) and max(p.t) < PROFILE_SIGNIFICANCE
    assert p.reach == pytest.approx((1.0 / top, top)) and p.spread == pytest.approx(top)
    # twice the sigma spans the farther reach: x top (the mass refitted, so nearly)
    for name in ("cable_stiffness", "cable_damping"):
        assert 2.0 * u.sigma_scale[name] == pytest.approx(values[name] * (top - 1.0), rel=1e-9)
    assert np.all(2.0 * u.sigma_scale["rod_mass"] >= 0.9 * values["rod_mass"] * (top - 1.0))
    # published: the rest's sigma, at least the profile's
    rest = dataclasses.replace(u, sigma_scale={}, scale_profile=None).published()
    for name, s in u.published().items():
        assert s == pytest.approx(np.maximum(rest[name], u.sigma_scale[name]))


def test_no_profile_unless_the_config_asks_for_one(runs, monkeypatch):
    """`IdentificationConfig.scale_profile` off (the default): no profile is made and the
    published sigma is the rest's."""
    run = runs["mass"]
    monkeypatch.setattr(run, "config", dataclasses.replace(run.config, scale_profile=False))
    monkeypatch.setattr(run, "scale_profile", None)
    u = uncertainty.trainer_uncertainty(run)
    assert u.scale_profile is None and u.sigma_scale == {} and run.scale_profile is None


def test_a_models_profile_is_kept_until_its_data_doubles(runs, monkeypatch):
    """The next estimate of the same model on the same data reuses the profile (scaled to its
    values); data that has doubled since makes it again unless both first rungs were
    rejected by `PROFILE_SETTLED` standard errors; other data makes it again."""
    run = runs["lag"]
    uncertainty.trainer_uncertainty(run)
    kept = run.scale_profile
    assert kept is not None and scale_profile.kept_profile(run) is kept[0]

    def not_again(*args, **kwargs):
        raise AssertionError("profiled again")

    monkeypatch.setattr(uncertainty, "profile_cable_scale", not_again)
    k = float(run.parameters.as_dict()["cable_stiffness"][0])
    u = uncertainty.trainer_uncertainty(run, at={**run.parameters.as_dict(), "cable_stiffness": [1.1 * k]})
    assert u.scale_profile is kept[0]
    # its reach is relative: the sigma is the kept move at the values asked about
    assert u.sigma_scale["cable_stiffness"] == pytest.approx(kept[0].moved["cable_stiffness"] * 1.1 * k / 2.0)
    profile, size, first, starts = kept
    # data doubled since: made again, unless both first rungs were rejected by a wide margin
    # (this one: t 4.3 and 4.5)
    assert profile.settled and min(profile.t) >= scale_profile.PROFILE_SETTLED
    monkeypatch.setattr(run, "scale_profile", (profile, len(run.train) // 2, first, starts))
    assert scale_profile.kept_profile(run) is profile
    for t in ((profile.t[0], 3.0), (3.0, profile.t[1])):
        near = dataclasses.replace(profile, t=t)
        assert not near.settled
        monkeypatch.setattr(run, "scale_profile", (near, len(run.train) // 2, first, starts))
        assert scale_profile.kept_profile(run) is None
    one_side = dataclasses.replace(profile, factors=profile.factors[1:], t=profile.t[1:])
    monkeypatch.setattr(run, "scale_profile", (one_side, len(run.train) // 2, first, starts))
    assert not one_side.settled and scale_profile.kept_profile(run) is None
    monkeypatch.setattr(run, "scale_profile", (profile, size, first, starts + 1.0))            # other data
    assert scale_profile.kept_profile(run) is None


def test_the_reach_is_interpolated_between_the_last_rung_kept_and_the_first_rejected(runs, monkeypatch):
    """Each side goes out rung by rung and stops at its first rejected rung; the reach lies
    where the test's t crosses `PROFILE_SIGNIFICANCE` between the last rung not rejected and
    that one; a first rung rejected leaves the side at 1 (the curvature holds inside it). A
    rung that fits every window better by the same ratio (t = -inf) is kept."""
    run = runs["lag"]
    verdicts = iter([-math.inf, 3.5, 4.0])      # below: the first rung kept, the second rejected; above: the first rejected
    monkeypatch.setattr(scale_profile, "_verdict", lambda base, point: next(verdicts))
    names = tuple(run.learn)
    from tensegrity_engine.identification.solvers.levenberg_marquardt import raw_vector
    theta0 = raw_vector(run.parameters, names)
    lm, refit = uncertainty._scratch_solver(run, 0) if run.window_lm.windows is None else (run.window_lm, False)
    info = lm.information_at(run, theta0, refit=refit)
    p = scale_profile.profile_cable_scale(run, lm, info["vel"], theta0)
    a1, a2 = math.log(PROFILE_FACTORS[0]), math.log(PROFILE_FACTORS[1])
    w = (PROFILE_SIGNIFICANCE - 0.0) / (3.5 - 0.0)       # from the kept rung's t, counted as 0 (no worse)
    assert p.factors == (1.0 / PROFILE_FACTORS[0], 1.0 / PROFILE_FACTORS[1], PROFILE_FACTORS[0])
    assert p.reach[0] == pytest.approx(math.exp(-(a1 + w * (a2 - a1)))) and p.reach[1] == 1.0
    k = float(run.parameters.as_dict()["cable_stiffness"][0])
    sigma = p.sigma({n: run.parameters.shared_value(n).detach().numpy() for n in names})
    assert sigma["cable_stiffness"] == pytest.approx([k * (1.0 - p.reach[0]) / 2.0], rel=1e-6)


def test_rungs_are_scored_on_windows_they_were_not_refitted_on(runs, monkeypatch):
    """Every rung's refit sees only its windows, and its verdict comes from others of the
    solver's: disjoint, at least three each, spread over the record; too few windows for both
    make no profile."""
    run = runs["lag"]
    refitted, scored = [], []
    refit, held = scale_profile._refit, scale_profile._held_rss

    def spy_refit(trainer, lm, free, iterations):
        refitted.append(lm.windows.clone())
        return refit(trainer, lm, free, iterations)

    def spy_held(trainer, windows, start):
        scored.append(windows.clone())
        return held(trainer, windows, start)

    monkeypatch.setattr(scale_profile, "_refit", spy_refit)
    monkeypatch.setattr(scale_profile, "_held_rss", spy_held)
    monkeypatch.setattr(run, "scale_profile", None)
    monkeypatch.setattr(uncertainty, "may_widen", lambda published, values: True)   # the earlier tests' latents widen it
    p = uncertainty.trainer_uncertainty(run).scale_profile
    assert p is not None and len(refitted) == len(scored) == 1 + len(p.factors)
    starts = lambda w: {int(i) for i in w[:, 0]}                     # noqa: E731
    assert not starts(refitted[0]) & starts(scored[0])
    assert len(refitted[0]) == p.refit_windows >= 3 and len(scored[0]) == p.windows >= 3
    assert all(starts(w) == starts(scored[0]) for w in scored)
    # both drawn from the solver's windows, in `_split`'s even subsets over the whole record
    solver = run.window_lm if run.window_lm.windows is not None else run.sigma_scratch[0]
    fit, held = scale_profile._split(len(solver.windows), scale_profile.PROFILE_WINDOWS,
                                     scale_profile.PROFILE_HELD_WINDOWS)
    assert torch.equal(refitted[0], solver.windows[torch.as_tensor(fit)])
    assert torch.equal(scored[0], solver.windows[torch.as_tensor(held)])
    assert fit[-1] == len(solver.windows) - 1 and held[-1] >= len(solver.windows) - 3
    assert scale_profile._split(5, 12, 24) is None and scale_profile._split(40, 12, 2) is None
    fit, rest = scale_profile._split(40, 12, 24)
    assert len(fit) == 12 and len(rest) == 24 and not set(fit) & set(rest) and fit[-1] == 39


def test_no_profile_where_the_published_sigma_already_spans_the_top_rung():
    """A profile's sigma reaches at most half the move to the top rung: where every cable
    force's element already has that (or an infinite) sigma, the refits are skipped; one
    element narrower, or a value the profile does not hold, decides nothing else."""
    top = PROFILE_FACTORS[-1]
    values = {"cable_stiffness": np.array([1000.0, 2000.0]), "cable_damping": np.array([50.0]),
              "actuator_time_constant": np.array([0.1])}
    wide = {"cable_stiffness": np.array([500.0, 1000.0]) * (top - 1.0), "cable_damping": np.array([np.inf]),
            "actuator_time_constant": np.array([1e-6])}
    assert not scale_profile.may_widen(wide, values)
    narrow = {**wide, "cable_stiffness": np.array([500.0, 990.0]) * (top - 1.0)}
    assert scale_profile.may_widen(narrow, values)
    assert scale_profile.may_widen({**wide, "cable_damping": np.array([24.0 * (top - 1.0)])}, values)
    assert not scale_profile.may_widen({"actuator_time_constant": np.array([1e-6])}, values)


def test_rungs_that_predict_the_same_tie_however_consistent_the_difference():
    """Held-out errors within `PROFILE_TIE` (mean log ratio) of the base's are a tie, t 0,
    though a paired test finds them consistently worse; beyond it the paired test decides."""
    rng = np.random.default_rng(0)
    base = rng.uniform(0.5, 2.0, 20)
    assert acceptance.log_ratio_gain(base, base * (1.0 + 1e-7 * rng.uniform(1.0, 2.0, 20))) > PROFILE_SIGNIFICANCE
    assert scale_profile._verdict(base, base * (1.0 + 1e-7 * rng.uniform(1.0, 2.0, 20))) == 0.0
    worse = base * np.exp(0.05 + 0.01 * rng.standard_normal(20))
    assert scale_profile._verdict(base, worse) == pytest.approx(acceptance.log_ratio_gain(base, worse))
    assert scale_profile._verdict(base, worse) > PROFILE_SIGNIFICANCE
    assert scale_profile._verdict(base, base * 1.01) > 1e6        # the same ratio everywhere
    # a window whose rollout did not finish rejects the rung, whichever way the rest lean
    assert scale_profile._verdict(base, np.where(np.arange(20) == 3, np.inf, base * 0.5)) == math.inf
    assert scale_profile._verdict(base, np.where(np.arange(20) == 3, np.nan, base * 0.5)) == math.inf
