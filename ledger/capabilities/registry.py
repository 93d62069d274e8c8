"""What is live: the capabilities a generation lists, and calling one of HEAD's.

A generation's `capabilities` maps name -> entry:
    {"module": id, "source": id, "manifest": id, "compiler": {"id": id, ...identity},
     "tests": id (the admission test report), "grants": [handle, ...], "admitted_in": n}
Nothing here scans folders: HEAD (a fold of the journal) says what exists.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

from ledger import generations, records
from ledger.capabilities import cache, runtime
from ledger.capabilities import grants as grants_mod
from ledger.capabilities import manifest as manifest_mod
from ledger.capabilities.manifest import Handle, Manifest
from ledger.errors import UnknownRef


@dataclass(frozen=True)
class Entry:
    name: str
    module: str
    source: str
    manifest_id: str
    compiler: dict
    tests: str | None
    grants: tuple[Handle, ...]
    admitted_in: int
    generation: int          # the generation this entry was read from

    def to_json(self) -> dict:
        return {"name": self.name, "module": self.module, "source": self.source, "manifest": self.manifest_id,
                "compiler": self.compiler, "tests": self.tests, "grants": [h.to_json() for h in self.grants],
                "admitted_in": self.admitted_in, "generation": self.generation}


def fresh_head(store):
    """HEAD as the journal says now. Inside a transaction the lock is held, so this is the state
    the record will append to; a Store object's cached fold may predate another writer's commit."""
    store.refresh()
    return generations.head(store)


def entry_from(name: str, d: dict, gen_n: int) -> Entry:
    return Entry(name, d["module"], d["source"], d["manifest"], dict(d.get("compiler") or {}), d.get("tests"),
                 grants_mod.from_json(d.get("grants")), int(d["admitted_in"]), gen_n)


# Objects are immutable and named by content, so what was read (verified) and parsed once
# from a store is kept, per store, by id: a warm call does not re-read or re-validate them.
_parsed: "OrderedDict[tuple[str, str], object]" = OrderedDict()
_PARSED_MAX = 256


_parsed_lock = threading.Lock()


def _memo(store, oid: str, parse):
    k = (str(store.root), oid)
    with _parsed_lock:
        hit = _parsed.get(k)
    if hit is None:
        hit = parse(store.get_json(oid))
        with _parsed_lock:
            _parsed[k] = hit
            while len(_parsed) > _PARSED_MAX:
                _parsed.popitem(last=False)
    return hit


def _generation(store, ref: str):
    if ref == "HEAD":
        oid = store.state.refs.get("HEAD")
        if oid is None:
            return None
    else:
        oid = store.resolve(ref)
    return _memo(store, oid, lambda m: generations.from_manifest(oid, m))


def entries(store, ref: str = "HEAD") -> list[Entry]:
    gen = _generation(store, ref)
    if gen is None:
        return []
    return [entry_from(n, d, gen.n) for n, d in sorted(gen.capabilities.items())]


def entry(store, name: str, ref: str = "HEAD") -> Entry:
    gen = _generation(store, ref)
    caps = gen.capabilities if gen else {}
    if name not in caps:
        where = f"{ref} ({gen.name})" if gen else ref + " (no generation yet)"
        raise UnknownRef(f"no capability named {name!r} in {where}",
                         "see `ledger capability list`; `ledger capability add SRC --manifest M` admits one")
    return entry_from(name, caps[name], gen.n)


def grant(store, name: str, handles, *, note: str = "", actor: str | None = None, wait: float | None = None):
    """Make a new generation in which capability `name` holds exactly `handles`.

    `handles` must attenuate what HEAD grants (grants.py's rules); returns (generation, old
    handles, new handles). It lives here, not in grants.py, because it reads HEAD and makes a
    generation: grants.py stays the pure rules and registry -> grants the only direction."""
    proposed = grants_mod.normalize(handles)
    grants_mod.check_grantable(store, [h for h in proposed if h.kind == "dir"])
    with store.transaction("capability-grant", actor=actor, wait=wait) as tx:
        head = fresh_head(store)
        caps = dict(head.capabilities) if head else {}
        if name not in caps:
            raise UnknownRef(f"no capability named {name!r} in HEAD" + (f" ({head.name})" if head else ""),
                             "see `ledger capability list`")
        entry = dict(caps[name])
        current = grants_mod.from_json(entry.get("grants"))
        grants_mod.check_attenuates(current, proposed,
                                    what=f"granting {', '.join(map(str, proposed)) or 'nothing'} to {name!r}",
                                    against=f"what {head.name} grants it")
        entry["grants"] = grants_mod.to_json(proposed)
        caps[name] = entry
        gen = generations.new_generation(
            tx, store, capabilities=caps,
            note=note or f"capability {name}: grants {', '.join(map(str, proposed)) or 'none'} "
                         f"(were {', '.join(map(str, current)) or 'none'})")
        records.write(tx, records.CapabilityGrant(capability=name, action="grant", grants=entry["grants"],
                                                  previous=grants_mod.to_json(current), generation=gen.n))
    return gen, current, proposed


def load_manifest(store, e: Entry) -> Manifest:
    return _memo(store, e.manifest_id, lambda d: manifest_mod.from_json(d, where=f"manifest {e.manifest_id}"))


def call(store, name: str, export: str, argv: list[str], *, fuel: int | None = None, time_ms: int | None = None):
    """Call HEAD's capability `name` with exactly its grants, under its limits (or tighter /
    caller-chosen ones within the host maxima). Arguments are parsed by the export's signature."""
    e = entry(store, name)
    m = load_manifest(store, e)
    ex = m.export(export)
    args = runtime.parse_args(ex, list(argv))
    limits = m.limits.override(fuel, time_ms)
    granted = grants_mod.resolve(store, e.grants)
    module = cache.load(store, e.module)
    return runtime.run(module, ex, args, limits, granted, label=f"{name}.{export}")
