"""`ledger add`: store a file or a directory and record it; an unchanged re-add is a no-op.

"Unchanged" is decided from the stat cache (path, inode, size, mtime, ctime), whose entries
are written only after a commit: a hit means these exact bytes were committed before, so
neither the hash nor a new record is needed.
"""

from __future__ import annotations

import os
from pathlib import Path

from ledger.errors import BadInput
from ledger.store import trees
from ledger.store.state import check_ref_changes


def add_path(store, path, kind: str | None = None, name: str | None = None, wait: float = 0.0, bar=None) -> dict:
    """Store a file or folder and record it (an `add` record); an unchanged re-add returns the cached id."""
    path = Path(path)
    if not path.exists():
        raise BadInput(f"{path} does not exist")
    if path.is_symlink() or not (path.is_file() or path.is_dir()):
        raise BadInput(f"{path} is not a regular file or directory")
    ref = f"name/{name}" if name else None
    if ref:
        check_ref_changes({ref: None})
    is_dir = path.is_dir()
    kind = kind or ("tree" if is_dir else "blob")
    key = store.tree_key(path) if is_dir else store.stat_key(path)
    cached = store.stat_cache_get(key)
    if cached and (ref is None or store.state.refs.get(ref) == cached):
        return {"id": cached, "size": _size(store, cached, is_dir), "kind": kind, "name": name, "unchanged": True}
    with store.transaction("add", wait=wait) as tx:
        if is_dir:
            oid = tx.put_tree(path, kind, progress=bar)
            tx.stat_pending.append((key, oid))
            size = sum(s for o, (s, _) in tx.objects.items() if o != oid)
        else:
            oid = tx.put_file(path, kind, progress=bar)
            size = tx.objects[oid][0]
        tx.outputs.append(oid)
        shown, escaped = trees.encode_name(os.path.abspath(path))  # names are bytes: escape non-UTF-8
        tx.payload.update({"path": shown, "kind": kind, "size": size})
        if escaped:
            tx.payload["path_escaped"] = True
        if ref:
            tx.payload["name"] = name
            tx.refs[ref] = oid
    return {"id": oid, "size": size, "kind": kind, "name": name, "unchanged": False, "seq": tx.record["seq"]}


def _size(store, oid: str, is_dir: bool) -> int:
    if not is_dir:
        return store.objects.size(oid)
    return sum(e["size"] for e in store.get_json(oid)["entries"])
