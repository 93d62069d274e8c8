"""Tracked runs: any training loop logs into the ledger (docs/tracking.md).

    import ledger
    with ledger.track("sweep-lr", params={"lr": 3e-4, "r": 16}, seeds={"torch": 0}) as run:
        for step, batch in enumerate(loader):
            loss = train_step(batch)
            run.log(step, loss=loss, lr=sched.get_last_lr()[0])
        run.artifact("out/adapter")

A tracked run is three kinds of journal record, each a whole transaction:

  track-start    when the `with` block is entered: name, params, seeds, data files (stored as
                 objects), the source it can see, and where the process runs.
  track-metrics  every FLUSH_ROWS rows or FLUSH_SECONDS (whichever first): one object of
                 (step, name, value) rows. A killed process loses at most the rows since the last
                 flush, never a record (a record is whole or absent: docs/store-format.md).
  track          when the block is left: the receipt (kind "receipt", trainer "tracked") and the
                 status, finished or failed.

While the block runs, the process holds an flock on `tmp/runs/<run>.live` (the kernel drops it
when the process dies, in any PID namespace). A start record with no end record is `running`
while that lock is held and `interrupted` once it is not.

The receipt claims an honest rung: Ran when at least one step was logged and every value of the
declared loss was finite; Learned when, in addition, the declared loss fell (the mean of its last
10% of values below the mean of its first 10%). Never Checked: no plan was compiled, so there is
nothing ledger could re-execute (`ledger reproduce` refuses a tracked receipt, saying so).

`log` only appends to a list: the flush (a transaction, under the store lock) happens in the
calling thread when it is due, and is put off while another writer holds the lock (the rows stay
buffered; a hard cap makes it wait instead of growing without bound).
"""

from __future__ import annotations

import fcntl
import math
import os
import platform
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from ledger import records
from ledger.errors import BadInput, Locked
from ledger.runs import live_marker, run_id
from ledger.store import Store
from ledger.train.receipt import RECEIPT_VERSION, learned_evidence, source_identity

TRACKER_VERSION = 1
FLUSH_ROWS = 20_000
FLUSH_SECONDS = 10.0
HARD_CAP_ROWS = 1_000_000  # past this many unflushed rows, `log` waits for the lock
MAX_SCRIPT_BYTES = 16 << 20
LIBRARIES = ("torch", "transformers", "peft", "accelerate", "lightning", "pytorch_lightning", "numpy",
             "datasets", "tokenizers", "safetensors", "jax", "flax", "optax", "cupy")


def _finite(v) -> float | None:
    f = float(v)
    return f if math.isfinite(f) else None


def _json_scalar(name: str, v):
    """Params and seeds are stored as canonical JSON: plain scalars, lists and dicts of them."""
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        if not math.isfinite(v):
            raise BadInput(f"param {name!r} is {v}, which JSON cannot hold", "pass a finite number or a string")
        return v
    if isinstance(v, (list, tuple)):
        return [_json_scalar(name, x) for x in v]
    if isinstance(v, dict):
        return {str(k): _json_scalar(f"{name}.{k}", x) for k, x in v.items()}
    if hasattr(v, "item"):  # a numpy or torch scalar
        return _json_scalar(name, v.item())
    raise BadInput(f"param {name!r} has type {type(v).__name__}, which the ledger cannot store",
                   "pass numbers, strings, booleans, or lists/dicts of them")


def _versions() -> dict:
    """Versions of the libraries the process has already imported (never imports one itself)."""
    out = {"python": platform.python_version()}
    for name in LIBRARIES:
        mod = sys.modules.get(name)
        if mod is not None:
            out[name] = getattr(mod, "__version__", None)
    return out


def _device() -> dict:
    d = {"platform": platform.platform(), "machine": platform.machine(), "cpus": os.cpu_count(),
         "host": socket.gethostname()}
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch.cuda.is_available():
                d["cuda"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
                d["cuda_version"] = torch.version.cuda
        except Exception as e:  # a broken CUDA setup is recorded as such, not hidden
            d["cuda_error"] = f"{type(e).__name__}: {e}"[:300]
    return d


def _git(cwd: Path) -> dict | None:
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd,
                               capture_output=True, text=True, timeout=10)
        return {"commit": head.stdout.strip(), "dirty": bool(dirty.stdout.strip())}
    except (OSError, subprocess.SubprocessError):
        return None


@dataclass(frozen=True)
class TrackedReceipt:
    """What a finished tracked run left in the store."""

    run: str          # id of the track-start record
    receipt: str      # id of the receipt object
    status: str       # finished | failed
    rung: str | None  # Ran | Learned | None (nothing was logged)

    def to_json(self) -> dict:
        return {"run": self.run, "receipt": self.receipt, "status": self.status, "rung": self.rung}


