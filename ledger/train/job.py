"""The one child-job protocol: how ledger runs a training child and reads what it left behind.

SFT (`ledger.train.run`), DPO (`ledger.train.dpo`) and reproduce (through run) all go through it:

  1. `new_work(store, prefix)`: a fresh work folder `.ledger/tmp/<prefix>-<rand>/` with
     `inputs/` (the parent fills it; read-only to the child), `out/` and `scratch/` (the child's),
     held live (`Store.work_folder`: gc never removes it while this process runs) until
     `store.discard_work_folder(work)`;
  2. `ChildJob`: the child's argv, environment (`child_env`), sandbox policy and output limits;
  3. `run_job(store, job, ...)`: launches it through `ledger.sandbox.run_sandboxed` on a thread,
     polls `out/progress.jsonl` (and, through `poll`, anything else the caller ingests while the
     child runs, e.g. checkpoints), and when it ends either returns what `collect` read from
     `out/`, raises the child's own typed error (`out/error.json` -> `LedgerError.from_json`), or
     raises an InternalError naming how it died.

The child is hostile (ARCHITECTURE/DESIGN: assume a hostile child). Everything under `out/` is
read through `ChildOutputs`, which MUST:
  - walk folders by descriptor (openat), never through a path a child could re-point;
  - never follow a symbolic link (O_NOFOLLOW, lstat first), never open a FIFO, socket or device
    (lstat must say regular file before open; O_NONBLOCK in case it changes in between), and
    check after opening that the descriptor is the regular file lstat saw, with one name only
    (st_nlink == 1: a hard link could name a store file);
  - read at most a bound fixed by the plan (adapter/optimizer sizes from the memory plan plus a
    margin for safetensors headers, small fixed bounds for JSON), never more;
  - accept exactly the expected entries in a folder it ingests (checkpoints, final/, adapter/).
Anything else is a `Violation`. A run with a violation fails with `SandboxViolation` (exit 3),
and the violation is recorded in its own `sandbox-violation` journal record naming the run and
every checkpoint it committed; `resumable_checkpoint` and `check_resumable` never hand such a
checkpoint back to a child.
"""

from __future__ import annotations

import json
import os
import re
import stat
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import ledger
from ledger import errors, records
from ledger.errors import InternalError, LedgerError, Refused, SandboxViolation
from ledger.sandbox import SandboxPolicy, run_sandboxed
from ledger.store import lookup

VIOLATION_KIND = records.SandboxViolation.KIND
MiB = 1 << 20

# Environment a child may inherit from ledger's own (everything else is dropped).
PASS_ENV = ("PATH", "LANG", "LC_ALL", "TZ", "LEDGER_DEBUG", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")


# --- reading what the child wrote -----------------------------------------------------------------
@dataclass(frozen=True)
class Violation:
    path: str    # relative to out/
    what: str    # what was found instead of what was expected

    def as_dict(self) -> dict:
        return {"path": self.path, "what": self.what}


class Refusal(Exception):
    """Raised inside ChildOutputs; run_job turns it into a recorded violation."""

    def __init__(self, v: Violation):
        super().__init__(f"{v.path}: {v.what}")
        self.violation = v


@dataclass(frozen=True)
class Limits:
    """Upper bounds on what a child may leave in out/, derived from what it was asked to do."""
    steps: int                      # optimizer steps (progress lines, losses in JSON)
    adapter_bytes: int              # one adapter_model.safetensors
    optimizer_bytes: int = 0        # one optimizer.safetensors (0: the job writes none)
    rng_bytes: int = MiB            # torch CPU (+ CUDA) generator states are a few KiB
    config_bytes: int = 64 * 1024   # adapter_config.json
    error_bytes: int = 64 * 1024    # error.json: a real error report is a few hundred bytes

    @property
    def max_entries(self) -> int:
        """Entries in out/checkpoints/: at most one folder (and its .tmp) per step."""
        return 2 * self.steps + 8

    @property
    def progress_bytes(self) -> int:
        return 64 * 1024 + 1024 * self.steps

    @property
    def result_bytes(self) -> int:
        return MiB + 512 * self.steps

    @property
    def state_bytes(self) -> int:
        return 64 * 1024 + 64 * self.steps


def tensor_file_bound(payload_bytes: int, tensors: int) -> int:
    """A safetensors file of `payload_bytes` of tensor data in `tensors` tensors: the data plus its
    JSON header (name, dtype, shape, offsets: well under 512 bytes a tensor) plus a fixed margin."""
    return payload_bytes + 512 * tensors + 64 * 1024


_O_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISREG, "a regular file")):
        if test(mode):
            return name
    return "a special file"


