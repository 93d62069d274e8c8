"""History at scale (issue 18): every everyday command on a store of 1M (or 10M) records, as a
ratio to the same command on a 100-record store, measured in the same run, alternating.

    .venv/bin/python benchmarks/bench_scale.py                      # 1,000,000 records vs 100
    .venv/bin/python benchmarks/bench_scale.py --records 10000000
    .venv/bin/python benchmarks/bench_scale.py --only verify,gc,report --repeat 5
    .venv/bin/python benchmarks/bench_scale.py --build-only         # just make (and cache) the stores
    .venv/bin/python benchmarks/bench_scale.py --walks              # count journal walks of one `run --force`
    .venv/bin/python benchmarks/bench_scale.py --records 10000000 --keep DIR   # working copies kept in DIR, reused

The stores are synthetic but real: a template store runs one real learn cycle on the built-in
tiny model (init, genesis, seal, record, export, compile, checkpoint, train, judge, commit);
the big store's journal is then written directly, line by line in the real record format
(canonical JSON, the hash chain, counters and refs consistent), reusing the template's cycle
objects and writing a fresh `turns` object for every turn batch and a fresh manifest for every
generation. Per year of operation: turns recorded in small batches (the image's fold), an
`outcome` now and then, a learn cycle every `--per-cycle` records (2/3 commits, 1/3 refusals),
each cycle's judge on its own budget key (suites are re-sealed over a year). The result passes
`ledger verify --read-data`. Built stores are cached under --cache keyed by their parameters;
each measurement session works on a copy whose objects are hard links (objects are immutable,
written once), so the cache stays pristine. Disk: ~4.9 KiB a record (a `turns` object takes a
4 KiB block), so 10M records need ~49 GB for the cache and ~8 GB per working copy. Where that
does not fit, a filesystem with 1 KiB blocks holds the same store in ~19 GB (RESULTS.md, "10M
records, session 7": a loop-mounted ext4 made with `mkfs.ext4 -b 1024 -N 11500000`); the
format is the same, and the 100-record store is built beside it on the same filesystem. Each command's
wall, CPU (user + system) and peak RSS come from GNU time (see run_measured).

`--warm` runs each command once on each store, untimed, before the timed runs (printed as its
"first run"). A store in use carries the states gc and report save between runs
(.ledger/cache/reach.* and report.json, docs/store-format.md rules 22 and 23), but each benchmark
invocation makes fresh working copies without them (the cached stores hold none, and gc's
copied from elsewhere would be another file, refused by its seal in cache/reach.seal), so
without `--warm` the first of the `--repeat` runs walks everything and the others start from
its state: the min/median/max mix the two.

    .venv/bin/python benchmarks/bench_scale.py --only gc,report --warm   # the steady state

Targets (issue 18): `run --force` <= 1.1x; gens, log, show, query, record of 150 turns,
rollback, diff <= 1.2x; incremental verify <= 1 s; verify --full, gc, report, index rebuild
<= 5 us per record; peak RSS of any command <= 300 MiB at 10M records.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEMPLATE_VERSION = 1
# 2: each cycle's export names a dataset of its own (in v1 all 370 named the template's, so "the
# export of this dataset", which `diff` asks, matched 370 records where a real store has one)
BUILD_VERSION = 2
DEFAULT_CACHE = Path(tempfile.gettempdir()) / "ledger-bench-scale"
MIB = 1 << 20


# --- the template: one real learn cycle -----------------------------------------------------------
def template(cache: Path) -> Path:
    """A store that ran one real cycle on the built-in tiny model (cached)."""
    dest = cache / f"template-v{TEMPLATE_VERSION}"
    if (dest / ".ledger" / "template.done").exists():
        return dest
    from ledger import experience
    from ledger.cycle import ensure_genesis, load_spec, run_cycle
    from ledger.demo.story import GOOD_TURNS, good_turns
    from ledger.gate import seal as seallib
    from ledger.options import LearnOptions
    from ledger.store import Store

    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    s = Store.init(dest)
    ensure_genesis(s, load_spec(None))
    seallib.seal(s, seallib.write_demo_suite(dest / "suite"))
    experience.record(s, experience.parse_turns("\n".join(json.dumps(t) for t in good_turns(GOOD_TURNS, 1))))
    res = run_cycle(s, LearnOptions(min_turns=1, min_hours=0))
    if res.outcome != "commit":
        raise SystemExit(f"the template cycle did not commit ({res.outcome}, {res.verdict}); cannot build")
    (dest / ".ledger" / "template.done").write_text("ok\n")
    return dest


# --- the synthetic store ------------------------------------------------------------------------
class _Writer:
    """Writes journal lines (real format, real hash chain) and objects straight to disk. No
    fsync and no lock: this is a fresh directory that becomes the cache entry by one rename.

    Bulk, for 10M-record stores: objects are created relative to an open descriptor of their
    fan-out directory (no path building), and a turn batch's record line is formatted from a
    template rather than encoded from a dict twice (`record_line`; the first lines are checked
    against the canonical encoder, so the template cannot drift from the format)."""

    CHECK_LINES = 1000  # template lines compared with canonical.dumps of the same record

    def __init__(self, root: Path, t0: float, dt: float):
        from ledger.store import canonical
        from ledger.store.ids import hash_bytes

        self.canonical, self.hash_bytes = canonical, hash_bytes
        self.root = root
        self.objects = root / "objects"
        self.dirs = []
        for i in range(256):
            (self.objects / f"{i:02x}").mkdir(parents=True, exist_ok=True)
            self.dirs.append(os.open(self.objects / f"{i:02x}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC))
        self.f = open(root / "journal", "wb", buffering=16 << 20)
        self.seq, self.prev = 0, None
        self.t, self.dt = t0, dt
        self.counts: dict[str, int] = {}
        self.n_objects = 0
        self.checked = 0
        self._sec, self._stamp = None, ""

    def now(self) -> str:
        self.t += self.dt
        whole = int(self.t)
        if whole != self._sec:   # strftime once a second of synthetic time, not once a record
            self._sec, self._stamp = whole, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole))
        return f"{self._stamp}.{int((self.t - whole) * 1e6):06d}Z"

    def put_json(self, obj, write: bool = True) -> tuple[str, int]:
        return self.put_bytes(self.canonical.dumps(obj), write)

    def put_bytes(self, data: bytes, write: bool = True) -> tuple[str, int]:
        oid = self.hash_bytes(data)
        if not write:
            return oid, len(data)
        h = oid[3:]
        try:
            fd = os.open(h[2:], os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o444,
                         dir_fd=self.dirs[int(h[:2], 16)])
        except FileExistsError:
            return oid, len(data)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        self.n_objects += 1
        return oid, len(data)

    def record_line(self, actor: str, oid: str, size: int, count: int, first: int) -> None:
        """Append a turn batch's `record` record (the bulk of any store) from a template."""
        self.seq += 1
        t = self.now()
        a = json.dumps(actor, ensure_ascii=False)
        rest = (f'"inputs":[],"kind":"record","outputs":["{oid}"],"payload":{{"count":{count},'
                f'"counters":{{"turns":{count}}},"first":{first},"objects":[["{oid}",{size},"turns"]],'
                f'"turns":"{oid}"}},"prev":"{self.prev}","seq":{self.seq},"time":"{t}"}}')
        rid = self.hash_bytes(f'{{"actor":{a},{rest}'.encode())
        line = f'{{"actor":{a},"id":"{rid}",{rest}\n'.encode()
        if self.checked < self.CHECK_LINES:
            body = {"seq": self.seq, "prev": self.prev, "time": t, "kind": "record", "inputs": [], "outputs": [oid],
                    "actor": actor, "payload": {"count": count, "counters": {"turns": count}, "first": first,
                                                "objects": [[oid, size, "turns"]], "turns": oid}}
            body["id"] = self.hash_bytes(self.canonical.dumps(body))
            if self.canonical.dumps(body) + b"\n" != line:
                raise SystemExit(f"internal: the record template drifted from the format:\n{line!r}")
            self.checked += 1
        self.f.write(line)
        self.prev = rid
        self.counts["record"] = self.counts.get("record", 0) + 1

    def append(self, kind: str, inputs, outputs, actor: str, payload: dict) -> dict:
        self.seq += 1
        body = {"seq": self.seq, "prev": self.prev, "time": self.now(), "kind": kind, "inputs": list(inputs),
                "outputs": list(outputs), "actor": actor, "payload": payload}
        line = self.canonical.dumps(body)
        body["id"] = self.hash_bytes(line)
        self.f.write(self.canonical.dumps(body) + b"\n")
        self.prev = body["id"]
        self.counts[kind] = self.counts.get(kind, 0) + 1
        return body

    def close(self) -> None:
        self.f.close()
        for fd in self.dirs:
            os.close(fd)


