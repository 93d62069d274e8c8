"""Fixtures for sharing: colleagues' stores with real transactions, and an S3 server on loopback."""

from __future__ import annotations

import os
import socket

import pytest

from ledger import generations
from ledger.store import Store
from ledger.store.verify import verify


def make_history(store: Store, seed: int = 0, blob_size: int = 200_000) -> dict:
    """A small but real history: an added base blob, a dataset, a receipt naming both, and a
    generation admitted by that receipt — every step its own transaction, each record
    well-formed for its kind (records.py), so `verify` of a store holding it is clean."""
    rnd = __import__("random").Random(seed)
    with store.transaction("add") as tx:
        base = tx.put_bytes(rnd.randbytes(blob_size), "weights")
        tx.outputs.append(base)
        tx.refs["name/base"] = base
        tx.payload.update({"path": "base.bin", "kind": "file", "size": blob_size})
    with store.transaction("add") as tx:
        data = tx.put_json({"kind": "dataset", "rows": [f"row {i} {seed}" for i in range(20)]})
        tx.outputs.append(data)
        tx.refs["name/data"] = data
        tx.payload.update({"path": "data.json", "kind": "file", "size": store.objects.size(data)})
    with store.transaction("train") as tx:
        adapter = tx.put_bytes(rnd.randbytes(blob_size // 4), "adapter")
        receipt = tx.put_json({"kind": "receipt", "base": base, "dataset": data, "adapter": adapter,
                               "losses": [2.0, 1.5, 1.2], "rung": "Learned", "seed": seed})
        tx.inputs.extend([base, data])
        tx.outputs.extend([adapter, receipt])
        tx.payload.update({"receipt": receipt, "adapter": adapter, "rung": "Learned", "unsandboxed": False,
                           "wall_s": 1.0})
    with store.transaction("genesis") as tx:
        gen = generations.new_generation(tx, store, base=base, adapter=adapter, receipt=receipt)
    return {"base": base, "data": data, "adapter": adapter, "receipt": receipt, "gen": gen.id, "gen_name": gen.name}


def snapshot(store_root) -> tuple:
    """(journal head, set of object ids): what a refused import must leave exactly as it was."""
    s = Store.open(store_root)
    return s.state.head, s.state.seq, frozenset(oid for oid, _ in s.objects.iter_ids())


def assert_clean(store_root) -> None:
    rep = verify(Store.open(store_root), read_data=True)
    assert rep.ok, rep.errors


@pytest.fixture
def alice(tmp_path):
    s = Store.init(tmp_path / "alice")
    s.history = make_history(s, seed=1)
    return s


@pytest.fixture
def bob(tmp_path):
    return Store.init(tmp_path / "bob")


@pytest.fixture
def cli(capsys):
    """Run `ledger --store STORE ARGS…` in-process (the `ledger` script's own entry point,
    without a fresh interpreter's start-up cost): returns (exit code, stdout, stderr)."""
    from types import SimpleNamespace

    from ledger.cli.main import main

    def run(store, *args):
        capsys.readouterr()
        code = main(["--store", str(store.root), *map(str, args)])
        out, err = capsys.readouterr()
        return SimpleNamespace(returncode=code, stdout=out, stderr=" ".join(err.split()))
    return run


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def s3_server():
    """moto's standalone S3 server on a loopback port, started by the tests themselves."""
    try:
        import s3fs  # noqa: F401
        from moto.server import ThreadedMotoServer
    except ImportError as e:  # pragma: no cover - the test extra installs both
        pytest.skip(f"S3 tests need moto[server] and s3fs (pip install -e '.[test]'): {e}")
    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    saved = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")}
    os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture
def s3_bucket(s3_server, request):
    import s3fs

    fs = s3fs.S3FileSystem(endpoint_url=s3_server, skip_instance_cache=True, use_listings_cache=False)
    name = "b" + format(abs(hash(request.node.nodeid)) % (1 << 40), "x")
    fs.mkdir(name)
    return name, fs
