"""Training datasets: Parquet tables of turns (situation, action, outcome, refusal).

`builtin:tiny-task` is the train split of ledger.artefacts.builtin_task, written once as a Parquet object
(cached by recipe like the built-in base). Any other dataset is an object id or name holding a
Parquet table with at least string columns `situation` and `action`.
"""

from __future__ import annotations

import io
from importlib.metadata import version
from pathlib import Path

from ledger.artefacts import recipe_cache
from ledger.artefacts import tokenizer as toklib
from ledger.artefacts.builtin_task import BUILTIN_DATASET, turns
from ledger.errors import BadInput, SpecError

BUILTIN_TURNS = 4000
BUILTIN_SEED = 0


def turns_table(turns):
    import pyarrow as pa

    return pa.table({"situation": [t.situation for t in turns], "action": [t.action for t in turns],
                     "outcome": [t.outcome for t in turns], "refusal": [bool(t.refusal) for t in turns]})


def parquet_bytes(table) -> bytes:
    import pyarrow.parquet as pq

    buf = io.BytesIO()
    # No statistics or dictionary pages tied to writer heuristics: only the rows decide the bytes.
    pq.write_table(table, buf, compression="zstd", write_statistics=False, use_dictionary=False)
    return buf.getvalue()


def builtin_bytes() -> bytes:

    return parquet_bytes(turns_table(turns("train", BUILTIN_TURNS, BUILTIN_SEED)))


def ensure_builtin(tx, store) -> str:
    recipe = {"dataset": BUILTIN_DATASET, "task": "ledger.artefacts.builtin_task/1", "n": BUILTIN_TURNS,
              "seed": BUILTIN_SEED, "pyarrow": version("pyarrow")}
    oid = recipe_cache.lookup(store, "builtin-dataset", recipe)
    if oid:
        tx.record_object(oid, "dataset")
        return oid
    oid = tx.put_bytes(builtin_bytes(), "dataset")
    recipe_cache.remember(store, "builtin-dataset", recipe, oid)
    return oid


def read_parquet(source):
    """One Parquet file (path or bytes) as an Arrow table. ParquetFile rather than
    pq.read_table: the latter goes through pyarrow.dataset, whose import alone costs ~0.1 s.
    Raises pyarrow's ArrowException / OSError on anything that is not Parquet."""
    import pyarrow.parquet as pq

    return pq.ParquetFile(io.BytesIO(source) if isinstance(source, (bytes, bytearray)) else str(source)).read()


def read_turns(source) -> list[tuple[str | dict, str]]:
    """(situation, action) rows of a Parquet file path or bytes; BadInput if it is not one. An
    optional string column `system` gives a row's situation a system part: that row's situation
    is then {"system": ..., "user": ...} (template.situation), rendered as the system message."""
    import pyarrow as pa

    try:
        tbl = read_parquet(source)
    except (pa.ArrowException, OSError) as e:
        raise BadInput(f"dataset is not a readable Parquet table: {e}") from None
    for col in ("situation", "action"):
        if col not in tbl.column_names or not pa.types.is_string(tbl.schema.field(col).type):
            raise BadInput(f"dataset lacks a string column {col!r}", "a dataset needs columns situation and action")
    sit, act = tbl.column("situation").to_pylist(), tbl.column("action").to_pylist()
    if any(s is None for s in sit) or any(a is None for a in act):
        raise BadInput("dataset has null situations or actions")
    if not sit:
        raise BadInput("dataset has no rows")
    if "system" in tbl.column_names:
        if not pa.types.is_string(tbl.schema.field("system").type):
            raise BadInput("dataset column 'system' is not a string column", "the system part of a situation is text")
        sit = [{"system": p, "user": s} if p else s for s, p in zip(sit, tbl.column("system").to_pylist())]
    return list(zip(sit, act))


def resolve(tx, store, name: str) -> str:
    """The dataset object for the spec's data.dataset (writing the built-in one if needed)."""
    if name == BUILTIN_DATASET:
        return ensure_builtin(tx, store)
    if name.startswith("builtin:"):
        raise SpecError(f"spec field `data.dataset`: unknown built-in dataset {name!r}",
                        f"the built-in dataset is {BUILTIN_DATASET}", field="data.dataset")
    return store.resolve(name)


def write_parquet(turns, path: str | Path) -> None:
    Path(path).write_bytes(parquet_bytes(turns_table(turns)))



def encode_rows(rows, seq_len: int, chat):
    """(ids, attention mask, labels) as int64 tensors [rows, seq_len], each turn encoded by the
    base's `chat` (template.Chat: its tokenizer and chat template); labels only on the action
    span, which ends with the end-of-turn token. Right-padded with the tokenizer's pad id."""
    import numpy as np
    import torch

    n = len(rows)
    ids = np.full((n, seq_len), chat.tokenizer.pad_id, dtype=np.int64)
    mask = np.zeros((n, seq_len), dtype=np.int64)
    labels = np.full((n, seq_len), toklib.IGNORE, dtype=np.int64)
    for i, (s, a) in enumerate(rows):
        e = chat.encode_turn(s, a, seq_len)
        k = len(e.ids)
        ids[i, :k] = e.ids
        mask[i, :k] = 1
        labels[i, :k] = e.labels()
    return torch.from_numpy(ids), torch.from_numpy(mask), torch.from_numpy(labels)
