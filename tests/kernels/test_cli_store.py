"""`ledger kernel ...` and its store records, on the CPU.

Without cupy or a GPU every command that needs one fails with RealizationUnavailable (exit 3)
and writes nothing. The store side (one transaction per command, bodies and artefacts as
objects, refs, the gate ref compile checks) is exercised with records shaped exactly like the
harness's, produced by stand-ins for build/test/bench (the GPU tests run the real ones)."""

from __future__ import annotations

import importlib.util
import json

import pytest

from ledger.cli.main import main
from ledger.errors import RealizationUnavailable
from ledger.kernels import devices as T
from ledger.kernels import harness
from ledger.kernels import store_records as sr
from ledger.kernels.records import BenchRecord, BuildRecord, TestRecord, Timing, b3, canonical
from ledger.store import canonical as store_canonical
from ledger.store.ids import hash_bytes
from tests.conftest import ledger_cmd

K = "lora-linear-bf16"
HAS_CUPY = importlib.util.find_spec("cupy") is not None


# --- without a GPU: loud refusals, nothing written ---------------------------------------------
@pytest.mark.skipif(HAS_CUPY, reason="cupy is installed here")
def test_without_cupy_every_gpu_command_exits_3_and_writes_nothing(tmp_path):
    ledger_cmd("init", cwd=tmp_path, check=True)
    before = (tmp_path / ".ledger" / "journal").read_bytes()
    for args in (("build", K, "--target", "h200"), ("test", K, "--target", "h200"),
                 ("bench", K, "--target", "h200")):
        p = ledger_cmd("kernel", *args, "--json", cwd=tmp_path)
        assert p.returncode == 3, (args, p.stdout, p.stderr)
        # under --json the error is one JSON object on stdout (and the line on stderr)
        err = json.loads(p.stdout)
        assert (err["exit_code"], err["error"]) == (3, "RealizationUnavailable"), err
        assert "cupy is not available" in err["message"] and "cupy is not available" in p.stderr, p.stderr
    # a CPU target and a too-old GPU are refused before cupy is even looked for
    p = ledger_cmd("kernel", "build", K, "--target", "cpu", cwd=tmp_path)
    assert p.returncode == 3 and "has no CUDA device" in p.stderr
    p = ledger_cmd("kernel", "build", K, "--target", "sm_75", cwd=tmp_path)
    assert p.returncode == 3 and "compute capability >= 8.0" in p.stderr
    # the gate needs no GPU, but needs records: none exist
    p = ledger_cmd("kernel", "gate", K, "--target", "h200", cwd=tmp_path)
    assert p.returncode == 2 and "has no build" in p.stderr
    p = ledger_cmd("kernel", "build", "no-such-kernel", "--target", "h200", cwd=tmp_path)
    assert p.returncode == 2 and "unknown kernel" in p.stderr
    assert (tmp_path / ".ledger" / "journal").read_bytes() == before


