"""Sharing: bundles, remotes (directory and S3), signatures, and fetching a closure.

    from ledger.sharing import bundle, fetch, push, remote, repair
    bundle.create(store, ["gen-3"], Path("gen3.bundle"), key_name="alice")
    bundle.import_bundle(store, Path("gen3.bundle"), namespace="alice")
    be = remote.open_backend("/mnt/shared/ledger")          # or "s3://bucket/prefix"
    push.push(store, be, ["HEAD"]); fetch.pull(store, be, namespace="alice")
    fetch_closure(store, "alice", [receipt_id])             # bring a receipt's closure here, then
    ledger.train.reproduce.reproduce(store, receipt_id)   # re-run it (`ledger reproduce ID --from alice`)
    repair.repair(store, fetch.open_source(store, "alice"))  # replace damaged objects with verified copies

The rooms: sources.py (the Source protocol: remotes and bundles alike), push.py (outbound),
admit.py (the one inbound verification), fetch.py (pull, fetch_closure, the loose walk),
repair.py, bundle.py (the file format), remote.py (directory and S3 backends), manifest.py
(what is shared), signing.py and keys.py (trust), durable.py and pool.py (moving many objects).
"""

from ledger.sharing.fetch import fetch_closure  # noqa: F401
