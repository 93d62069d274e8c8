"""`ledger checkout REF DEST`: write what the store holds back to the filesystem.

  a generation (gen-N, HEAD, team/gen-7)  a folder peft.PeftModel.from_pretrained loads as is, the
                                          base's tokenizer files beside it, the base under base/
  a tree (anything `ledger add DIR` stored) the folder, every file byte-exact (names too)
  a file (any other object)               the file, verified while it is written

DEST must not exist, or be an empty folder (a tree or generation); nothing is overwritten. Every
byte is verified against its id while it is written, and a file appears only when it is whole.
"""

from __future__ import annotations

import errno
from dataclasses import dataclass
from pathlib import Path

from ledger import generations
from ledger.artefacts import model as modellib
from ledger.errors import BadInput
from ledger.store import fsio, trees

MAX_STRUCTURED = 64 << 20  # larger objects are files, never parsed as JSON


@dataclass(frozen=True)
class CheckedOut:
    """What was written: the kind of thing, its id, where, and the files."""

    kind: str                   # generation | tree | file
    id: str
    path: str
    files: tuple[str, ...]
    generation: str | None = None
    adapter: str | None = None
    base: str | None = None

    def to_json(self) -> dict:
        return {"kind": self.kind, "id": self.id, "dir": self.path, "files": list(self.files),
                "generation": self.generation, "adapter": self.adapter, "base": self.base}


def _structured_kind(store, oid: str) -> str | None:
    if store.objects.size(oid) > MAX_STRUCTURED:
        return None
    try:
        obj = store.get_json(oid)
    except BadInput:  # not canonical JSON: a file
        return None
    return obj.get("kind") if isinstance(obj, dict) else None


def _empty_or_new(dest: Path) -> None:
    if dest.is_symlink() or (dest.exists() and (not dest.is_dir() or any(dest.iterdir()))):
        raise BadInput(f"{dest} exists and is not an empty folder", "choose a new folder; nothing is overwritten")


def _generation(store, g: generations.Generation, dest: Path, with_base: bool) -> CheckedOut:
    """A folder PeftModel.from_pretrained loads as is (adapter_model.safetensors +
    adapter_config.json) and, for a base with its own tokenizer, AutoTokenizer.from_pretrained
    loads as is (tokenizer.json, tokenizer_config.json, chat template), plus the base under base/."""
    dest.mkdir(parents=True, exist_ok=True)
    written = []
    if g.adapter:
        trees.materialise_tree(store, g.adapter, dest)  # refuses unsafe paths
        written.extend(e["path"] for e in trees.tree_entries(store, g.adapter))
    if g.base:
        manifest = modellib.load_manifest(store, g.base)
        for e in trees.tree_entries(store, manifest["files"]):
            if e["path"] in modellib.TOKENIZER_CHECKOUT:
                store.export_file(e["id"], dest / e["path"])
                written.append(e["path"])
        if with_base:
            trees.materialise_tree(store, manifest["files"], dest / "base")
            written.append("base/")
    return CheckedOut("generation", g.id, str(dest), tuple(written), g.name, g.adapter, g.base)


def checkout(store, ref: str, dest, *, with_base: bool = True) -> CheckedOut:
    """Write the generation, tree or file that `ref` names to `dest` (see the module docstring)."""
    dest = Path(dest)
    try:
        return _checkout(store, ref, dest, with_base)
    except OSError as e:
        # DEST lies under a file, in /proc, or somewhere this user cannot write: the path given
        # is at fault (exit 2); a full disk or an I/O error is the environment's (exit 6)
        if e.errno in (errno.ENOSPC, errno.EIO, errno.EDQUOT):
            raise fsio.io_error(e, f"writing {dest}") from None
        raise BadInput(f"cannot write {dest}: {e.strerror or e}", "choose a new path in a folder you can write") from None


def _checkout(store, ref: str, dest: Path, with_base: bool) -> CheckedOut:
    oid = store.resolve(ref)
    kind = _structured_kind(store, oid)
    if kind == "generation":
        _empty_or_new(dest)
        return _generation(store, generations.load(store, oid), dest, with_base)
    if kind == "tree":
        _empty_or_new(dest)
        trees.materialise_tree(store, oid, dest)
        files = tuple(e["path"] for e in trees.tree_entries(store, oid))
        return CheckedOut("tree", oid, str(dest), files)
    if dest.exists() or dest.is_symlink():
        raise BadInput(f"{dest} exists", "give the path of a new file; nothing is overwritten")
    if not dest.parent.is_dir():
        raise BadInput(f"{dest.parent} is not a folder", "create it first, or give another path")
    store.export_file(oid, dest)
    return CheckedOut("file", oid, str(dest), (dest.name,))
