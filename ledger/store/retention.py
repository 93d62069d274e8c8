"""Retention: which superseded training state `ledger gc --prune` removes, under a named policy.

A training run stores a checkpoint (adapter, optimizer state, RNG state) every N steps and a
final one; a learn cycle's next run starts from the committed adapter, never from those
files, so after 100 cycles they are most of the store (issue 18: 3.79× base + adapters after
6 demo cycles). Reachability alone keeps them forever, because receipts and checkpoint
records name them. A retention policy says which of those names are *not* reasons to keep:

  superseded-training-state (the default)
    prunes the optimizer and RNG state of every checkpoint of a finished run (one a receipt
    lists), and the adapter of each such checkpoint that is not a run's final one; and of an
    unfinished run (no receipt: killed, resumable) every checkpoint but its latest. Kept: each
    receipt's final adapter, the plan, dataset, base and tokenizer (what `ledger reproduce`
    needs to re-run from scratch), every checkpoint some record names as an input (a run
    resumed from it: reproducing that run needs it whole), and anything else reaches that is
    not one of those edges (the committed adapter tree, a generation, an `add`).
  final-adapters
    the same, but a checkpoint a run resumed from is pruned too: receipts of resumed runs can
    then no longer be reproduced (`reproduce` answers MissingInputs naming what was removed).

Pruning is recorded before anything is removed (docs/store-format.md, rule P1): one `prune`
record with the policy and every removed object as [hex, size, role, of] — the id *without*
its `b3:` prefix, so it is not a reference (a removed object is not missing: verify and
reads say "pruned by policy" and name the record).
"""

from __future__ import annotations

from dataclasses import dataclass

from ledger.errors import BadInput, LedgerError
from ledger.store.ids import PREFIX, find_ids, hex_of, is_id

PRUNE_KIND = "prune"


@dataclass(frozen=True)
class Policy:
    """A retention policy: what superseded training state `gc --prune` may remove."""

    name: str
    keep_resumed: bool            # a checkpoint some record names as an input stays whole
    keep_unfinished_latest: bool  # a run with no receipt keeps its latest checkpoint whole
    description: str
    version: int = 1

    def to_json(self) -> dict:
        return {"name": self.name, "version": self.version, "keep_resumed": self.keep_resumed,
                "keep_unfinished_latest": self.keep_unfinished_latest,
                "prunes": ["checkpoint optimizer state", "checkpoint rng state", "non-final checkpoint adapters"],
                "keeps": ["final adapters", "plans, specs, datasets, bases, tokenizers, templates",
                          "checkpoints a run resumed from" if self.keep_resumed else None,
                          "the latest checkpoint of an unfinished run" if self.keep_unfinished_latest else None],
                "description": self.description}


DEFAULT = Policy("superseded-training-state", keep_resumed=True, keep_unfinished_latest=True,
                 description="checkpoints and optimizer states that no reproduce or resume needs")
FINAL_ADAPTERS = Policy("final-adapters", keep_resumed=False, keep_unfinished_latest=True,
                        description="keep only final adapters: resumed runs can no longer be reproduced")
NONE = Policy("none", keep_resumed=True, keep_unfinished_latest=True,
              description="remove only what no record reaches")
POLICIES = {p.name: p for p in (DEFAULT, FINAL_ADAPTERS, NONE)}


def policy(name: str | None) -> Policy:
    """The policy named `name` (None: the default)."""
    if name is None:
        return DEFAULT
    if name not in POLICIES:
        raise BadInput(f"unknown retention policy {name!r}", f"choose one of: {', '.join(POLICIES)}")
    return POLICIES[name]


@dataclass(frozen=True)
class Pruning:
    """What a policy would remove: (id, size, role, of) for each object, `of` naming the
    checkpoint or receipt whose field it was."""

    policy: Policy
    remove: tuple = ()

    @property
    def bytes(self) -> int:
        return sum(size for _, size, _, _ in self.remove)

    def payload(self) -> dict:
        """The `prune` record's payload: removed objects by hex (not references), the policy."""
        return {"policy": self.policy.to_json(), "objects_removed": len(self.remove), "bytes_removed": self.bytes,
                "removed": [[hex_of(o), size, role, hex_of(of)] for o, size, role, of in self.remove]}


