"""Views over generations for `ledger gens` (and the report): one row per generation."""

from __future__ import annotations

from ledger import generations


def generation_rows(store) -> list[dict]:
    head = store.state.refs.get("HEAD")
    rows = []
    for n in generations.numbers(store):
        g = generations.load(store, f"gen-{n}")
        v = verdict_summary(store.get_json(g.verdict)) if g.verdict else None
        parent = None
        if g.parent:
            parent = f"gen-{store.get_json(g.parent)['n']}"
        rows.append({"name": g.name, "n": n, "id": g.id, "head": g.id == head, "parent": parent, "adapter": g.adapter,
                     "base": g.base, "receipt": g.receipt, "verdict": v["verdict"] if v else None,
                     "mean_delta": v["mean_delta"] if v else None,
                     "capabilities": sorted(g.capabilities), "note": g.note})
    return rows


def verdict_summary(v: dict | None) -> dict | None:
    """The few numbers people look at, from a verdict object (ledger.verdicts Verdict.to_json)."""
    if not v:
        return None
    sc = ((v.get("statistics") or {}).get("scored")) or {}
    can = ((v.get("statistics") or {}).get("canary")) or {}
    return {"verdict": v.get("verdict"), "reasons": list(v.get("reason_codes") or []), "summary": v.get("summary"),
            "mean_delta": sc.get("mean"), "p_better": sc.get("p_better"), "wins": sc.get("wins"), "n": sc.get("n"),
            "eta": sc.get("eta"), "incumbent_loss": sc.get("incumbent_mean_loss"),
            "candidate_loss": sc.get("candidate_mean_loss"), "canary_delta": can.get("mean_delta"),
            "budget": v.get("budget")}
