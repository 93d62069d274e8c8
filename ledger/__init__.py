"""ledger: a content-addressed experiment ledger.

`import ledger` stays light (the CLI's start-up path imports it): the porcelain is loaded on
first use, e.g. `ledger.track(...)` for a training loop of your own (docs/tracking.md).
"""
from ledger.store import schema as _schema

__version__ = "0.1.0"

# Every record kind's schema and index projection lives in ledger.records, which registers into the
# store; the store (the bottom layer) may not import it, so it is named here and loaded on first
# use (store/schema.py says why; loading it here would cost every CLI command ~25 ms).
_schema.use_kinds_from("ledger.records")


def __getattr__(name):
    # Lazy so that `import ledger` (every CLI command) does not import the store and its writers.
    if name in ("track", "Run"):
        from ledger.train import track as _track

        return getattr(_track, name)
    raise AttributeError(f"module 'ledger' has no attribute {name!r}")