def select(store, pol: Policy, walk) -> Pruning:
    """What `pol` removes, given gc's walk (ledger/store/reach.py): the policy's closure — what
    records name (not their `payload.objects`: being written is not being needed), followed
    through every field but a checkpoint's and a receipt's training state — as `walk.is_kept`,
    the checkpoints and receipts in it as `walk.special`, and the inputs records name as
    `walk.has_input`. Reads only."""
    if pol is NONE:
        return Pruning(pol)
    checkpoints: dict[str, dict] = {}
    receipts: dict[str, dict] = {}
    for oid in sorted(walk.special):
        try:
            obj = store.get_json(oid)
        except Exception:  # noqa: BLE001 - damage is verify's to report; here it only means "not structure"
            continue
        if isinstance(obj, dict) and obj.get("kind") == "checkpoint":
            checkpoints[oid] = obj
        elif isinstance(obj, dict) and obj.get("kind") == "receipt":
            receipts[oid] = obj

    finished: set[str] = set()
    finals: set[str] = set()
    resumed: set[str] = set()
    for r in receipts.values():
        cks = [c for c in (r.get("checkpoints") or []) if is_id(c)]
        if is_id(r.get("final_checkpoint")):
            finals.add(r["final_checkpoint"])
            cks.append(r["final_checkpoint"])
        finished.update(cks)
        if pol.keep_resumed and is_id(r.get("resumed_from")):
            resumed.add(r["resumed_from"])
    whole: set[str] = {c for c in checkpoints if pol.keep_resumed and (c in resumed or walk.has_input(c))}
    if pol.keep_unfinished_latest:
        latest: dict[str, tuple[int, str]] = {}
        for c, m in checkpoints.items():
            if c in finished:
                continue
            key = str((m.get("state") or {}).get("run") or m.get("plan"))
            step = m.get("step") if isinstance(m.get("step"), int) else -1
            if key not in latest or (step, c) > latest[key]:
                latest[key] = (step, c)
        whole.update(c for _, c in latest.values())
    keep_files: set[str] = set()
    for c in whole:
        keep_files.update(checkpoints[c].get(k) for k in ("adapter", "optimizer", "rng"))
    for c in finals & set(checkpoints):
        keep_files.add(checkpoints[c].get("adapter"))

    candidates: dict[str, tuple[str, str]] = {}
    for c, m in sorted(checkpoints.items()):
        for role in ("adapter", "optimizer", "rng"):
            f = m.get(role)
            if is_id(f) and f not in keep_files and f not in candidates and not walk.is_kept(f):
                candidates[f] = (f"checkpoint {role}", c)
    for rid, r in sorted(receipts.items()):
        for role in ("optimizer_state", "rng_state"):
            f = r.get(role)
            if is_id(f) and f not in keep_files and f not in candidates and not walk.is_kept(f):
                candidates[f] = (f"receipt {role}", rid)
    remove = []
    for f, (role, of) in sorted(candidates.items()):
        if store.objects.has(f):
            try:
                size = store.objects.size(f)
            except Exception:  # noqa: BLE001 - a damaged object is removed all the same; its size is unknown
                size = 0
            remove.append((f, size, role, of))
    return Pruning(pol, tuple(remove))


def pruned_ids(records) -> dict[str, dict]:
    """Every id a `prune` record removed: {id: {"seq", "policy", "role"}} (later records win).
    An id some record after its prune names again (inputs, outputs, payload: re-added, or an
    input of a later run) is live again, so not pruned: its loss is missing, never hidden."""
    out: dict[str, dict] = {}
    for r in records:
        if r.get("kind") != PRUNE_KIND:
            if out:
                named: set = set()
                find_ids([r.get("inputs"), r.get("outputs"), r.get("payload")], named)
                for oid in named & out.keys():
                    del out[oid]
            continue
        p = r.get("payload") or {}
        name = (p.get("policy") or {}).get("name") if isinstance(p.get("policy"), dict) else None
        for e in p.get("removed") or []:
            if isinstance(e, list) and e and isinstance(e[0], str):
                out[PREFIX + e[0]] = {"seq": r["seq"], "policy": name, "role": e[2] if len(e) > 2 else None,
                                      "of": PREFIX + e[3] if len(e) > 3 and isinstance(e[3], str) else None}
    return out


# the fields a policy prunes, by the role a `prune` record gives them (Pruning.payload)
ROLE_FIELDS = {"checkpoint adapter": ("checkpoint", "adapter"), "checkpoint optimizer": ("checkpoint", "optimizer"),
               "checkpoint rng": ("checkpoint", "rng"), "receipt optimizer_state": ("receipt", "optimizer_state"),
               "receipt rng_state": ("receipt", "rng_state")}


def honoured(store, pruned: dict[str, dict]) -> dict[str, dict]:
    """The entries of `pruned_ids` that a policy could have written: the object the entry
    names as `of` is held, is a checkpoint (or receipt) and holds the pruned id in the field
    its role names. Those objects are never pruned themselves, so a true entry always passes;
    a forged `prune` record naming anything else (a dataset, an `add`'s blob, an object no
    ref names) does not make its loss "pruned": verify reports it missing."""
    objs: dict[str, object] = {}
    out = {}
    for oid, e in pruned.items():
        kind_field = ROLE_FIELDS.get(e.get("role"))
        of = e.get("of")
        if kind_field is None or not is_id(of):
            continue
        if of not in objs:
            try:
                objs[of] = store.get_json(of)
            except LedgerError:   # absent, damaged or a blob: it vouches for nothing
                objs[of] = None
        obj = objs[of]
        if isinstance(obj, dict) and obj.get("kind") == kind_field[0] and obj.get(kind_field[1]) == oid:
            out[oid] = e
    return out
