"""LedgerError.to_json / from_json: the one way an error crosses a process boundary (errors.py).

The reading side is hostile-input code: a training child, the image or its keeper writes the JSON."""

from __future__ import annotations

import json
import os

import pytest

import ledger.image.protocol  # noqa: F401 - defines NoReply: every subclass must round-trip
import ledger.image.spool  # noqa: F401 - defines SpoolCorrupt
import ledger.store.fsio  # noqa: F401 - defines StorageIOError
from ledger import errors
from ledger.errors import (
    MAX_ERROR_JSON_BYTES,
    MAX_ERROR_TEXT,
    CorruptObject,
    InternalError,
    LedgerError,
    MissingObject,
    read_error_file,
)
from tests.conftest import ledger_cmd

OID = "b3:" + "ab" * 32


def _all_subclasses() -> list[type[LedgerError]]:
    out, todo = [], [LedgerError]
    while todo:
        c = todo.pop()
        out.append(c)
        todo.extend(c.__subclasses__())
    return sorted(set(out), key=lambda c: (c.__module__, c.__qualname__))


def _example(cls: type[LedgerError]) -> LedgerError:
    if issubclass(cls, (CorruptObject, MissingObject)):
        return cls(OID)
    return cls(f"{cls.__name__} happened", f"do the {cls.__name__} thing", path="/x", count=3, ok=True)


@pytest.mark.parametrize("cls", _all_subclasses(), ids=lambda c: f"{c.__module__}.{c.__name__}")
def test_every_subclass_round_trips(cls):
    e = _example(cls)
    for wire in (e.to_json(), json.dumps(e.to_json()), json.dumps(e.to_json()).encode()):
        back = LedgerError.from_json(wire)
        assert type(back) is cls
        assert (back.message, back.hint, back.details, back.exit_code) == (e.message, e.hint, e.details, e.exit_code)
        assert back.to_json() == e.to_json()
        assert str(back) == str(e)
    if isinstance(e, (CorruptObject, MissingObject)):
        assert back.oid == OID


def test_the_set_of_classes_is_the_expected_one():
    # the walk must reach classes defined outside errors.py (else they would come back as InternalError)
    names = {c.__name__ for c in _all_subclasses()}
    assert {"NoReply", "SpoolCorrupt", "StorageIOError", "CorruptObject", "Locked", "SpecError"} <= names


@pytest.mark.parametrize("name", ["Exception", "SystemExit", "os.system", "__import__", "", "Nope", None, 7])
def test_unknown_class_becomes_internal_error_naming_the_claim(name):
    e = LedgerError.from_json({"error": name, "message": "boom", "hint": "h", "exit_code": 2})
    assert type(e) is InternalError and e.exit_code == 1
    assert "boom" in e.message and "unknown error type" in e.message


def test_exit_code_comes_from_the_class_not_the_claim():
    e = LedgerError.from_json({"error": "BadInput", "message": "m", "exit_code": 0})
    assert type(e) is errors.BadInput and e.exit_code == 2


@pytest.mark.parametrize("data", [b"", b"not json", b"[1,2]", b"null", b'"str"', 42, None, [],
                                  b"[" * 100000, b'{"error": "BadInput", "message": ' + b"1" * 5000 + b"}"])
def test_unreadable_reports_are_internal_errors_not_exceptions(data):
    e = LedgerError.from_json(data)
    assert type(e) is InternalError
    assert e.message


def test_size_is_bounded():
    big = json.dumps({"error": "BadInput", "message": "x" * (MAX_ERROR_JSON_BYTES + 1)})
    e = LedgerError.from_json(big)
    assert type(e) is InternalError and "larger than" in e.message


def test_text_is_one_printable_bounded_line():
    e = LedgerError.from_json({"error": "Refused", "message": "a\nb\x1b[2J\rc" + "y" * 10 * MAX_ERROR_TEXT,
                               "hint": ["not", "a", "string"]})
    assert type(e) is errors.Refused
    assert e.message.isprintable() and "\x1b" not in e.message and len(e.message) <= MAX_ERROR_TEXT
    assert e.message.startswith("a b [2J c")
    assert e.hint == errors.Refused.default_hint  # a hint that is not a string is the class's own


def test_details_are_bounded_scalars_and_cannot_clash_with_arguments():
    det = {f"k{i}": i for i in range(1000)}
    det.update({"message": "m2", "hint": "h2", "nested": {"a": {"b": 1}}, "huge": 10 ** 30, "lst": list(range(100))})
    e = LedgerError.from_json({"error": "BadInput", "message": "m", "details": det})
    assert type(e) is errors.BadInput and e.message == "m"
    assert len(e.details) <= errors.MAX_ERROR_DETAILS
    e = LedgerError.from_json({"error": "BadInput", "message": "m",
                               "details": {"message": "m2", "nested": {"a": 1}, "huge": 10 ** 30,
                                           "lst": list(range(100))}})
    assert e.details["message"] == "m2" and e.message == "m"
    assert e.details["nested"] == "dict" and e.details["huge"] == str(10 ** 30)
    assert len(e.details["lst"]) == 32


def test_demoted_classes_become_internal_errors():
    for claim in ("CorruptObject", "JournalCorrupt", "StoreCorrupt", "Locked"):
        e = LedgerError.from_json({"error": claim, "message": "your store is broken", "details": {"id": OID}},
                                  origin="the training child", demote=errors.NOT_FROM_A_CHILD)
        assert type(e) is InternalError and e.exit_code == 1
        assert claim in e.message and "the training child" in e.message
        assert "id" not in e.details and e.details["reported_id"] == OID
    ok = LedgerError.from_json({"error": "RealizationUnavailable", "message": "m"}, demote=errors.NOT_FROM_A_CHILD)
    assert type(ok) is errors.RealizationUnavailable


def test_read_error_file(tmp_path):
    p = tmp_path / "error.json"
    assert read_error_file(p) is None
    p.write_text(json.dumps(errors.SpecError("bad field", "fix it").to_json()))
    e = read_error_file(p)
    assert type(e) is errors.SpecError and e.message == "bad field" and e.hint == "fix it"


def test_read_error_file_refuses_links_and_special_files(tmp_path):
    real = tmp_path / "real.json"
    real.write_text(json.dumps(errors.BadInput("m").to_json()))
    link = tmp_path / "link.json"
    link.symlink_to(real)
    assert type(read_error_file(link)) is InternalError
    d = tmp_path / "dir.json"
    d.mkdir()
    assert "not a regular file" in read_error_file(d).message
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    assert "not a regular file" in read_error_file(fifo).message  # and it did not hang
    big = tmp_path / "big.json"
    big.write_bytes(b" " * (MAX_ERROR_JSON_BYTES + 10) + json.dumps(errors.BadInput("m").to_json()).encode())
    assert "larger than" in read_error_file(big).message


def test_a_typed_error_crosses_from_the_detached_keeper(tmp_path):
    """`ledger serve --detach` on a store with no generation: the keeper (another process) fails
    with Refused; its JSON line in the log comes back through from_json as the same type, exit code
    and hint (it was once parsed out of a human log line and the exit-code table)."""
    assert ledger_cmd("init", cwd=tmp_path).returncode == 0
    p = ledger_cmd("serve", "--detach", cwd=tmp_path, timeout=120)
    assert p.returncode == 3, (p.stdout, p.stderr)
    assert "there is no generation to serve" in p.stderr and "ledger run" in p.stderr
    p = ledger_cmd("serve", "--detach", "--json", cwd=tmp_path, timeout=120)
    err = json.loads(p.stdout)
    assert err["error"] == "Refused" and err["exit_code"] == 3
