"""The image: a live process that serves HEAD, acts through its capabilities, records its turns,
and is stopped and resumed by the learn cycle. See docs/image.md.

    ledger.image.keeper.serve(store, ServeOptions(...))      run the keeper (`ledger serve`)
    ledger.image.client.paused(store)                       the learn cycle's stop/restart hook
    ledger.image.protocol.act(store_root, situation, ...)    a client request (`ledger act`)
"""

from ledger.image.client import paused

__all__ = ["paused"]
