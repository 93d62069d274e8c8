"""The content-addressed store. See docs/store-api.md and docs/store-format.md."""

from ledger.store.repo import Store, Transaction, find_root  # noqa: F401