def test_list_needs_no_store_and_no_gpu(tmp_path):
    p = ledger_cmd("kernel", "list", "--json", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    names = {k["name"] for k in json.loads(p.stdout)}
    assert {"linear-bf16", K, "linear-int8", "linear-q4b32", "linear-int8-x16", "linear-q4b32-x16",
            "linear-q4b32p-x16"} == names


# --- the store side, with stand-ins shaped like the harness's records -------------------------
class Fakes:
    """build/test/bench stand-ins: what the harness returns, without a GPU."""

    def __init__(self):
        self.salt = b"v1"
        self.candidate_s = 39e-6
        self.rel_l2 = 1.7e-3
        self.calls = []

    def build(self, name, tgt, defines=()):
        tgt = T.resolve(tgt)
        self.calls.append(("build", name, tgt.arch))
        return BuildRecord(kernel=name, arch=tgt.arch, source="// decode_linear.cu " + self.salt.decode(),
                           source_file="decode_linear.cu", options=("-std=c++17", f"-arch={tgt.arch}"),
                           ptx_options=("-std=c++17", f"-arch={tgt.virtual_arch}"), nvrtc_version="13.0",
                           entry_points={"decode_linear<0,8,1,1,true,0>": "_Z13decode_linear"},
                           ptx=b"//\n.target sm_90 " + self.salt, cubin=b"\x7fELF cubin " + self.salt, log="ptxas info")

    def test(self, name, shapes=None, *, seed=0, build_record=None, config=None):
        self.calls.append(("test", name, build_record.id))
        case = {"shape": {"m": 1, "n": 4096, "k": 4096, "r": 16}, "path": "fused", "entry": "e",
                "rel_l2": self.rel_l2, "rel_max": 0.02, "unwritten": 0, "deterministic": True}
        return TestRecord(kernel=name, code_object=build_record.code_object, device={"name": "FakeGPU", "cc": [9, 0]},
                          tolerance=5e-3, cases=(case,), seed=seed)

    def bench(self, name, shape, *, launches=50, warmup=10, seed=0, build_record=None, config=None, side_by_side=True):
        self.calls.append(("bench", name, build_record.id))
        desc = {"realization": "torch-eager:lora_linear_bf16", "source": "def f(): ...", "torch": "x"}
        t = lambda oid, entry, s: Timing(oid, entry, s, s * 0.98, s * 1.05, launches)  # noqa: E731
        return BenchRecord(kernel=name, shape=shape.body(), device={"name": "FakeGPU"}, warmup=warmup, launches=launches,
                           weight_bytes=2 * 8192 * 8192, copy_bytes_per_s=4.24e12,
                           candidate=t(build_record.code_object, "decode_linear<...>", self.candidate_s),
                           baseline=t(b3(canonical(desc)), desc["realization"], 52e-6),
                           baseline_description=desc, extra={"copies": 2})


@pytest.fixture
def fakes(monkeypatch):
    f = Fakes()
    monkeypatch.setattr(harness, "build", f.build)
    monkeypatch.setattr(harness, "test", f.test)
    monkeypatch.setattr(harness, "bench", f.bench)
    monkeypatch.setattr(sr, "probe_device", lambda: {"name": "FakeGPU", "cc": [9, 0]})
    return f


def cli(capsys, store_dir, *args):
    code = main(["--store", str(store_dir), "kernel", *args, "--json"])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if out.strip() else None), err


def test_each_command_is_one_transaction_with_its_record_and_artefacts(tmp_path, store, fakes, capsys):
    d = store.root
    seq0 = store.state.seq
    code, b, _ = cli(capsys, d, "build", K, "--target", "h200")
    assert code == 0 and b["new"] and b["target"] == "h200"
    code, t, _ = cli(capsys, d, "test", K)           # the only target built: no --target needed
    assert code == 0
    code, r, _ = cli(capsys, d, "bench", K, "--target", "h200", "--launches", "20")
    assert code == 0
    code, g, err = cli(capsys, d, "gate", K, "--target", "h200")
    assert code == 0, err
    assert g["body"]["verdict"] == "accepted" and g["body"]["code"] == "Accepted"

    from ledger.store import Store

    s = Store.open(d)
    recs = list(s.journal.records())[seq0:]
    assert [x["kind"] for x in recs] == ["kernel-build", "kernel-test", "kernel-bench", "kernel-gate"]
    for rec, out in zip(recs, (b, t, r, g)):
        p = rec["payload"]
        assert p["record"] == out["record"] and p["kernel"] == K and p["target"] == "h200"
        assert out["record"] in rec["outputs"]
        body = s.get_json(out["record"])
        assert body == out["body"] and hash_bytes(store_canonical.dumps(body)) == out["record"]
    # the build's artefacts are objects, named in its body by the ids the store gave them
    bb = s.get_json(b["record"])
    assert s.get_bytes(bb["cubin"]).startswith(b"\x7fELF") and s.get_bytes(bb["ptx"]).startswith(b"//")
    assert s.get_bytes(bb["source_id"]).decode().startswith("// decode_linear.cu")
    # test and bench ran the stored build (read back from the store), and name it as their input
    assert recs[1]["inputs"] == [b["record"]] and recs[2]["inputs"] == [b["record"]]
    assert fakes.calls[1] == ("test", K, b["record"]) and fakes.calls[2] == ("bench", K, b["record"])
    assert s.get_json(t["record"])["code_object"] == bb["cubin"]
    # both code objects the bench timed are objects, and they differ: nothing was timed twice
    rb = s.get_json(r["record"])
    assert rb["candidate"]["code_object"] == bb["cubin"] != rb["baseline"]["code_object"]
    assert s.get_json(rb["baseline"]["code_object"]) == rb["baseline_description"]
    assert rb["baseline"]["code_object"] in recs[2]["outputs"]
    # refs: what is current, and the gate ref compile checks
    refs = s.state.refs
    assert refs[f"kernel-build/{K}/h200"] == b["record"] and refs[f"kernel-test/{K}/h200"] == t["record"]
    assert refs[f"kernel-bench/{K}/h200"] == r["record"] and refs[f"kernel/{K}/h200"] == g["record"]
    assert set(recs[3]["inputs"]) == {b["record"], t["record"], r["record"]}
    info = sr.gated(s, K, "h200")
    assert info["gate"] == g["record"] and info["build"] == b["record"] and info["code_object"] == bb["cubin"]
    # building again unchanged writes nothing
    code, again, _ = cli(capsys, d, "build", K, "--target", "h200")
    assert code == 0 and again["new"] is False and Store.open(d).state.seq == recs[-1]["seq"]
    listing = json.loads(ledger_cmd("--store", d, "kernel", "list", "--json").stdout)
    (lora,) = [k for k in listing if k["name"] == K]
    assert lora["targets"]["h200"]["gate"] == g["record"]


