"""The image's buffer: what is appended is read back once, in order; an unfinished last entry is
dropped only when the writer is gone; any other damage stops the keeper with a typed error."""

import os

import pytest

from ledger.image import spool


def _turn(i):
    return {"situation": f"s{i}", "action": f"a{i}", "request": f"r{i}"}


def test_append_read_incrementally_and_roll_parts(tmp_path):
    w = spool.SpoolWriter(tmp_path, "a" * 16, part_bytes=400)
    r = spool.SpoolReader(tmp_path, "a" * 16)
    for i in range(3):
        w.append(_turn(i), {"kind": "text"})
    w.sync()
    got = r.read()
    assert [e.n for e in got] == [1, 2, 3] and got[1].turn == _turn(1) and got[0].meta == {"kind": "text"}
    for i in range(3, 9):
        w.append(_turn(i), {})
    assert w.part >= 2, "small parts roll over"
    assert [e.n for e in r.read()] == [4, 5, 6, 7, 8, 9]
    assert r.read() == [] and r.done_parts, "parts read to the end are reported for deletion"
    assert list(spool.sessions(tmp_path)) == ["a" * 16]


def test_unfinished_last_entry(tmp_path):
    w = spool.SpoolWriter(tmp_path, "b" * 16)
    w.append(_turn(1), {})
    line = spool.encode_entry("b" * 16, 2, _turn(2), {})
    os.write(w.fd, line[:25])                      # the writer was killed mid-append
    r = spool.SpoolReader(tmp_path, "b" * 16)
    assert [e.n for e in r.read()] == [1] and not r.torn   # it may still be writing: wait
    assert r.read(final=True) == [] and r.torn == line[:25]  # it is gone: never acknowledged


@pytest.mark.parametrize("damage", ["flip", "gap", "garbage-middle"])
def test_damage_is_corruption(tmp_path, damage):
    w = spool.SpoolWriter(tmp_path, "c" * 16)
    for i in range(3):
        w.append(_turn(i), {})
    p = spool.part_path(tmp_path, "c" * 16, 0)
    data = bytearray(p.read_bytes())
    if damage == "flip":
        data[60] ^= 0x01
    elif damage == "gap":
        lines = bytes(data).split(b"\n")
        data = bytearray(b"\n".join([lines[0], lines[2], b""]))
    else:
        lines = bytes(data).split(b"\n")
        data = bytearray(b"\n".join([lines[0], b"nonsense", lines[1], lines[2], b""]))
    p.write_bytes(bytes(data))
    with pytest.raises(spool.SpoolCorrupt) as ei:
        spool.SpoolReader(tmp_path, "c" * 16).read(final=True)
    assert ei.value.exit_code == 4 and p.name in ei.value.message


def test_unfinished_line_before_a_later_part_is_corruption(tmp_path):
    w = spool.SpoolWriter(tmp_path, "d" * 16)
    w.append(_turn(1), {})
    os.write(w.fd, spool.encode_entry("d" * 16, 2, _turn(2), {})[:20])
    spool.part_path(tmp_path, "d" * 16, 1).write_bytes(spool.encode_entry("d" * 16, 2, _turn(2), {}))
    with pytest.raises(spool.SpoolCorrupt) as ei:
        spool.SpoolReader(tmp_path, "d" * 16).read()
    assert "unfinished line before the next part" in ei.value.message
