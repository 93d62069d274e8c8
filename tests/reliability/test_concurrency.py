"""8 processes x 50 transactions: each commits or fails fast with Locked; the chain stays linear."""

import json
import subprocess
import sys
import textwrap

from ledger.store import Store
from ledger.store.verify import verify

WORKER = textwrap.dedent("""
    import json, sys
    from ledger.store import Store
    from ledger.errors import Locked
    root, me = sys.argv[1], int(sys.argv[2])
    committed, locked = [], 0
    for i in range(50):
        try:
            s = Store.open(root)
            with s.transaction("work") as tx:
                tx.payload["who"] = me
                tx.payload["i"] = i
                oid = tx.put_bytes(f"{me}-{i}".encode())
                tx.outputs.append(oid)
                tx.refs[f"name/w{me}"] = oid
            committed.append(tx.record["id"])
        except Locked as e:
            assert e.exit_code == 5
            locked += 1
    print(json.dumps({"committed": committed, "locked": locked}))
""")


def test_eight_writers(tmp_path):
    s = Store.init(tmp_path)
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, str(s.root), str(w)], stdout=subprocess.PIPE, text=True)
             for w in range(8)]
    results = []
    for p in procs:
        out, _ = p.communicate(timeout=300)
        assert p.returncode == 0
        results.append(json.loads(out))
    committed = [rid for r in results for rid in r["committed"]]
    assert sum(len(r["committed"]) + r["locked"] for r in results) == 400
    assert len(committed) > 0
    recs = Store.open(s.root).journal.records()
    # no lost update: every committed record is in the journal exactly once, and nothing else
    assert sorted(r["id"] for r in recs[1:]) == sorted(committed)
    assert [r["seq"] for r in recs] == list(range(1, len(recs) + 1))
    assert verify(Store.open(s.root), read_data=True).ok
    # each writer's last successful write is what its ref names
    st = Store.open(s.root).state
    for w, r in enumerate(results):
        if r["committed"]:
            last = next(x for x in reversed(recs) if x["payload"].get("who") == w)
            assert st.refs[f"name/w{w}"] == last["outputs"][0]


def test_wait_option_serialises(tmp_path):
    s = Store.init(tmp_path)
    worker = WORKER.replace('s.transaction("work")', 's.transaction("work", wait=30)')
    procs = [subprocess.Popen([sys.executable, "-c", worker, str(s.root), str(w)], stdout=subprocess.PIPE, text=True)
             for w in range(3)]
    outs = [json.loads(p.communicate(timeout=300)[0]) for p in procs]
    assert all(o["locked"] == 0 and len(o["committed"]) == 50 for o in outs)
    assert Store.open(s.root).state.seq == 151