class ChildOutputs:
    """Bounded, no-follow reads of one work folder's out/ (see the module docstring)."""

    def __init__(self, out: Path, limits: Limits):
        self.out = Path(out)
        self.limits = limits
        self._progress_at = 0
        self._progress_tail = b""
        self._progress_lines = 0

    # descriptors ----------------------------------------------------------------------------
    def _open_out(self) -> int:
        # out/ is the parent's: a confined child may write inside it, not replace it; an
        # unconfined one could, and then out/ is not followed either
        try:
            return os.open(self.out, _O_DIR)
        except OSError as e:
            raise Refusal(Violation(".", f"out/ itself could not be opened as a folder without following links "
                                         f"({e.strerror})")) from None

    def _dir_at(self, parent: int, name: str, rel: str) -> int | None:
        """A descriptor of the real directory `name` in `parent`, None if absent."""
        try:
            st = os.stat(name, dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError:
            return None
        if not stat.S_ISDIR(st.st_mode):
            raise Refusal(Violation(rel, f"{_kind(st.st_mode)} where a folder is expected"))
        try:
            fd = os.open(name, _O_DIR, dir_fd=parent)
        except OSError as e:  # replaced between lstat and open
            raise Refusal(Violation(rel, "could not be opened as a folder without following links "
                                         f"({e.strerror})")) from None
        fst = os.fstat(fd)
        if (fst.st_dev, fst.st_ino) != (st.st_dev, st.st_ino):
            os.close(fd)
            raise Refusal(Violation(rel, "was replaced while being opened"))
        return fd

    def _walk(self, rel: str) -> int | None:
        """A descriptor of folder out/<rel> (components walked one at a time), None if absent."""
        fd = self._open_out()
        for i, part in enumerate(p for p in rel.split("/") if p):
            try:
                nxt = self._dir_at(fd, part, "/".join(rel.split("/")[:i + 1]))
            finally:
                os.close(fd)
            if nxt is None:
                return None
            fd = nxt
        return fd

    def _file_at(self, parent: int, name: str, rel: str, limit: int) -> tuple[bytes, int] | None:
        """(bytes, mode) of the regular, singly-linked file `name` in `parent`, at most `limit`
        bytes long; None if absent."""
        try:
            st = os.stat(name, dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError:
            return None
        if not stat.S_ISREG(st.st_mode):  # decided before open: a FIFO or device is never opened
            raise Refusal(Violation(rel, f"{_kind(st.st_mode)} where a regular file is expected"))
        try:
            fd = os.open(name, _O_READ, dir_fd=parent)
        except OSError as e:
            raise Refusal(Violation(rel, f"could not be opened without following links ({e.strerror})")) from None
        try:
            fst = _check_opened(rel, fd, st, limit)
            data = _read_at_most(fd, limit + 1)
            if len(data) > limit:  # it grew after fstat
                raise Refusal(Violation(rel, f"more than the {limit} bytes this run may write there"))
            return data, fst.st_mode
        finally:
            os.close(fd)

    # what callers use -------------------------------------------------------------------------
    def read_file(self, rel: str, limit: int) -> bytes | None:
        folder, _, name = rel.rpartition("/")
        fd = self._walk(folder)
        if fd is None:
            return None
        try:
            got = self._file_at(fd, name, rel, limit)
        finally:
            os.close(fd)
        return None if got is None else got[0]

    def read_json(self, rel: str, limit: int) -> object | None:
        data = self.read_file(rel, limit)
        if data is None:
            return None
        try:
            return json.loads(data)
        except (ValueError, RecursionError):
            raise Refusal(Violation(rel, "not JSON")) from None

    def read_folder(self, rel: str, expected: dict[str, int]) -> dict[str, tuple[bytes, int]] | None:
        """{name: (bytes, mode)} of folder out/<rel>, which must hold exactly the files `expected`
        names (each within its bound) and nothing else; None if the folder is absent."""
        fd = self._walk(rel)
        if fd is None:
            return None
        try:
            names = _names(fd, rel, len(expected) + 1)  # one more, so an extra entry is named
            extra = [n for n in names if n not in expected]
            if extra:
                st = os.stat(extra[0], dir_fd=fd, follow_symlinks=False)
                raise Refusal(Violation(f"{rel}/{extra[0]}", f"unexpected entry ({_kind(st.st_mode)})"))
            out = {}
            for name, limit in sorted(expected.items()):
                got = self._file_at(fd, name, f"{rel}/{name}", limit)
                if got is None:
                    raise Refusal(Violation(f"{rel}/{name}", "missing from a folder the child said is complete"))
                out[name] = got
            return out
        finally:
            os.close(fd)

    def read_tree(self, rel: str, max_bytes: int, max_files: int, max_depth: int) -> dict[str, tuple[bytes, int]] | None:
        """{relative path: (bytes, mode)} of every file under out/<rel>, for an output whose
        names the parent cannot list in advance (a compile cache): walked by descriptor, each
        file checked like any other (regular, one name, no links), and refused past `max_files`
        files, `max_bytes` bytes in all or `max_depth` folders deep; None if absent."""
        fd = self._walk(rel)
        if fd is None:
            return None
        out: dict[str, tuple[bytes, int]] = {}
        left = [max_bytes]

        def visit(dfd: int, prefix: str, depth: int) -> None:
            if depth > max_depth:
                raise Refusal(Violation(f"{rel}/{prefix}", f"more than {max_depth} folders deep"))
            for name in _names(dfd, f"{rel}/{prefix}".rstrip("/"), max_files):
                path = f"{prefix}{name}"
                st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    sub = self._dir_at(dfd, name, f"{rel}/{path}")
                    try:
                        visit(sub, path + "/", depth + 1)
                    finally:
                        os.close(sub)
                    continue
                if len(out) >= max_files:
                    raise Refusal(Violation(f"{rel}/{path}", f"more than the {max_files} files this run may write there"))
                if st.st_size > left[0]:
                    raise Refusal(Violation(f"{rel}/{path}", f"more than the {max_bytes} bytes in all this run may "
                                                             "write there"))
                got = self._file_at(dfd, name, f"{rel}/{path}", left[0])
                if got is None:
                    raise Refusal(Violation(f"{rel}/{path}", "vanished while being read"))
                left[0] -= len(got[0])
                out[path] = got

        try:
            visit(fd, "", 0)
        finally:
            os.close(fd)
        return out

    def list_folder(self, rel: str, pattern: re.Pattern, skip: re.Pattern | None = None) -> list[str]:
        """Names in out/<rel> matching `pattern` (sorted); names matching `skip` are passed over
        unread (work in progress); any other name is a violation. [] if the folder is absent."""
        fd = self._walk(rel)
        if fd is None:
            return []
        try:
            names = _names(fd, rel, self.limits.max_entries)
        finally:
            os.close(fd)
        for n in names:
            if not pattern.fullmatch(n) and not (skip and skip.fullmatch(n)):
                raise Refusal(Violation(f"{rel}/{n}", "unexpected entry"))
        return [n for n in names if pattern.fullmatch(n)]

    def new_progress(self) -> list[dict]:
        """Complete lines appended to out/progress.jsonl since the last call, each a JSON object.

        Reads only the bytes after the previous call's, with _file_at's checks."""
        rel, limit = "progress.jsonl", self.limits.progress_bytes
        parent = self._open_out()
        try:
            try:
                st = os.stat(rel, dir_fd=parent, follow_symlinks=False)
            except FileNotFoundError:
                if self._progress_at:
                    raise Refusal(Violation(rel, "removed while the run was reading it")) from None
                return []
            if not stat.S_ISREG(st.st_mode):
                raise Refusal(Violation(rel, f"{_kind(st.st_mode)} where a regular file is expected"))
            try:
                fd = os.open(rel, _O_READ, dir_fd=parent)
            except OSError as e:
                raise Refusal(Violation(rel, f"could not be opened without following links ({e.strerror})")) from None
        finally:
            os.close(parent)
        try:
            fst = _check_opened(rel, fd, st, limit)
            if fst.st_size < self._progress_at:
                raise Refusal(Violation(rel, "shrank while the run was reading it"))
            want = limit - self._progress_at
            chunks, got = [], 0
            while got <= want:
                b = os.pread(fd, want + 1 - got, self._progress_at + got)
                if not b:
                    break
                chunks.append(b)
                got += len(b)
            if got > want:
                raise Refusal(Violation(rel, f"more than the {limit} bytes this run may write there"))
        finally:
            os.close(fd)
        data = b"".join(chunks)
        self._progress_at += len(data)
        *lines, self._progress_tail = (self._progress_tail + data).split(b"\n")
        out = []
        for line in lines:
            self._progress_lines += 1
            try:
                obj = json.loads(line)
            except (ValueError, RecursionError):
                obj = None
            if not _is_progress(obj):
                raise Refusal(Violation(rel, f"line {self._progress_lines} is not a progress record "
                                             "(an object of numbers with an integer step)"))
            out.append(obj)
        return out


def _names(fd: int, rel: str, cap: int) -> list[str]:
    """The sorted names in a folder, reading no more than `cap` + 1 of them (a child could fill
    a folder with millions)."""
    names = []
    with os.scandir(fd) as it:
        for entry in it:
            names.append(entry.name)
            if len(names) > cap:
                raise Refusal(Violation(rel, f"more than the {cap} entries this run may write there"))
    return sorted(names)


def check_result(result, types: dict) -> dict:
    """`result` (out/result.json) holds at least the fields `types` names, each of its type;
    anything less is a violation (the receipt is built from it: a missing field must not crash
    the parent)."""
    if not isinstance(result, dict):
        raise Refusal(Violation("result.json", "not a JSON object"))
    for name, want in types.items():
        v = result.get(name)
        ok = isinstance(v, want) and not (isinstance(v, bool) and want in (int, (int, float)))
        if name not in result or not ok:
            what = getattr(want, "__name__", " or ".join(t.__name__ for t in want) if isinstance(want, tuple) else want)
            raise Refusal(Violation("result.json", f"field {name!r} is missing or not {what}"))
    losses = result.get("losses")
    if isinstance(losses, list) and not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in losses):
        raise Refusal(Violation("result.json", "field 'losses' holds something other than numbers"))
    return result


def _is_progress(obj) -> bool:
    """A progress line as every recipe writes it: {name: number}, with an integer `step`. Nothing
    else reaches the caller's progress display."""
    return (isinstance(obj, dict) and isinstance(obj.get("step"), int)
            and all(isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool)
                    for k, v in obj.items()))


