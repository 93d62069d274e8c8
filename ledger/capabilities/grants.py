"""Grants: which handles a capability holds, and the rule that they only ever shrink.

A grant set is a list of handles. Set B *attenuates* set A when every handle in B is covered by
some handle in A: the same kind; for directories, the same path or a sub-path of it, and `ro`
where A has `ro` (`ro` is covered by `rw`, never the reverse). Dropping a handle is attenuation.
Admission grants at most what the manifest declares; every later generation's grants must
attenuate the grants HEAD holds. Widening is refused (exit 3) naming the offending handle.
Changing a capability's grants makes a new generation: that is `registry.grant`, which reads
HEAD (so these rules stay free of the journal, and registry -> grants is the only direction).

Directory handles are paths relative to the project (the folder that holds `.ledger`). They are
resolved component by component without following symlinks, must be existing directories,
and may neither contain the store nor lie inside it: a capability must never reach `.ledger`.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path, PurePosixPath

from ledger import generations
from ledger.capabilities.manifest import Handle
from ledger.capabilities.runtime import Grant
from ledger.errors import BadInput, Refused


def covers(granted: Handle, wanted: Handle) -> bool:
    if granted.kind != wanted.kind:
        return False
    if granted.kind != "dir":
        return True
    if wanted.mode == "rw" and granted.mode != "rw":
        return False
    if granted.path == ".":
        return True
    g, w = PurePosixPath(granted.path).parts, PurePosixPath(wanted.path).parts if wanted.path != "." else ()
    return w[:len(g)] == g


def widening(current, proposed) -> list[Handle]:
    """The handles of `proposed` that no handle of `current` covers (empty: an attenuation)."""
    return [h for h in proposed if not any(covers(c, h) for c in current)]


def check_attenuates(current, proposed, *, what: str, against: str) -> None:
    wide = widening(current, proposed)
    if wide:
        have = ", ".join(map(str, current)) or "nothing"
        raise Refused(f"{what} would widen authority: {', '.join(map(str, wide))} is not within {against} ({have})",
                      "grants can only be narrowed (a sub-path, ro instead of rw, or dropped); "
                      "roll back to a generation that held the wider grant, or admit the capability anew",
                      widening=[h.to_json() for h in wide])


def normalize(handles) -> tuple[Handle, ...]:
    return tuple(sorted(set(handles)))


def to_json(handles) -> list[dict]:
    return [h.to_json() for h in normalize(handles)]


def from_json(items) -> tuple[Handle, ...]:
    return normalize(Handle.from_json(h, "grant") for h in items or [])


# --- resolving directory handles on the host ---------------------------------------------------
def project_root(store) -> Path:
    return Path(store.root).resolve().parent


def resolve_dir(store, handle: Handle) -> Path:
    """The host directory a dir handle names, checked component by component (no symlinks)."""
    root = project_root(store)
    cur = root
    for part in ([] if handle.path == "." else PurePosixPath(handle.path).parts):
        cur = cur / part
        try:
            st = os.lstat(cur)
        except FileNotFoundError:
            raise BadInput(f"granted folder {handle.path!r} does not exist under {root}",
                           "create it, or grant a folder that exists") from None
        if stat.S_ISLNK(st.st_mode):
            raise Refused(f"granted folder {handle.path!r} passes through a symlink ({cur.relative_to(root)})",
                          "grant the real folder; links are never followed out of the project")
        if not stat.S_ISDIR(st.st_mode):
            raise BadInput(f"granted path {handle.path!r} is not a folder")
    store_root = Path(store.root).resolve()
    if cur == store_root or store_root.is_relative_to(cur) or cur.is_relative_to(store_root):
        raise Refused(f"granted folder {handle.path!r} would expose the store ({store_root})",
                      "grant a folder beside .ledger, not one that contains it")
    return cur


def check_grantable(store, handles) -> None:
    """Fail now, not at call time, for a dir grant that can never be honoured here: one that
    would contain or enter the store, or (if it exists yet) passes through a symlink. A folder
    that does not exist yet may be granted; calls fail until it does."""
    rel = Path(store.root).resolve().relative_to(project_root(store)).parts
    for h in handles:
        if h.kind != "dir":
            continue
        parts = () if h.path == "." else PurePosixPath(h.path).parts
        n = min(len(parts), len(rel))
        if parts[:n] == rel[:n]:
            raise Refused(f"granted folder {h.path!r} would expose the store ({store.root})",
                          "grant a folder beside .ledger, not one that contains it")
        try:
            resolve_dir(store, h)
        except BadInput:
            pass   # missing or not a folder yet: checked again at every call


def resolve(store, handles):
    """The handles as runtime Grants, each dir handle resolved to its host folder now."""
    return tuple(Grant(h, resolve_dir(store, h) if h.kind == "dir" else None) for h in normalize(handles))


# --- grants belong to the module's content ---------------------------------------------------------
def module_history(store, module_id: str) -> list[tuple[int, dict[str, tuple[Handle, ...]]]]:
    """Every generation that names the module's content id, oldest first:
    (generation number, {capability name: its grants})."""

    out = []
    for n in sorted(generations.numbers(store)):
        g = generations.load(store, f"gen-{n}")
        names = {name: from_json(e.get("grants")) for name, e in g.capabilities.items() if e.get("module") == module_id}
        if names:
            out.append((n, names))
    return out


def regained(store, module_id: str, proposed) -> tuple[list[Handle], dict] | None:
    """The handles of `proposed` that the module (by content id) held once and was later
    attenuated out of: not covered by what it held when a generation last named it (under any
    name), but covered by what it held in an earlier one. None when there are none.

    Grants attach to the module's content, not to the name it was admitted under: admitting the
    same module again under another name must not undo an attenuation (issue 16). A handle it
    never held is a first grant (within its manifest), not a regain."""
    history = module_history(store, module_id)
    if not history:
        return None
    n, names = history[-1]
    last = [h for grants in names.values() for h in grants]
    before = [h for _, ns in history[:-1] for grants in ns.values() for h in grants]
    wide = sorted(h for h in widening(last, proposed) if any(covers(b, h) for b in before))
    if not wide:
        return None
    return wide, {"generation": n, "names": {k: to_json(v) for k, v in sorted(names.items())}}
