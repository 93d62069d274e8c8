"""Sharing: bundles, remotes (directory and S3), signatures, and fetching a closure.

    from ledger.sharing import bundle, remote, transfer, keys
    bundle.create(store, ["gen-3"], Path("gen3.bundle"), key_name="alice")
    bundle.import_bundle(store, Path("gen3.bundle"), namespace="alice")
    be = remote.open_backend("/mnt/shared/ledger")          # or "s3://bucket/prefix"
    transfer.push(store, be, ["HEAD"]); transfer.pull(store, be, namespace="alice")
    fetch_closure(store, "alice", [receipt_id])             # bring a receipt's closure here
    reproduce_from(store, "alice", receipt_id)              # `reproduce --from`: fetch, then re-run
"""

from ledger.sharing.transfer import fetch_closure  # noqa: F401


def reproduce_from(*args, **kwargs):
    """See ledger.sharing.reproduce (imported lazily: it pulls in the runners)."""
    from ledger.sharing.reproduce import reproduce_from as impl

    return impl(*args, **kwargs)