def _check_opened(rel: str, fd: int, st: os.stat_result, limit: int) -> os.stat_result:
    """The opened file is the one that was looked at (not swapped in between), regular, the only
    name of its inode, and within `limit` bytes; else the Refusal that names why."""
    fst = os.fstat(fd)
    if (fst.st_dev, fst.st_ino) != (st.st_dev, st.st_ino) or not stat.S_ISREG(fst.st_mode):
        raise Refusal(Violation(rel, "was replaced while being opened"))
    if fst.st_nlink != 1:
        raise Refusal(Violation(rel, f"a hard link ({fst.st_nlink} names for one file)"))
    if fst.st_size > limit:
        raise Refusal(Violation(rel, f"{fst.st_size} bytes, more than the {limit} this run may write there"))
    return fst


def _read_at_most(fd: int, n: int) -> bytes:
    chunks, left = [], n
    while left > 0:
        b = os.read(fd, min(left, 16 * MiB))
        if not b:
            break
        chunks.append(b)
        left -= len(b)
    return b"".join(chunks)


def put_tree_bytes(tx, files: dict[str, tuple[bytes, int]]) -> str:
    """A tree object of files read through ChildOutputs (the same entries `Transaction.put_tree`
    writes for a folder), so nothing the child wrote is re-opened by path."""
    entries = [{"path": name, "id": tx.put_bytes(data), "size": len(data), "exec": bool(mode & 0o111)}
               for name, (data, mode) in sorted(files.items())]
    return tx.put_json({"kind": "tree", "entries": entries}, "tree")


