"""Sharing: bundles, remotes (directory and S3), signatures, and fetching a closure.

    from ledger.sharing import bundle, remote, transfer, keys
    bundle.create(store, ["gen-3"], Path("gen3.bundle"), key_name="alice")
    bundle.import_bundle(store, Path("gen3.bundle"), namespace="alice")
    be = remote.open_backend("/mnt/shared/ledger")          # or "s3://bucket/prefix"
    transfer.push(store, be, ["HEAD"]); transfer.pull(store, be, namespace="alice")
    fetch_closure(store, "alice", [receipt_id])             # bring a receipt's closure here, then
    ledger.train.reproduce.reproduce(store, receipt_id)   # re-run it (`ledger reproduce ID --from alice`)
"""

from ledger.sharing.transfer import fetch_closure  # noqa: F401
