"""Sign-flip test, descriptive statistics and bootstrap (ledger/verdicts/stats.py).

Exact p-values below are enumerated by hand. Convention: T(s) = sum_i s_i d_i over the 2^n sign
patterns s; p_better = #{s: T(s) <= T_obs} / 2^n, p_worse = #{s: T(s) >= T_obs} / 2^n.
"""

import itertools
import math
import time

import numpy as np
import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from ledger.errors import BadInput
from ledger.verdicts.settings import GateSettings
from ledger.verdicts.stats import EXACT, MONTE_CARLO, bootstrap_mean_interval, paired_stats, sign_flip_test


def brute_force(d):
    """Independent oracle: literally enumerate sign tuples with itertools (tiny n only)."""
    d = list(d)
    t_obs = sum(d)
    tol = 2e-10 * sum(abs(x) for x in d)  # the implementation's tie tolerance, on T
    ts = [sum(s * x for s, x in zip(signs, d)) for signs in itertools.product((1, -1), repeat=len(d))]
    n = len(ts)
    return sum(t <= t_obs + tol for t in ts) / n, sum(t >= t_obs - tol for t in ts) / n


# --- exact enumeration, by hand ------------------------------------------------------------
def test_n1():
    # d = [-0.5]: T in {-0.5 (obs), +0.5}. p_better = 1/2; p_worse counts both = 2/2.
    r = sign_flip_test([-0.5])
    assert (r.p_better, r.p_worse, r.method, r.patterns) == (0.5, 1.0, EXACT, 2)


def test_n2_both_better():
    # d = [-1, -2]: T in {-3 (obs), -1, +1, +3}: p_better = 1/4, p_worse = 4/4.
    r = sign_flip_test([-1.0, -2.0])
    assert (r.p_better, r.p_worse) == (0.25, 1.0)


def test_n2_mixed():
    # d = [-1, 2]: T_obs = 1; T in {1, 3, -3, -1}: p_better = #{1,-3,-1} = 3/4, p_worse = #{1,3} = 2/4.
    r = sign_flip_test([-1.0, 2.0])
    assert (r.p_better, r.p_worse) == (0.75, 0.5)


def test_n3():
    # d = [-3, -2, 1], T_obs = -4. The 8 patterns (signs on -3, -2, 1):
    #  +++ -4 | -++ 2 | +-+ 0 | ++- -6 | --+ 6 | -+- 0 | +-- -2 | --- 4
    # p_better = #{-4, -6} / 8 = 0.25;  p_worse = #{all but -6} / 8 = 0.875.
    r = sign_flip_test([-3.0, -2.0, 1.0])
    assert (r.p_better, r.p_worse) == (0.25, 0.875)


def test_n4_floor_is_one_sixteenth():
    # All 4 documents better: only the identity pattern is as extreme, so p = 1/16 = 0.0625 > 0.05.
    # This is why 4 canaries can never be "significant" and divergence is an effect-size rule.
    r = sign_flip_test([-0.1, -0.2, -0.3, -0.4])
    assert r.p_better == 1 / 16 == 0.0625
    assert r.p_worse == 1.0
    assert r.patterns == 16


def test_n4_one_worse():
    # d = [-4, -3, -2, 1], T_obs = -8. T(F) = T_obs - 2*sum_{F} d, so T(F) <= T_obs iff the
    # flipped subset F sums to >= 0: only {} and {1} -> p_better = 2/16. Every subset except
    # {1} sums to <= 0 -> p_worse = 15/16.
    r = sign_flip_test([-4.0, -3.0, -2.0, 1.0])
    assert (r.p_better, r.p_worse) == (2 / 16, 15 / 16)


def test_exact_ties_count_for_both_directions():
    # d = [1, -1]: T_obs = 0; T in {0, -2, 2, 0}: p_better = 3/4 = p_worse.
    r = sign_flip_test([1.0, -1.0])
    assert (r.p_better, r.p_worse) == (0.75, 0.75)
    # all zero: every pattern ties with the observation
    r = sign_flip_test([0.0, 0.0, 0.0])
    assert (r.p_better, r.p_worse) == (1.0, 1.0)


