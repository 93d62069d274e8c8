"""Views over generations for `ledger gens` (and the report): one row per generation."""

from __future__ import annotations

from ledger import generations


def generation_rows(store) -> list[dict]:
    head = store.state.refs.get("HEAD")
    rows = []
    for n in generations.numbers(store):
        g = generations.load(store, f"gen-{n}")
        v = store.get_json(g.verdict) if g.verdict else {}
        st = v.get("statistics") or {}
        parent = None
        if g.parent:
            parent = f"gen-{store.get_json(g.parent)['n']}"
        rows.append({"name": g.name, "n": n, "id": g.id, "head": g.id == head, "parent": parent, "adapter": g.adapter,
                     "base": g.base, "receipt": g.receipt, "verdict": v.get("verdict"), "mean_delta": st.get("mean"),
                     "capabilities": sorted(g.capabilities), "note": g.note})
    return rows
