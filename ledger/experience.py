"""Experience: the turns the image records, and the export that turns new ones into a dataset.

A turn is (situation, action verbatim, outcome as ground truth, refusal flag, time). A batch
of turns is one object and one `record` transaction, so a bad batch records nothing. Turns
are numbered globally in recording order (counter `turns`); `export` takes the turns after
the cursor (counter `exported`) into a Parquet dataset object, so each turn is trained on
once: a refused cycle does not hand the same turns to the same policy again.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from ledger import records
from ledger.artefacts.dataset import parquet_bytes
from ledger.errors import BadInput, Refused, UnknownRef
from ledger.store.journal import now

FIELDS = {"situation": str, "action": str, "outcome": (str, type(None)), "refusal": bool, "time": str,
          "generation": (str, type(None)), "latency_ms": (int, float, type(None)),
          # Written by the image (ledger/image): the client's idempotency key, and whether the
          # action came from the model or was given by the client. Kept only when present, so
          # turns recorded without them keep their exact bytes (and object ids).
          "request": (str, type(None)), "source": (str, type(None)),
          # The situation's system part (rendered as the chat template's system message; docs/real-models.md).
          # Kept only when present, like the two above.
          "system": (str, type(None))}
OPTIONAL = ("request", "source", "system")
REQUIRED = ("situation", "action")
MAX_TEXT = 1 << 16


def parse_turns(text: str, source: str = "input") -> list[dict]:
    """Validate JSONL rows; any bad row fails the whole batch, naming its line."""
    turns = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{source} line {lineno}"
        try:
            row = json.loads(line)
        except ValueError as e:
            # a JSONDecodeError has .msg; a ValueError from int() (an integer of more digits than
            # Python converts) has only its text
            why = getattr(e, "msg", None) or str(e).split(";")[0]
            raise BadInput(f"{where}: not JSON ({why})", "each line must be one JSON object") from None
        except RecursionError:
            raise BadInput(f"{where}: not JSON (nested too deeply to parse)", "each line must be one JSON object") from None
        if not isinstance(row, dict):
            raise BadInput(f"{where}: expected a JSON object", "each line must be one JSON object")
        unknown = set(row) - set(FIELDS)
        if unknown:
            raise BadInput(f"{where}: unknown field(s) {', '.join(sorted(unknown))}",
                           f"fields are {', '.join(FIELDS)}")
        for f in REQUIRED:
            if not isinstance(row.get(f), str) or not row[f].strip():
                raise BadInput(f"{where}: field {f!r} must be a non-empty string")
        for f, typ in FIELDS.items():
            if f in row and not isinstance(row[f], typ) or (f == "latency_ms" and isinstance(row.get(f), bool)):
                raise BadInput(f"{where}: field {f!r} has the wrong type")
            if isinstance(row.get(f), str) and len(row[f]) > MAX_TEXT:
                raise BadInput(f"{where}: field {f!r} is longer than {MAX_TEXT} characters")
        turns.append({"situation": row["situation"], "action": row["action"], "outcome": row.get("outcome"),
                      "refusal": bool(row.get("refusal", False)), "time": row.get("time") or now(),
                      "generation": row.get("generation"), "latency_ms": row.get("latency_ms"),
                      **{f: row[f] for f in OPTIONAL if row.get(f) is not None}})
    if not turns:
        raise BadInput(f"{source}: no turns", "give JSONL rows with situation and action")
    return turns


def record(store, turns: list[dict], actor: str | None = None, wait: float | None = None, extra=None) -> dict:
    """Append a batch of validated turns as one transaction.

    `extra(tx, first)`, if given, runs inside the same transaction after the batch is written, so
    a caller's own bookkeeping (the image's context and buffer cursor) commits with the turns or
    not at all."""
    with store.transaction(records.Record.KIND, actor=actor, wait=wait) as tx:
        first = store.state.counters.get("turns", 0) + 1
        batch = [dict(t, id=f"t{first + i}") for i, t in enumerate(turns)]
        oid = tx.put_json({"kind": "turns", "first": first, "turns": batch})
        tx.outputs.append(oid)
        records.write(tx, records.Record(turns=oid, first=first, count=len(batch), counters={"turns": len(batch)}))
        if extra is not None:
            extra(tx, first)
    return {"turns": oid, "first": first, "last": first + len(batch) - 1, "count": len(batch), "seq": tx.record["seq"]}


TURN_ID_RE = re.compile(r"^t([1-9][0-9]*)$")


def attach_outcome(store, turn: str, outcome: str, *, actor: str | None = None, wait: float | None = None,
                   **note) -> dict:
    """Attach the ground-truth outcome of turn `turn` (tN), learned after it was recorded: one
    `outcome` record. The turn's batch object is never rewritten; the latest outcome record for a
    turn wins in `export` and in the index's `outcomes` table."""
    m = TURN_ID_RE.match(turn) if isinstance(turn, str) else None
    if m is None:
        raise BadInput(f"{turn!r} is not a turn id", "turn ids look like t42 (see the turns table)")
    if not isinstance(outcome, str) or not outcome.strip() or len(outcome) > MAX_TEXT:
        raise BadInput(f"an outcome must be a non-empty string of at most {MAX_TEXT} characters")
    with store.transaction(records.Outcome.KIND, actor=actor, wait=wait) as tx:
        total = store.state.counters.get("turns", 0)
        if int(m.group(1)) > total:
            raise UnknownRef(f"no turn {turn}: {total} turns are recorded", "see `ledger query 'select id from turns'`")
        records.write(tx, records.Outcome(turn=turn, outcome=outcome, time=now(),
                                          extra={k: v for k, v in note.items() if v}))
    return {"turn": turn, "outcome": outcome, "seq": tx.record["seq"]}


