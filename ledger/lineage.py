"""Views over generations for `ledger gens` (and the report): one row per generation."""

from __future__ import annotations

from ledger import generations
from ledger.verdicts.summary import verdict_summary


def generation_rows(store, limit: int | None = None) -> list[dict]:
    """Rows of the newest `limit` generations (all when None), oldest first, and HEAD's always:
    each row reads its manifest, verdict and parent, so a listing costs what it shows."""
    head = store.state.refs.get("HEAD")
    numbers = generations.numbers(store)
    if limit is not None and len(numbers) > limit:
        shown = set(numbers[len(numbers) - limit:] if limit > 0 else [])
        head_n = next((n for n in numbers if store.state.refs.get(f"gen-{n}") == head), None)
        numbers = [n for n in numbers if n in shown or n == head_n]
    rows = []
    for n in numbers:
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
