"""ledger: a content-addressed experiment ledger.

`import ledger` stays light (the CLI's start-up path imports it): the porcelain is loaded on
first use, e.g. `ledger.track(...)` for a training loop of your own (docs/tracking.md).
"""
__version__ = "0.1.0"


def __getattr__(name):
    # Lazy so that `import ledger` (every CLI command) does not import the store and its writers.
    if name in ("track", "Run"):
        from ledger.train import track as _track  # lazy: the facade stays light (above)

        return getattr(_track, name)
    raise AttributeError(f"module 'ledger' has no attribute {name!r}")
