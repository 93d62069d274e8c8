"""`ledger diff A B`: what changed between two generations, receipts, plans or specs, field by field.

A and B may be anything that names one of those: an object id or prefix, a ref (HEAD, gen-N, a
name), a journal record id as `ledger log` prints it (its receipt, plan or generation), or a
tracked run's id (`run:…`, as `ledger runs` prints it: its receipt).

Everything is compared as data: the two objects are flattened to dotted paths and every
leaf that differs is reported. On top of that, generations bring in their receipts (every
identity, data range and library version), their verdicts (scores) and the per-module
weight change of their adapters (Frobenius norms of the LoRA deltas, computed with numpy
from the safetensors files; no torch).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from ledger import records
from ledger.errors import BadInput, UnknownRef
from ledger.store import lookup
from ledger.store.ids import is_id
from ledger.verdicts.summary import verdict_summary

LONG_LIST = 8  # lists longer than this (e.g. per-step losses) are summarised, not listed


def flatten(obj, prefix: str = "", out: dict | None = None) -> dict:
    out = {} if out is None else out
    if isinstance(obj, dict):
        for k in sorted(obj):
            flatten(obj[k], f"{prefix}.{k}" if prefix else str(k), out)
    elif (
        isinstance(obj, list)
        and len(obj) > LONG_LIST
        and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in obj)
    ):
        out[prefix] = {"n": len(obj), "first": obj[0], "last": obj[-1], "min": min(obj), "max": max(obj)}
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            flatten(v, f"{prefix}[{i}]", out)
        if not obj:
            out[prefix] = []
    else:
        out[prefix] = obj
    return out


def field_changes(a, b, skip: tuple = ()) -> list[dict]:
    fa, fb = flatten(a), flatten(b)
    changes = []
    for k in sorted(set(fa) | set(fb)):
        if any(k == s or k.startswith(s + ".") for s in skip):
            continue
        va, vb = fa.get(k, "∅"), fb.get(k, "∅")
        if va != vb:
            changes.append({"field": k, "a": va, "b": vb})
    return changes


def _kind(obj) -> str:
    return obj.get("kind", "") if isinstance(obj, dict) else ""


def adapter_norms(store, a_tree: str | None, b_tree: str | None) -> list[dict]:
    """Per LoRA module: ||ΔW_a||, ||ΔW_b|| and ||ΔW_b − ΔW_a|| (ΔW = alpha/r · B·A)."""
    deltas = [_deltas(store, t) if t else {} for t in (a_tree, b_tree)]
    rows = []
    import numpy as np

    for m in sorted(set(deltas[0]) | set(deltas[1])):
        da, db = deltas[0].get(m), deltas[1].get(m)
        na = float(np.linalg.norm(da)) if da is not None else 0.0
        nb = float(np.linalg.norm(db)) if db is not None else 0.0
        if da is not None and db is not None:
            change = float(np.linalg.norm(db - da))
        else:
            change = nb if db is not None else na
        rows.append({"module": m, "norm_a": round(na, 6), "norm_b": round(nb, 6), "change": round(change, 6)})
    return rows


def _deltas(store, tree: str) -> dict:

    import numpy as np
    from safetensors.numpy import load_file

    files = {e["path"]: e["id"] for e in store.get_json(tree)["entries"]}
    if "adapter_model.safetensors" not in files:
        raise BadInput(f"{tree} is not an adapter tree")
    cfg = json.loads(store.get_bytes(files["adapter_config.json"]))
    scale = float(cfg.get("lora_alpha", 1)) / float(cfg.get("r", 1))
    with tempfile.TemporaryDirectory() as td:
        p = Path(td) / "a.safetensors"
        store.export_file(files["adapter_model.safetensors"], p)
        t = load_file(str(p))
    out = {}
    for k, A in t.items():
        if ".lora_A." not in k:
            continue
        Bk = k.replace(".lora_A.", ".lora_B.")
        if Bk in t:
            name = k.split(".lora_A.")[0].removeprefix("base_model.model.")
            out[name] = scale * (t[Bk].astype(np.float64) @ A.astype(np.float64))
    return out


DIFFABLE = ("generation", "receipt", "plan", "spec")


def _from_record(store, ref: str) -> str | None:
    """The object a journal record stands for, when `ref` is (a prefix of) a record's id."""
    hexpart = ref.removeprefix("b3:").removeprefix("run:")
    if len(hexpart) < 8 or any(c not in "0123456789abcdef" for c in hexpart):
        return None
    if ref.startswith("run:"):  # a tracked run: the receipt its end record wrote
        _, rows = store.query(f"SELECT receipt FROM runs WHERE run LIKE 'run:{hexpart}%' LIMIT 2")
        if len(rows) > 1:
            raise BadInput(f"{ref!r} matches more than one run", "give more hex digits")
        return rows[0][0] if rows and rows[0][0] else None
    cols, rows = store.query(f"SELECT seq, kind, payload FROM journal WHERE id LIKE 'b3:{hexpart}%' LIMIT 2")
    if len(rows) != 1:
        if len(rows) > 1:
            raise BadInput(f"{ref!r} matches more than one journal record", "give more hex digits")
        return None
    seq, kind, payload = rows[0]
    p = records.read({"seq": seq, "kind": kind, "payload": json.loads(payload)})  # typed; ill-formed: JournalCorrupt
    for key in ("receipt", "generation", "plan", "spec"):  # the object fields a kind may name
        if is_id(getattr(p, key, None)):
            return getattr(p, key)
    gens = [v for k, v in records.given(p.refs, {}).items() if k.startswith("gen-") and is_id(v)]
    return gens[0] if len(gens) == 1 else None