def test_floating_near_ties_are_ties():
    # 0.1 + 0.2 - 0.3 is 5.5e-17 in floats, not 0: the tolerance must still see a tie, so the
    # answer is the same as for the exactly representable [1, 2, -3].
    a = sign_flip_test([0.1, 0.2, -0.3])
    b = sign_flip_test([1.0, 2.0, -3.0])
    assert (a.p_better, a.p_worse) == (b.p_better, b.p_worse)


def test_matches_bit_matrix_oracle_n16():
    # Independent vectorised oracle: the (2^n x n) bit matrix the fast path avoids building.
    rng = np.random.default_rng(3)
    d = rng.normal(-0.1, 0.3, 16)
    n = d.size
    bits = (np.arange(1 << n)[:, None] >> np.arange(n)) & 1
    t = (1 - 2 * bits) @ d
    t_obs = d.sum()
    tol = 1e-9 * np.abs(d).sum()
    r = sign_flip_test(d)
    assert r.p_better == np.count_nonzero(t <= t_obs + tol) / (1 << n)
    assert r.p_worse == np.count_nonzero(t >= t_obs - tol) / (1 << n)


def test_n20_exact_is_fast():
    d = -np.linspace(0.01, 0.2, 20)
    t0 = time.perf_counter()
    r = sign_flip_test(d)
    elapsed = time.perf_counter() - t0
    assert r.method == EXACT and r.patterns == 2 ** 20
    assert r.p_better == 2.0 ** -20
    assert elapsed < 1.0, f"n=20 enumeration took {elapsed:.2f}s"


# --- Monte Carlo ---------------------------------------------------------------------------
def test_monte_carlo_above_20_is_deterministic():
    rng = np.random.default_rng(11)
    d = rng.normal(-0.05, 0.3, 25)
    a, b = sign_flip_test(d), sign_flip_test(d)
    assert a == b
    assert a.method == MONTE_CARLO and a.patterns == 10_000
    # p = (1 + count) / (1 + draws): a whole number of 1/10001 steps
    for p in (a.p_better, a.p_worse):
        assert abs(p * 10_001 - round(p * 10_001)) < 1e-6


def test_monte_carlo_never_zero():
    # All 25 better: the true p is 2^-25, far below 1/10001; MC reports the floor 1/(1+draws).
    r = sign_flip_test([-1.0] * 25)
    assert r.p_better == 1 / 10_001
    assert r.p_worse == 1.0


def test_monte_carlo_seed_matters_and_is_close_to_exact():
    rng = np.random.default_rng(5)
    d = rng.normal(-0.08, 0.3, 21)
    exact = sign_flip_test(d, exact_max_n=21)
    mc1 = sign_flip_test(d, seed=1)
    mc2 = sign_flip_test(d, seed=2)
    assert exact.method == EXACT and mc1.method == MONTE_CARLO
    assert mc1 != mc2  # the seed is really used
    # 10^4 draws: standard error <= 0.005
    assert abs(mc1.p_better - exact.p_better) < 0.02
    assert abs(mc1.p_worse - exact.p_worse) < 0.02


def test_exact_max_n_boundary():
    assert sign_flip_test([-1.0] * 20).method == EXACT
    assert sign_flip_test([-1.0] * 21).method == MONTE_CARLO
    assert sign_flip_test([-1.0] * 5, exact_max_n=4).method == MONTE_CARLO


def test_monte_carlo_chunking_does_not_change_the_stream(monkeypatch):
    import ledger.verdicts.stats as stats_mod
    d = np.random.default_rng(9).normal(0.0, 1.0, 30)
    whole = sign_flip_test(d, mc_draws=3000)
    monkeypatch.setattr(stats_mod, "_CHUNK_ELEMENTS", 30 * 7)  # 7 draws per chunk
    assert sign_flip_test(d, mc_draws=3000) == whole


# --- properties ----------------------------------------------------------------------------
deltas = st.lists(st.floats(min_value=-5, max_value=5, allow_nan=False, allow_infinity=False),
                  min_size=1, max_size=9)


