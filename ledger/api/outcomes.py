"""Ground truth for the image's turns: outcome.

Part of ledger.api (see its docstring): import the verbs from there, `from ledger import api`."""

from __future__ import annotations

import time
from dataclasses import dataclass

from ledger import experience
from ledger.api._base import Result, StoreLike, take_warnings
from ledger.api._open import open_store
from ledger.errors import UnknownRef
from ledger.image import context, protocol


@dataclass(frozen=True)
class Outcome(Result):
    """The ground truth one `outcome` record attached to a turn."""
    turn: str
    outcome: str
    seq: int



def outcome(turn: str, value: str, *, timeout: float = 10.0, wait: float = 0.0, store: StoreLike = None) -> Outcome:
    """Attach the ground-truth outcome to a recorded turn (tN, or the request id of an image turn,
    waited for up to `timeout` s): one `outcome` record; the latest wins."""
    s = open_store(store)
    tid, rid = turn, None
    if not experience.TURN_ID_RE.match(turn):
        rid = protocol.check_id(turn)
        deadline = time.monotonic() + timeout
        while (tid := context.find_request(s, rid)) is None:
            if time.monotonic() >= deadline:
                raise UnknownRef(f"no recorded turn for request {rid!r}",
                                 "check the id; a turn still in the image's buffer is recorded within a second")
            time.sleep(0.1)
    r = experience.attach_outcome(s, tid, value, wait=wait, request=rid)
    return Outcome(r["turn"], r["outcome"], r["seq"], warnings=take_warnings(s))
