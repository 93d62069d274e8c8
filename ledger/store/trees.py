"""Tree objects: a folder as one structured object listing its regular files.

`{"kind": "tree", "entries": [{"path", "id", "size", "exec"[, "escaped"]}, ...]}`, entries
sorted by path. Names are bytes on POSIX: a name that is valid UTF-8 is stored as is; one that
is not is stored percent-encoded (RFC 3986: every byte except unreserved characters and `/`
becomes %XX) with `"escaped": true`, and decodes back to exactly the same bytes
(docs/store-format.md, "Names are bytes").

`put_tree` reads a folder into a transaction (refusing links and special files, and a folder
that changes while it is read); `materialise_tree` writes a tree back out, refusing paths that
would leave the destination.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from urllib.parse import quote_from_bytes, unquote_to_bytes

from ledger.errors import BadInput
from ledger.store import fsio


def encode_name(name: str | bytes) -> tuple[str, bool]:
    """A file name (as os gives it: str with surrogate escapes, or bytes) as manifest text.
    Returns (text, escaped)."""
    raw = os.fsencode(name)
    try:
        return raw.decode("utf-8"), False
    except UnicodeDecodeError:
        return quote_from_bytes(raw, safe="/"), True


def decode_name(text: str, escaped: bool) -> bytes:
    """The exact bytes of a name written by encode_name."""
    return unquote_to_bytes(text) if escaped else text.encode("utf-8")


def entry_path(entry: dict) -> bytes:
    """The relative path of a tree entry, as bytes."""
    path = entry.get("path")
    if not isinstance(path, str):
        raise BadInput(f"tree entry has no path: {entry!r}")
    return decode_name(path, bool(entry.get("escaped")))


def _walk_error(e: OSError):
    raise BadInput(f"{e.filename} could not be read while adding ({e.strerror})",
                   "retry when nothing is changing the folder") from None


def put_tree(tx, directory: str | Path, kind: str = "tree", progress=None) -> str:
    """Every regular file under `directory` as a blob, then a tree object listing them.

    The walk holds each folder open (os.fwalk, never following a link) and judges each file by
    its stat relative to that folder; the file then read by path must be that very file
    (Transaction.put_file's `identity`). So a subfolder swapped for a link while the folder is
    read is never entered (os.walk looked with islink, then listed the path: through the link),
    and no byte from outside the folder is read, or answered from the stat cache, for a file in
    it; a subfolder seen as a folder and then not walked is a folder that changed (BadInput)."""
    root = os.fsencode(Path(directory))  # bytes all the way: names are not always UTF-8
    entries, folders, walked = [], set(), set()
    for dirpath, dirnames, filenames, dfd in os.fwalk(root, follow_symlinks=False, onerror=_walk_error):
        walked.add(dirpath)
        dirnames.sort()
        for name in dirnames:
            sub = os.path.join(dirpath, name)
            try:
                mode = os.stat(name, dir_fd=dfd, follow_symlinks=False).st_mode
            except FileNotFoundError:
                folders.add(sub)   # gone since it was listed: a folder that changed (below)
                continue
            if not stat.S_ISDIR(mode):
                # a link to a folder is listed here and never walked: refused like a link to a
                # file, not left out of the tree without a word
                raise BadInput(f"{os.fsdecode(sub)} is a {fsio.file_kind(mode)}, not a folder",
                               "ledger stores regular files only; remove links and special files")
            folders.add(sub)   # a folder, not a link: it must be walked
        for name in sorted(filenames):
            p = os.path.join(dirpath, name)
            shown = os.fsdecode(p)
            try:
                st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            except FileNotFoundError:
                raise BadInput(f"{shown} vanished while the folder was being added",
                               "retry when nothing is changing the folder") from None
            if not stat.S_ISREG(st.st_mode):
                raise BadInput(f"{shown} is not a regular file",
                               "ledger stores regular files only; remove links and special files")
            oid = tx.put_file(Path(shown), progress=progress,
                              identity=(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))
            text, escaped = encode_name(os.path.relpath(p, root))
            entry = {"path": text, "id": oid, "size": tx.objects[oid][0], "exec": bool(st.st_mode & 0o111)}
            if escaped:
                entry["escaped"] = True
            entries.append(entry)
    if folders - walked:
        raise BadInput(f"{os.fsdecode(min(folders - walked))} changed while the folder was being added",
                       "retry when nothing is changing the folder")
    return tx.put_json({"kind": "tree", "entries": entries}, kind)


def tree_entries(store, tree_id: str) -> list[dict]:
    """The entries of tree object `tree_id` (BadInput if it is not a tree)."""
    t = store.get_json(tree_id)
    if not isinstance(t, dict) or t.get("kind") != "tree" or not isinstance(t.get("entries"), list):
        raise BadInput(f"{tree_id} is not a tree object")
    return t["entries"]


def materialise_tree(store, tree_id: str, dest: Path) -> None:
    """Write every file of a tree under `dest` (verified while copying), names byte-exact."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    for e in tree_entries(store, tree_id):
        rel = entry_path(e)
        parts = rel.split(b"/")
        if rel.startswith(b"/") or b".." in parts or b"" in parts or b"\0" in rel:
            raise BadInput(f"tree {tree_id} names an unsafe path {e['path']!r}")
        target = Path(os.fsdecode(os.path.join(os.fsencode(dest), rel)))
        target.parent.mkdir(parents=True, exist_ok=True)
        store.export_file(e["id"], target)