# --- the job --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ChildJob:
    """One child execution: what runs, under which policy, and what it may leave behind."""
    trainer: str                  # "sft" or "dpo": names the run in records and messages
    work: Path
    argv: tuple[str, ...]
    env: dict
    policy: SandboxPolicy
    limits: Limits
    launcher: tuple[str, ...] = ()
    processes: int = 1
    net: str = "host"             # "loopback": launcher and ranks in a network namespace of loopback alone
    unsandboxed: bool = False
    timeout: float | None = None
    plan: str | None = None       # the plan id the parent ran (never the child's claim)
    name: str | None = None       # the run's name when its folder runs under another (compile_cache.settle)

    @property
    def run_name(self) -> str:
        return self.name or self.work.name

    @property
    def out(self) -> Path:
        return self.work / "out"


def new_work(store, prefix: str) -> Path:
    """A fresh work folder with inputs/, out/ and scratch/, which this process holds live (gc
    keeps it) until `store.discard_work_folder(work)` removes it."""
    work = store.work_folder(prefix)
    try:
        for d in ("inputs", "out", "scratch"):
            (work / d).mkdir()
    except BaseException:
        store.discard_work_folder(work)
        raise
    return work


# The child imports THE ledger package this process runs, by its folder -- the one folder of it
# the sandbox grants (ledger.sandbox.policy.system_allowances) -- never whatever `ledger` its own
# sys.path would find: a checkout that is not installed (its folder is not on the child's path,
# which gets no PYTHONPATH of ours), an editable install of any mode (a .pth naming the checkout
# would need the checkout listed, which is not granted), or another installed version (a child
# running other code than its parent records).
_START = ("import importlib.util, runpy, sys\n"
          "spec = importlib.util.spec_from_file_location('ledger', {init!r}, submodule_search_locations=[{pkg!r}])\n"
          "mod = importlib.util.module_from_spec(spec)\n"
          "sys.modules['ledger'] = mod\n"
          "spec.loader.exec_module(mod)\n"
          "runpy.run_module({module!r}, run_name='__main__', alter_sys=True)\n")


