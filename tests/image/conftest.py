"""Fixtures of the image tests.

The template store is built once per session (about 20 s on one core): gen-0 the built-in tiny
base, gen-1 + the adder capability, gen-2 + a LoRA adapter with random (non-zero) weights, and a
sealed demo suite. Each test works on its own copy. `Served` runs a detached keeper (`python -m
ledger.image`) on a copy and always kills it at teardown."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path

import pytest

from ledger.store import trees

ROOT = Path(__file__).resolve().parents[2]
ADDER = ROOT / "examples" / "capabilities"


def random_adapter(store, base_id: str, work: Path, seed: int = 0) -> str:
    """A LoRA adapter tree for `base_id` whose B matrices are not zero (so it changes outputs)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaForCausalLM

    from ledger.artefacts import model as modellib

    man = modellib.load_manifest(store, base_id)
    bdir = work / "base"
    trees.materialise_tree(store, man["files"], bdir)
    torch.manual_seed(seed)
    base = LlamaForCausalLM.from_pretrained(str(bdir), local_files_only=True)
    cfg = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, init_lora_weights=False,
                     target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    model = get_peft_model(base, cfg)
    out = work / "adapter"
    model.save_pretrained(str(out))
    c = json.loads((out / "adapter_config.json").read_text())
    c["base_model_name_or_path"] = base_id
    (out / "adapter_config.json").write_text(json.dumps(c))
    (out / "README.md").unlink(missing_ok=True)
    with store.transaction("add") as tx:
        oid = tx.put_tree(out)
        tx.outputs.append(oid)
    shutil.rmtree(work)
    return oid


def build_template(root: Path) -> Path:
    from ledger import generations
    from ledger.capabilities import admission
    from ledger.cycle import ensure_genesis, load_spec
    from ledger.gate import seal as seallib
    from ledger.store import Store

    s = Store.init(root)
    g0 = ensure_genesis(s, load_spec(None))
    admission.admit(s, ADDER / "adder.wat", ADDER / "adder.toml")
    aid = random_adapter(s, g0.base, root / "adapter-work")
    with s.transaction("commit") as tx:
        generations.new_generation(tx, s, adapter=aid, note="test: a random adapter")
    seallib.seal(s, seallib.write_demo_suite(root / "suite-src"))
    shutil.rmtree(root / "suite-src")
    return root


@pytest.fixture(scope="session")
def template(tmp_path_factory):
    return build_template(tmp_path_factory.mktemp("imgtpl"))


@pytest.fixture
def project(template, tmp_path):
    dst = tmp_path / "w"
    shutil.copytree(template, dst)
    return dst


def _alive(pid: int) -> bool:
    """Running (a zombie -- exited, not yet reaped by this test process -- is not)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


class Served:
    """A detached keeper serving a project's store."""

    def __init__(self, project: Path, **env):
        self.project, self.root = Path(project), Path(project) / ".ledger"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("LEDGER_FAULT", "LEDGER_IMAGE")) and k != "LEDGER_DIR"}
        self.env.update(env)
        self.pid = self.image_pid = None

    def start(self, options=None, **env) -> dict:
        from ledger.image import client
        from ledger.options import ServeOptions

        st = client.start_detached(self.root, options or ServeOptions(), env={**self.env, **env}, timeout=300)
        self.pid, self.image_pid = st["pid"], st["image_pid"]
        return st

    def act(self, situation: str, **kw) -> dict:
        from ledger.image import protocol

        kw.setdefault("timeout", 60)
        return protocol.act(self.root, situation, **kw)

    def status(self) -> dict:
        from ledger.image import client

        return client.status(self.root)

    def kill(self) -> None:
        """SIGKILL the keeper; its image dies with it (PR_SET_PDEATHSIG)."""
        os.kill(self.pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while (_alive(self.pid) or (self.image_pid and _alive(self.image_pid))) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(self.image_pid), "the image outlived its keeper"

    def stop(self) -> None:
        from ledger.image import client

        if self.pid and _alive(self.pid):
            try:
                client.stop(self.root, timeout=120)
            finally:
                deadline = time.monotonic() + 30
                while _alive(self.pid) and time.monotonic() < deadline:
                    time.sleep(0.05)
                if _alive(self.pid):
                    os.kill(self.pid, signal.SIGKILL)

    def turns(self, where: str = "true") -> list[tuple]:
        from ledger.store import Store

        return Store.open(self.project).query(f"select id, situation, action, outcome, refusal, generation from turns "
                                              f"where {where} order by n")[1]


@pytest.fixture
def served(project):
    s = Served(project)
    yield s
    try:
        s.stop()
    except Exception:  # noqa: BLE001 - teardown: never leave a keeper behind
        if s.pid and _alive(s.pid):
            os.kill(s.pid, signal.SIGKILL)
