"""Opening the store a verb names (apart from _base: the journal's readers never need a Store)."""

from __future__ import annotations

from ledger.api._base import StoreLike
from ledger.store.repo import Store


def open_store(store: StoreLike) -> Store:
    """A Store for `store`: a Store as is, a folder (DIR or DIR/.ledger), or None for the store
    found from the current folder or any parent (LEDGER_DIR when set)."""
    if isinstance(store, Store):
        return store
    return Store.open(None if store is None else str(store))