def module_argv(module: str, work: Path) -> list[str]:
    """`python -c <start> WORK`, which runs MODULE as `python -m MODULE WORK` would, over this
    process's ledger package (see _START): how every ledger child starts."""
    pkg = os.path.dirname(os.path.abspath(ledger.__file__))
    return [sys.executable, "-c", _START.format(init=os.path.join(pkg, "__init__.py"), pkg=pkg, module=module),
            str(work)]


def policy_for(store, work: Path, *, gpu: bool = False, network: bool = False) -> SandboxPolicy:
    """inputs/ read-only, out/ and scratch/ read-write, the store's sealed/ protected."""
    return SandboxPolicy(read_only=(str(work / "inputs"),), read_write=(str(work / "out"), str(work / "scratch")),
                         protected=(str(store.root / "sealed"),), gpu=gpu, network=network)


def child_env(work: Path, threads: int, pass_env: tuple[str, ...] = PASS_ENV) -> dict:
    """Nothing of the caller's environment beyond `pass_env`; a private HOME and TMPDIR in
    scratch/, offline hub libraries, a fixed hash seed and the plan's thread count."""
    env = {k: os.environ[k] for k in pass_env if k in os.environ}
    env.setdefault("PATH", os.defpath)
    scratch = str(work / "scratch")
    t = str(threads)
    env.update({"HOME": scratch, "TMPDIR": scratch, "HF_HOME": os.path.join(scratch, "hf"), "HF_HUB_OFFLINE": "1",
                "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
                "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": t, "MKL_NUM_THREADS": t, "OPENBLAS_NUM_THREADS": t,
                "PYTHONUNBUFFERED": "1"})
    return env


