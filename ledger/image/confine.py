"""What the image process may touch: its Landlock policy, computed from the journal.

"Read its store, write its buffer" -- and nothing that judges it. Landlock rights are inherited
down a directory tree and cannot be carved out again, so the store itself (`.ledger`) can never
be granted: that would include `.ledger/sealed/`. And the sealed suite's documents are also
objects in `.ledger/objects/` (gate/seal.py), so even `objects/` cannot be granted whole. The
image therefore gets:

  read        the journal file (appended in place, so a rule on it stays valid) -- to see HEAD
              move between requests; each object file a generation of this store serves from
              (manifest, base manifest and files, adapter tree and files, capability modules and
              manifests) for EVERY generation, so a rollback is served without a restart; the
              compiled-capability cache folder (`.ledger/cache/wasm`, compiled code only)
  read-write  its buffer folder `.ledger/run/image/`, which holds its buffer files and its
              scratch folder (HOME, TMPDIR, the model files it unpacks)
  the folders the generations grant to capabilities (`dir:` handles; ro or rw as granted)
  no TCP at all; `.ledger/sealed/` is listed as protected, so a policy reaching it is refused
  no socket() at all (seccomp), no ptrace, no capabilities, a private /dev/shm (rules() below)

Writing the journal, the lock, the refs cache and the index would need rights on `.ledger`
itself, so the image never does: the keeper (`ledger serve`, not confined, small, no model, no
wasm, no client input beyond control requests) commits the buffer for it. A generation committed
while the image runs may need objects outside this set; the image then asks to be restarted
(the client retries transparently, same request id).
"""

from __future__ import annotations

from pathlib import Path

from ledger import generations
from ledger.artefacts import model as modellib
from ledger.capabilities import grants as grants_mod
from ledger.errors import BadInput, MissingObject, SandboxUnavailable
from ledger.sandbox import SandboxPolicy, seccomp
from ledger.sandbox import run as sandbox_run
from ledger.store import trees

STORE_LOCK_WAIT = 30.0   # seconds a spawn waits for the store lock to take its objects' paths (a gc --prune holds it)


def serving_objects(store, g: generations.Generation) -> set[str]:
    """The object ids the image reads to serve generation `g`."""
    out = {g.id}
    if g.base:
        man = modellib.load_manifest(store, g.base)
        out |= {g.base, man["files"]}
        out |= {e["id"] for e in trees.tree_entries(store, man["files"])}
        # the base's tokenizer and chat template are objects of their own (artefacts/tokenizer.py,
        # template.py); an HF tokenizer keeps its tokenizer.json as one more blob
        for key in ("tokenizer", "template"):
            if man.get(key):
                out.add(man[key])
        if man.get("tokenizer"):
            tok = store.get_json(man["tokenizer"])
            blob = tok.get("tokenizer_json") if isinstance(tok, dict) else None
            if isinstance(blob, str):
                out.add(blob)
    if g.adapter:
        out.add(g.adapter)
        out |= {e["id"] for e in trees.tree_entries(store, g.adapter)}
    for entry in g.capabilities.values():
        out |= {entry["module"], entry["manifest"]}
    return out


def all_generations(store) -> list[generations.Generation]:
    return [generations.load(store, f"gen-{n}") for n in generations.numbers(store)]


def capability_dirs(store, gens) -> tuple[set[Path], set[Path]]:
    """Host folders the generations grant to capabilities: (read-only, read-write)."""
    ro, rw = set(), set()
    for g in gens:
        for entry in g.capabilities.values():
            for h in grants_mod.from_json(entry.get("grants")):
                if h.kind != "dir":
                    continue
                try:
                    path = grants_mod.resolve_dir(store, h)
                except BadInput:
                    continue   # not there yet: calls fail with that message until it is
                (rw if h.mode == "rw" else ro).add(path)
    return ro, rw


