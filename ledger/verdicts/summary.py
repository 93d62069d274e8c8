"""The few numbers people look at, read back from a stored verdict (Verdict.to_json's shape):
what `ledger gens`, `ledger run`, `ledger diff` and the report show of a verdict."""

from __future__ import annotations


def verdict_summary(v: dict | None) -> dict | None:
    """The few numbers people look at, from a verdict object (ledger.verdicts Verdict.to_json)."""
    if not v:
        return None
    sc = ((v.get("statistics") or {}).get("scored")) or {}
    can = ((v.get("statistics") or {}).get("canary")) or {}
    # One p-value to show: the one the verdict's reason cites (a Regressed verdict is decided by
    # the test for "worse", every other by the test for "better"), with the side it tests.
    side = "worse" if v.get("verdict") == "Regressed" and sc.get("p_worse") is not None else "better"
    return {"verdict": v.get("verdict"), "reasons": list(v.get("reason_codes") or []), "summary": v.get("summary"),
            "mean_delta": sc.get("mean"), "p_better": sc.get("p_better"), "p_worse": sc.get("p_worse"),
            "p": sc.get(f"p_{side}"), "p_side": side, "wins": sc.get("wins"), "n": sc.get("n"),
            "eta": sc.get("eta"), "incumbent_loss": sc.get("incumbent_mean_loss"),
            "candidate_loss": sc.get("candidate_mean_loss"), "canary_delta": can.get("mean_delta"),
            "budget": v.get("budget")}
