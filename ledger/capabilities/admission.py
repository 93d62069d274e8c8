"""Admission: a capability becomes live only after its tests pass with zero authority.

    compile (size-checked) -> validate -> imports are WASI preview1 only -> exports match the
    manifest -> every manifest test runs in a fresh sandbox granted NOTHING (no preopens,
    env, args or stdio) under the manifest's fuel, time and memory limits, with a fixed clock
    and fixed random bytes (runtime.FIXED_CLOCK_NS: a test passes or fails the same way every
    time) -> the grants are checked against what the module's content id held before -> one `capability`
    transaction: source, module, manifest, compiler identity and test report as objects, and
    a new generation listing the capability with its grants.

Everything before the transaction only reads, so a refused capability changes nothing in the
store: no object, no journal record, no cache entry. The first failing test stops admission
and is named with its trap or its wrong result.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ledger import generations, records
from ledger.capabilities import cache, registry, runtime
from ledger.capabilities import compile as compile_mod
from ledger.capabilities import grants as grants_mod
from ledger.capabilities import manifest as manifest_mod
from ledger.capabilities.manifest import Handle, Manifest
from ledger.errors import BadInput, CapabilityTrapped, InternalError, Refused
from ledger.store.ids import hash_bytes


@dataclass(frozen=True)
class TestOutcome:
    name: str
    export: str
    ok: bool
    fuel_used: int
    got: str            # the results, or the trap code
    message: str = ""

    def to_json(self) -> dict:
        return {"name": self.name, "export": self.export, "ok": self.ok, "fuel_used": self.fuel_used, "got": self.got,
                **({"message": self.message} if self.message else {})}


@dataclass(frozen=True)
class Admission:
    name: str
    generation: generations.Generation
    module: str
    source: str
    manifest: str
    compiler: str
    tests: str
    grants: tuple[Handle, ...]
    outcomes: tuple[TestOutcome, ...]
    replaced: bool

    def to_json(self) -> dict:
        return {"name": self.name, "generation": self.generation.n, "generation_id": self.generation.id,
                "module": self.module, "source": self.source, "manifest": self.manifest, "compiler": self.compiler,
                "tests": self.tests, "grants": [h.to_json() for h in self.grants],
                "outcomes": [o.to_json() for o in self.outcomes], "replaced": self.replaced}


def _show(values, types) -> str:
    return "[" + ", ".join(runtime.format_value(v, t) for v, t in zip(values, types)) + "]"


def run_test(module, m: Manifest, t: manifest_mod.Test) -> TestOutcome:
    """One manifest test in a fresh sandbox with no grants at all, in the fixed world (a fixed
    clock and fixed random bytes: the same outcome at every run)."""
    ex = m.export(t.export)
    label = t.export
    try:
        r = runtime.run(module, ex, t.args, m.limits, grants=(), label=label, fixed_world=True)
    except CapabilityTrapped as e:
        code = e.details.get("trap", "")
        fuel = int(e.details.get("fuel_used", -1))
        if t.trap is not None and code == t.trap:
            return TestOutcome(t.name, t.export, True, fuel, code)
        want = f"trap {t.trap}" if t.trap else _show(t.expect, ex.results)
        return TestOutcome(t.name, t.export, False, fuel, code, f"{e.message}; expected {want}")
    got = _show(r.values, ex.results)
    if t.trap is not None:
        return TestOutcome(t.name, t.export, False, r.fuel_used, got, f"{label} returned {got}; expected trap {t.trap}")
    if tuple(r.values) != tuple(t.expect):
        return TestOutcome(t.name, t.export, False, r.fuel_used, got,
                           f"{label} returned {got}; expected {_show(t.expect, ex.results)}")
    return TestOutcome(t.name, t.export, True, r.fuel_used, got)


def check(source: str | Path, manifest_path: str | Path, *,
          max_module_bytes: int = compile_mod.MAX_MODULE_BYTES):
    """Everything admission checks, without touching the store: returns (manifest, compiled,
    wasmtime module, test outcomes) or raises the typed refusal."""
    m = manifest_mod.load(manifest_path)
    compiled = compile_mod.compile_source(source, max_module_bytes=max_module_bytes)
    module = runtime.compile_module(compiled.wasm)
    runtime.check_imports(module)
    runtime.check_exports(module, m.exports)
    outcomes = []
    for t in m.tests:
        o = run_test(module, m, t)
        outcomes.append(o)
        if not o.ok:
            left = len(m.tests) - len(outcomes)
            raise Refused(f"capability {m.name!r} refused: test {t.name!r} failed: {o.message}",
                          "fix the module or its test; nothing was stored"
                          + (f" ({left} later test{'s' if left != 1 else ''} not run)" if left else ""),
                          test=t.name, trap=o.got if not o.got.startswith("[") else None,
                          tests=[x.to_json() for x in outcomes])
    return m, compiled, module, tuple(outcomes)


def _check_module_grants(store, module_id: str, name: str, proposed, regrant_reason: str | None) -> dict | None:
    """Grants attach to the module's content id: the same module admitted again (under any
    name) may not regain a handle it was attenuated out of, unless the operator says why
    (`regrant_reason`, kept in the record). Returns the regrant record, or None."""
    found = grants_mod.regained(store, module_id, proposed)
    if found is None:
        return None
    wide, held = found
    where = ", ".join(f"{k!r}: {', '.join(str(Handle.from_json(h, 'grant')) for h in v) or 'nothing'}"
                      for k, v in held["names"].items())
    if regrant_reason is None:
        raise Refused(f"admitting {name!r} would give its module back {', '.join(map(str, wide))}, which it was "
                      f"attenuated out of (gen-{held['generation']} last named it: {where}); "
                      "regaining it needs --regrant-reason",
                      "grants belong to the module's content, not its name; to grant it again on purpose, "
                      "say why: --regrant-reason \"...\"", widening=[h.to_json() for h in wide], held=held)
    return {"reason": regrant_reason, "widening": [h.to_json() for h in wide], "held": held}


def admit(store, source: str | Path, manifest_path: str | Path, *, grants=None, replace: bool = False,
          note: str = "", actor: str | None = None, wait: float | None = None,
          max_module_bytes: int = compile_mod.MAX_MODULE_BYTES, regrant_reason: str | None = None) -> Admission:
    """Admit a capability: check it (zero authority), then commit it as a new generation.

    `grants`: the handles to grant (default: exactly what the manifest declares); they must be
    within the manifest's handles. With `replace`, a capability of the same name in HEAD is
    replaced, and the new grants must attenuate its current ones. A module (by content id)
    may not regain, under any name, a handle it was attenuated out of, unless `regrant_reason`
    says why (the record keeps it)."""
    if regrant_reason is not None and not regrant_reason.strip():
        raise BadInput("the regrant reason is empty", "say why the module may hold more again: --regrant-reason \"...\"")
    m, compiled, module, outcomes = check(source, manifest_path, max_module_bytes=max_module_bytes)
    proposed = grants_mod.normalize(m.handles if grants is None else grants)
    grants_mod.check_attenuates(m.handles, proposed, what=f"granting {', '.join(map(str, proposed))} to {m.name!r}",
                                against="what its manifest declares")
    grants_mod.check_grantable(store, proposed)
    identity = runtime.engine_identity()

    with store.transaction("capability", actor=actor, wait=wait) as tx:
        head = registry.fresh_head(store)
        caps = dict(head.capabilities) if head else {}
        if m.name in caps and not replace:
            raise Refused(f"a capability named {m.name!r} is already live (admitted in gen-{caps[m.name].get('admitted_in')})",
                          "pass --replace to admit a new version (its grants may only narrow), or rename it")
        if replace and m.name not in caps:
            raise BadInput(f"--replace: no capability named {m.name!r} in HEAD to replace", "drop --replace to add it")
        if replace:
            grants_mod.check_attenuates(grants_mod.from_json(caps[m.name].get("grants")), proposed,
                                        what=f"replacing {m.name!r}", against="what HEAD grants it")
        regrant = _check_module_grants(store, hash_bytes(compiled.wasm), m.name, proposed, regrant_reason)
        source_id = tx.put_bytes(compiled.source, kind=f"capability-source-{compiled.language}")
        module_id = tx.put_bytes(compiled.wasm, kind="wasm")
        manifest_id = tx.put_json(m.to_json())
        compiler_id = tx.put_json(compiled.compiler)
        report_id = tx.put_json({"kind": "capability-tests", "capability": m.name, "module": module_id,
                                 "manifest": manifest_id, "engine": identity, "authority": "none",
                                 "world": runtime.fixed_world_description(),
                                 "results": [o.to_json() for o in outcomes]})
        tx.outputs.extend([source_id, module_id, manifest_id, compiler_id, report_id])
        n = (max(generations.numbers(store)) + 1) if generations.numbers(store) else 0
        caps[m.name] = {
            "module": module_id,
            "source": source_id,
            "manifest": manifest_id,
            "compiler": {
                "id": compiler_id,
                **{k: v for k, v in compiled.compiler.items() if k in ("language", "tool", "version")},
            },
            "tests": report_id,
            "grants": grants_mod.to_json(proposed),
            "admitted_in": n,
        }
        gen = generations.new_generation(tx, store, capabilities=caps,
                                         note=note or f"capability {m.name} {'replaced' if replace else 'admitted'}")
        if gen.n != n:
            raise InternalError(f"generation number moved under the lock ({n} != {gen.n})")
        records.write(tx, records.Capability(
            capability=m.name, action="replace" if replace else "add", module=module_id, manifest=manifest_id,
            grants=grants_mod.to_json(proposed), generation=gen.n,
            # the operator's explicit record of why the module holds more again
            **({"regrant": regrant} if regrant is not None else {})))
    # Committed. The compiled artefact is a cache: write it now so the first call is warm.

    cache.put(store, module_id, module)
    return Admission(m.name, gen, module_id, source_id, manifest_id, compiler_id, report_id, proposed,
                     outcomes, replace)
