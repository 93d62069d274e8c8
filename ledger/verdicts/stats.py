"""Statistics of paired per-document deltas d_i = L_candidate(i) - L_incumbent(i).

Lower loss is better, so the candidate is *better* when mean d < 0 and *worse* when mean d > 0.

The significance test is the one-sided paired sign-flip permutation test. Under the null
hypothesis "candidate and incumbent are exchangeable on each document", each d_i is as likely to
have come out as -d_i, so the 2^n sign patterns s are equally likely and the p-value is the
fraction of patterns whose statistic sum(s_i * d_i) is at least as extreme as the observed sum.
It assumes nothing about the distribution of d (no normality), which matters on suites of 10-30
documents, and with n documents its smallest possible p-value is 1/2^n (1/16 for 4 canaries).

A useful identity turns the whole test into subset sums: flipping the signs of a subset F gives
sum(s*d) = sum(d) - 2*sum_{i in F} d_i, so the flipped statistic is <= the observed one exactly
when sum_{i in F} d_i >= 0. Counting subsets with a non-negative sum therefore counts patterns at
least as favourable to "candidate better", with no subtraction of nearly equal numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

import numpy as np

from ledger.errors import BadInput
from ledger.verdicts.settings import GateSettings

EXACT = "exact"
MONTE_CARLO = "monte_carlo"

# Elements per Monte Carlo / bootstrap chunk: bounds memory for large suites (16 MiB of float64).
_CHUNK_ELEMENTS = 1 << 21


def as_deltas(d: Iterable[float]) -> np.ndarray:
    """Validate deltas: a non-empty 1-D sequence of finite real numbers (not strings, not bools:
    numpy would happily convert "0.5" or True, hiding a caller's bug)."""
    if isinstance(d, np.ndarray):
        if d.dtype.kind not in "fiu":
            raise BadInput(f"deltas must be real numbers, got an array of {d.dtype}")
        a = d.astype(np.float64, copy=False)
    else:
        try:
            items = list(d)
        except TypeError:
            raise BadInput(f"deltas must be a sequence of numbers, got {type(d).__name__}") from None
        for x in items:
            if isinstance(x, bool) or not isinstance(x, (int, float, np.integer, np.floating)):
                raise BadInput(f"deltas must be real numbers, got {x!r}")
        a = np.asarray(items, dtype=np.float64)
    if a.ndim != 1:
        raise BadInput(f"deltas must be one-dimensional, got shape {a.shape}")
    if a.size == 0:
        raise BadInput("no documents: the statistics need at least one paired delta")
    if not np.all(np.isfinite(a)):
        raise BadInput("deltas must be finite (a NaN or inf loss reached the gate)")
    return a


def _tie_tolerance(d: np.ndarray) -> float:
    # Subset sums carry rounding error of about n * 2^-53 * sum|d| (< 1e-14 relative for any n we
    # enumerate). Sums within 1e-10 * sum|d| of zero are treated as ties, which counts them for
    # *both* directions: conservative, and it makes p_better(d) == p_worse(-d) exactly.
    return 1e-10 * float(np.sum(np.abs(d)))


@dataclass(frozen=True)
class SignFlipResult:
    """The exact (or Monte Carlo) one-sided paired sign-flip permutation test's p-values."""
    p_better: float  # one-sided p for "candidate better" (mean d < 0)
    p_worse: float  # one-sided p for "candidate worse" (mean d > 0)
    method: str  # EXACT or MONTE_CARLO
    patterns: int  # 2^n sign patterns enumerated, or Monte Carlo draws

    def to_json(self) -> dict:
        return {"p_better": self.p_better, "p_worse": self.p_worse, "method": self.method,
                "patterns": self.patterns}


def _subset_sums(d: np.ndarray) -> np.ndarray:
    """All 2^n subset sums; entry k is the sum of d_i over the bits i set in k.

    Built by doubling: after step i the first 2^(i+1) entries cover every subset of d_0..d_i
    (the upper half is the lower half plus d_i). 2^n additions in total, one float64 array, no
    (2^n x n) bit matrix: n = 20 takes a few milliseconds and 8 MiB.
    """
    n = d.size
    sums = np.zeros(1 << n, dtype=np.float64)
    size = 1
    for x in d:
        np.add(sums[:size], x, out=sums[size:2 * size])
        size <<= 1
    return sums


def sign_flip_test(d: Iterable[float], *, exact_max_n: int = 20, mc_draws: int = 10_000,
                   seed: int = GateSettings.mc_seed) -> SignFlipResult:
    """One-sided paired sign-flip permutation test, in both directions.

    n <= exact_max_n: exact, over all 2^n patterns (the identity pattern included, so p >= 2^-n).
    Above: `mc_draws` random patterns from a generator seeded with `seed`, and
    p = (1 + count) / (1 + draws), which counts the observed pattern once and so never gives 0.
    """
    a = as_deltas(d)
    n = a.size
    tol = _tie_tolerance(a)
    if n <= exact_max_n:
        sums = _subset_sums(a)
        total = sums.size
        better = int(np.count_nonzero(sums >= -tol))
        worse = int(np.count_nonzero(sums <= tol))
        return SignFlipResult(better / total, worse / total, EXACT, total)

    if mc_draws < 1:
        raise BadInput(f"mc_draws must be >= 1, got {mc_draws}")
    rng = np.random.default_rng(seed)
    chunk = max(1, _CHUNK_ELEMENTS // n)
    better = worse = 0
    done = 0
    while done < mc_draws:
        m = min(chunk, mc_draws - done)
        # Each row is a flip set F (element i flipped with probability 1/2); random() rather than
        # integers() so the stream does not depend on the chunk size.
        flips = (rng.random((m, n)) < 0.5).astype(np.float64)
        sums = flips @ a
        better += int(np.count_nonzero(sums >= -tol))
        worse += int(np.count_nonzero(sums <= tol))
        done += m
    return SignFlipResult((1 + better) / (1 + mc_draws), (1 + worse) / (1 + mc_draws),
                          MONTE_CARLO, mc_draws)


@dataclass(frozen=True)
class BootstrapInterval:
    """A bootstrap interval of the mean paired delta (for display, never for deciding)."""
    low: float
    high: float
    level: float
    draws: int
    seed: int

    def to_json(self) -> dict:
        return {"low": self.low, "high": self.high, "level": self.level, "draws": self.draws,
                "seed": self.seed}


def bootstrap_mean_interval(d: Iterable[float], *, draws: int = 2_000, level: float = 0.95,
                            seed: int = GateSettings.bootstrap_seed) -> BootstrapInterval:
    """Seeded percentile bootstrap interval for mean d. For display only: the decision uses the
    permutation test, which is exact on small suites where the bootstrap is not."""
    a = as_deltas(d)
    if draws < 1:
        raise BadInput(f"bootstrap draws must be >= 1, got {draws}")
    if not 0.0 < level < 1.0:
        raise BadInput(f"bootstrap level must be in (0, 1), got {level}")
    n = a.size
    rng = np.random.default_rng(seed)
    chunk = max(1, _CHUNK_ELEMENTS // n)
    means = np.empty(draws, dtype=np.float64)
    done = 0
    while done < draws:
        m = min(chunk, draws - done)
        idx = rng.integers(0, n, size=(m, n))
        means[done:done + m] = a[idx].mean(axis=1)
        done += m
    tail = (1.0 - level) / 2.0
    low, high = np.quantile(means, [tail, 1.0 - tail])
    return BootstrapInterval(float(low), float(high), float(level), draws, seed)


@dataclass(frozen=True)
class PairedStats:
    """Everything the gate and the record need about one set of paired deltas."""
    n: int
    mean: float
    sd: float  # sample sd (ddof=1); 0.0 when n == 1, where it is undefined
    d_z: float | None  # mean / sd (Cohen's d_z); None when sd == 0
    wins: int  # documents with d_i < 0 (candidate better)
    losses: int  # documents with d_i > 0
    ties: int
    test: SignFlipResult
    bootstrap: BootstrapInterval

    @property
    def p_better(self) -> float:
        return self.test.p_better

    @property
    def p_worse(self) -> float:
        return self.test.p_worse

    @property
    def standard_error(self) -> float:
        return self.sd / math.sqrt(self.n)

    def to_json(self) -> dict:
        return {"n": self.n, "mean": self.mean, "sd": self.sd, "d_z": self.d_z,
                "standard_error": self.standard_error, "wins": self.wins, "losses": self.losses,
                "ties": self.ties, "wins_over_n": self.wins / self.n,
                "p_better": self.p_better, "p_worse": self.p_worse,
                "test": self.test.to_json(), "bootstrap": self.bootstrap.to_json()}


def paired_stats(d: Iterable[float], settings: GateSettings | None = None) -> PairedStats:
    """Mean, sd, d_z, wins and the sign-flip p-values of paired deltas d."""
    s = settings or GateSettings()
    a = as_deltas(d)
    n = a.size
    mean = float(np.mean(a))
    sd = float(np.std(a, ddof=1)) if n > 1 else 0.0
    d_z = mean / sd if sd > 0 else None
    return PairedStats(
        n=n, mean=mean, sd=sd, d_z=d_z,
        wins=int(np.count_nonzero(a < 0)), losses=int(np.count_nonzero(a > 0)),
        ties=int(np.count_nonzero(a == 0)),
        test=sign_flip_test(a, exact_max_n=s.exact_max_n, mc_draws=s.mc_draws, seed=s.mc_seed),
        bootstrap=bootstrap_mean_interval(a, draws=s.bootstrap_draws, level=s.bootstrap_level,
                                          seed=s.bootstrap_seed),
    )
