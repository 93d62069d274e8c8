"""`ledger adopt team/gen-7`: make a colleague's imported generation live here.

An imported generation (pulled under a namespace, `team/gen-7`) is a manifest in this store that
no local record made live. Adopting it is one command:

  1. its model — base weights and adapter — must be here whole (pull or fetch brought its closure);
  2. the local gate judges its adapter against the local HEAD on the local sealed suite (one
     `judge` record, as for any candidate); anything but Accept refuses with the verdict (exit 3);
     `--force` skips the gate, and the adopt record says it was forced and why;
  3. one `adopt` record makes gen-(N+1) from it and moves HEAD.

What is taken from the import is the model and the evidence that came with it (its receipt). The
capabilities, grants and kernels stay the local HEAD's: grants are local policy and may only be
attenuated here, never widened by someone else's manifest.
"""

from __future__ import annotations

from dataclasses import dataclass

from ledger import generations, records
from ledger.errors import BadInput, MissingObject, Refused
from ledger.gate import judge as judgelib


@dataclass(frozen=True)
class Adopted:
    """The generation made live, what it came from, and how it was admitted."""

    generation: str      # gen-N
    id: str              # its manifest id
    source_ref: str      # what the user named (team/gen-7)
    source: str          # the imported manifest's id
    verdict: str | None  # the local gate's verdict id (None when forced)
    forced: bool
    seq: int

    def to_json(self) -> dict:
        return {"generation": self.generation, "id": self.id, "source_ref": self.source_ref, "source": self.source,
                "verdict": self.verdict, "forced": self.forced, "seq": self.seq}


def adopt(store, ref: str, *, force: bool = False, reason: str = "", progress=None, wait: float | None = None) -> Adopted:
    """Judge an imported generation with the local gate and, on Accept (or `force`), make it HEAD."""
    if force and not reason.strip():
        raise BadInput("--force needs a --reason", 'e.g. --force --reason "bench-tested on the team cluster"')
    oid = store.resolve(ref)
    imported = generations.from_manifest(oid, store.get_json(oid))
    local = generations.head(store)
    if local is not None and local.id == oid:
        raise BadInput(f"{ref} is already HEAD")
    if f"gen-{imported.n}" in store.state.refs and store.state.refs[f"gen-{imported.n}"] == oid:
        raise BadInput(f"{ref} is the local gen-{imported.n} already", f"`ledger rollback gen-{imported.n}` moves HEAD to it")
    if not imported.base:
        raise BadInput(f"{ref} names no base weights", "adopt a generation that carries a model")
    missing = [x for x in (imported.base, imported.adapter) if x and not store.has(x)]
    if missing:
        raise MissingObject(missing[0], f"{ref} is here as a manifest, but its model is not: "
                            f"{', '.join(m[:15] + '…' for m in missing)}",
                            f"bring it with `ledger fetch REMOTE {' '.join(missing)}`")
    verdict_id = None
    if not force:
        outcome = judgelib.judge(store, imported.adapter or oid, progress=progress)
        verdict_id = outcome.verdict_id
        if outcome.verdict.verdict != "Accept":
            raise Refused(f"the local gate did not accept {ref}: {outcome.verdict.verdict}",
                          "the verdict is recorded (`ledger log --kind judge`); `--force --reason …` adopts anyway")
    with store.transaction("adopt", wait=wait) as tx:
        tx.inputs.extend(x for x in (oid, imported.base, imported.adapter, imported.receipt) if x)
        g = generations.new_generation(tx, store, note=f"adopted {ref}" + (f" (forced: {reason})" if force else ""),
                                       base=imported.base, adapter=imported.adapter, receipt=imported.receipt,
                                       verdict=verdict_id)
        records.write(tx, records.Adopt(generation=g.n, source_ref=ref, source=oid, forced=force, reason=reason,
                                        verdict=verdict_id))
    return Adopted(g.name, g.id, ref, oid, verdict_id, force, tx.record["seq"])
