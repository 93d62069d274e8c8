"""Every training run in one table: ledger's own (SFT, DPO, reproduce) and tracked ones.

The index holds one `run_rows` row per record that starts, ends or re-runs a run (projected by
`rows_for`, registered with the record kinds in ledger/records.py); the `runs` view
(store/index.py VIEWS) keeps each run's latest row and joins the newest verdict on its adapter. Key hyper-parameters are columns
(lr, r, alpha, steps, batch, seed, base), read from the plan (SFT), the DPO config, or the
params a tracked run was given under their usual names (`PARAM_NAMES`); the rest stay in `params`.

A tracked run's status in the index is `started` until its end record arrives; `list_runs` turns
that into `running` (its process still holds the live lock) or `interrupted` (it does not).
"""

from __future__ import annotations

import fcntl
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

from ledger.errors import BadInput, StoreCorrupt
from ledger.store import schema

RUN_PREFIX = "run:"

def run_id(start_record_id: str) -> str:
    """A tracked run is named after the record that started it: `run:<hex of that record's id>`.
    Not a `b3:` id, because every b3: id in a payload must name a stored object, and records are not."""
    return RUN_PREFIX + start_record_id.removeprefix("b3:")


def live_marker(store, run: str) -> Path:
    """The file a tracked run's process holds an flock on while it runs."""
    return store.tmp / "runs" / f"{run.removeprefix(RUN_PREFIX)}.live"


def is_live(store, run: str) -> bool:
    """Whether the process of a started run still holds its live lock: the kernel drops an flock
    when its holder dies, in any PID namespace, so liveness is never judged from a pid."""
    path = live_marker(store, run)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    except OSError as e:
        raise StoreCorrupt(f"cannot read the live marker of {run[:20]}…: {e.strerror}",
                           f"remove {path}; the run then shows as interrupted") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


# Where a tracked run's params name the key hyper-parameters (first match wins).
PARAM_NAMES = {
    "lr": ("lr", "learning_rate"),
    "r": ("r", "lora_r", "rank"),
    "alpha": ("alpha", "lora_alpha"),
    "steps": ("steps", "max_steps", "num_steps"),
    "batch": ("batch", "batch_size", "per_device_train_batch_size", "micro_batch"),
    "seed": ("seed",),
    "base": ("base", "model", "model_name"),
}
SORTABLE = ("seq", "time", "name", "trainer", "status", "verdict", "rung", "lr", "r", "alpha", "steps", "batch",
            "seed", "final_loss")


def _num(v, kind=float):
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    if kind is int:
        return int(v) if float(v).is_integer() and abs(v) < 2 ** 63 else None
    return float(v) if math.isfinite(v) else None


def _param(params: dict, key: str, kind=float):
    for name in PARAM_NAMES[key]:
        if name in params:
            v = params[name]
            if kind is str:
                return v if isinstance(v, str) else None
            return _num(v, kind)
    return None


def _final_loss(losses) -> float | None:
    return _num(losses[-1]) if isinstance(losses, list) and losses else None


def _row(rec: dict, **c) -> tuple:
    return (c["run"], rec["seq"], schema.index_time(rec["time"]), c["trainer"], c.get("name"), c["status"], c.get("rung"),
            c.get("receipt"), c.get("adapter"), c.get("base"), c.get("lr"), c.get("r"), c.get("alpha"), c.get("steps"),
            c.get("batch"), c.get("seed"), c.get("final_loss"),
            json.dumps(c.get("metrics") or {}, sort_keys=True), json.dumps(c.get("params") or {}, sort_keys=True))


def _tracked_columns(params: dict, seeds: dict) -> dict:
    seed = _param(params, "seed", int)
    if seed is None and len(seeds) == 1:
        seed = _num(next(iter(seeds.values())), int)
    return {"lr": _param(params, "lr"), "r": _param(params, "r", int), "alpha": _param(params, "alpha"),
            "steps": _param(params, "steps", int), "batch": _param(params, "batch", int), "seed": seed,
            "base": _param(params, "base", str), "params": params}


