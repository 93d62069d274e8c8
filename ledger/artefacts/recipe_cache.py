"""Recipe caches for built-in artefacts (the tiny base, the built-in dataset).

Building them is deterministic but not free, so `.ledger/cache/<kind>/<hash of recipe>` remembers
the object id a recipe produced. A cache, never a source of truth: an entry is used only if it
names an object the store has, and any damage is a miss (the artefact is rebuilt, same bytes).
"""

from __future__ import annotations

from pathlib import Path

from ledger.store import canonical, fsio
from ledger.store.ids import hash_bytes, is_id


def path(store, kind: str, recipe: dict) -> Path:
    return store.root / "cache" / kind / hash_bytes(canonical.dumps(recipe))[3:35]


def lookup(store, kind: str, recipe: dict) -> str | None:
    try:
        oid = path(store, kind, recipe).read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None
    return oid if is_id(oid) and store.has(oid) else None


def remember(store, kind: str, recipe: dict, oid: str) -> None:
    p = path(store, kind, recipe)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        fsio.atomic_write(p, oid.encode(), store.tmp, durable=False)
    except OSError:
        pass  # a cache: losing an entry costs a rebuild