@hsettings(max_examples=150, deadline=None)
@given(deltas)
def test_property_p_in_unit_interval_and_matches_oracle(d):
    r = sign_flip_test(d)
    assert 0 < r.p_better <= 1 and 0 < r.p_worse <= 1
    assert r.p_better >= 2.0 ** -len(d)
    # every pattern is on at least one side of the observation
    assert r.p_better + r.p_worse >= 1
    # compare with itertools only where no sum sits inside the two tie tolerances' difference
    pb, pw = brute_force(d)
    if all(abs(x) > 1e-6 for x in d) or not any(d):
        assert (r.p_better, r.p_worse) == pytest.approx((pb, pw))


@hsettings(max_examples=150, deadline=None)
@given(deltas)
def test_property_symmetric_under_negation(d):
    a = sign_flip_test(d)
    b = sign_flip_test([-x for x in d])
    assert a.p_better == b.p_worse
    assert a.p_worse == b.p_better


@hsettings(max_examples=30, deadline=None)
@given(st.lists(st.floats(min_value=-5, max_value=5, allow_nan=False), min_size=21, max_size=40))
def test_property_monte_carlo_symmetric_under_negation(d):
    a = sign_flip_test(d, mc_draws=500)
    b = sign_flip_test([-x for x in d], mc_draws=500)
    assert (a.p_better, a.p_worse) == (b.p_worse, b.p_better)
    assert 0 < a.p_better <= 1


# --- descriptive statistics ----------------------------------------------------------------
def test_paired_stats_by_hand():
    # d = [-1, -2, -3, -4]: mean -2.5; deviations 1.5, .5, -.5, -1.5; sum of squares 5;
    # sd (ddof=1) = sqrt(5/3) = 1.2909944; d_z = -2.5 / 1.2909944 = -1.9364917.
    s = paired_stats([-1.0, -2.0, -3.0, -4.0])
    assert s.n == 4 and s.mean == -2.5
    assert s.sd == pytest.approx(math.sqrt(5 / 3))
    assert s.d_z == pytest.approx(-1.9364917)
    assert (s.wins, s.losses, s.ties) == (4, 0, 0)
    assert s.p_better == 1 / 16
    assert s.standard_error == pytest.approx(math.sqrt(5 / 3) / 2)


def test_paired_stats_counts_and_degenerate_cases():
    s = paired_stats([-1.0, 0.0, 2.0])
    assert (s.wins, s.losses, s.ties) == (1, 1, 1)
    one = paired_stats([-0.3])
    assert one.sd == 0.0 and one.d_z is None
    flat = paired_stats([0.5, 0.5, 0.5])
    assert flat.sd == 0.0 and flat.d_z is None


def test_paired_stats_json_is_finite():
    import json
    s = paired_stats([-0.3])
    json.dumps(s.to_json(), allow_nan=False)


def test_bootstrap_seeded_and_sane():
    d = np.random.default_rng(1).normal(-0.2, 0.5, 40)
    a = bootstrap_mean_interval(d)
    assert a == bootstrap_mean_interval(d)
    assert a.low < d.mean() < a.high
    # roughly mean +- 1.96 * se
    se = d.std(ddof=1) / math.sqrt(d.size)
    assert a.high - a.low == pytest.approx(2 * 1.96 * se, rel=0.25)
    assert bootstrap_mean_interval(d, seed=2) != a
    c = bootstrap_mean_interval([0.25, 0.25, 0.25])
    assert (c.low, c.high) == (0.25, 0.25)


def test_settings_flow_into_stats():
    s = GateSettings(exact_max_n=3, mc_draws=99, bootstrap_draws=7)
    p = paired_stats([-1.0, -2.0, -3.0, -4.0], s)
    assert p.test.method == MONTE_CARLO and p.test.patterns == 99
    assert p.bootstrap.draws == 7


@pytest.mark.parametrize("bad", [[], [float("nan")], [1.0, float("inf")], ["0.5"], [True],
                                 [[1.0, 2.0]], None])
def test_bad_deltas(bad):
    with pytest.raises(BadInput):
        sign_flip_test(bad)
    with pytest.raises(BadInput):
        paired_stats(bad)


def test_bad_array_dtype():
    with pytest.raises(BadInput):
        sign_flip_test(np.array(["a", "b"]))
    with pytest.raises(BadInput):
        sign_flip_test(np.zeros((2, 2)))
