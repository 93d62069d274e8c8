"""The content-addressed store. See docs/store-api.md and docs/store-format.md.

Names are loaded lazily so that light commands (`ledger log`) import only what they use.
"""

import importlib

_LAZY = {"Store": "ledger.store.repo", "Transaction": "ledger.store.repo", "find_root": "ledger.store.paths"}


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(name)