def _load(store, ref: str):
    try:
        oid = store.resolve(ref)
    except UnknownRef:
        oid = _from_record(store, ref)
        if oid is None:
            raise
    return oid, store.get_json(oid)


def diff(store, a_ref: str, b_ref: str) -> dict:
    ida, a = _load(store, a_ref)
    idb, b = _load(store, b_ref)
    ka, kb = _kind(a), _kind(b)
    if ka != kb:
        raise BadInput(f"cannot diff a {ka or 'blob'} with a {kb or 'blob'}", "diff two generations, two receipts or two plans")
    if ka not in DIFFABLE:
        raise BadInput(f"diff compares generations, receipts, plans or specs, not {ka or 'blobs'}",
                       "pass two ids of the same kind, e.g. `ledger diff gen-1 gen-2` or two receipt ids from `ledger runs`")
    out = {"kind": ka, "a": {"ref": a_ref, "id": ida}, "b": {"ref": b_ref, "id": idb}, "fields": field_changes(a, b)}
    if ka == "receipt":
        # a receipt names its plan by id; what a reader wants is the settings that differ
        out["config"] = field_changes(_config(store, a), _config(store, b))
    if ka == "generation":
        out["a"]["name"], out["b"]["name"] = f"gen-{a['n']}", f"gen-{b['n']}"
        if a.get("receipt") and b.get("receipt"):
            out["receipt"] = field_changes(store.get_json(a["receipt"]), store.get_json(b["receipt"]))
        out["verdicts"] = {side: _verdict_summary(store, g.get("verdict")) for side, g in (("a", a), ("b", b))}
        out["data"] = {side: _data_range(store, g.get("receipt")) for side, g in (("a", a), ("b", b))}
        if a.get("adapter") or b.get("adapter"):
            out["adapter"] = adapter_norms(store, a.get("adapter"), b.get("adapter"))
    elif ka == "receipt" and a.get("adapter") and b.get("adapter"):
        out["adapter"] = adapter_norms(store, a["adapter"], b["adapter"])
    return out


def _config(store, receipt: dict) -> dict:
    """The settings behind a receipt: its plan's config (SFT, reproduce), the DPO config, or a
    tracked run's params."""
    if receipt.get("trainer") == "tracked":
        return {"params": receipt.get("params") or {}, "seeds": receipt.get("seeds") or {}}
    if receipt.get("trainer") == "dpo":
        return {"config": receipt.get("config") or {}}
    if is_id(receipt.get("plan")) and store.has(receipt["plan"]):
        return {"config": store.get_json(receipt["plan"]).get("config") or {}}
    return {}


def _data_range(store, rid: str | None) -> dict | None:
    """Which recorded turns the generation's adapter was trained on (from the export record)."""
    if not rid:
        return None
    dataset = store.get_json(rid).get("dataset")
    # the first export of that dataset, from the index (ledger/store/lookup.py), not a walk of history
    found = list(lookup.records(store, "export", {"dataset": dataset})) if isinstance(dataset, str) else []
    rec = found[-1] if found else None
    if rec is None:
        return {"dataset": dataset, "turns": None}
    p = records.read(rec)
    return {"dataset": dataset, "turns": f"t{p.first}–t{p.last}", "count": p.last - p.first + 1,
            "cycle": records.given(p.cycle)}


def _verdict_summary(store, vid: str | None) -> dict | None:
    return dict(verdict_summary(store.get_json(vid)), id=vid) if vid else None
