"""The context: counters and cursor follow the recorded turns; it is one ref away after a restart."""

from ledger import generations
from ledger.image import context as ctxlib
from ledger.image.spool import Entry
from ledger.store import Store


def _e(n, gen, **turn):
    return Entry("s" * 16, n, {"situation": "s", "action": "a", "generation": gen, **turn}, turn.pop("meta", {}))


def test_after_counts_and_switches(tmp_path):
    class G:
        def __init__(self, oid, n, caps):
            self.id, self.n, self.capabilities = oid, n, caps

    gens = {"g1": G("g1", 1, {"adder": {"grants": []}}), "g2": G("g2", 2, {})}
    ctx = ctxlib.Context().serving(gens["g1"])
    assert ctx.counters["switches"] == 0 and ctx.grants == {"adder": []}
    entries = [_e(1, "g1", refusal=True), _e(2, "g1", source="given"), _e(3, "g2"), _e(4, "g2")]
    entries[1] = Entry(entries[1].session, 2, entries[1].turn, {"kind": "call", "error": True})
    new = ctx.after(entries, 11, gens.__getitem__)
    c = new.counters
    assert (c["turns"], c["refusals"], c["given"], c["calls"], c["call_errors"], c["switches"]) == (4, 1, 1, 1, 1, 1)
    assert new.generation == "g2" and new.gen == 2 and new.grants == {}
    assert new.cursor == {"session": "s" * 16, "n": 4, "turn": 14}


def test_written_context_is_restored_through_its_ref(tmp_path):
    s = Store.init(tmp_path)
    assert ctxlib.load(s) == ctxlib.Context()
    with s.transaction("image") as tx:
        c1 = ctxlib.write(tx, ctxlib.Context().bump(starts=1))
    with s.transaction("image") as tx:
        c2 = ctxlib.write(tx, c1.bump(turns=3))
    back = ctxlib.load(Store.open(tmp_path))
    assert back == c2 and back.previous == c1.id and back.counters["turns"] == 3 and back.counters["starts"] == 1


def test_request_lookup_from_the_journal(tmp_path):
    from ledger import experience

    s = Store.init(tmp_path)
    rows = "\n".join('{"situation": "s%d", "action": "a", "request": "r%d"}' % (i, i) for i in range(3))

    def extra(tx, first):
        tx.payload["requests"] = ["r0", "r1", "r2"]

    experience.record(s, experience.parse_turns('{"situation": "x", "action": "y"}'))
    experience.record(s, experience.parse_turns(rows), extra=extra)
    assert ctxlib.find_request(s, "r2") == "t4" and ctxlib.find_request(s, "nope") is None
    recent = ctxlib.recent_requests(s)
    assert list(recent) == ["r0", "r1", "r2"] and recent["r1"]["id"] == "t3"
    assert generations.head(s) is None
