"""Reproducing a colleague's receipt from a remote or bundle: fetch its closure, then re-run.

This is the `--from` half of `ledger reproduce RECEIPT --from REMOTE|BUNDLE`; the re-run and
the comparison object are the runners' (ledger.runners.reproduce). Nothing but the receipt id
and the source is needed: the closure carries the plan, spec, base weights, tokenizer,
dataset and checkpoints the receipt pins.
"""

from __future__ import annotations

from dataclasses import dataclass

from ledger.sharing.transfer import FetchResult, fetch_closure


@dataclass(frozen=True)
class ReproducedFrom:
    fetch: FetchResult
    result: object          # ledger.runners.reproduce.ReproduceResult

    def to_json(self) -> dict:
        return {"fetch": self.fetch.to_json(), **self.result.to_json()}


def reproduce_from(store, source: str, receipt: str, namespace: str | None = None, progress=None,
                   **reproduce_kwargs) -> ReproducedFrom:
    """Fetch `receipt`'s closure from `source` (remote name, bundle file, remote directory or
    s3:// URL), then call the runners' reproduce on it. Inputs the source lacks are not an
    error here: reproduce answers MissingInputs naming them."""
    from ledger.runners.reproduce import reproduce

    fetched = fetch_closure(store, source, [receipt], namespace=namespace, progress=progress)
    return ReproducedFrom(fetch=fetched, result=reproduce(store, fetched.requested[0], **reproduce_kwargs))
