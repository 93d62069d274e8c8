"""ledger: a content-addressed experiment ledger."""
__version__ = "0.1.0"