def launch(job: ChildJob, stop: threading.Event | None = None):
    """The one place a training child is started (`stop` kills it at once). Returns
    ledger.sandbox.SandboxResult."""
    return run_sandboxed(list(job.argv), job.policy, env=job.env, cwd=str(job.work / "scratch"), timeout=job.timeout,
                         unsandboxed=job.unsandboxed, launcher=list(job.launcher), processes=job.processes,
                         stop=stop, net=job.net)


@dataclass(frozen=True)
class Finished:
    """What a child run left behind, read and checked."""
    returncode: int
    sandbox: dict
    result: dict
    collected: object = None          # what the caller's collect() read from out/
    checkpoints: tuple[str, ...] = ()  # committed while it ran, in order
    stderr: str = ""


def sandbox_record(res, policy: SandboxPolicy) -> dict:
    """The sandbox part of a receipt."""
    return {"sandboxed": res.sandboxed, "landlock_abi": res.abi, "policy": policy.as_dict(),
            "denied_attempts": [a.as_dict() for a in res.denied_attempts],
            "protected_attempts": [a.as_dict() for a in res.protected_attempts],
            "audit_truncated": res.audit_truncated, "child_wall_s": round(res.wall_s, 3),
            "processes": res.processes,
            # what confined it: Landlock ABI, seccomp filter id, dropped capabilities, private /dev/shm
            "confinement": res.confinement.as_dict() if res.confinement else None,
            "syscall_denials": [d.as_dict() for d in res.syscall_denials],
            "syscall_denials_truncated": res.syscall_denials_truncated}


def run_job(store, job: ChildJob, *, progress: Callable[[dict], None] | None = None,
            poll: Callable[[ChildOutputs], list[str]] | None = None,
            collect: Callable[[ChildOutputs, dict], object] | None = None,
            describe_failure: Callable[[int, str, dict, list[str]], LedgerError] | None = None) -> Finished:
    """Run `job` to its end (see the module docstring).

    progress(line)   each complete progress line, as the child writes them
    poll(outputs)    called every 0.2 s while the child runs and once after: ingests what is
                     complete (checkpoints) and returns the ids it committed
    collect(outputs, result)  after a successful exit: reads the outputs the caller commits
    describe_failure(returncode, stderr, sandbox, checkpoints)  the error for a child that died
                     without an error.json (default: InternalError with its last words)
    """
    reader = ChildOutputs(job.out, job.limits)
    box: dict = {}
    violations: list[Violation] = []
    checkpoints: list[str] = []
    stop = threading.Event()   # set on the first violation: a child that broke the rules is not waited for

    def target():
        try:
            box["result"] = launch(job, stop)
        except BaseException as e:  # noqa: BLE001 - re-raised on the calling thread
            box["error"] = e

    def guarded(fn):
        try:
            return fn()
        except Refusal as r:
            violations.append(r.violation)
            stop.set()
            return None

    def tick():
        if violations:
            return  # nothing more is read from a child that broke the rules
        lines = guarded(reader.new_progress) or []
        if progress is not None:
            for line in lines:
                progress(line)
        if poll is not None and not violations:
            checkpoints.extend(guarded(lambda: poll(reader)) or [])

    th = threading.Thread(target=target, name=f"ledger-{job.trainer}-child", daemon=True)
    th.start()
    try:
        while th.is_alive():
            th.join(0.2)
            errors.check_interrupt()   # a Ctrl-C swallowed on the way (a checkpoint's commit) still stops the wait
            tick()
    except BaseException:   # Ctrl-C: the launching thread kills the child's group now, not at our exit
        stop.set()
        raise
    tick()
    if "error" in box:
        if violations:  # stopped for breaking the rules, it could not report as a finished child would
            raise record_violation(store, job, violations, checkpoints,
                                   {"sandboxed": not job.unsandboxed, "policy": job.policy.as_dict()})
        raise box["error"]
    res = box["result"]
    sandbox = sandbox_record(res, job.policy)
    stderr = res.stderr_tail
    result, collected = None, None
    if not violations and res.returncode != 0:
        data = guarded(lambda: reader.read_file("error.json", job.limits.error_bytes))
        if data is not None and not violations:
            # A child reports its own failure; it cannot report the parent's store as corrupt or locked.
            raise LedgerError.from_json(data, origin=f"the {job.trainer} training child",
                                        demote=errors.NOT_FROM_A_CHILD)
    if not violations and res.returncode == 0:
        result = guarded(lambda: reader.read_json("result.json", job.limits.result_bytes))
        if result is not None and not isinstance(result, dict):
            violations.append(Violation("result.json", "not a JSON object"))
        if not violations and result is None:
            raise InternalError(f"the {job.trainer} training child exited 0 without writing out/result.json",
                                "rerun with LEDGER_DEBUG=1 to see the child's output", stderr=stderr[-8000:])
        if not violations and collect is not None:
            collected = guarded(lambda: collect(reader, result))
    if violations:
        raise record_violation(store, job, violations, checkpoints, sandbox)
    if res.returncode != 0:
        if describe_failure is not None:
            raise describe_failure(res.returncode, stderr, sandbox, checkpoints)
        raise InternalError(f"the {job.trainer} training child exited with {res.returncode}",
                            "rerun with LEDGER_DEBUG=1 to see the child's output", stderr=stderr[-8000:])
    return Finished(res.returncode, sandbox, result, collected, tuple(checkpoints), stderr)