def policy(store, gens, buffer_dir: Path, *, gpu: bool = False):
    """(SandboxPolicy, object ids granted) for an image serving any of `gens`; gpu: also the
    NVIDIA device nodes and driver files (the ledger-cuda decoders, ledger.image.cuda_decode)."""
    objects: set[str] = set()
    for g in gens:
        objects |= serving_objects(store, g)
    missing = [o for o in sorted(objects) if not store.objects.has(o)]
    if missing:
        raise MissingObject(missing[0], f"object {missing[0]} that a generation serves from is missing "
                                        f"({len(missing)} missing in all)")
    # a chunked object is its index and the packs holding its chunks (ledger/store/chunks.py); a
    # packed one (ledger/store/packed.py) is first given a file of its own: a pack holds other
    # objects (verdicts, turns) the image must not read. Under the store lock: gc --prune packs
    # loose files only while no keeper holds keeper.lock, and this keeper holds it, so the paths
    # taken here stay while it serves (docs/store-format.md P5).
    with store.locked(wait=STORE_LOCK_WAIT):
        for o in sorted(objects):
            if store.objects.packed_only(o):
                store.objects.loosen(o)
        paths = list(dict.fromkeys(p for o in sorted(objects) for p in store.objects.files(o)))
    read = [str(store.journal.path), *map(str, paths)]
    wasm = store.root / "cache" / "wasm"
    if wasm.is_dir():
        read.append(str(wasm))
    ro, rw = capability_dirs(store, gens)
    read += sorted(map(str, ro - rw))
    p = SandboxPolicy(read_only=tuple(read), read_write=(str(buffer_dir), *sorted(map(str, rw))),
                      protected=(str(store.root / "sealed"),), network=False, shared_memory=False, gpu=gpu)
    p.check()
    return p, objects


def rules(p, *, landlock: bool = True, notify: str | None = None) -> tuple[dict, bytes]:
    """The bootstrap's rules (ledger/sandbox/__main__.py) for the image, and its seccomp program.

    Beyond the policy's grants: no TCP (network=False), no socket() of any family -- the image
    serves on the listening socket and talks over the socketpair the keeper hands it, so it can
    open no socket of its own and reach neither the keeper's control socket nor any other --,
    no ptrace, no capabilities, a private /dev/shm. notify: a supervisor's socket (supervisor()),
    which records every refused syscall; without one they only fail with EPERM."""
    return sandbox_run.bootstrap_rules(p.grants(), p, landlock=landlock, notify=notify, shm="private")


def supervisor(run_dir: Path, session: str) -> seccomp.Supervisor:
    """The seccomp supervisor of one image: its socket sits in the keeper's run folder (0700, not
    granted to the image, whose own socket() calls are refused anyway)."""
    path = Path(run_dir) / f"sc{session[:6]}.sock"     # as short as the keeper's own sockets
    try:
        return seccomp.Supervisor(str(path)).start()
    except OSError as e:
        raise SandboxUnavailable(f"cannot supervise the image's seccomp filter at {path} ({e}); nothing was served",
                                 "use a store at a shorter path") from None


def status(sandbox: dict, sup: seccomp.Supervisor | None) -> dict:
    """The image's sandbox section for `ledger image status`: what was applied, and the syscalls
    its filter refused so far (the kernel's record, not the image's)."""
    if sup is None:
        return sandbox
    return {**sandbox, "syscall_denials": [d.as_dict() for d in sup.denials()],
            "syscall_denials_truncated": sup.truncated}


def confinement(status: str, prog: bytes) -> dict:
    """What the image's bootstrap reported it applied (raises SandboxUnavailable otherwise)."""
    return sandbox_run.read_confinement([status.splitlines()], prog).as_dict()


def scratch_dir(buffer_dir: Path, session: str) -> Path:
    """The image's private scratch folder (HOME, TMPDIR, unpacked model files), inside its buffer
    folder: already writable to it, and removed by the next keeper if this one is killed."""
    d = Path(buffer_dir) / f"scratch-{session}"
    d.mkdir(mode=0o700)
    return d.resolve()
