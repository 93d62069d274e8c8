"""Journal payloads are read and written through ledger/records.py (issue 14: every record kind has
one home, and writers, readers and the index use it), checked over the AST of every module.

Outside ledger/records.py and ledger/store/ (which owns the envelope and hands payloads to the
hooks records.py registers), no module may
  - subscript a record with "payload" (`rec["payload"]`) or `.get("payload")` it: a reader calls
    `records.read(rec)` (the typed payload; an ill-formed one is JournalCorrupt naming the record);
  - touch a transaction's `.payload` (`tx.payload[...] = …`, `tx.payload.update(…)`): a writer calls
    `records.write(tx, records.<Kind>(…))`, or `records.write_field` for the one field a helper
    shared by several kinds writes (a generation's number, the image's context);
  - pass a predicate to `lookup.latest` (ledger/store/lookup.py hands it the raw payload): filter
    `lookup.records(...)` on `records.read(r)` instead, as cycle._find does.
A method call named payload (`disk.payload(tokenizer, base)`, the seal's suite-hash input) is not
a journal payload and is not flagged.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from tests.house.layers import PACKAGE

# Where code outside records.py and the store may still see a payload as stored, and why. Each entry
# is (file under ledger/, function), so a new raw read elsewhere in the same file still fails.
ALLOWED = {
    # `ledger log` shows every record as it is stored — an ill-formed one, or one of a kind this
    # version does not define, included (verify names it; tests/reliability/test_ill_formed_records.py
    # requires that log shows it) — and stays light: it never loads ledger/records.py (~25 ms of
    # dataclasses; store/schema.py says why), so it reads the few display fields tolerantly.
    ("cli/render.py", "_summary"),
    ("api/journal.py", "log"),
}
EXEMPT = ("records.py", "store/")


@dataclass(frozen=True)
class Access:
    path: str        # relative to ledger/
    line: int
    function: str    # the innermost enclosing function ("" at module level)
    what: str

    def __str__(self) -> str:
        return f"  ledger/{self.path}:{self.line} ({self.function or 'module'}): {self.what}"


def _is_payload_str(node) -> bool:
    return isinstance(node, ast.Constant) and node.value == "payload"


class _Finder(ast.NodeVisitor):
    def __init__(self, path: str):
        self.path, self.stack, self.found = path, [], []
        self.called: set[int] = set()   # Attribute nodes that are the func of a call

    def _add(self, node, what: str) -> None:
        self.found.append(Access(self.path, node.lineno, self.stack[-1] if self.stack else "", what))

    def _function(self, node) -> None:
        self.stack.append(node.name)
        self.generic_visit(node)
        self.stack.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = _function

    def visit_Call(self, node: ast.Call) -> None:
        if isinstance(node.func, ast.Attribute):
            self.called.add(id(node.func))
            if node.func.attr == "get" and node.args and _is_payload_str(node.args[0]):
                self._add(node, '.get("payload")')
            if node.func.attr == "latest" and isinstance(node.func.value, ast.Name) and node.func.value.id == "lookup" \
                    and (len(node.args) > 3 or any(k.arg == "pred" for k in node.keywords)):
                self._add(node, "lookup.latest(..., pred) (its predicate reads the raw payload)")
        self.generic_visit(node)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        if _is_payload_str(node.slice):
            self._add(node, '["payload"]')
        self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if node.attr == "payload" and id(node) not in self.called:
            self._add(node, ".payload")
        self.generic_visit(node)


def accesses(package: Path = PACKAGE) -> list[Access]:
    out = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package).as_posix()
        if rel == EXEMPT[0] or rel.startswith(EXEMPT[1]):
            continue
        finder = _Finder(rel)
        finder.visit(ast.parse(path.read_bytes(), filename=str(path)))
        out += finder.found
    return out


def test_payloads_are_read_and_written_through_records():
    bad = [a for a in accesses() if (a.path, a.function) not in ALLOWED]
    assert not bad, ("journal payloads are read with records.read(rec) and written with records.write(tx, "
                     "records.<Kind>(...)) (ledger/records.py); raw payload access:\n" + "\n".join(map(str, bad)))


def test_every_allowance_is_still_needed():
    """An allow-list entry whose function no longer reads a raw payload is removed, not kept."""
    used = {(a.path, a.function) for a in accesses()}
    assert ALLOWED <= used, f"allow-list entries with no raw payload access left: {sorted(ALLOWED - used)}"


def test_the_check_can_fail(tmp_path):
    """The scan reads real files: planted raw reads and writes are found, a method named payload
    and the store's own files are not."""
    pkg = tmp_path / "ledger"
    (pkg / "store").mkdir(parents=True)
    (pkg / "store" / "repo.py").write_text("def commit(tx):\n    return dict(tx.payload)\n")
    (pkg / "records.py").write_text("def read(rec):\n    return rec['payload']\n")
    (pkg / "bad.py").write_text(
        "def reader(rec):\n    return rec['payload']['receipt']\n\n"
        "def getter(rec):\n    return rec.get('payload')\n\n"
        "def writer(tx):\n    tx.payload['head'] = 1\n    tx.payload.update({})\n\n"
        "def fine(disk):\n    return disk.payload(1, 2)\n\n"
        "def looked(store):\n    return lookup.latest(store, 'judge', {}, lambda p: p)\n")
    found = [(a.path, a.line, a.function, a.what) for a in accesses(pkg)]
    assert found == [("bad.py", 2, "reader", '["payload"]'), ("bad.py", 5, "getter", '.get("payload")'),
                     ("bad.py", 8, "writer", ".payload"), ("bad.py", 9, "writer", ".payload"),
                     ("bad.py", 15, "looked", "lookup.latest(..., pred) (its predicate reads the raw payload)")]
