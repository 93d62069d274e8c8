"""Invariants every reliability test checks after damage (a crash mid-transaction: tests/reliability/)."""

from ledger.store import Store, index
from ledger.store.verify import verify


def assert_consistent(root, allowed_heads=None):
    store = Store.open(root)
    rep = verify(store, read_data=True)
    assert rep.ok, rep.errors
    st = store.state
    if allowed_heads is not None:
        assert st.head in allowed_heads, (st.seq, st.head)
    # every object a record reaches exists (verify checked), and the index, once brought up
    # to date, equals a fresh rebuild
    with store.locked():
        store.sync_index()
    synced = index.dump(store.root)
    store.rebuild_index()
    assert index.dump(store.root) == synced
    return store