def _plan_cycles(n: int, per_cycle: int) -> tuple[int, list[int]]:
    """(cycles, turn-batch records before each cycle and after the last one)."""
    body = n - 3                              # init, genesis, seal
    cycles = max(2, round(body / per_cycle))
    turns_records = body - 6 * cycles         # each cycle: export compile checkpoint train judge end
    if turns_records < cycles + 1:
        raise SystemExit(f"--records {n} is too few for {cycles} cycles")
    groups = [turns_records // (cycles + 1)] * (cycles + 1)
    groups[-1] += turns_records - sum(groups)  # the tail: turns recorded since the last cycle
    return cycles, groups


def build(n: int, cache: Path, per_cycle: int = 2700, batch: int = 2, say=print, objects_upto: int | None = None) -> Path:
    """The synthetic store of `n` records (cached under `cache`, keyed by its parameters).
    `objects_upto`: the turn batches after record seq `objects_upto` are recorded with their
    objects' ids and sizes but the objects are not written — a store for the passes that read the
    journal alone (an index rebuild reads the objects of its first REBUILD_EAGER records only) at
    10M records, whose ~46 GB of turn objects a 2-core test machine's disk does not hold. verify
    and gc on such a store report the objects missing: never time them there."""
    tpl = template(cache)
    key = f"store-n{n}-c{per_cycle}-b{batch}-v{BUILD_VERSION}" + ("" if objects_upto is None else f"-o{objects_upto}")
    dest = cache / key
    if (dest / ".ledger" / "built.json").exists():
        return dest
    t_start = time.perf_counter()
    say(f"building {key} ...")
    work = cache / f"{key}.building-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    src = tpl / ".ledger"
    root = work / ".ledger"
    root.mkdir(parents=True)
    for sub in ("sealed", "cache"):
        shutil.copytree(src / sub, root / sub, symlinks=True)
    (root / "tmp").mkdir()
    cfg = json.loads((src / "config").read_text())
    cfg["id"] = "store-" + uuid.uuid4().hex
    (root / "config").write_text(json.dumps(cfg, sort_keys=True, separators=(",", ":")) + "\n")
    (work / "suite").symlink_to(tpl / "suite") if (tpl / "suite").exists() else None

    tpl_recs = [json.loads(line) for line in (src / "journal").read_bytes().splitlines()]
    by_kind = {r["kind"]: r for r in tpl_recs}
    cycles, groups = _plan_cycles(n, per_cycle)
    span = 365 * 86400 * max(n, 1_000_000) / 1_000_000   # a year per million records
    w = _Writer(root, time.time() - span - 3600, span / n)
    # the template's objects, as hard links (same bytes, same names)
    for d in (src / "objects").iterdir():
        for f in d.iterdir():
            target = w.objects / d.name / f.name
            if not target.exists():
                os.link(f, target)
    actor = by_kind["init"]["actor"]
    for r in tpl_recs[:3]:                              # init, genesis, seal: as recorded
        w.append(r["kind"], r["inputs"], r["outputs"], r["actor"], r["payload"])
    gen0 = by_kind["genesis"]["payload"]["refs"]["HEAD"]
    # read through the object store: the template's structured objects are stored compressed (Z1)
    from ledger.store.objects import ObjectStore
    tpl_objects = ObjectStore(src)
    turns_obj = tpl_objects.get_json(by_kind["record"]["payload"]["turns"])
    sample = turns_obj["turns"][:50]
    dataset_bytes = tpl_objects.get_bytes(by_kind["export"]["payload"]["dataset"])
    gen_manifest = tpl_objects.get_json(by_kind["commit"]["payload"]["refs"]["HEAD"])
    turns = exported = 0
    head, gen_n = gen0, 0
    report_every = max(1, n // 10)

    def record_turns(k: int) -> None:
        nonlocal turns
        for _ in range(k):
            if w.seq % 50 == 49 and turns:
                # ground truth learned later for a recent turn
                w.append("outcome", [], [], actor, {"turn": f"t{turns}", "outcome": f"ok {turns}", "time": w.now()})
            else:
                first = turns + 1
                batch_turns = []
                for i in range(batch):
                    t = dict(sample[(first + i) % len(sample)])
                    t["id"] = f"t{first + i}"
                    t["situation"] = f"{t['situation']} #{first + i}"
                    t["time"] = w.now()
                    batch_turns.append(t)
                oid, size = w.put_json({"kind": "turns", "first": first, "turns": batch_turns},
                                       write=objects_upto is None or w.seq < objects_upto)
                turns += batch
                w.record_line(actor, oid, size, batch, first)
            if w.seq % report_every == 0:
                say(f"  {w.seq:,} records ({time.perf_counter() - t_start:.0f} s)")

    for c in range(1, cycles + 1):
        record_turns(groups[c - 1])
        r = by_kind["export"]
        ex = dict(r["payload"], cycle=c, first=exported + 1, last=turns, counters={"exported": turns - exported})
        outputs = r["outputs"]
        if c > 1:   # the template's dataset is cycle 1's; every later export has its own
            did, dsize = w.put_bytes(_dataset_of_cycle(dataset_bytes, c))
            ex.update(dataset=did, objects=[[did, dsize, "dataset"]])
            outputs = [did]
        exported = turns
        w.append("export", r["inputs"], outputs, actor, ex)
        for kind in ("compile", "checkpoint", "train"):
            r = by_kind[kind]
            w.append(kind, r["inputs"], r["outputs"], actor, r["payload"])
        r = by_kind["judge"]
        budget = w.hash_bytes(f"suite epoch {c}".encode())[3:]
        w.append("judge", r["inputs"], r["outputs"], actor, dict(r["payload"], budget_key=f"budget:{budget}"))
        r = by_kind["commit"]
        if c % 3:
            gen_n += 1
            m = dict(gen_manifest, n=gen_n, parent=head, note=f"cycle {c}: Accept")
            gid, size = w.put_json(m)
            head = gid
            w.append("commit", r["inputs"], [gid], actor,
                     {"counters": {"cycles": 1}, "cycle": c, "generation": gen_n, "objects": [[gid, size, "generation"]],
                      "refs": {"HEAD": gid, f"gen-{gen_n}": gid}, "verdict_name": "Accept"})
        else:
            w.append("refusal", r["inputs"], [], actor,
                     {"counters": {"cycles": 1}, "cycle": c, "receipt": r["inputs"][0], "verdict": r["inputs"][1],
                      "verdict_name": "Reject"})
    record_turns(groups[-1])
    w.close()
    if w.seq != n:
        raise SystemExit(f"internal: wrote {w.seq} records, wanted {n}")
    say(f"  journal written: {n:,} records, {w.n_objects:,} new objects ({time.perf_counter() - t_start:.0f} s); "
        "indexing ...")
    from ledger.store import Store
    from ledger.store import verify as verifylib

    t_index = time.perf_counter()
    store = Store(root)
    store.rebuild_index()   # the index and refs.json, as `ledger index rebuild` makes them
    say(f"  indexed in {time.perf_counter() - t_index:.0f} s")
    # The watermark a clean `verify --full` leaves (docs/store-format.md rule 20), written from the
    # rebuild's fold: a full verify of millions of records costs minutes, and this store is right by
    # construction (`ledger verify --read-data` passes on small builds: tests/benchmarks). So
    # `verify` on it is incremental from the start, as on a store that is verified now and then.
    st = Store(root).state
    verifylib._write_watermark(store, st, (root / "journal").stat().st_size, verifylib.Report())
    info = {"records": n, "cycles": cycles, "generations": gen_n + 1, "turns": turns, "per_cycle": per_cycle,
            "batch": batch, "kinds": w.counts, "objects_written": w.n_objects,
            "build_s": round(time.perf_counter() - t_start, 1), "journal_bytes": (root / "journal").stat().st_size}
    (root / "built.json").write_text(json.dumps(info, indent=1) + "\n")
    shutil.rmtree(dest, ignore_errors=True)
    os.replace(work, dest)
    say(f"  built in {info['build_s']} s: {json.dumps(info)}")
    return dest


def _dataset_of_cycle(template: bytes, cycle: int) -> bytes:
    """The template's dataset (Parquet) with the cycle in its metadata: a valid dataset of its own."""
    import io

    import pyarrow.parquet as pq

    table = pq.read_table(io.BytesIO(template))
    table = table.replace_schema_metadata({**(table.schema.metadata or {}), b"synthetic_cycle": str(cycle).encode()})
    out = io.BytesIO()
    pq.write_table(table, out)
    return out.getvalue()


COPY_DONE = ".bench-scale-copy.json"  # beside .ledger in a working copy: made whole, from which cache entry


def working_copy(built: Path, into: Path, keep: bool = False) -> Path:
    """A store to measure on: objects hard-linked (immutable files), everything else copied.

    With `keep`, a copy already made whole under `into` from the same cache entry (its COPY_DONE
    names the entry's built.json) is reused as it is, with whatever earlier invocations wrote into
    it: at 10M records a copy costs minutes (10M hard links, a 5.6 GB journal, one fold)."""
    dest = into / built.name
    marker = dest / COPY_DONE
    stamp = (built / ".ledger" / "built.json").read_text()
    if keep and marker.exists():
        if json.loads(marker.read_text()).get("built") != stamp:
            raise SystemExit(f"{dest} is a kept copy of another build of {built.name}; remove it to make a new one")
        return dest
    shutil.rmtree(dest, ignore_errors=True)
    src, root = built / ".ledger", dest / ".ledger"
    root.mkdir(parents=True)
    subprocess.run(["cp", "-al", str(src / "objects"), str(root / "objects")], check=True)
    for p in src.iterdir():
        if p.name == "objects":
            continue
        if p.is_dir():
            shutil.copytree(p, root / p.name, symlinks=True)
        elif p.name != "refs.json":
            shutil.copy2(p, root / p.name)
    # A copied journal is another file (inode, ctime): refs.json would no longer vouch for it
    # (docs/store-format.md, rule 19) and the first writer would re-check the whole chain. One
    # untimed read folds the copy and writes a refs.json that vouches, as on a store in use.
    # Then one untimed write, so the timed ledger (--code) has written the cache it trusts itself:
    # an export of the turns pending since the last cycle, so every timed `run` trains on the 150
    # turns recorded just before it, on either store.
    subprocess.run(LEDGER + ["--store", str(dest), "log", "-n", "1"], cwd=into, env=_env(), check=True,
                   capture_output=True)
    subprocess.run(LEDGER + ["--store", str(dest), "export"], cwd=into, env=_env(), check=True, capture_output=True)
    marker.write_text(json.dumps({"built": stamp, "made": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}) + "\n")
    return dest


# What gc and report save for their next run (docs/store-format.md rules 22 and 23): removed from a
# kept copy by --forget-states, as a store whose states were lost, so the next gc / report walks everything.
SAVED_STATES = (("cache", "reach.bin"), ("cache", "reach.seal"), ("cache", "report.json"))


def forget_states(store: Path) -> list[str]:
    gone = []
    for parts in SAVED_STATES:
        p = store.joinpath(".ledger", *parts)
        if p.exists():
            p.unlink()
            gone.append("/".join(parts))
    return gone


# --- measuring --------------------------------------------------------------------------------------
CODE = ROOT  # the ledger whose commands are timed (--code: another checkout, e.g. the code before a change)


def _env() -> dict:
    e = {k: v for k, v in os.environ.items() if not k.startswith("LEDGER_")}
    e.update(OMP_NUM_THREADS="1", PYTHONPATH=str(CODE))
    return e


def run_measured(argv: list[str], cwd: Path, stdin: bytes | None = None) -> tuple[float, float, int, str]:
    """(wall s, peak RSS MiB, exit code, output tail) of `argv`; its CPU time (user + system)
    goes to LAST_CPU. Both RSS and CPU include the children it waited for (a run's training child).

    Measured by /usr/bin/time, not by this process's wait4: Linux carries a process's peak RSS
    across fork and exec (the child's count starts at its parent's resident size), so a command
    forked from this benchmark (which has loaded pyarrow, DuckDB and a store's worth of Python)
    would report at least this process's size. `time` is small; what it forks reports its own."""
    global LAST_CPU
    fd, ru_file = tempfile.mkstemp(prefix="bench-scale-rusage-")
    os.close(fd)
    argv = [TIME, "-f", "%M %U %S", "-o", ru_file, *argv]
    t0 = time.perf_counter()
    p = subprocess.Popen(argv, cwd=cwd, env=_env(), stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    if stdin is not None:
        p.stdin.write(stdin)
        p.stdin.close()
    out = p.stdout.read()
    p.wait()
    wall = time.perf_counter() - t0
    try:
        # the last line: `time` writes "Command exited with non-zero status N" before it on failure
        kib, user, sys_ = Path(ru_file).read_text().split("\n")[-2].split()
    finally:
        os.unlink(ru_file)
    LAST_CPU = float(user) + float(sys_)
    tail = out.decode(errors="replace").strip()[-600:]
    return wall, int(kib) / 1024, p.returncode, tail


LEDGER = [sys.executable, "-m", "ledger.cli.main"]
TIME = "/usr/bin/time"  # GNU time: the command's own peak RSS and CPU (see run_measured)
LAST_CPU = 0.0  # CPU seconds of the last run_measured (on a contended machine wall time is not the cost)


def _turns_file(n: int = 150) -> bytes:
    return "".join(json.dumps({"situation": f"user: what is {i} plus {i + 1}?", "action": f"call adder.add({i}, {i + 1})",
                               "outcome": str(2 * i + 1)}) + "\n" for i in range(n)).encode()


# name -> (argv after `ledger --store DIR`, stdin, target, untimed steps before, untimed steps after).
# A step is (argv, stdin). Each timed `run` follows 150 newly recorded turns (a day's worth, as the
# cycle's policy wants); a rollback is undone after it is timed; an incremental verify follows a
# clean verify and one write.
RECORD = (["record", "-"], "turns")
COMMANDS = {
    "run": (["run", "--force", "--refusal-ok"], None, "ratio<=1.1", [RECORD], []),
    "gens": (["gens"], None, "ratio<=1.2", [], []),
    "log": (["log"], None, "ratio<=1.2", [], []),
    "log-kind": (["log", "--kind", "commit", "-n", "3"], None, "ratio<=1.2", [], []),
    "show": (["show", "HEAD"], None, "ratio<=1.2", [], []),
    "query": (["query", "select kind, count(*) from journal group by all"], None, "ratio<=1.2", [], []),
    "record": (["record", "-"], "turns", "ratio<=1.2", [], []),
    "rollback": (["rollback"], None, "ratio<=1.2", [], [(["rollback", "--undo"], None)]),
    "rollback-undo": (["rollback", "--undo"], None, "ratio<=1.2", [(["rollback"], None)], []),
    "diff": (["diff", "gen-1", "HEAD"], None, "ratio<=1.2", [], []),
    "verify": (["verify"], None, "<=1s", [(["verify"], None), RECORD], []),
    "verify-full": (["verify", "--full"], None, "<=5us/rec", [], []),
    "verify-read-data": (["verify", "--read-data"], None, "<=5us/rec", [], []),
    "gc": (["gc"], None, "<=5us/rec", [], []),
    "report": (["report", "-o", "{tmp}/report.html"], None, "<=5us/rec", [], []),
    "index-rebuild": (["index", "rebuild"], None, "<=5us/rec", [], []),
}


def _check_undo_arg() -> None:
    """`rollback --undo` is a flag of this CLI version; drop the command otherwise."""
    out = subprocess.run(LEDGER + ["rollback", "--help"], capture_output=True, text=True, env=_env(), cwd=ROOT).stdout
    if "--undo" not in out:
        COMMANDS.pop("rollback-undo", None)


def measure(names: list[str], stores: dict[str, Path], repeat: int, tmp: Path, n_large: int, say=print,
            warm: bool = False) -> dict:
    """Each command `repeat` times on each store, alternating small/large; with `warm`, after one untimed
    run of it on each store (what a command saves for its next run is then in place: gc's and report's
    states), whose figures are kept apart as `first`."""
    results: dict[str, dict] = {}
    turns = _turns_file()
    for name in names:
        args, stdin, target, before, after = COMMANDS[name]
        args = [a.replace("{tmp}", str(tmp)) for a in args]
        per: dict[str, list] = {label: [] for label in stores}

        def untimed(steps, path, label):
            for step_args, step_in in steps:
                _, _, rc, tail = run_measured(LEDGER + ["--store", str(path)] + step_args, tmp,
                                              turns if step_in == "turns" else None)
                if rc != 0:
                    raise SystemExit(f"untimed `ledger {' '.join(step_args)}` on the {label} store exited {rc}:\n{tail}")

        first: dict[str, dict] = {}
        if warm:
            for label, path in stores.items():
                untimed(before, path, label)
                wall, rss, rc, tail = run_measured(LEDGER + ["--store", str(path)] + args, tmp,
                                                   turns if stdin == "turns" else None)
                if rc != 0:
                    raise SystemExit(f"warm-up `ledger {' '.join(args)}` on the {label} store exited {rc}:\n{tail}")
                first[label] = {"wall": wall, "rss_mib": rss, "cpu": LAST_CPU}
                say(f"{name:14s} {label}: first run (warm-up, untimed) {wall:.3f} s, CPU {LAST_CPU:.2f} s, "
                    f"RSS {rss:.0f} MiB")
                untimed(after, path, label)

        for i in range(repeat):
            for label, path in (stores.items() if i % 2 == 0 else reversed(list(stores.items()))):
                untimed(before, path, label)
                wall, rss, rc, tail = run_measured(LEDGER + ["--store", str(path)] + args, tmp,
                                                   turns if stdin == "turns" else None)
                if rc != 0:
                    raise SystemExit(f"`ledger {' '.join(args)}` on the {label} store exited {rc}:\n{tail}")
                per[label].append((wall, rss, LAST_CPU))
                untimed(after, path, label)
        results[name] = {label: {"min": min(w for w, _, _ in v), "median": statistics.median(w for w, _, _ in v),
                                 "max": max(w for w, _, _ in v), "rss_mib": max(r for _, r, _ in v),
                                 "cpu_median": statistics.median(c for _, _, c in v)}
                         for label, v in per.items()}
        for label, f in first.items():
            results[name][label]["first"] = f
        results[name]["target"] = target
        say(_line(name, results[name], list(stores), n_large))
    return results


def _line(name: str, r: dict, labels: list[str], n: int) -> str:
    small, large = labels
    s, lg = r[small], r[large]
    ratio = lg["median"] / s["median"] if s["median"] else float("inf")
    cpu_ratio = lg["cpu_median"] / s["cpu_median"] if s["cpu_median"] else float("inf")
    extra = f"  {1e6 * lg['median'] / n:.2f} us/rec ({1e6 * lg['cpu_median'] / n:.2f} CPU)"
    return (f"{name:14s} {small}: {s['min']:.3f}/{s['median']:.3f}/{s['max']:.3f} s  "
            f"{large}: {lg['min']:.3f}/{lg['median']:.3f}/{lg['max']:.3f} s  ratio {ratio:5.2f}x  "
            f"CPU {s['cpu_median']:.2f}/{lg['cpu_median']:.2f} s ({cpu_ratio:4.2f}x)  "
            f"RSS {lg['rss_mib']:.0f} MiB{extra}  target {r['target']}")


def verdicts(results: dict, n_large: int, n_small: int, small: str, large: str) -> list[str]:
    out = []
    for name, r in results.items():
        lg, s = r[large], r[small]
        t = r["target"]
        if t.startswith("ratio<="):
            v = lg["median"] / s["median"]
            ok = v <= float(t.split("<=")[1])
            what = f"{v:.2f}x"
        elif t == "<=1s":
            ok, what = lg["median"] <= 1.0, f"{lg['median']:.2f} s"
        else:
            # whole command per record, and the part that grows with history: (large - small)
            # per added record (the interpreter's start and imports are paid by both)
            v = 1e6 * lg["median"] / n_large
            marginal = 1e6 * (lg["median"] - s["median"]) / max(1, n_large - n_small)
            ok, what = v <= 5.0, f"{v:.2f} us/record ({marginal:.2f} marginal)"
        rss_ok = lg["rss_mib"] <= 300
        # RSS is the command's process and the children it waited for (a run's training child)
        out.append(f"{name:14s} {what:>16s} (target {t}) {'met' if ok else 'MISSED'}; peak RSS {lg['rss_mib']:.0f} MiB "
                   f"(small store {s['rss_mib']:.0f}){'' if rss_ok else ' over 300 MiB'}")
    return out


# --- counting journal walks ------------------------------------------------------------------------
WALK_HOOK = r"""
import atexit, json, sys, time
from ledger.store import journal as J
counts = {}
def wrap(name):
    real = getattr(J.Journal, name)
    if name in ("backwards",):
        def f(self, *a, **k):
            c = counts.setdefault(name, {"calls": 0, "records": 0, "s": 0.0})
            c["calls"] += 1
            for r in real(self, *a, **k):
                c["records"] += 1
                yield r
    else:
        def f(self, *a, **k):
            c = counts.setdefault(name, {"calls": 0, "records": 0, "s": 0.0})
            c["calls"] += 1
            t = time.perf_counter()
            out = real(self, *a, **k)
            c["s"] += time.perf_counter() - t
            if time.perf_counter() - t > 0.5:   # the slow ones, with where they started and who asked
                import traceback
                who = [f"{fr.name}:{fr.lineno}" for fr in traceback.extract_stack()[-5:-1]]
                c.setdefault("slow", []).append([round(time.perf_counter() - t, 2), a[:1], who])
            recs = getattr(out, "records", out if isinstance(out, list) else None)
            if recs is not None:
                c["records"] += len(recs)
            return out
    setattr(J.Journal, name, f)
for n in ("scan", "records", "backwards", "prefix_digest", "tail"):
    if hasattr(J.Journal, n):
        wrap(n)
atexit.register(lambda: sys.stderr.write("WALKS " + json.dumps(counts) + "\n"))
from ledger.cli.main import main
sys.argv = ["ledger"] + sys.argv[1:]
sys.exit(main(sys.argv[1:]))
"""


def count_walks(path: Path, args: list[str], tmp: Path) -> dict:
    p = subprocess.run([sys.executable, "-c", WALK_HOOK, "--store", str(path), *args], cwd=tmp, env=_env(),
                       capture_output=True, text=True)
    line = next((ln for ln in p.stderr.splitlines() if ln.startswith("WALKS ")), None)
    if line is None:
        raise SystemExit(f"walk count failed ({p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    out = json.loads(line[6:])
    out["exit"] = p.returncode
    out["output"] = (p.stdout.strip().splitlines() or [""])[-1][:300]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--small", type=int, default=100)
    ap.add_argument("--per-cycle", type=int, default=2700, help="records per learn cycle (a day's turns)")
    ap.add_argument("--batch", type=int, default=2, help="turns per `record` record")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--only", default="", help=f"comma-separated: {','.join(COMMANDS)}")
    ap.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    ap.add_argument("--build-only", action="store_true")
    ap.add_argument("--objects-upto", type=int, help="with --build-only: write the turn batches' objects only up to "
                                                      "this record seq (a journal-only store for index rebuild at 10M; "
                                                      "see build())")
    ap.add_argument("--walks", action="store_true", help="count journal walks of one `run --force` on each store")
    ap.add_argument("--warm", action="store_true", help="run each command once per store, untimed, before the timed "
                                                         "runs (gc's and report's saved states in place)")
    ap.add_argument("--keep", type=Path, help="make the working copies under this folder once and keep them: a later "
                                               "invocation with the same --keep reuses them as they are (what earlier "
                                               "commands wrote included; at 10M records a copy costs minutes)")
    ap.add_argument("--forget-states", action="store_true", help="before measuring, remove gc's and report's saved "
                                                                  "states from the working copies (with --keep)")
    ap.add_argument("--pack", action="store_true", help="before measuring, run `gc --prune` (untimed) on each working "
                                                       "copy, so its small objects are packed (docs/store-format.md P3)")
    ap.add_argument("--json", type=Path, help="write the figures here")
    ap.add_argument("--code", type=Path, help="time the ledger of this source tree (e.g. `git archive` of an "
                                               "older commit) on the same stores; they are built by this one")
    a = ap.parse_args(argv)
    global CODE
    a.cache.mkdir(parents=True, exist_ok=True)
    if a.objects_upto is not None and not a.build_only:
        raise SystemExit("--objects-upto builds a store whose later objects are missing: use it with --build-only")
    built = {f"{n:,}": build(n, a.cache, a.per_cycle, a.batch, objects_upto=a.objects_upto) for n in (a.small, a.records)}
    if a.build_only:
        for label, p in built.items():
            print(label, p)
        return 0
    if a.keep:
        a.keep.mkdir(parents=True, exist_ok=True)
    tmp = a.keep.resolve() if a.keep else Path(tempfile.mkdtemp(prefix="bench-scale-", dir=a.cache))
    try:
        if a.code:
            CODE = a.code.resolve()
            print(f"timing the ledger at {CODE}")
        t = time.perf_counter()
        stores = {label: working_copy(p, tmp, keep=bool(a.keep)) for label, p in built.items()}
        print(f"working copies in {time.perf_counter() - t:.1f} s (contended machine: 2 cores shared)")
        if a.forget_states:
            for label, p in stores.items():
                print(f"{label}: removed saved states {forget_states(p) or 'none'}")
        if a.pack:
            for label, p in stores.items():
                t = time.perf_counter()
                _, _, rc, tail = run_measured(LEDGER + ["--store", str(p), "gc", "--prune"], tmp)
                if rc != 0:
                    raise SystemExit(f"untimed `ledger gc --prune` on the {label} store exited {rc}:\n{tail}")
                print(f"{label}: gc --prune in {time.perf_counter() - t:.1f} s; packs: "
                      f"{sorted(x.name for x in (p / '.ledger' / 'packed').glob('*.pack'))}")
        if a.walks:
            for label, p in stores.items():
                # the 150 turns a timed `run` follows (COMMANDS["run"]): the working copy exported
                # what was pending, so without them the run has nothing to train on and stops
                _, _, rc, tail = run_measured(LEDGER + ["--store", str(p), "record", "-"], tmp, _turns_file())
                if rc != 0:
                    raise SystemExit(f"untimed `ledger record -` on the {label} store exited {rc}:\n{tail}")
                print(label, json.dumps(count_walks(p, ["run", "--force", "--refusal-ok"], tmp)))
            return 0
        _check_undo_arg()
        names = [n for n in (a.only.split(",") if a.only else COMMANDS) if n]
        unknown = [n for n in names if n not in COMMANDS]
        if unknown:
            raise SystemExit(f"unknown command(s) {unknown}; choose from {','.join(COMMANDS)}")
        small, large = list(stores)
        print(f"{'command':14s} min/median/max wall, peak RSS of the large store's runs")
        res = measure(names, stores, a.repeat, tmp, a.records, warm=a.warm)
        print("\nagainst the targets:")
        for line in verdicts(res, a.records, a.small, small, large):
            print("  " + line)
        if a.json:
            a.json.write_text(json.dumps({"records": a.records, "small": a.small, "results": res}, indent=1))
    finally:
        if not a.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
