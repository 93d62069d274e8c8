"""Views over generations for `ledger gens` (and the report): one row per generation."""

from __future__ import annotations

from ledger import generations
from ledger.verdicts.summary import verdict_summary


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