def pending(store) -> int:
    c = store.state.counters
    return c.get("turns", 0) - c.get("exported", 0)


def turns_between(store, first: int, last: int) -> list[dict]:
    """Turns numbered first..last inclusive, each with the latest outcome attached to it later
    (`ledger outcome`), if any.

    Turns are numbered in journal order, and an outcome can only be attached to a turn already
    recorded (attach_outcome checks it inside its transaction), so every record this needs lies
    from the batch holding turn `first` on: the walk back from the journal's end stops there. An
    export reads what it exports, not the whole history."""
    batches, later = [], {}
    for r in store.journal.backwards():
        if r["kind"] == "outcome":
            o = records.read(r)                            # typed: an ill-formed record is JournalCorrupt
            later.setdefault(o.turn, o.outcome)            # newest first: the latest wins
            continue
        if r["kind"] != "record":
            continue
        b = records.read(r)
        lo, n = b.first, b.count
        if lo <= last and lo + n - 1 >= first:
            batches.append(b.turns)
        if lo <= first:
            break                                          # this batch holds turn `first`
    out = []
    for tid in reversed(batches):
        out.extend(t for t in store.get_json(tid)["turns"] if first <= int(t["id"][1:]) <= last)
    return [dict(t, outcome=later[t["id"]]) if t["id"] in later else t for t in out]


@dataclass(frozen=True)
class Export:
    id: str           # dataset object
    first: int
    last: int
    seq: int

    def to_json(self) -> dict:
        return {"dataset": self.id, "first": self.first, "last": self.last, "count": self.last - self.first + 1, "seq": self.seq}


def export(store, cycle: int | None = None, wait: float | None = None, policy: dict | None = None, **note) -> Export:
    """Turn the turns after the cursor into a Parquet dataset object; advance the cursor. `cycle`
    and `policy`: the learn cycle's number and trigger policy; `note`: more fields to record."""
    import pyarrow as pa


    with store.transaction(records.Export.KIND, wait=wait) as tx:
        c = store.state.counters
        first, last = c.get("exported", 0) + 1, c.get("turns", 0)
        if last < first:
            raise Refused("no new turns to export", "record experience first (`ledger record FILE`)")
        rows = turns_between(store, first, last)   # outcomes attached since recording included
        table = pa.table({"situation": [t["situation"] for t in rows], "action": [t["action"] for t in rows],
                          "outcome": [t.get("outcome") or "" for t in rows], "refusal": [bool(t["refusal"]) for t in rows],
                          "turn": [t["id"] for t in rows]})
        if any(t.get("system") for t in rows):  # only then: exports without one keep their bytes
            table = table.append_column("system", pa.array([t.get("system") for t in rows], pa.string()))
        oid = tx.put_bytes(parquet_bytes(table), "dataset")
        tx.outputs.append(oid)
        records.write(tx, records.Export(dataset=oid, first=first, last=last, counters={"exported": last - first + 1},
                                         cycle=records.ABSENT if cycle is None else cycle,
                                         policy=policy if policy else records.ABSENT,
                                         extra={k: v for k, v in note.items() if v}))
    return Export(oid, first, last, tx.record["seq"])
