"""What ledger is: its version.

Part of ledger.api (see its docstring): import the verbs from there, `from ledger import api`."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as dist_version

from ledger.errors import BadInput


def version() -> str:
    """The installed ledger's version."""
    try:
        return dist_version("ledger")
    except PackageNotFoundError:
        raise BadInput("the ledger package is not installed, so it has no version", "pip install -e .") from None
