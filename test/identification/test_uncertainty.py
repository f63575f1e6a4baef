"""1-sigma of identified values and the parameters data cannot determine."""
import dataclasses

import numpy as np
import pytest
import torch

from tensegrity_engine import identification as idf
from tensegrity_engine.identification import dataset as ds
from tensegrity_engine.identification.solvers.levenberg_marquardt import raw_vector
from tensegrity_engine.identification.uncertainty import (element_mean_sigma, elements_covered,
                                                         gauss_newton_uncertainty, horizon_shift, trainer_uncertainty,
                                                         value_slopes)
from tensegrity_engine.physics.params import PhysicalParameters

PERIOD = 0.02
LEARN = ("cable_stiffness", "cable_damping", "actuator_time_constant", "rod_mass")


@pytest.fixture(scope="module")
def sigma_data(tmp_path_factory, superball):
    root = tmp_path_factory.mktemp("sigma")
    ds.generate_dataset(superball, "noncontact", root, counts={"train": 2, "val": 1, "test": 1},
                        duration=0.6, period=PERIOD, seed=11, dense=False)
    return {s: ds.load_split(root / "noncontact", s) for s in ("train", "val")}


@pytest.fixture(scope="module")
def clean_tuples(sigma_data):
    return {s: ds.tuples_from(v, period=PERIOD) for s, v in sigma_data.items()}


def _noisy(ts, scale, seed):
    """Targets X_t+T with sensor-like noise: 1 mm and 1 cm/s per unit ``scale``."""
    rng = np.random.default_rng(seed)
    x1 = ts.x1.copy()
    x1[..., 0:3] += 1e-3 * scale * rng.standard_normal(x1[..., 0:3].shape)
    x1[..., 7:13] += 1e-2 * scale * rng.standard_normal(x1[..., 7:13].shape)
    return dataclasses.replace(ts, x1=x1)


def _identified(robot, train, val, learn=LEARN):
    cfg = idf.IdentificationConfig(period=PERIOD, learn=learn, schedule="fine_only", init="given",
                                   lm_max_iters=6, val_tuples=16, patience=2, seed=0)
    tr = idf.ProgressiveTrainer(robot, cfg, log=lambda m: None)
    tr.set_data(train, val)
    tr.run()
    return tr


def test_sigma_covers_the_error_and_grows_with_the_noise(superball, clean_tuples):
    """On data of the exact model with added noise the identified values lie within 3 sigma
    of the truth, sigma is a small fraction of each value (5 % per mm of noise), and it
    scales with the noise."""
    truth = PhysicalParameters(superball).as_dict()
    sig = {}
    for scale in (1.0, 4.0):
        tr = _identified(superball, _noisy(clean_tuples["train"], scale, 1), clean_tuples["val"])
        u = trainer_uncertainty(tr)
        assert u.undetermined == ()
        got = tr.parameters.as_dict()
        for name in LEARN:
            err = abs(got[name][0] - truth[name][0])
            assert err > 0                                          # the noise moved it
            assert err < 3.0 * u.sigma[name][0], (scale, name, err, u.sigma[name])
            assert u.sigma[name][0] < 0.05 * scale * truth[name][0], (scale, name, u.sigma[name])
        sig[scale] = np.array([u.sigma[n][0] for n in LEARN])
        flat = u.flat(tr.parameters)
        names, _ = tr.parameters.flat()
        assert len(flat) == len(names)
        assert np.isnan(flat[names.index("friction_sliding")])      # not identified: no sigma
    ratio = sig[4.0] / sig[1.0]
    assert np.all((ratio > 2.5) & (ratio < 6.0)), ratio


def test_a_parameter_the_data_does_not_touch_is_undetermined(superball, clean_tuples):
    """Sliding friction from hanging data (no contact anywhere): flagged, sigma inf; the
    others keep finite sigmas."""
    tr = _identified(superball, _noisy(clean_tuples["train"], 1.0, 2), clean_tuples["val"],
                     learn=LEARN + ("friction_sliding",))
    u = trainer_uncertainty(tr)
    assert u.undetermined == ("friction_sliding",)
    assert np.isinf(u.sigma["friction_sliding"]).all()
    assert all(np.isfinite(u.sigma[n]).all() for n in LEARN)


def test_a_limit_the_data_never_reach_is_unreached_not_undetermined(superball, clean_tuples):
    """A winch speed limit above anything these commands ask for acts on none of the data:
    sigma inf, yet not an excitation problem (`unreached`); one that binds has a finite sigma.
    A zero column of an ordinary parameter stays undetermined."""
    tr = _identified(superball, _noisy(clean_tuples["train"], 1.0, 2), clean_tuples["val"],
                     learn=LEARN + ("actuator_max_speed",))
    u = trainer_uncertainty(tr)
    assert u.unreached == ("actuator_max_speed",) and u.undetermined == ()
    assert np.isinf(u.sigma["actuator_max_speed"]).all()
    assert not any("actuator_max_speed" in d for d in u.weak_directions)     # nothing to excite for it
    assert all(np.isfinite(u.sigma[n]).all() for n in LEARN)
    tr.parameters.set_value("actuator_max_speed", np.array([0.05]))        # m/s: binds on these commands
    u = trainer_uncertainty(tr)
    assert u.unreached == () and np.isfinite(u.sigma["actuator_max_speed"]).all()
    params = PhysicalParameters(superball)
    rng = np.random.default_rng(1)
    J = torch.as_tensor(np.hstack([rng.standard_normal((50, 1)), np.zeros((50, 2))]))
    r = torch.as_tensor(0.01 * rng.standard_normal(50))
    u = gauss_newton_uncertainty(params, ("cable_stiffness", "friction_sliding", "actuator_max_speed"), J, r)
    assert u.undetermined == ("friction_sliding",) and u.unreached == ("actuator_max_speed",)


def test_two_parameters_only_their_sum_matters_are_both_undetermined(superball):
    """A direction in which two columns cancel (here: two identical Jacobian columns) is
    unconstrained: both parameters flagged, a third, independent one keeps its sigma."""
    params = PhysicalParameters(superball)
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((200, 1)), rng.standard_normal((200, 1))
    b -= a * (a[:, 0] @ b[:, 0]) / (a[:, 0] @ a[:, 0])                        # independent of a
    J = torch.as_tensor(np.hstack([a, a, b]))
    r = torch.as_tensor(0.01 * rng.standard_normal(200))
    u = gauss_newton_uncertainty(params, ("cable_stiffness", "cable_damping", "rod_mass"), J, r)
    assert set(u.undetermined) == {"cable_stiffness", "cable_damping"}
    assert np.isfinite(u.sigma["rod_mass"]).all()
    # sigma of the independent one: s / |b| in raw units, times d value / d raw
    s = float(np.sqrt(r.numpy() @ r.numpy() / 197))
    raw_sigma = s / np.linalg.norm(b)
    spec = params.specs["rod_mass"]
    frac = torch.sigmoid(params.rod_mass.detach()).item()
    slope = frac * (1 - frac) * params.as_dict()["rod_mass"][0] * np.log(spec.upper / spec.lower)
    assert u.sigma["rod_mass"][0] == pytest.approx(raw_sigma * slope, rel=1e-9)