@dataclass
class Run:
    """A tracked run in progress. Create it with `ledger.track(...)`; use it as a context manager."""

    name: str
    params: dict = field(default_factory=dict)
    seeds: dict = field(default_factory=dict)
    data: dict = field(default_factory=dict)       # name -> path of a data file or folder to store
    loss: str = "loss"                             # the metric whose fall is the Learned evidence
    source: str | os.PathLike | None = None        # a folder to store as the run's source tree
    store: Store | str | os.PathLike | None = None
    actor: str | None = None

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name.strip() or len(self.name) > 200:
            raise BadInput(f"a tracked run needs a name of 1-200 characters, not {self.name!r}",
                           'e.g. ledger.track("lr-sweep-3e-4")')
        self.params = {str(k): _json_scalar(str(k), v) for k, v in dict(self.params).items()}
        self.seeds = {str(k): _json_scalar(str(k), v) for k, v in dict(self.seeds).items()}
        self._store = self.store if isinstance(self.store, Store) else Store.open(self.store)
        self._rows: list[tuple[int, str, float | None]] = []
        self._mutex = threading.Lock()
        self._chunks: list[str] = []
        self._artifacts: dict[str, str] = {}
        self._last: dict[str, float | None] = {}
        self._loss_values: list[float | None] = []
        self._steps = 0
        self._last_step: int | None = None
        self._flushed_at = time.monotonic()
        self._live_fd: int | None = None
        self.id: str | None = None
        self.receipt: TrackedReceipt | None = None

    # --- the block ------------------------------------------------------------------------
    def __enter__(self) -> "Run":
        st = self._store
        with st.transaction("track-start", actor=self.actor, wait=60) as tx:
            data_ids = {}
            for key, path in self.data.items():
                p = Path(path)
                data_ids[str(key)] = tx.put_tree(p, kind="dataset") if p.is_dir() else tx.put_file(p, kind="dataset")
            src = self._source(tx)
            tx.inputs.extend(sorted(set(data_ids.values())))
            records.write(tx, records.TrackStart(
                run=self.name, version=TRACKER_VERSION, params=self.params, seeds=self.seeds, data=data_ids,
                loss=self.loss, source=src, started=time.time(), pid=os.getpid(), host=socket.gethostname(),
                argv=[str(a)[:500] for a in sys.argv[:50]]))
        self.id = run_id(tx.record["id"])
        self._bound = {"source": src, "data": data_ids}
        self._hold_live_lock()
        self._t0 = time.time()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        status = "finished" if exc_type is None else "failed"
        error = None
        if exc is not None:
            error = f"{exc_type.__name__}: {exc}"[:2000]
        try:
            self._finish(status, error)
        finally:
            self._release_live_lock()
        # An exception inside the block propagates; KeyboardInterrupt included (the run is
        # recorded as failed with that reason, and the caller's exit code is its own business).

    # --- logging --------------------------------------------------------------------------
    def log(self, step: int, **metrics) -> None:
        """Record metric values at `step`. Costs a list append; flushes when due."""
        if self.id is None or self.receipt is not None:
            raise BadInput("run.log() outside its `with ledger.track(...)` block",
                           "log inside the block that created the run")
        rows = [(int(step), name, _finite(v)) for name, v in metrics.items()]
        with self._mutex:
            self._rows.extend(rows)
            self._steps += 1
            self._last_step = int(step)
            for _, name, v in rows:
                self._last[name] = v
                if name == self.loss:
                    self._loss_values.append(v)
            due = len(self._rows) >= FLUSH_ROWS or time.monotonic() - self._flushed_at >= FLUSH_SECONDS
        if due:
            self.flush(wait=0.0 if len(self._rows) < HARD_CAP_ROWS else 60)

    def artifact(self, path: str | os.PathLike, name: str | None = None) -> str:
        """Store a file or folder as an object of this run; returns its id (named in the receipt)."""
        if self.id is None or self.receipt is not None:
            raise BadInput("run.artifact() outside its `with ledger.track(...)` block",
                           "store artifacts inside the block that created the run")
        p = Path(path)
        if not (p.is_file() or p.is_dir()) or p.is_symlink():
            raise BadInput(f"{p} is not a regular file or folder", "pass the path of a file or folder the run wrote")
        key = name or p.name
        with self._store.transaction("add", actor=self.actor, wait=60) as tx:
            oid = tx.put_tree(p) if p.is_dir() else tx.put_file(p, kind="artifact")
            tx.outputs.append(oid)  # the run is named by its start record's id, which is no object
            records.write(tx, records.Add(name=f"{self.name}/{key}", run=self.id, tracked_artifact=key))
        self._artifacts[key] = oid
        return oid

    def flush(self, wait: float | None = 60) -> bool:
        """Write the buffered rows as one track-metrics record. False when put off (locked)."""
        with self._mutex:
            rows, self._rows = self._rows, []
        if not rows:
            self._flushed_at = time.monotonic()
            return True
        try:
            with self._store.transaction("track-metrics", actor=self.actor, wait=wait) as tx:
                oid = tx.put_json({"kind": "metrics", "run": self.id, "rows": [list(r) for r in rows]})
                tx.outputs.append(oid)
                records.write(tx, records.TrackMetrics(run=self.id, metrics=oid, rows=len(rows),
                                                       first_step=rows[0][0], last_step=rows[-1][0]))
        except Locked:
            if wait:  # asked to wait, and the lock stayed held: say so (the rows stay buffered)
                with self._mutex:
                    self._rows[:0] = rows
                raise
            with self._mutex:  # put off: another writer holds the store; keep the rows, in order
                self._rows[:0] = rows
            self._flushed_at = time.monotonic()
            return False
        self._chunks.append(oid)
        self._flushed_at = time.monotonic()
        return True

    # --- internals ------------------------------------------------------------------------
    def _source(self, tx) -> dict:
        # under a key ending in "hash": a hash that names no stored object (ledger.store.ids)
        src: dict = {"ledger_hash": source_identity()["hash"]}
        main = sys.modules.get("__main__")
        script = getattr(main, "__file__", None)
        if script:
            p = Path(script)
            try:
                info = p.lstat()
                if p.is_file() and not p.is_symlink() and info.st_size <= MAX_SCRIPT_BYTES:
                    src["script"] = {"path": str(p), "id": tx.put_file(p, kind="source")}
            except OSError:
                pass  # a script that vanished is simply not bound; the receipt says what it has
            git = _git(p.resolve().parent) if p.exists() else None
            if git:
                src["git"] = git
        if self.source is not None:
            tree = Path(self.source)
            if not tree.is_dir():
                raise BadInput(f"source={tree} is not a folder", "pass the folder of the training code")
            src["tree"] = tx.put_tree(tree, kind="source")
        return src

    def _hold_live_lock(self) -> None:
        path = live_marker(self._store, self.id)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        self._live_fd = fd

    def _release_live_lock(self) -> None:
        if self._live_fd is not None:
            try:
                live_marker(self._store, self.id).unlink()
            except OSError:
                pass  # already gone (gc of dead live files): nothing to release but the fd
            os.close(self._live_fd)
            self._live_fd = None

    def _finish(self, status: str, error: str | None) -> None:
        self.flush(wait=60)
        losses = self._loss_values
        rung, evidence = None, {}
        if self._steps:
            finite = all(v is not None for v in losses)
            evidence["Ran"] = {"steps_logged": self._steps, "last_step": self._last_step,
                               "declared_loss": self.loss, "loss_values": len(losses), "all_losses_finite": finite}
            rung = "Ran"
            le = learned_evidence([v for v in losses if v is not None]) if finite else None
            if le and le["fell"]:
                evidence["Learned"] = le
                rung = "Learned"
        body = {"kind": "receipt", "version": RECEIPT_VERSION, "trainer": "tracked", "run": self.id,
                "name": self.name, "status": status, "error": error, "rung": rung, "evidence": evidence,
                "params": self.params, "seeds": self.seeds, **self._bound, "losses": [v for v in losses if v is not None],
                "metrics": {"chunks": list(self._chunks), "final": dict(sorted(self._last.items())),
                            "steps_logged": self._steps},
                "artifacts": dict(sorted(self._artifacts.items())), "versions": _versions(), "device": _device(),
                "timings": {"wall_s": round(time.time() - self._t0, 3)}}
        with self._store.transaction("track", actor=self.actor, wait=60) as tx:
            rid = tx.put_json(body)
            tx.inputs.extend([*self._chunks, *sorted(set(self._bound["data"].values()))])
            tx.outputs.extend([rid, *self._artifacts.values()])
            records.write(tx, records.Track(run=self.id, receipt=rid, status=status, rung=rung, name=self.name))
        self.receipt = TrackedReceipt(self.id, rid, status, rung)


def track(name: str, *, params: dict | None = None, seeds: dict | None = None, data: dict | None = None,
          loss: str = "loss", source=None, store=None, actor: str | None = None) -> Run:
    """Start a tracked run (use it in a `with` block). See the module docstring."""
    return Run(name=name, params=params or {}, seeds=seeds or {}, data=data or {}, loss=loss, source=source,
               store=store, actor=actor)
