"""`ledger add`: store a file or a directory and record it; an unchanged re-add is a no-op.

"Unchanged" is decided from the stat cache (path, inode, size, mtime, ctime), whose entries
are written only after a commit: a hit means these exact bytes were committed before, so
neither the hash nor a new record is needed.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from ledger.errors import BadInput, StoreCorrupt
from ledger.store import trees
from ledger.store.state import check_ref_changes


def add_path(store, path, kind: str | None = None, name: str | None = None, wait: float = 0.0, bar=None) -> dict:
    """Store a file or folder and record it (an `add` record); an unchanged re-add returns the cached id."""
    path = Path(path)
    if not path.exists():
        raise BadInput(f"{path} does not exist")
    if path.is_symlink() or not (path.is_file() or path.is_dir()):
        raise BadInput(f"{path} is not a regular file or directory")
    if name is not None:
        _check_name(store, name)
    ref = f"name/{name}" if name else None
    if ref:
        check_ref_changes({ref: None})
    is_dir = path.is_dir()
    kind = kind or ("tree" if is_dir else "blob")
    key = store.tree_key(path) if is_dir else store.stat_key(path)
    cached = store.stat_cache_get(key)
    size = _hit_size(store, cached, is_dir, key.size) if cached else None
    if size is not None and (ref is None or store.state.refs.get(ref) == cached):
        return {"id": cached, "size": size, "kind": kind, "name": name, "unchanged": True}
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


def _hit_size(store, oid: str, is_dir: bool, covered: int) -> int | None:
    """The size an unchanged re-add reports for a stat-cache hit, or None if the hit is not
    believed (rule 11). A file's: the lookup found its object at the file's size. A folder's: the
    tree's entries' sizes, which must be a tree's and add up to the folder's files' total; an
    entry naming anything else (a present JSON object, another tree, a damaged one: its read
    was a KeyError, exit 1) is a miss, and the whole add stores the folder again."""
    if not is_dir:
        return covered
    try:
        t = store.get_json(oid)
    except (BadInput, StoreCorrupt):
        return None
    entries = t.get("entries") if isinstance(t, dict) and t.get("kind") == "tree" else None
    if not isinstance(entries, list) or not all(isinstance(e, dict) and type(e.get("size")) is int for e in entries):
        return None
    size = sum(e["size"] for e in entries)
    return size if size == covered else None


_GENERATION = re.compile(r"gen-[0-9]+")


def _check_name(store, name: str) -> None:
    """A name `add --name` may give: `show NAME` must find it, so never empty, and never a name
    another ref answers first (Store.resolve looks up HEAD, gen-N and the other refs before
    name/NAME): HEAD and gen-N always, any other ref that exists now."""
    if not name:
        raise BadInput("add --name is empty", "give a name (`--name train`), or leave --name out")
    if name == "HEAD" or _GENERATION.fullmatch(name) or name in store.state.refs:
        raise BadInput(f"add --name {name!r}: {name} already names a ref (HEAD, a generation or another), "
                       "so the name would never be found", "choose another name")