def test_a_value_pinned_at_its_bound_is_reported_and_a_free_one_is_not(superball):
    """The data pushed the time constant into its lower bound (the sigmoid saturated): it
    is reported at_bound, whatever its sigma; a value inside its range is not (on a log
    range of 500x, 0.5 % above the bound is 0.08 % of the way in: pinned; 2 % is 0.3 %: not)."""
    spec = PhysicalParameters(superball).specs["actuator_time_constant"]
    rng = np.random.default_rng(2)
    J = torch.as_tensor(rng.standard_normal((100, 2)))
    r = torch.as_tensor(0.01 * rng.standard_normal(100))
    names = ("actuator_time_constant", "cable_stiffness")
    for factor, pinned in ((1.0001, True), (1.005, True), (1.02, False)):
        params = PhysicalParameters(superball, {"actuator_time_constant": [spec.lower * factor]})
        u = gauss_newton_uncertainty(params, names, J, r)
        assert u.at_bound == (("actuator_time_constant",) if pinned else ()), factor
        assert u.undetermined == ()                      # a pinned value is not an excitation problem
    upper = PhysicalParameters(superball, {"cable_stiffness": [params.specs["cable_stiffness"].upper * 0.9999]})
    assert gauss_newton_uncertainty(upper, names, J, r).at_bound == ("cable_stiffness",)


@pytest.mark.parametrize("name, compensates", [
    ("actuator_time_constant", True), ("cable_stiffness", True), ("rod_inertia_factor", True),
    ("contact_damping", False), ("contact_time_constant", False), ("friction_sliding", False),
    ("actuator_max_speed", False), ("cable_slack_damping", False)])
def test_a_cable_rod_or_motor_value_pinned_at_its_bound_voids_every_published_sigma(superball, name, compensates):
    """Pinned at a bound, a cable's, rod's or the motors' value makes every learnt value a
    compensation for structure the model lacks: what the node publishes is inf for all of
    them (measured: all 10 such SUPERball runs off by up to 160 / 1270 / 99 %, none of the 35
    others pinned). Not so for a ground contact value (its bounds include the step's
    stability limit), a limit (a top speed the robot does not have) or a share whose range
    is its meaning (the slack damping's 1: damping on slack cables as on taut ones)."""
    spec = PhysicalParameters(superball).specs[name]
    names = ("cable_damping", name)
    params = PhysicalParameters(superball, {name: [spec.upper * 0.9999]})
    rng = np.random.default_rng(3)
    J = torch.as_tensor(rng.standard_normal((100, 2)))
    r = torch.as_tensor(0.01 * rng.standard_normal(100))
    u = gauss_newton_uncertainty(params, names, J, r)
    assert u.at_bound == (name,)
    assert u.compensating == ((name,) if compensates else ())
    published = u.published()
    assert set(published) == set(names)
    assert all(bool(np.isinf(s).all()) == compensates for s in published.values())
    flat = u.flat(params, structure=True)
    damping = params.flat()[0].index("cable_damping")
    assert np.isinf(flat[damping]) == compensates and np.isfinite(u.flat(params)[damping])     # sigma itself kept


def test_the_sigma_of_an_element_mean_holds_whatever_the_elements_correlation():
    """Per-cable values published with their own sigma: the mean's sigma must hold for errors
    that move together (a compensation), which independence understates by sqrt(n)."""
    rng = np.random.default_rng(3)
    sigma = rng.uniform(0.5, 2.0, 24)
    for rho in (0.0, 0.5, 1.0):
        cov = sigma[:, None] * sigma[None, :] * (rho + (1.0 - rho) * np.eye(24))
        errors = rng.multivariate_normal(np.zeros(24), cov, size=20000, method="eigh")
        spread = errors.mean(axis=1).std()
        assert spread <= 1.03 * element_mean_sigma(sigma)
        if rho == 1.0:          # the bound is reached; independence would claim a fifth of it
            assert spread == pytest.approx(element_mean_sigma(sigma), rel=0.03)
            assert np.sqrt(np.sum(sigma ** 2)) / sigma.size < 0.3 * spread
    assert np.isnan(element_mean_sigma([]))
    # each element against its own true value; a shared value or another split: not counted
    truth = np.array([1.0, 2.0, 3.0])
    assert elements_covered([1.1, 2.5, 3.0], truth, [0.1, 0.1, np.inf]) == (1, 2)
    assert elements_covered([2.0], [2.0], [0.1]) is None
    assert elements_covered([1.0, 2.0], truth, [0.1, 0.1]) is None


def test_correlation_of_the_estimate_follows_the_columns(superball):
    """Two nearly parallel Jacobian columns trade off: their estimates are strongly
    negatively correlated (covariance ~ (J'J)^-1); an orthogonal third is uncorrelated."""
    params = PhysicalParameters(superball)
    rng = np.random.default_rng(1)
    a, noise = rng.standard_normal((300, 1)), rng.standard_normal((300, 1))
    b = rng.standard_normal((300, 1))
    J = np.hstack([a, a + 0.1 * noise, b])
    J[:, 2] -= J[:, :2] @ np.linalg.lstsq(J[:, :2], J[:, 2], rcond=None)[0]   # orthogonal to both
    u = gauss_newton_uncertainty(params, ("cable_stiffness", "cable_damping", "rod_mass"), torch.as_tensor(J),
                                 torch.as_tensor(0.01 * rng.standard_normal(300)))
    assert u.labels == ("cable_stiffness", "cable_damping", "rod_mass")
    inv = np.linalg.inv(J.T @ J)
    expected = inv[0, 1] / np.sqrt(inv[0, 0] * inv[1, 1])
    assert expected < -0.9
    assert u.correlation[0, 1] == pytest.approx(expected, abs=1e-9)
    np.testing.assert_allclose(np.diag(u.correlation), 1.0)
    assert abs(u.correlation[0, 2]) < 1e-9 and abs(u.correlation[1, 2]) < 1e-9


def test_windows_cut_every_chain_into_non_overlapping_pieces():
    from tensegrity_engine.identification.solvers.windows import chain_windows

    nxt = [1, 2, 3, 4, 5, 6, -1, 8, -1, -1]               # chains 0..6, 7..8, 9
    pool, width = chain_windows(nxt, 3)
    assert width == 3 and pool.tolist() == [[0, 1, 2], [3, 4, 5]]
    pool, width = chain_windows([1, -1, 3, -1], 3)        # no chain of 3: windows of 2
    assert width == 2 and pool.tolist() == [[0, 1], [2, 3]]


def test_cluster_robust_sigma_widens_for_correlated_residuals(superball):
    """A straight-line fit whose residuals come in correlated groups: the plain Gauss-Newton
    sigma assumes independent residuals and is too small; the sandwich over the groups is
    not (checked against the spread of the estimate over many draws)."""
    from tensegrity_engine.identification.uncertainty import normal_matrix_uncertainty

    params = PhysicalParameters(superball)
    names = ("cable_stiffness",)
    rng = np.random.default_rng(0)
    groups, per = 40, 25
    # the regressor and the error both vary slowly (per group), as along a trajectory
    x = torch.as_tensor(np.repeat(rng.uniform(-1, 1, groups), per) + 0.05 * rng.normal(0, 1, groups * per))
    J = x[:, None]
    estimates, plain, robust = [], [], []
    for _ in range(200):
        shared = np.repeat(rng.normal(0, 1, groups), per)          # one offset per group
        y = torch.as_tensor(shared + 0.1 * rng.normal(0, 1, groups * per))
        H = J.T @ J
        theta = float(torch.linalg.solve(H, J.T @ y))
        r = y - J[:, 0] * theta
        G = (J[:, 0] * r).reshape(groups, per).sum(1, keepdim=True)
        estimates.append(theta)
        a = normal_matrix_uncertainty(params, names, H, float(r @ r), len(r) - 1)
        b = normal_matrix_uncertainty(params, names, H, float(r @ r), len(r) - 1, scores=G)
        plain.append(float(a.sigma[names[0]][0]))
        robust.append(float(b.sigma[names[0]][0]))
    assert a.sigma_spread == {}                                      # no groups: no spread
    from tensegrity_engine.identification.uncertainty import value_slopes
    to_value = float(value_slopes(params, names).abs()[0])
    of_mean = np.std(estimates) * to_value
    assert np.median(plain) < 0.6 * of_mean                       # the plain sigma is overconfident
    assert 0.7 * of_mean < np.median(robust) < 1.4 * of_mean