# --- violations and resume ------------------------------------------------------------------------
def record_violation(store, job: ChildJob, violations: list[Violation], checkpoints: list[str],
                     sandbox: dict) -> SandboxViolation:
    """Record the violation in its own journal record; returns the error that fails the run."""
    vs = [v.as_dict() for v in violations]
    committed = list(dict.fromkeys(checkpoints))
    payload = records.SandboxViolation(run=job.run_name, trainer=job.trainer, violations=vs, checkpoints=committed,
                                       sandboxed=sandbox["sandboxed"], policy=sandbox["policy"],
                                       **({"plan": job.plan} if job.plan else {}))
    with store.transaction(VIOLATION_KIND, wait=60) as tx:
        tx.inputs.extend(committed)
        records.write(tx, payload)
    v = violations[0]
    return SandboxViolation(f"the {job.trainer} training child wrote {v.what} at out/{v.path}; the run is refused "
                            f"(recorded as {VIOLATION_KIND} #{tx.record['seq']})", None,
                            violations=vs[:50], run=job.run_name, checkpoints=list(checkpoints))


def violated_checkpoints(store) -> set[str]:
    """Every checkpoint named by a sandbox-violation record."""
    out: set[str] = set()
    for r in lookup.records(store, VIOLATION_KIND):  # from the index: violations are rare, history is long
        out.update(records.read(r).checkpoints)
    return out


def resumable_checkpoint(store, plan_id: str) -> str | None:
    """The latest checkpoint of `plan_id` that no violating run produced, or None.

    Both come from the index (ledger/store/lookup.py): a plan that never checkpointed (every
    new cycle's) costs two queries, not a walk of history. A violation record is always
    appended after the checkpoints it names, so every violation's checkpoints are exactly the
    ones a newest-first walk would have seen tainted."""
    tainted = violated_checkpoints(store)
    for r in lookup.records(store, records.Checkpoint.KIND, {"plan": plan_id}):
        p = records.read(r)
        if p.plan == plan_id and p.checkpoint not in tainted:
            return p.checkpoint
    return None


def check_resumable(store, checkpoint_id: str) -> None:
    """Refuse a checkpoint that a run with a sandbox violation produced."""
    if checkpoint_id in violated_checkpoints(store):
        raise Refused(f"checkpoint {checkpoint_id[:15]}… was written by a training run that violated its sandbox; "
                      "ledger never resumes from it", "train from the start, or resume from another checkpoint")