def rows_for(rec: dict, p, get_json) -> list[tuple]:
    """run_rows gained from one record (train, reproduce, track-start, track); [] for others.
    `p` is the record's typed payload (ledger.records.read; records imports this module, so the
    payload is handed in rather than parsed here)."""
    kind = rec["kind"]
    if kind == "track-start":
        params, seeds = p.params or {}, p.seeds or {}
        return [_row(rec, run=run_id(rec["id"]), trainer="tracked", name=p.run, status="started",
                     **_tracked_columns(params, seeds))]
    if kind == "track":
        body = get_json(p.receipt)
        params, seeds = body.get("params") or {}, body.get("seeds") or {}
        final = (body.get("metrics") or {}).get("final") or {}
        return [_row(rec, run=p.run, trainer="tracked", name=body.get("name"), status=body.get("status"),
                     rung=body.get("rung"), receipt=p.receipt, final_loss=_final_loss(body.get("losses")),
                     metrics=final, **_tracked_columns(params, seeds))]
    if kind in ("train", "reproduce") and p.receipt:
        body = get_json(p.receipt)
        status = "finished" if body.get("stopped") is None else "stopped"
        common = {"rung": body.get("rung"), "receipt": p.receipt, "adapter": body.get("adapter"),
                  "base": body.get("base"), "final_loss": _final_loss(body.get("losses")), "status": status}
        if body.get("trainer") == "dpo":
            cfg = body.get("config") or {}
            return [_row(rec, run=p.receipt, trainer="dpo", name=kind, lr=_num(cfg.get("lr")),
                         r=_num(cfg.get("r"), int), alpha=_num(cfg.get("alpha")), steps=_num(cfg.get("steps"), int),
                         batch=_num(cfg.get("batch"), int), seed=_num(cfg.get("seed"), int),
                         metrics={k: v for k, v in (body.get("dpo") or {}).items() if _num(v) is not None},
                         params=cfg, **common)]
        plan = get_json(body["plan"]) if body.get("plan") else {}
        c = plan.get("config") or {}
        lora, opt, data, seeds = (c.get(k) or {} for k in ("lora", "optimizer", "data", "seeds"))
        batch = _num(data.get("micro_batch"), int)
        if batch is not None and _num(data.get("grad_accum"), int):
            batch *= data["grad_accum"]
        return [_row(rec, run=p.receipt, trainer="sft" if kind == "train" else "reproduce", name=kind,
                     lr=_num(opt.get("lr")), r=_num(lora.get("r"), int), alpha=_num(lora.get("alpha")),
                     steps=_num(data.get("steps"), int), batch=batch, seed=_num(seeds.get("lora_init"), int),
                     metrics={"loss": common["final_loss"]} if common["final_loss"] is not None else {},
                     params={k: c[k] for k in ("lora", "optimizer", "data", "seeds", "schedule") if k in c},
                     **common)]
    return []


@dataclass(frozen=True)
class RunRow:
    """One training run as `ledger runs` shows it."""

    run: str
    trainer: str
    name: str | None
    status: str
    verdict: str | None
    rung: str | None
    lr: float | None
    r: int | None
    alpha: float | None
    steps: int | None
    batch: int | None
    seed: int | None
    base: str | None
    final_loss: float | None
    metrics: dict
    params: dict
    receipt: str | None
    adapter: str | None
    seq: int
    time: str

    def to_json(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


FIELDS = tuple(RunRow.__dataclass_fields__)


def list_runs(store, *, where: str | None = None, sort: str = "seq", descending: bool = False,
              limit: int | None = None) -> list[RunRow]:
    """The runs view, filtered by a SQL condition over its columns (`--where "lr > 1e-3"`)."""
    if sort not in SORTABLE:
        raise BadInput(f"cannot sort runs by {sort!r}", f"sort by one of: {', '.join(SORTABLE)}")
    if limit is not None and not 1 <= limit < 2 ** 63:   # DuckDB's LIMIT is a BIGINT
        raise BadInput(f"--limit must be a positive number below 2^63, not {limit}", "e.g. --limit 20")
    sql = "SELECT * FROM runs"
    if where:
        if ";" in where:
            raise BadInput("--where is one SQL condition, not a statement", "e.g. --where \"lr >= 1e-3 and r = 8\"")
        sql += f" WHERE ({where})"
    sql += f" ORDER BY {sort} {'DESC' if descending else 'ASC'} NULLS LAST, seq"
    if limit:
        sql += f" LIMIT {int(limit)}"
    try:
        cols, rows = store.query(sql)
    except BadInput as e:
        if where:
            raise BadInput(f"--where {where!r} is not a condition over the runs columns: {e.message}",
                           f"columns: {', '.join(FIELDS)}; e.g. --where \"status = 'finished' and lr < 1e-2\"") from None
        raise
    out = []
    for values in rows:
        d = dict(zip(cols, values))
        d["metrics"] = json.loads(d["metrics"]) if d["metrics"] else {}
        d["params"] = json.loads(d["params"]) if d["params"] else {}
        d["time"] = str(d["time"])
        if d["status"] == "started" and d["run"].startswith(RUN_PREFIX):
            d["status"] = "running" if is_live(store, d["run"]) else "interrupted"
        out.append(RunRow(**{k: d.get(k) for k in FIELDS}))
    return out


@dataclass(frozen=True)
class Runs:
    """The answer of `ledger runs`."""

    rows: tuple[RunRow, ...]

    def to_json(self) -> dict:
        return {"runs": [r.to_json() for r in self.rows]}


def csv_cell(v) -> str:
    """A value as a CSV cell: dicts (params, metrics) as JSON, None as empty."""
    if v is None:
        return ""
    if isinstance(v, (dict, list)):
        return json.dumps(v, sort_keys=True)
    return str(v)
