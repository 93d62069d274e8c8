"""No ambient authority: the image process cannot read the sealed suite -- neither its sealed copy
nor its documents among the objects -- nor write the journal, while it reads what it serves.
The same probes succeed when the image runs --unsandboxed, so the denials are Landlock's."""

import errno
import os

import pytest

from ledger.gate import seal as seallib
from ledger.image import protocol
from ledger.options import ServeOptions
from ledger.sandbox import landlock_abi
from ledger.store import Store

pytestmark = pytest.mark.skipif(landlock_abi() < 1, reason="needs Landlock")


def _targets(project):
    s = Store.open(project)
    suite = seallib.pinned(s)
    doc = sorted((seallib.sealed_dir(s, suite.id) / "eval").iterdir())[0]
    # the file that holds each object, whole or compressed (docs/store-format.md Z1)
    doc_object = s.objects.files(next(iter(s.get_json(suite.id)["scored"].values())))[0]
    head = s.objects.files(s.state.refs["HEAD"])[0]
    return {"sealed": (doc, False), "suite-doc-object": (doc_object, False),
            "suite-manifest": (s.objects.files(suite.id)[0], False),
            "refs": (s.root / "refs.json", False), "index": (s.root / "index.duckdb", False),
            "project-file": (project / "README", False), "journal-append": (s.journal.path, True),
            "served-object": (head, False), "journal": (s.journal.path, False)}


def _probe(served, path, write):
    r = protocol.request(protocol.image_socket(served.root), {"op": "probe", "path": str(path), "write": write})
    assert r["ok"], r
    return r


def test_image_cannot_read_the_suite(served):
    (served.project / "README").write_text("a file beside the store\n")
    targets = _targets(served.project)
    st = served.start(LEDGER_IMAGE_PROBE="1")
    assert st["sandbox"]["sandboxed"] and str(served.root / "sealed") in st["sandbox"]["protected"]
    conf = st["sandbox"]["confinement"]     # `ledger image status` names the whole confinement
    assert conf["landlock_abi"] == landlock_abi() and conf["seccomp_filter_hash"].startswith("b3:")
    assert conf["shm_private"] and conf["capabilities_left"] == [] and conf["no_new_privs"]
    assert "cap_sys_admin" in conf["capabilities_dropped"] or os.geteuid() != 0
    assert conf["seccomp_supervised"] and st["sandbox"]["syscall_denials"] == []   # the keeper's record of refusals
    for name, (path, write) in targets.items():
        r = _probe(served, path, write)
        if name in ("served-object", "journal"):
            assert r["opened"], (name, r)
        else:
            assert not r["opened"] and r["errno"] == errno.EACCES, (name, r)
    # and it still serves
    assert served.act("user: what is 1 plus 2?", action="call adder.add(1, 2)")["turn"]["outcome"] == "3"
    served.stop()

    st = served.start(ServeOptions(unsandboxed=True), LEDGER_IMAGE_PROBE="1")
    assert not st["sandbox"]["sandboxed"]
    assert st["sandbox"]["confinement"] is None
    for name in ("sealed", "suite-doc-object", "refs"):
        path, write = targets[name]
        assert _probe(served, path, write)["opened"], name
    recs = [r["payload"] for r in Store.open(served.project).journal.records() if r["kind"] == "image"]
    assert [p["sandbox"]["sandboxed"] for p in recs if p["event"] == "start"] == [True, False]   # recorded
