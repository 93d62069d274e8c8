"""Per-document losses, as the scorer hands them to the gate.

A loss is the mean negative log-likelihood (nats/token) over the action span of one document.
Both models are scored in the same run; the deltas are candidate minus incumbent, so a negative
delta means the candidate is better on that document.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from ledger.errors import BadInput


def _losses(name: str, m: Mapping[str, float] | None) -> dict[str, float]:
    if m is None:
        return {}
    if not isinstance(m, Mapping):
        raise BadInput(f"{name}: expected a mapping of doc id -> loss, got {type(m).__name__}")
    out = {}
    for doc_id, v in m.items():
        if not isinstance(doc_id, str) or not doc_id:
            raise BadInput(f"{name}: doc id must be a non-empty string, got {doc_id!r}")
        if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
            raise BadInput(f"{name}: loss of {doc_id!r} must be a number, got {v!r}")
        v = float(v)
        # A NaN loss would make every comparison False and could slip through as "not worse".
        if not math.isfinite(v) or v < 0:
            raise BadInput(f"{name}: loss of {doc_id!r} must be a finite NLL >= 0, got {v!r}")
        out[doc_id] = v
    return out


@dataclass(frozen=True)
class Scores:
    """Fresh losses of both models on the suite, plus (optionally) the incumbent's losses as
    recorded when it was itself judged: the drift check compares those with its fresh ones."""
    incumbent_scored: Mapping[str, float]
    candidate_scored: Mapping[str, float]
    incumbent_canary: Mapping[str, float] = field(default_factory=dict)
    candidate_canary: Mapping[str, float] = field(default_factory=dict)
    # doc id -> loss over S and K; None when there is no record (e.g. the first generation).
    incumbent_recorded: Mapping[str, float] | None = None

    def __post_init__(self) -> None:
        # Copy into plain dicts: a caller mutating its mapping later must not change a verdict.
        for name in ("incumbent_scored", "candidate_scored", "incumbent_canary", "candidate_canary"):
            object.__setattr__(self, name, _losses(name, getattr(self, name)))
        if self.incumbent_recorded is not None:
            object.__setattr__(self, "incumbent_recorded",
                               _losses("incumbent_recorded", self.incumbent_recorded))
        if not self.incumbent_scored:
            raise BadInput("no scored documents: the gate needs at least one")
        for what, a, b in (("scored", self.incumbent_scored, self.candidate_scored),
                           ("canary", self.incumbent_canary, self.candidate_canary)):
            if a.keys() != b.keys():
                only_i = sorted(a.keys() - b.keys())[:5]
                only_c = sorted(b.keys() - a.keys())[:5]
                raise BadInput(f"{what} documents differ between incumbent and candidate "
                               f"(only incumbent: {only_i}, only candidate: {only_c})",
                               hint="both models must be scored on the same documents in the same run")
        both = self.incumbent_scored.keys() & self.incumbent_canary.keys()
        if both:
            raise BadInput(f"documents both scored and canary: {sorted(both)[:5]}")

    # Doc ids in sorted order, so deltas (and so every statistic) do not depend on dict order.
    @property
    def scored_ids(self) -> list[str]:
        return sorted(self.incumbent_scored)

    @property
    def canary_ids(self) -> list[str]:
        return sorted(self.incumbent_canary)

    def scored_deltas(self) -> np.ndarray:
        return np.array([self.candidate_scored[i] - self.incumbent_scored[i] for i in self.scored_ids],
                        dtype=np.float64)

    def canary_deltas(self) -> np.ndarray:
        return np.array([self.candidate_canary[i] - self.incumbent_canary[i] for i in self.canary_ids],
                        dtype=np.float64)

    def incumbent_fresh(self) -> dict[str, float]:
        return {**self.incumbent_scored, **self.incumbent_canary}
