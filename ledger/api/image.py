"""The image: serve, act, status, stop.

Part of ledger.api (see its docstring): import the verbs from there, `from ledger import api`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

from ledger.api._base import Result, StoreLike, store_root, take_warnings
from ledger.api._open import open_store
from ledger.errors import ImageUnavailable
from ledger.image import client, protocol
from ledger.options import ServeOptions


@dataclass(frozen=True)
class ImageStatus(Result):
    """A running image's state: what it serves, its confinement and its buffer."""
    status: Mapping   # the keeper's status ({"running": false} when no image serves the store)

    def to_json(self):
        return self.status


def serve(options: ServeOptions = ServeOptions(), *, detach: bool = False,
          ready: Callable[[Mapping], None] | None = None,
          store: StoreLike = None) -> ImageStatus:
    """Serve HEAD on .ledger/run/image.sock: act, record every turn, follow HEAD, pause for cycles.
    In this process until stopped (`ready(status)` is called once serving), or with `detach` in
    the background, returning once it serves. The detached keeper gets `options` as JSON."""
    s = open_store(store)
    if options.learn is not None:
        from ledger import cycle  # the spec and target, checked before serving (not at the first cycle)

        cycle.check_options(options.learn)
    if detach:
        return ImageStatus(client.start_detached(s.root, options))
    import ledger.image.keeper as keeper  # torch and the learn cycle: only when serving in this process

    keeper.serve(s, options, ready=(lambda k: ready(k.status())) if ready else None)
    return ImageStatus({"running": False, "stopped": True}, warnings=take_warnings(s))


@dataclass(frozen=True)
class Acted(Result):
    """One answer from the image: the action, the turn it recorded and the generation."""
    reply: Mapping   # the image's reply: id, turn (action, outcome, kind, latency_ms, ...), turn_id, duplicate

    def to_json(self):
        return self.reply


def act(situation: str, *, action: str | None = None, request_id: str | None = None, max_new: int | None = None,
        wait_recorded: bool = True, timeout: float = 120.0, store: StoreLike = None) -> Acted:
    """Ask the running image to act on a situation (or execute and record `action`); `request_id`
    makes a retry idempotent; `wait_recorded`: wait for the journal's turn id."""
    reply = protocol.act(store_root(store), situation, action=action, request_id=request_id, max_new=max_new,
                         wait_recorded=wait_recorded, timeout=timeout)
    return Acted(reply)


def image_status(*, store: StoreLike = None) -> ImageStatus:
    """Whether an image serves this store, which generation, and its context."""
    return ImageStatus(client.status(store_root(store)))


def image_stop(*, store: StoreLike = None) -> ImageStatus:
    """Stop the image: it finishes the request in flight, its turns are committed, it exits."""
    root = store_root(store)
    if not client.status(root).get("running"):
        raise ImageUnavailable(f"no image is serving {root}", "nothing to stop")
    return ImageStatus(client.stop(root))