def test_cluster_jackknife_covers_a_group_that_dominates_the_information(superball):
    """One group of residuals carries most of the information (a window whose rollout is
    far more sensitive than the others', as at a contact switch) and every group has its own
    offset: the fit follows that group, so its score is small and the sandwich's sigma
    covers the truth in well under half the draws. Leaving one group out at a time (the
    cluster jackknife, with each group's share of H) covers it at the nominal rate; where
    no group dominates it agrees with the sandwich."""
    from tensegrity_engine.identification.uncertainty import normal_matrix_uncertainty

    params = PhysicalParameters(superball)
    names = ("cable_stiffness",)
    slope = float(value_slopes_of(params, names))
    rng = np.random.default_rng(5)
    groups, per = 20, 25
    covered = {"sandwich": [], "jackknife": []}
    even = []
    for draw in range(300):
        level = rng.uniform(-1, 1, groups)
        if draw % 2 == 0:
            level[0] = 12.0                                          # the dominating group
        x = torch.as_tensor(np.repeat(level, per) + 0.05 * rng.normal(0, 1, groups * per))
        y = torch.as_tensor(np.repeat(rng.normal(0, 1, groups), per) + 0.1 * rng.normal(0, 1, groups * per))
        H = (x @ x)[None, None]
        theta = float((x @ y) / (x @ x))                              # truth: 0
        r = y - x * theta
        G = (x * r).reshape(groups, per).sum(1, keepdim=True)
        HG = (x ** 2).reshape(groups, per).sum(1)[:, None, None]
        a = normal_matrix_uncertainty(params, names, H, float(r @ r), len(r) - 1, scores=G)
        b = normal_matrix_uncertainty(params, names, H, float(r @ r), len(r) - 1, scores=G, group_information=HG)
        sa, sb = (float(u.sigma[names[0]][0]) / slope for u in (a, b))
        if draw % 2 == 0:
            covered["sandwich"].append(abs(theta) < 2 * sa)
            covered["jackknife"].append(abs(theta) < 2 * sb)
        else:
            even.append(sb / sa)
    assert np.mean(covered["sandwich"]) < 0.6
    assert np.mean(covered["jackknife"]) > 0.88
    assert 0.9 < np.median(even) < 1.25


def test_cluster_jackknife_covers_more_values_than_groups(superball):
    """48 values (a stiffness and a damping per cable), 12 groups of residuals each with its
    own offset: the sandwich needs more groups than values, the jackknife only enough groups.
    The plain sigma covers the truth in well under half the cases; with each group's
    information the published sigma covers it at about the nominal rate; with fewer than
    `MIN_JACKKNIFE_GROUPS` groups nothing but the plain sigma is claimed."""
    from tensegrity_engine.identification.uncertainty import (MIN_JACKKNIFE_GROUPS, normal_matrix_uncertainty,
                                                              value_slopes)

    per = 60
    params = PhysicalParameters(superball, per_element=("cable_stiffness", "cable_damping"))
    names = ("cable_stiffness", "cable_damping")
    P = sum(getattr(params, n).numel() for n in names)
    slopes = value_slopes(params, names).abs().numpy()
    rng = np.random.default_rng(3)
    covered = {"plain": [], "jackknife": []}
    for groups in (12, MIN_JACKKNIFE_GROUPS - 1):
        for _ in range(40 if groups >= MIN_JACKKNIFE_GROUPS else 3):
            X = torch.as_tensor(rng.normal(0, 1, (groups * per, P)) + np.repeat(rng.normal(0, 1, (groups, P)), per, 0))
            y = torch.as_tensor(np.repeat(rng.normal(0, 1, groups), per) + 0.1 * rng.normal(0, 1, groups * per))
            H = X.T @ X
            theta = torch.linalg.solve(H, X.T @ y).numpy()                 # truth: 0
            r = y - X @ torch.as_tensor(theta)
            Xg, rg = X.reshape(groups, per, P), r.reshape(groups, per)
            G, HG = (Xg * rg[..., None]).sum(1), Xg.transpose(1, 2) @ Xg
            plain = normal_matrix_uncertainty(params, names, H, float(r @ r), len(r) - P)
            jack = normal_matrix_uncertainty(params, names, H, float(r @ r), len(r) - P, scores=G, group_information=HG)
            flat = lambda u: np.concatenate([u.sigma[n] for n in names]) / slopes      # noqa: E731
            if groups < MIN_JACKKNIFE_GROUPS:
                np.testing.assert_allclose(flat(jack), flat(plain))
                assert jack.sigma_spread == {}
                continue
            covered["plain"].append(np.mean(np.abs(theta) < 2 * flat(plain)))
            covered["jackknife"].append(np.mean(np.abs(theta) < 2 * flat(jack)))
    assert P > 12 and np.mean(covered["plain"]) < 0.5
    assert np.mean(covered["jackknife"]) > 0.88


