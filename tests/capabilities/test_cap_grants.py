"""Grants only attenuate: a sub-path, ro instead of rw, or dropped. Widening is refused."""

from __future__ import annotations

import os

import pytest

from ledger import generations
from ledger.capabilities import admission, grants, registry
from ledger.capabilities.manifest import Handle
from ledger.errors import BadInput, Refused, UnknownRef
from tests.capabilities.helpers import ADDER_EXPORTS, ADDER_TESTS, ADDER_WAT, store_snapshot, write_cap

D = lambda p, m="ro": Handle("dir", p, m)  # noqa: E731


@pytest.mark.parametrize("granted, wanted, ok", [
    (D("data"), D("data"), True),
    (D("data"), D("data/sub"), True),
    (D("data", "rw"), D("data/sub", "ro"), True),
    (D("data", "rw"), D("data", "rw"), True),
    (D("data"), D("data", "rw"), False),          # rw is wider than ro
    (D("data/sub"), D("data"), False),            # a parent is wider
    (D("data"), D("data2"), False),               # a sibling sharing a prefix is not a sub-path
    (D("data"), D("dat"), False),
    (D("a/b"), D("a/bc/d"), False),
    (Handle("stdout"), Handle("stdout"), True),
    (Handle("stdout"), Handle("stderr"), False),
    (D("data"), Handle("stdout"), False),
])
def test_covers(granted, wanted, ok):
    assert grants.covers(granted, wanted) is ok


def test_widening_lists_exactly_the_wider_handles():
    cur = [D("data", "rw"), Handle("stdout")]
    assert grants.widening(cur, [D("data/x"), Handle("stdout")]) == []
    assert grants.widening(cur, []) == []
    assert grants.widening(cur, [D("data/x"), D("etc"), Handle("stderr")]) == [D("etc"), Handle("stderr")]


@pytest.fixture
def notes(store, tmp_path):
    (tmp_path / "data" / "sub").mkdir(parents=True)
    handles = [{"kind": "dir", "path": "data", "mode": "rw"}, {"kind": "stdout"}]
    src, man = write_cap(tmp_path, "notes", ADDER_WAT, ADDER_EXPORTS, ADDER_TESTS, handles=handles)
    admission.admit(store, src, man)
    return store


def test_attenuation_over_generations(notes):
    store = notes
    steps = [[D("data", "ro"), Handle("stdout")], [D("data/sub", "ro"), Handle("stdout")], [D("data/sub", "ro")], []]
    n0 = generations.head(store).n
    for i, want in enumerate(steps, 1):
        gen, old, new = registry.grant(store, "notes", want)
        assert gen.n == n0 + i and new == tuple(sorted(want))
        assert registry.entry(store, "notes").grants == tuple(sorted(want))
        assert store.journal.tail(1)[0]["kind"] == "capability-grant"
    # Each generation keeps its own grants; the admitting generation is unchanged.
    assert registry.entry(store, "notes", f"gen-{n0 + 1}").grants == (D("data", "ro"), Handle("stdout"))
    assert registry.entry(store, "notes").admitted_in == n0


@pytest.mark.parametrize("wider", [
    [D("data", "rw"), Handle("stdout"), Handle("stderr")],   # a new kind
    [D("etc")],                                             # another folder
    [D("data/sub", "rw")],                                  # rw back after ro (see below)
])
def test_widening_is_refused_and_changes_nothing(notes, wider):
    store = notes
    registry.grant(store, "notes", [D("data/sub", "ro"), Handle("stdout")])
    before, head = store_snapshot(store), store.state.head
    with pytest.raises(Refused) as ei:
        registry.grant(store, "notes", wider)
    assert ei.value.exit_code == 3 and "widen" in ei.value.message and ei.value.details["widening"]
    assert store_snapshot(store) == before and store.state.head == head


def test_rollback_restores_older_grants_explicitly(notes):
    store = notes
    first = generations.head(store)
    registry.grant(store, "notes", [])
    assert registry.entry(store, "notes").grants == ()
    with store.transaction("rollback") as tx:
        generations.move_head(tx, store, first)
    assert registry.entry(store, "notes").grants == (D("data", "rw"), Handle("stdout"))


def test_grant_refuses_unknown_capability_and_store_paths(notes, tmp_path):
    with pytest.raises(UnknownRef):
        registry.grant(notes, "nope", [])
    for bad in (".", ".ledger", ".ledger/objects"):
        with pytest.raises(Refused) as ei:
            grants.check_grantable(notes, [D(bad, "ro")])
        assert "expose the store" in ei.value.message


def test_symlinks_are_not_followed_out_of_the_project(notes, tmp_path):
    outside = tmp_path.parent / (tmp_path.name + "-outside")
    outside.mkdir()
    os.symlink(outside, tmp_path / "data" / "escape")
    with pytest.raises(Refused) as ei:
        grants.resolve_dir(notes, D("data/escape"))
    assert "symlink" in ei.value.message
    with pytest.raises(Refused):
        registry.grant(notes, "notes", [D("data/escape")])
    # A link that stays inside is refused too: links are never followed.
    os.symlink(tmp_path / "data" / "sub", tmp_path / "data" / "inner")
    with pytest.raises(Refused):
        grants.resolve_dir(notes, D("data/inner"))
    assert grants.resolve_dir(notes, D("data/sub")) == (tmp_path / "data" / "sub").resolve()


def test_a_missing_folder_fails_the_call_not_the_grant(notes, tmp_path):
    registry.grant(notes, "notes", [D("data/sub/later")])
    with pytest.raises(BadInput) as ei:
        registry.call(notes, "notes", "add", ["1", "2"])
    assert "does not exist" in ei.value.message
    (tmp_path / "data" / "sub" / "later").mkdir()
    assert registry.call(notes, "notes", "add", ["1", "2"]).values == (3,)


@pytest.mark.parametrize("text, handle", [
    ("dir:data:ro", D("data")), ("dir:data", D("data")), ("dir:./data/x/:rw", D("data/x", "rw")),
    ("stdout", Handle("stdout")), ("stderr", Handle("stderr")),
])
def test_handle_parse(text, handle):
    assert Handle.parse(text) == handle
    assert Handle.parse(str(handle)) == handle


@pytest.mark.parametrize("text", ["", "dir", "dir:", "dir:/etc:ro", "dir:../x", "dir:a/../../b", "stdin", "stdout:x",
                                  "net:1.2.3.4"])
def test_handle_parse_rejects(text):
    with pytest.raises(BadInput):
        Handle.parse(text)


def test_the_guest_sees_a_narrowed_folder_under_its_own_path(notes, tmp_path):
    """fd 3's preopen name is the granted path, which is what wasi-libc matches paths against."""
    wat = '''(module (import "wasi_snapshot_preview1" "fd_prestat_dir_name" (func $n (param i32 i32 i32) (result i32)))
      (memory (export "memory") 1)
      (func (export "name") (result i64) (drop (call $n (i32.const 3) (i32.const 0) (i32.const 8))) (i64.load (i32.const 0))))'''
    src, man = write_cap(tmp_path, "seer", wat, {"name": ([], ["i64"])},
                         [{"name": "nothing preopened", "export": "name", "args": [], "expect": [0]}],
                         handles=[{"kind": "dir", "path": "data", "mode": "ro"}])
    admission.admit(notes, src, man)

    def seen():
        v = registry.call(notes, "seer", "name", []).values[0]
        return (v & (2 ** 64 - 1)).to_bytes(8, "little").rstrip(b"\0")
    assert seen() == b"data"
    registry.grant(notes, "seer", [D("data/sub")])
    assert seen() == b"data/sub"