def test_refusal_is_recorded_exits_3_and_removes_the_gate_ref(store, fakes, capsys):
    d = store.root
    for args in (("build", K, "--target", "h200"), ("test", K), ("bench", K)):
        assert cli(capsys, d, *args)[0] == 0
    assert cli(capsys, d, "gate", K)[0] == 0
    from ledger.store import Store

    assert f"kernel/{K}/h200" in Store.open(d).state.refs
    fakes.candidate_s = 60e-6                     # slower than the 52 us baseline
    assert cli(capsys, d, "bench", K)[0] == 0
    code, g, err = cli(capsys, d, "gate", K)
    assert code == 3 and "NotFaster" in err
    s = Store.open(d)
    last = list(s.journal.records())[-1]
    assert last["kind"] == "kernel-gate" and last["payload"]["verdict"] == "refused" and last["payload"]["code"] == "NotFaster"
    assert s.get_json(last["payload"]["record"])["verdict"] == "refused"
    assert f"kernel/{K}/h200" not in s.state.refs and sr.gated(s, K, "h200") is None
    # a wrong kernel is refused as Wrong even when fast
    fakes.candidate_s, fakes.rel_l2 = 30e-6, 0.2
    assert cli(capsys, d, "test", K)[0] == 0 and cli(capsys, d, "bench", K)[0] == 0
    code, g, err = cli(capsys, d, "gate", K)
    assert code == 3 and "Wrong" in err


def test_a_rebuild_with_another_cubin_drops_the_gate_and_old_records_cannot_gate_it(store, fakes, capsys):
    d = store.root
    for args in (("build", K, "--target", "h200"), ("test", K), ("bench", K), ("gate", K)):
        assert cli(capsys, d, *args)[0] == 0
    from ledger.store import Store

    old_gate = Store.open(d).state.refs[f"kernel/{K}/h200"]
    fakes.salt = b"v2"
    code, b, _ = cli(capsys, d, "build", K, "--target", "h200")
    assert code == 0 and b["new"]
    s = Store.open(d)
    assert f"kernel/{K}/h200" not in s.state.refs and sr.gated(s, K, "h200") is None
    assert list(s.journal.records())[-1]["payload"]["gate_dropped"] == old_gate
    code, _, err = cli(capsys, d, "gate", K)      # the latest test is of the old cubin
    assert code == 2 and "current build" in err


def test_records_round_trip_through_their_bodies(fakes):
    br = fakes.build(K, "h200")
    t = fakes.test(K, build_record=br)
    fakes.candidate_s = float("nan")               # a non-finite time is stored as null ...
    b = fakes.bench(K, harness.S.Shape(1, 8192, 8192, 16), build_record=br)
    assert sr.test_from_body(json.loads(canonical(t.body()))).id == t.id
    back = sr.bench_from_body(json.loads(canonical(b.body())))
    assert back.id == b.id
    from ledger.kernels import gate

    d = gate(t, back)                              # ... and the gate refuses it
    assert not d.accepted and d.code == "Unproven"
    assert sr.gate_from_body(d.body()).id == d.id


def test_target_keys_and_missing_device(store, monkeypatch):
    assert sr.target_key(T.resolve("h200")) == "h200" and sr.target_key(T.resolve("sm_90")) == "sm_90"
    assert sr.target_key(T.CudaTarget("local:NVIDIA H200", (9, 0))) == "sm_90"

    def no_gpu():
        raise RealizationUnavailable("no CUDA device is visible")

    monkeypatch.setattr(sr, "probe_device", no_gpu)
    seq = store.state.seq
    with pytest.raises(RealizationUnavailable):
        sr.record_test(store, K, "h200")
    assert store.state.seq == seq