def test_reduced_information_is_the_schur_complement_and_stays_positive_semidefinite():
    """Latents eliminated by projecting each window's parameter columns off its latent
    range: on well-conditioned blocks the same as A'A - A'B(B'B)^-1 B'A and its gradient;
    with latent columns that nearly coincide (spin moves no node, contact windows) still
    positive semi-definite and exact, where the normal-matrix formula is rounding noise."""
    from tensegrity_engine.identification.solvers.windows import reduced_information

    rng = np.random.default_rng(3)
    N, M, P, L = 30, 40, 3, 6
    A = torch.as_tensor(rng.standard_normal((N, M, P)))
    B = torch.as_tensor(rng.standard_normal((N, M, L)))
    r = torch.as_tensor(rng.standard_normal((N, M)))
    info = reduced_information(A, B, r)
    At, Bt = A.transpose(1, 2), B.transpose(1, 2)
    Binv = torch.linalg.inv(Bt @ B)
    H = (At @ A - At @ B @ Binv @ Bt @ A).sum(0)
    g = (At @ r[..., None] - At @ B @ Binv @ Bt @ r[..., None])[..., 0]
    torch.testing.assert_close(info["H"], H, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(info["G"].sum(0), g.sum(0), rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(info["HG"].sum(0), H, rtol=1e-9, atol=1e-9)          # the groups' shares
    assert info["G"].shape == (10, P)                                  # clusters of consecutive windows
    assert info["dof"] == N * M - P - N * L
    # one latent column a hair off another, and a parameter column mostly in that pair's span
    B2 = B.clone()
    B2[..., 1] = B2[..., 0] * (1 + 1e-9) + 1e-9 * B2[..., 2]
    A2 = A.clone()
    A2[..., 0] = 1e3 * B2[..., 0] + 1e-3 * A2[..., 0]
    info2 = reduced_information(A2, B2, r)
    assert float(torch.linalg.eigvalsh(info2["H"]).min()) >= -1e-9 * float(info2["H"].diagonal().max())
    # column 1 lies in the span of columns 0 and 2, so dropping it leaves the latent range,
    # and the information, unchanged: a well-conditioned reference
    exact = reduced_information(A2, B2[..., [0, 2, 3, 4, 5]], r)["H"]
    torch.testing.assert_close(info2["H"], exact, rtol=1e-6, atol=1e-6 * float(exact.diagonal().max()))
    Bt2 = B2.transpose(1, 2)
    naive = (A2.transpose(1, 2) @ A2 - A2.transpose(1, 2) @ B2 @ torch.linalg.inv(Bt2 @ B2) @ Bt2 @ A2).sum(0)
    assert float((naive - exact).abs().max()) > 100 * float(exact.diagonal().max())   # rounding noise, any sign


def test_a_window_crossing_a_switch_gives_its_smooth_side_not_the_jump(superball):
    """A residual that jumps within the difference step (a contact or stick-slip switch in
    the window's rollout) must not count as information: the one-sided parameter Jacobian
    takes each window's smaller difference, which is the slope of the smooth side."""
    from types import SimpleNamespace

    from tensegrity_engine.identification.solvers.windows import EPS, WindowLevenbergMarquardt

    params = PhysicalParameters(superball)
    names = ("cable_stiffness",)
    run = SimpleNamespace(config=SimpleNamespace(jacobian="central"), objective=None, params=params, learn=names)
    lm = WindowLevenbergMarquardt(idf.IdentificationConfig())
    theta0 = torch.zeros(1, dtype=torch.float64) + params.cable_stiffness.detach().reshape(-1)[:1]
    slope = torch.tensor([[1.0, 2.0], [3.0, -1.0]], dtype=torch.float64)      # [windows, residuals]

    def residual(run_, theta, windows, vel):
        dt = float(theta[0] - theta0[0])
        r = slope * dt
        r[1] += 5e-3 * (dt > 0.5 * EPS)                                  # window 1 jumps just above theta0
        return r

    lm._residual = residual
    r0 = residual(run, theta0, None, None)
    plain = lm._param_jacobian(run, theta0, None, None, r0)[..., 0]
    robust = lm._param_jacobian(run, theta0, None, None, r0, one_sided=True)[..., 0]
    assert float(plain[1].abs().max()) > 1e3                             # the jump, divided by the step
    torch.testing.assert_close(robust, slope, rtol=1e-6, atol=1e-6)


def test_the_other_side_is_taken_only_where_the_forward_difference_jumps():
    """With the rows of single units at hand, the one-sided Jacobian rolls out the backward
    side only for the units whose forward difference is far above the median unit's: a
    jump just above theta0 in one window of twelve gives that window its slope from the
    other side, every window equals the full rule's, and the backward side costs that
    window's rows alone (a parameter whose forward difference jumps nowhere costs none)."""
    from tensegrity_engine.identification.solvers.levenberg_marquardt import one_sided_jacobian
    from tensegrity_engine.identification.solvers.windows import EPS

    gen = torch.Generator().manual_seed(1)
    N, M, P = 12, 5, 3
    slope = torch.randn(N, M, P, dtype=torch.float64, generator=gen)
    theta0 = torch.zeros(P, dtype=torch.float64)
    jump_window, jump_param = 7, 1

    def rows_of(theta, idx):
        r = (slope[idx] @ theta[:, None])[..., 0]
        crossed = (idx == jump_window) & (theta[jump_param] > 0.5 * EPS)
        return r + 4e-3 * crossed[:, None].to(r.dtype)

    evaluated = []

    def units_residual(theta, idx):
        evaluated.append(len(idx))
        return rows_of(theta, idx)

    everything = torch.arange(N)
    r0 = rows_of(theta0, everything)
    full = one_sided_jacobian(lambda th: rows_of(th, everything), theta0, r0, N, EPS)
    checked = one_sided_jacobian(lambda th: rows_of(th, everything), theta0, r0, N, EPS,
                                 units_residual=units_residual)
    plain = one_sided_jacobian(lambda th: rows_of(th, everything), theta0, r0, N, EPS, sides=())
    assert float(plain[jump_window, :, jump_param].abs().max()) > 1e3            # the jump is there
    torch.testing.assert_close(checked, slope, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(checked, full, rtol=0, atol=1e-9)
    assert evaluated == [1]


def test_spread_sigma_covers_each_groups_own_value_and_equals_sigma_when_groups_agree(superball):
    """Each group of residuals has its own value of the parameter (the robot's regimes, seen
    through a model that is not the robot): the spread sigma is the scatter of those values
    about the estimate, several times the sandwich's sigma of the estimate. With three
    parameters and groups that agree (independent noise), sigma and the spread are the
    model's sigma (no inflation from the small-sample factor)."""
    from tensegrity_engine.identification.uncertainty import normal_matrix_uncertainty

    params = PhysicalParameters(superball)
    rng = np.random.default_rng(4)
    groups, per = 10, 50
    one = ("cable_stiffness",)
    three = ("cable_stiffness", "cable_damping", "rod_mass")
    ratios, spread_vs_sigma, agree = [], [], []
    for _ in range(200):
        x = rng.uniform(-1, 1, (groups * per, 3))
        own = np.repeat(0.2 * rng.normal(0, 1, groups), per)              # each group's own value
        y = own * x[:, 0] + 0.05 * rng.normal(0, 1, groups * per)
        J, r = torch.as_tensor(x[:, :1]), None
        theta = float(np.linalg.lstsq(x[:, :1], y, rcond=None)[0][0])
        r = torch.as_tensor(y - x[:, 0] * theta)
        G = (J[:, 0] * r).reshape(groups, per).sum(1, keepdim=True)
        u = normal_matrix_uncertainty(params, one, J.T @ J, float(r @ r), len(r) - 1, scores=G)
        slope = float(value_slopes_of(params, one))
        ratios.append(u.sigma_spread[one[0]][0] / slope / np.std(own[::per] - theta))
        spread_vs_sigma.append(u.sigma_spread[one[0]][0] / u.sigma[one[0]][0])
        # three parameters, groups that agree
        y3 = x @ np.array([0.3, -0.2, 0.1]) + 0.05 * rng.normal(0, 1, groups * per)
        J3 = torch.as_tensor(x)
        th3 = np.linalg.lstsq(x, y3, rcond=None)[0]
        r3 = torch.as_tensor(y3 - x @ th3)
        G3 = (J3 * r3[:, None]).reshape(groups, per, 3).sum(1)
        plain = normal_matrix_uncertainty(params, three, J3.T @ J3, float(r3 @ r3), len(r3) - 3)
        robust = normal_matrix_uncertainty(params, three, J3.T @ J3, float(r3 @ r3), len(r3) - 3, scores=G3)
        agree.append([robust.sigma[n][0] / plain.sigma[n][0] for n in three]
                     + [robust.sigma_spread[n][0] / plain.sigma[n][0] for n in three])
    assert 0.75 < np.median(ratios) < 1.3
    assert np.median(spread_vs_sigma) > 2.5
    med = np.median(np.asarray(agree), 0)
    assert np.all(med[:3] < 1.15) and np.all(med[3:] < 1.3), med


def value_slopes_of(params, names):
    from tensegrity_engine.identification.uncertainty import value_slopes

    return value_slopes(params, names).abs()[0]


def test_pose_only_sigma_comes_from_the_windows_in_every_stage(superball, sigma_data, monkeypatch):
    """Pose-only data: sigma is taken from the windowed problem (latents fitted at the values,
    groups of windows for the sandwich and the spread) while the solver is still in its
    finite-difference stage and after the schedule has ended, never from tuple residuals on
    finite-difference velocities; the solver's own state and random stream are left alone."""
    from tensegrity_engine.identification.solvers.windows import WindowLevenbergMarquardt

    calls = []
    original = WindowLevenbergMarquardt.information_at

    def spy(self, run, theta, refit=False):
        entry = None if self.window_vel is None else self.window_vel.clone()
        info = original(self, run, theta, refit=refit)
        calls.append((self, refit, entry, info))
        return info

    monkeypatch.setattr(WindowLevenbergMarquardt, "information_at", spy)
    cfg = idf.IdentificationConfig(period=PERIOD, learn=("cable_stiffness", "cable_damping"), schedule="online",
                                   init="given", lm_max_iters=40, lm_windows=12, seed=0)
    tr = idf.ProgressiveTrainer(superball, cfg, log=lambda m: None)
    pose = {k: ds.tuples_from([t.without_velocity() for t in v], period=PERIOD) for k, v in sigma_data.items()}
    tr.set_data(pose["train"], pose["val"])
    for _ in range(2):
        tr.train_epoch()
    assert tr.schedule.use_lm and tr.schedule.pose_stage == "finite_difference"
    state = tr.rng.bit_generator.state
    values = tr.parameters.as_dict()
    monkeypatch.setattr("tensegrity_engine.identification.uncertainty.MIN_WARM", 2)     # 12 windows only here
    u = trainer_uncertainty(tr)
    # the solver's windows, then the horizon shift's windows twice as long (a scratch solver)
    longer = [c for c in calls if c[0].config.pose_window == 2 * cfg.pose_window]
    calls[:] = [c for c in calls if c not in longer]
    assert len(calls) == 1 and calls[0][0] is not tr.window_lm and calls[0][1]       # a scratch solver, refitted
    # the longer windows start from the scratch solver's latents, just fitted, not refitted
    assert len(longer) == 1 and longer[0][0] is not tr.window_lm and not longer[0][1]
    scratch, fitted = calls[0][0], calls[0][3]["vel"]
    row = {w: i for i, w in enumerate(scratch.windows[:, 0].tolist())}
    for j, w in enumerate(longer[0][0].windows[:, 0].tolist()):
        assert torch.equal(longer[0][2][j], fitted[row[w]])
    assert tr.window_lm.windows is None and tr.rng.bit_generator.state == state
    assert all(np.array_equal(v, values[k]) for k, v in tr.parameters.as_dict().items())
    assert u.undetermined == () and u.dof == 12 * 108 - 2 - 12 * 30     # 12 windows of 3 x 36 coordinates, 6 spins each
    truth = PhysicalParameters(superball).as_dict()
    for name in ("cable_stiffness", "cable_damping"):
        assert 0 < u.sigma[name][0] <= u.sigma_spread[name][0] < 0.2 * truth[name][0]
    tr.run()
    assert tr.done
    solver_state = (tr.window_lm.windows.clone(), tr.window_lm.window_vel.clone())
    trainer_uncertainty(tr)
    assert torch.equal(tr.window_lm.windows, solver_state[0]) and torch.equal(tr.window_lm.window_vel, solver_state[1])
    longer = [c for c in calls if c[0].config.pose_window == 2 * cfg.pose_window]
    assert len(longer) == 1 and not longer[0][1]            # warm: the solver's latents where windows start alike
    starts = set(tr.window_lm.windows[:, 0].tolist())
    assert set(longer[0][0].windows[:, 0].tolist()) <= starts
    calls[:] = [c for c in calls if c[0].config.pose_window == cfg.pose_window]
    assert len(calls) == 2 and calls[1][0] is tr.window_lm and not calls[1][1]       # the solver's own windows


def _scratch_spy(monkeypatch):
    """(the (solver, refit) of every estimate on the solver-length windows, as they come; the
    online config of the scratch-window tests)."""
    from tensegrity_engine.identification.solvers.windows import WindowLevenbergMarquardt

    refits = []
    original = WindowLevenbergMarquardt.information_at

    def spy(self, run, theta, refit=False):
        if self.config.pose_window == run.config.pose_window:       # not the horizon shift's windows
            refits.append((self, refit))
        return original(self, run, theta, refit=refit)

    monkeypatch.setattr(WindowLevenbergMarquardt, "information_at", spy)
    monkeypatch.setattr("tensegrity_engine.identification.uncertainty.MIN_WARM", 2)
    return refits, idf.IdentificationConfig(period=PERIOD, learn=("cable_stiffness", "cable_damping"),
                                            schedule="online", init="given", lm_max_iters=40, lm_windows=12, seed=0)


def test_a_finite_difference_stage_fits_its_sigma_windows_once_and_then_polishes_them(superball, sigma_data,
                                                                                      monkeypatch):
    """Before the windowed stage each estimate fitted the latents of a scratch windowed problem
    from scratch, most of its cost. The fitted problem is kept while the data only grows (less
    than twice): the next estimate polishes its latents, costs less and gives about the same
    sigma; new data (or twice the data) draws and fits it again."""
    from tensegrity_engine.physics.work import METER

    refits, cfg = _scratch_spy(monkeypatch)
    tr = idf.ProgressiveTrainer(superball, cfg, log=lambda m: None)
    pose = [t.without_velocity() for t in sigma_data["train"] + sigma_data["val"]]     # three records
    tr.set_data(ds.tuples_from(pose[:2], period=PERIOD))
    tr.train_epoch()
    assert tr.schedule.pose_stage == "finite_difference" and tr.window_lm.windows is None

    def estimate():
        before = METER.rod_steps
        return trainer_uncertainty(tr), METER.rod_steps - before

    first, first_cost = estimate()
    assert refits[-1][1] and tr.sigma_scratch is not None and refits[-1][0] is tr.sigma_scratch[0]
    tr.train_epoch()                                     # new values, the same data
    assert tr.window_lm.windows is None
    polished, polished_cost = estimate()
    assert refits[-1] == (tr.sigma_scratch[0], False)
    assert 0 < polished_cost < 0.6 * first_cost
    scratch = tr.sigma_scratch
    tr.sigma_scratch = None                              # the same windows (one draw), fitted from scratch
    fresh, _ = estimate()
    assert refits[-1][1] and torch.equal(tr.sigma_scratch[0].windows, scratch[0].windows)
    for name in ("cable_stiffness", "cable_damping"):
        assert polished.sigma[name][0] == pytest.approx(fresh.sigma[name][0], rel=0.1)
    tr.extend_data(ds.tuples_from(pose, period=PERIOD))                                 # grown, not doubled
    estimate()
    assert refits[-1] == (tr.sigma_scratch[0], False)    # the windows of the last draw kept
    tr.sigma_scratch = scratch
    tr.extend_data(ds.tuples_from(pose + pose[:1], period=PERIOD))                      # twice the data
    estimate()
    assert refits[-1][1] and tr.sigma_scratch[0] is not scratch[0]
    tr.set_data(ds.tuples_from(pose[1:], period=PERIOD))                                # other data
    assert tr.window_lm.windows is None
    estimate()
    assert refits[-1][1]


def test_an_adopted_trainer_polishes_the_latents_of_the_solver_it_replaces(superball, sigma_data, monkeypatch):
    """A structure challenger adopted before its windowed stage: its first estimate starts from
    the replaced solver's windows and fitted latents (the same tuples), polished, not from
    every window fitted from scratch; other tuples, or a trainer with windows, get nothing."""
    from tensegrity_engine.identification.uncertainty import inherit_scratch
    from tensegrity_engine.physics.work import METER

    refits, cfg = _scratch_spy(monkeypatch)
    pose = ds.tuples_from([t.without_velocity() for t in sigma_data["train"]], period=PERIOD)
    donor = idf.ProgressiveTrainer(superball, cfg, log=lambda m: None)
    donor.set_data(pose)
    donor.run()
    assert donor.window_lm.windows is not None

    def adopted():
        tr = idf.ProgressiveTrainer(superball, dataclasses.replace(cfg, per_element=("cable_stiffness",)),
                                    log=lambda m: None)
        tr.set_data(pose)
        tr.train_epoch()
        assert tr.window_lm.windows is None
        return tr

    def estimate(tr):
        before = METER.rod_steps
        return trainer_uncertainty(tr), METER.rod_steps - before

    tr = adopted()
    assert inherit_scratch(tr, donor)
    warm, warm_cost = estimate(tr)
    assert refits[-1] == (tr.sigma_scratch[0], False)
    assert torch.equal(refits[-1][0].windows, donor.window_lm.windows)
    cold_tr = adopted()
    cold, cold_cost = estimate(cold_tr)
    assert refits[-1][1] and 0 < warm_cost < 0.6 * cold_cost
    for name in ("cable_stiffness", "cable_damping"):
        assert np.all(np.isfinite(warm.sigma[name])) and np.all(warm.sigma[name] > 0)
    assert not inherit_scratch(donor, tr)                      # a trainer with windows of its own
    other = idf.ProgressiveTrainer(superball, cfg, log=lambda m: None)
    other.set_data(ds.tuples_from([t.without_velocity() for t in sigma_data["val"]], period=PERIOD))
    assert not inherit_scratch(other, donor) and other.sigma_scratch is None


def test_gauss_newton_step_reaches_a_linear_problems_minimum_and_skips_unconstrained_directions():
    """For residuals linear in theta one step lands on the least-squares minimum; a
    direction the data does not constrain (a zero column) gets no step."""
    from tensegrity_engine.identification.uncertainty import gauss_newton_step

    rng = np.random.default_rng(3)
    A = torch.as_tensor(rng.standard_normal((50, 3)) * np.array([1.0, 1e3, 1e-2]))      # badly scaled columns
    y = torch.as_tensor(rng.standard_normal(50))
    theta0 = torch.as_tensor(rng.standard_normal(3))
    r = A @ theta0 - y
    step = gauss_newton_step(A.T @ A, A.T @ r)
    best = torch.linalg.lstsq(A, y[:, None]).solution[:, 0]
    assert torch.allclose(theta0 + step, best, rtol=1e-8, atol=1e-10)
    A[:, 1] = 0.0
    step = gauss_newton_step(A.T @ A, A.T @ (A @ theta0 - y))
    assert step[1] == 0.0 and torch.isfinite(step).all() and step.abs().sum() > 0


def test_published_sigma_adds_the_horizon_shift_and_flags_structure(superball):
    """What the node publishes is the spread and the horizon shift in quadrature; a value
    that moves with the horizon by more than twice its spread is flagged."""
    from tensegrity_engine.identification.uncertainty import ParameterUncertainty

    params = PhysicalParameters(superball)
    u = ParameterUncertainty(sigma={"cable_stiffness": np.array([3.0]), "cable_damping": np.array([1.0])},
                             undetermined=(), residual_sigma=1.0, dof=10,
                             sigma_spread={"cable_stiffness": np.array([4.0]), "cable_damping": np.array([2.0])},
                             sigma_structure={"cable_stiffness": np.array([3.0]), "cable_damping": np.array([5.0])})
    assert u.published()["cable_stiffness"][0] == pytest.approx(5.0)
    assert u.structure_suspect() == ("cable_damping",)
    names, _ = params.flat()
    flat = u.flat(params, structure=True)
    assert flat[names.index("cable_stiffness")] == pytest.approx(5.0)
    assert flat[names.index("cable_damping")] == pytest.approx(np.hypot(2.0, 5.0))
    assert u.flat(params, spread=True)[names.index("cable_damping")] == pytest.approx(2.0)
    bare = dataclasses.replace(u, sigma_structure={})
    assert bare.structure_suspect() == () and bare.published()["cable_damping"][0] == 2.0
    stepped = dataclasses.replace(bare, sigma_step={"cable_damping": np.array([1.5])})
    assert stepped.published()["cable_damping"][0] == pytest.approx(2.5)
    assert stepped.published()["cable_stiffness"][0] == pytest.approx(4.0)


def test_the_horizon_shift_shows_a_structure_the_model_lacks_and_not_an_exact_one(superball, sigma_data):
    """Pose-only data of the SUPERball hanging, fitted over windows of 3 tuples by the exact
    model and by one that assumes a 20 ms command delay the robot does not have. Fitted over
    windows of 6 the wrong model's values move (its compromise depends on the horizon), the
    exact model's stay where they are (noise-free data: the truth fits at every horizon)."""
    pose = {k: ds.tuples_from([t.without_velocity() for t in v], period=PERIOD) for k, v in sigma_data.items()}
    learn = ("cable_stiffness", "cable_damping", "actuator_time_constant")
    late = superball.replace(actuator=dataclasses.replace(superball.actuator, delay=0.02))
    shifts = {}
    for label, robot in (("exact", superball), ("delayed", late)):
        cfg = idf.IdentificationConfig(period=PERIOD, learn=learn, schedule="online", init="given",
                                       lm_max_iters=60, lm_windows=64, seed=0)
        tr = idf.ProgressiveTrainer(robot, cfg, log=lambda m: None)
        tr.set_data(pose["train"], pose["val"])
        tr.run()
        u = trainer_uncertainty(tr)
        here = tr.parameters.as_dict()
        shifts[label] = {n: float(u.sigma_structure[n][0]) / here[n][0] for n in learn}
        if label == "delayed":     # the latents fitted afresh: the same verdict
            cold = horizon_shift(tr, raw_vector(tr.params, tr.learn), warm=False)
            assert max(cold[n][0] / here[n][0] for n in learn) > 0.005, cold
        published = u.published()
        for n in learn:
            assert published[n][0] == pytest.approx(np.sqrt(u.sigma_spread[n][0] ** 2 + u.sigma_structure[n][0] ** 2
                                                            + u.sigma_step[n][0] ** 2))
        if label == "exact":       # converged at the truth: no step left; 3 % off: about 3 % left
            assert max(u.sigma_step[n][0] / here[n][0] for n in learn) < 1e-4, u.sigma_step
            off = trainer_uncertainty(tr, at={**here, "cable_stiffness": [1.03 * here["cable_stiffness"][0]]})
            assert off.sigma_step["cable_stiffness"][0] == pytest.approx(0.03 * here["cable_stiffness"][0], rel=0.3)
    assert max(shifts["delayed"].values()) > 0.005, shifts
    assert max(shifts["exact"].values()) < 1e-4, shifts
    # the estimates are pooled per model: an earlier shift of 50 % widens the next one's
    tr.horizon_shifts.insert(0, {n: np.array([0.5]) for n in learn})
    pooled = len(tr.horizon_shifts) + 1
    again = trainer_uncertainty(tr)
    assert again.sigma_structure["cable_damping"][0] >= 0.5 / np.sqrt(pooled) * here["cable_damping"][0]


def test_the_horizon_shifts_of_a_models_estimates_are_pooled(superball):
    """One estimate's shift is one noisy draw of the model's mismatch: the published
    shift is the root mean square of the model's draws (relative to the values each was
    made at), so a draw near 0 after a large one does not make the mismatch vanish; a new
    model (a new trainer) starts its own pool, and a failed draw leaves the pool as it is."""
    from types import SimpleNamespace

    from tensegrity_engine.identification.uncertainty import SHIFT_POOL, pooled_shift

    def trainer(k: float):
        params = PhysicalParameters(superball)
        params.set_value("cable_stiffness", [k])
        return SimpleNamespace(learn=("cable_stiffness",), params=params)

    tr = trainer(5000.0)
    first = pooled_shift(tr, {"cable_stiffness": np.array([60.0])})
    assert first["cable_stiffness"][0] == pytest.approx(60.0)
    second = pooled_shift(tr, {"cable_stiffness": np.array([0.5])})
    assert second["cable_stiffness"][0] == pytest.approx(np.sqrt((60.0 ** 2 + 0.5 ** 2) / 2), rel=1e-6)
    assert pooled_shift(tr, {})["cable_stiffness"][0] == pytest.approx(second["cable_stiffness"][0])
    tr.params.set_value("cable_stiffness", [2500.0])       # relative: the same share of a value half as large
    assert pooled_shift(tr, {})["cable_stiffness"][0] == pytest.approx(second["cable_stiffness"][0] / 2, rel=1e-6)
    assert pooled_shift(trainer(5000.0), {"cable_stiffness": np.array([0.5])})["cable_stiffness"][0] == \
        pytest.approx(0.5)
    for _ in range(SHIFT_POOL):                            # the oldest draws leave the pool
        latest = pooled_shift(tr, {"cable_stiffness": np.array([1.0])})
    assert latest["cable_stiffness"][0] == pytest.approx(1.0)


def _pose_only_noisy(records, mm: float, seed: int):
    """Pose-only records with mocap-like position noise (``mm`` per coordinate)."""
    rng = np.random.default_rng(seed)
    return [dataclasses.replace(t.without_velocity(),
                                position=t.position + 1e-3 * mm * rng.standard_normal(t.position.shape))
            for t in records]


def _settling_run(superball, sigma_data, settle: float):
    """The online schedule's windowed solver on noisy pose-only data, from values 1.4x / 0.6x
    the truth, run until it ends."""
    cfg = idf.IdentificationConfig(period=PERIOD, learn=("cable_stiffness", "cable_damping"), schedule="online",
                                   init="given", lm_max_iters=60, lm_windows=12, seed=0, lm_settle_sigmas=settle)
    tr = idf.ProgressiveTrainer(superball, cfg, log=lambda m: None)
    truth = PhysicalParameters(superball).as_dict()
    tr.parameters.set_value("cable_stiffness", 1.4 * np.asarray(truth["cable_stiffness"]))
    tr.parameters.set_value("cable_damping", 0.6 * np.asarray(truth["cable_damping"]))
    pose = {k: ds.tuples_from(_pose_only_noisy(v, 1.0, 4), period=PERIOD) for k, v in sigma_data.items()}
    tr.set_data(pose["train"], pose["val"])
    path = []                               # raw values after each accepted windowed step
    for _ in range(80):
        if tr.done:
            break
        windows = tr.schedule.windows
        m = tr.train_epoch()
        if windows and m["lm_accepted"]:
            path.append((raw_vector(tr.parameters, cfg.learn).clone(), m["settled_sigmas"]))
    assert tr.done
    return tr, path


def test_the_windowed_solver_converges_when_its_values_settle_within_their_sigma(superball, sigma_data):
    """Pose-only, the windowed solver's objective can keep falling by its latents while its
    values no longer move: it has converged when its last `lm_patience` accepted steps moved
    every value by at most ``lm_settle_sigmas`` of the sigma the node publishes. The test
    is a convergence test (the controller takes it for done); 0 turns it off."""
    from tensegrity_engine.identification.schedule import CONVERGED_STOPS, SETTLED

    tr, path = _settling_run(superball, sigma_data, settle=0.25)
    k = tr.config.lm_patience
    assert tr.schedule.stop_reason == SETTLED and SETTLED in CONVERGED_STOPS and tr.schedule.converged
    # no verdict before k accepted steps on this problem; then the path's span in sigmas
    assert all(s == np.inf for _, s in path[:k]) and len(path) > k
    assert path[-1][1] <= 0.25 and all(s > 0.25 for _, s in path[k:-1])
    # ... in the published sigma (the larger of the plain and the robust one), at the end values
    u = trainer_uncertainty(tr)
    slopes = torch.as_tensor([float(value_slopes(tr.parameters, (n,))[0]) for n in tr.config.learn],
                             dtype=torch.float64)
    sigma_raw = torch.as_tensor([float(np.max(u.sigma[n])) for n in tr.config.learn], dtype=torch.float64) / slopes
    moved = (path[-1][0].double() - path[-1 - k][0].double()).abs()
    assert float((moved / sigma_raw).max()) <= 2 * 0.25         # sigma there from fresh latent blocks
    # off: the same run ends by another test, later, its objective still falling meanwhile,
    # and no more than half a sigma from where the test stopped it
    off, off_path = _settling_run(superball, sigma_data, settle=0.0)
    assert off.schedule.stop_reason != SETTLED and len(off_path) > len(path) + k
    assert off.history[-1]["val_loss"] < (1 - tr.config.min_rel_improvement) * tr.history[-1]["val_loss"]
    assert float(((off_path[-1][0].double() - path[-1][0].double()).abs() / sigma_raw).max()) <= 0.5


def test_a_lag_split_the_training_windows_cannot_tell_from_its_mirror_widens_the_published_sigma(monkeypatch):
    """`lag_split.check_lag_split`: the fit and its mirror (tau and the cables' c / k
    exchanged) are scored on the same windows; a mirror no significantly worse leaves the
    split undetermined and the published 1-sigma of c and tau reaches it, one significantly
    worse leaves it determined and adds nothing."""
    from tensegrity_engine.identification import acceptance
    from tensegrity_engine.identification.lag_split import SPLIT_SIGNIFICANCE, check_lag_split, swapped_lags
    from tensegrity_engine.identification.uncertainty import ParameterUncertainty

    values = {"cable_stiffness": [5000.0], "cable_damping": [500.0], "actuator_time_constant": [0.02]}  # 0.1 s / 0.02 s
    mirror = swapped_lags(values)
    rng = np.random.default_rng(0)
    base = rng.uniform(1.0, 2.0, 40)
    scored, settled = {}, []

    def fake_fit(run, vals, width, max_windows=256, settle_values=None):
        settled.append(settle_values)
        is_mirror = float(vals["actuator_time_constant"][0]) != 0.02
        return base * (scored["worse"] if is_mirror else 1.0) * (1.0 + 0.05 * rng.standard_normal(40))

    monkeypatch.setattr(acceptance, "window_fit", fake_fit)
    scored["worse"] = 1.0                                     # a tie: the split is undetermined
    tie = check_lag_split(None, values, 3)
    assert tie.windows == 40 and abs(tie.t) < SPLIT_SIGNIFICANCE and not tie.determined
    assert all(s is settled[0] for s in settled) and settled[0]["actuator_time_constant"] == mirror["actuator_time_constant"]
    sigma = tie.sigma(values)
    assert sigma["actuator_time_constant"] == pytest.approx([(0.1 - 0.02) / np.sqrt(2)])
    assert sigma["cable_damping"] == pytest.approx([(500.0 - 100.0) / np.sqrt(2)])
    scored["worse"] = 1.3                                     # the mirror fits 30 % worse
    worse = check_lag_split(None, values, 3)
    assert worse.determined and worse.log_ratio == pytest.approx(np.log(1.3), abs=0.05) and worse.sigma(values) == {}
    assert check_lag_split(None, {**values, "actuator_time_constant": [0.09]}, 3) is None     # lags alike: no mirror

    u = ParameterUncertainty(sigma={"cable_damping": np.array([5.0]), "actuator_time_constant": np.array([0.001])},
                             undetermined=(), residual_sigma=1.0, dof=10)
    wide = dataclasses.replace(u, sigma_split=sigma, lag_split=tie)
    assert wide.published()["cable_damping"] == pytest.approx(np.sqrt(25.0 + sigma["cable_damping"] ** 2))
    assert 2 * wide.published()["actuator_time_constant"][0] >= 0.1 - 0.02          # 2 sigma reaches the mirror
    assert u.published()["cable_damping"] == pytest.approx([5.0])


def test_the_windowed_uncertainty_carries_the_lag_split_check(superball, monkeypatch):
    """Pose-only data learning both lags: `trainer_uncertainty` runs the split check at the
    values it is asked about and publishes its sigma."""
    import rolling_records
    from tensegrity_engine.identification import uncertainty
    from tensegrity_engine.identification.lag_split import LagSplit

    run, _ = rolling_records.rolling_twin_run(superball, seconds=2.4, config=dict(
        learn=("cable_stiffness", "cable_damping", "actuator_time_constant")))
    asked = []

    def fake_check(trainer, values, width):
        asked.append((values["actuator_time_constant"][0], width))
        mirror = {**values, "cable_damping": [2.0 * values["cable_damping"][0]], "actuator_time_constant": [0.2]}
        return LagSplit(0.1, 0.2, mirror, 0.0, 0.0, 10)

    monkeypatch.setattr(uncertainty, "check_lag_split", fake_check)
    own = run.parameters.as_dict()["actuator_time_constant"][0]
    at = {**run.parameters.as_dict(), "actuator_time_constant": [0.15]}
    u = uncertainty.trainer_uncertainty(run, at=at)
    assert asked == [(pytest.approx(0.15), run.config.pose_window)]
    assert u.sigma_split["actuator_time_constant"] == pytest.approx([0.05 / np.sqrt(2)])
    assert u.published()["actuator_time_constant"][0] >= 0.05 / np.sqrt(2)
    assert run.parameters.as_dict()["actuator_time_constant"][0] == pytest.approx(own)    # the trainer's values restored


def test_the_sigma_of_a_mean_takes_the_elements_correlation_in():
    """`mean_sigma`: 1' Sigma 1 / n with Sigma from the elements' plain sigmas and their
    correlation; n sigmas fully correlated give their mean, independent ones sqrt(sum s^2) / n."""
    from tensegrity_engine.identification.uncertainty import ParameterUncertainty

    s = np.array([1.0, 2.0, 4.0])
    labels = ("cable_stiffness[0]", "cable_stiffness[1]", "cable_stiffness[2]", "rod_mass")
    for rho, expected in ((1.0, s.mean()), (0.0, np.sqrt((s ** 2).sum()) / 3), (-0.4, None)):
        corr = np.full((4, 4), 0.0)
        corr[:3, :3] = rho
        np.fill_diagonal(corr, 1.0)
        u = ParameterUncertainty(sigma={"cable_stiffness": 2 * s, "rod_mass": np.array([0.5])}, undetermined=(),
                                 residual_sigma=1.0, dof=10, correlation=corr, labels=labels,
                                 sigma_curvature={"cable_stiffness": s, "rod_mass": np.array([0.5])})
        cov = s[:, None] * s[None, :] * corr[:3, :3]
        assert u.mean_sigma("cable_stiffness") == pytest.approx(np.sqrt(cov.sum()) / 3, rel=1e-12)
        if expected is not None:
            assert u.mean_sigma("cable_stiffness") == pytest.approx(expected, rel=1e-12)
        assert u.mean_sigma("cable_stiffness", curvature=False) == pytest.approx(2 * u.mean_sigma("cable_stiffness"))
        assert u.mean_sigma("rod_mass") == 0.5
    u.sigma_curvature["cable_stiffness"] = np.array([1.0, np.inf, 1.0])
    assert u.mean_sigma("cable_stiffness") == np.inf


def test_data_information_uses_every_window_at_the_values_given_and_leaves_the_trainer(superball, sigma_data):
    """The data's information at given values: every window of the training data (not the
    solver's subset of lm_windows), the latents fitted there (clean data from the config's
    values fit to round-off at the truth and not at a stiffness 20 % off), its plain sigma
    no wider than the published one and narrower than on the solver's subset; the trainer's
    values and windows as they were."""
    from tensegrity_engine.identification.solvers.windows import training_windows
    from tensegrity_engine.identification.uncertainty import data_information

    cfg = idf.IdentificationConfig(period=PERIOD, learn=("cable_stiffness", "cable_damping"), schedule="online",
                                   init="given", lm_max_iters=40, lm_windows=6, seed=0)
    tr = idf.ProgressiveTrainer(superball, cfg, log=lambda m: None)
    pose = {k: ds.tuples_from([t.without_velocity() for t in v], period=PERIOD) for k, v in sigma_data.items()}
    tr.set_data(pose["train"], pose["val"])
    truth = {k: np.asarray(v) for k, v in PhysicalParameters(superball).as_dict().items()}
    tr.parameters.set_value("cable_stiffness", 1.3 * truth["cable_stiffness"])
    before = tr.parameters.as_dict()
    u = data_information(tr, truth)
    assert all(np.array_equal(v, before[k]) for k, v in tr.parameters.as_dict().items())
    assert tr.window_lm.windows is None
    pool, width = training_windows(tr.train.ts, cfg.pose_window, 0)
    assert len(pool) > cfg.lm_windows
    # dof: every window's 36 coordinates at each of its samples, less 2 values and 6 x 5 latents per window
    assert u.dof == len(pool) * (36 * width - 30) - 2
    off = data_information(tr, {**truth, "cable_stiffness": 0.8 * truth["cable_stiffness"]})
    assert u.residual_sigma < 1e-3 * off.residual_sigma
    subset = trainer_uncertainty(tr, at=truth)
    for name in ("cable_stiffness", "cable_damping"):
        assert 0 < u.sigma_curvature[name][0] <= u.sigma[name][0]
        assert u.sigma_curvature[name][0] < subset.sigma_curvature[name][0]


def test_a_compensating_estimate_skips_the_horizon_shift_and_the_lag_split_check(superball, monkeypatch):
    """A value pinned at a bound of its range publishes every sigma as inf (`compensating`):
    the estimate then draws no horizon shift and runs no lag split check (nothing published
    would change), yet keeps the model's earlier shifts; the same values off the bound do both."""
    import rolling_records
    from tensegrity_engine.identification import uncertainty
    from tensegrity_engine.physics.params import SPEC_BY_NAME

    learn = ("cable_stiffness", "cable_damping", "actuator_time_constant")
    run, _ = rolling_records.rolling_twin_run(superball, seconds=2.4, config=dict(learn=learn))
    calls = []
    shift_of, check_of = uncertainty.horizon_shift, uncertainty.check_lag_split
    monkeypatch.setattr(uncertainty, "horizon_shift", lambda *a, **k: calls.append("shift") or shift_of(*a, **k))
    monkeypatch.setattr(uncertainty, "check_lag_split", lambda *a, **k: calls.append("split") or check_of(*a, **k))
    spec = SPEC_BY_NAME["actuator_time_constant"]
    here = run.parameters.as_dict()
    # the motors' lag well apart from the cables' (a mirror to check) and, pinned, within
    # 0.05 % of its log range from the lower bound
    off = {**here, "actuator_time_constant": [4.0 * here["cable_damping"][0] / here["cable_stiffness"][0]]}
    pinned = {**here, "actuator_time_constant": [spec.lower * (spec.upper / spec.lower) ** 5e-4]}

    free = uncertainty.trainer_uncertainty(run, at=off)
    assert not free.compensating and calls == ["shift", "split"], calls
    assert free.sigma_structure
    calls.clear()
    run.horizon_shifts = [{n: np.array([0.25]) for n in learn}]       # an earlier estimate's draw
    u = uncertainty.trainer_uncertainty(run, at=pinned)
    assert u.compensating == ("actuator_time_constant",) and calls == [], calls
    assert u.lag_split is None and u.sigma_split == {}
    assert u.sigma_structure["cable_stiffness"][0] == pytest.approx(0.25 * pinned["cable_stiffness"][0])
    assert len(run.horizon_shifts) == 1                                  # no draw added
    assert all(np.isinf(s).all() for s in u.published().values())
