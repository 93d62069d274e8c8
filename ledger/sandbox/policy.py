"""What a sandboxed child may reach: SandboxPolicy, its grants and the system allowances.

A policy is data (frozen, JSON round trip); the bootstrap turns its grants into Landlock rules
(landlock.py) and its socket needs into a seccomp filter (seccomp.py).
"""

from __future__ import annotations

import dataclasses
import json
import os
import site
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import ledger
from ledger.errors import BadInput, Refused
from ledger.sandbox.landlock import KIND_RIGHTS

__all__ = ["Grant", "SandboxPolicy", "system_allowances", "within"]


@dataclass(frozen=True)
class Grant:
    """One path a child may reach, with a kind naming the rights (see landlock.KIND_RIGHTS)."""
    path: str
    kind: str
    why: str = ""


def _norm(p: str | os.PathLike, field: str, *, absolute_only: bool = False) -> str:
    if not isinstance(p, (str, os.PathLike)):
        raise BadInput(f"sandbox policy: {field} must hold paths, got {type(p).__name__}")
    s = os.fspath(p)
    if isinstance(s, bytes):
        s = os.fsdecode(s)
    if not s or "\x00" in s:
        raise BadInput(f"sandbox policy: empty or NUL-containing path in {field}")
    if absolute_only and not os.path.isabs(s):
        raise BadInput(f"sandbox policy: {field} path {s!r} is not absolute")
    return os.path.realpath(s)


def within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _store_trouble(path: str) -> str | None:
    """Why granting `path` would expose a store (or its sealed area) wholesale, else None."""
    parts = Path(path).parts
    for i, part in enumerate(parts):
        if part.endswith(".ledger"):
            if i == len(parts) - 1:
                return "it is a store (.ledger) itself; grant specific objects or folders in it"
            if parts[i + 1] == "sealed":
                return "it is inside a store's sealed area"
    if os.path.isdir(os.path.join(path, ".ledger")):
        return "it contains a store (.ledger); grant specific folders instead"
    return None


@dataclass(frozen=True)
class SandboxPolicy:
    """What a sandboxed child may reach. Paths are stored absolute with symlinks resolved.

    read_only   declared inputs: read files, list folders
    read_write  output folders: create, write, rename, delete inside
    protected   paths that must stay unreachable (e.g. `.ledger/sealed`); any attempt on them is
                reported separately, and a policy whose grants reach them is refused
    system      add the system allowances (`system_allowances`) a Python child needs to start
    gpu         also grant NVIDIA device nodes and the /proc and /sys files drivers read
    network     allow TCP; False denies TCP bind/connect (needs ABI 4, else SandboxUnavailable)
    shared_memory  grant /dev/shm read-write (torch DataLoader workers pass tensors through it)
    """
    read_only: tuple[str, ...] = ()
    read_write: tuple[str, ...] = ()
    protected: tuple[str, ...] = ()
    system: bool = True
    gpu: bool = False
    network: bool = True
    shared_memory: bool = True

    _FORMAT = 1

    def __post_init__(self):
        for name in ("read_only", "read_write", "protected"):
            raw = getattr(self, name)
            if raw is None:
                raw = ()
            if isinstance(raw, (str, os.PathLike)):
                raise BadInput(f"sandbox policy: {name} must be a list of paths, not one path")
            paths = tuple(dict.fromkeys(_norm(p, name) for p in raw))
            object.__setattr__(self, name, paths)
        for name in ("system", "gpu", "network", "shared_memory"):
            if not isinstance(getattr(self, name), bool):
                raise BadInput(f"sandbox policy: {name} must be true or false")

    # JSON ----------------------------------------------------------------------------------
    def as_dict(self) -> dict:
        return {"format": self._FORMAT, "read_only": list(self.read_only),
                "read_write": list(self.read_write), "protected": list(self.protected),
                "system": self.system, "gpu": self.gpu, "network": self.network,
                "shared_memory": self.shared_memory}

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, data: str | bytes | Mapping) -> SandboxPolicy:
        if isinstance(data, (str, bytes)):
            try:
                data = json.loads(data)
            except ValueError as e:
                raise BadInput(f"sandbox policy: not JSON ({e})") from None
        if not isinstance(data, Mapping):
            raise BadInput("sandbox policy: expected a JSON object")
        if data.get("format") != cls._FORMAT:
            raise BadInput(f"sandbox policy: unknown format {data.get('format')!r}")
        known = {f.name for f in dataclasses.fields(cls)} | {"format"}
        extra = set(data) - known
        if extra:
            raise BadInput(f"sandbox policy: unknown fields {sorted(extra)}")
        kw = {}
        for name in ("read_only", "read_write", "protected"):
            value = data.get(name, [])
            if not isinstance(value, list) or not all(isinstance(p, str) for p in value):
                raise BadInput(f"sandbox policy: {name} must be a list of strings")
            kw[name] = tuple(_norm(p, name, absolute_only=True) for p in value)
        for name in ("system", "gpu", "network", "shared_memory"):
            if name in data:
                kw[name] = data[name]
        return cls(**kw)

    # grants --------------------------------------------------------------------------------
    def grants(self) -> tuple[Grant, ...]:
        """Every path the child gets: system allowances first, then the caller's."""
        out = list(system_allowances(self)) if self.system else []
        out += [Grant(p, "r", "declared input") for p in self.read_only]
        out += [Grant(p, "rw", "output folder") for p in self.read_write]
        return tuple(out)

    def check(self) -> None:
        """Refuse a policy that would expose a protected path, a store or home wholesale."""
        home = os.path.realpath(os.path.expanduser("~"))
        for g in self.grants():
            if g.path == "/proc/self":
                continue
            if g.path == "/":
                raise Refused("sandbox policy grants the whole filesystem (/)",
                              "grant specific folders", path=g.path)
            if home != "/" and within(home, g.path):
                raise Refused(f"sandbox policy grants {g.path}, which contains the home folder",
                              "grant specific folders", path=g.path)
            trouble = _store_trouble(g.path)
            if trouble:
                raise Refused(f"sandbox policy grants {g.path}: {trouble}",
                              "grant specific object paths or folders, never .ledger itself",
                              path=g.path)
            for p in self.protected:
                if within(p, g.path) or within(g.path, p):
                    raise Refused(f"sandbox policy grant {g.path} ({g.why}) reaches protected "
                                  f"path {p}", "narrow the grant so the protected path is outside it",
                                  path=g.path, protected=p)
        for p in self.read_only + self.read_write:
            if not os.path.exists(p):
                raise BadInput(f"sandbox policy: granted path {p} does not exist",
                               "create the output folder before running the child")


def _python_paths() -> list[str]:
    paths = [sys.base_prefix, sys.base_exec_prefix, sys.prefix, sys.exec_prefix]
    try:
        paths += site.getsitepackages()
    except (AttributeError, ImportError):   # pragma: no cover - old virtualenv site.py
        pass
    return paths


def system_allowances(policy: SandboxPolicy | None = None) -> tuple[Grant, ...]:
    """The system paths a child gets unless policy.system is False. Only existing paths appear.

    Deliberately NOT here: the working directory, home, /tmp, /opt, /var, /srv, /mnt, the store.
    The child's HOME, TMPDIR and default cwd are a private scratch folder made per run.
    """
    policy = policy or SandboxPolicy()
    cand: list[Grant] = []
    for p in ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        cand.append(Grant(p, "rx", "system programs and shared libraries"))
    for p in _python_paths():
        cand.append(Grant(p, "rx", "the Python installation, venv and site-packages"))
    cand.append(Grant(os.path.dirname(os.path.abspath(ledger.__file__)), "r",
                      "the ledger package, so training children can import it"))
    for p in ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime"):
        cand.append(Grant(p, "r", "dynamic loader configuration and local time"))
    for p in ("/etc/passwd", "/etc/group", "/etc/nsswitch.conf"):   # world-readable, no secrets
        cand.append(Grant(p, "r", "user database (getpwuid; torch's cache dir asks for the user)"))
    cand.append(Grant("/dev/null", "dev", "null device"))
    for p in ("/dev/zero", "/dev/urandom", "/dev/random"):
        cand.append(Grant(p, "r", "random and zero devices"))
    if policy.shared_memory:
        cand.append(Grant("/dev/shm", "rw", "POSIX shared memory (DataLoader workers)"))
    # /proc/self is resolved by the bootstrap to /proc/<its pid>, which the exec'd target keeps.
    # Writable because the CUDA driver names its threads through /proc/self/task/*/comm (cuInit
    # fails with 304 otherwise); fd/* and cwd links still resolve to, and are checked as, their
    # real targets. Other processes' entries are NOT granted: with /proc readable, a child could
    # read the parent's environ (measured on kernel 6.18), which may hold credentials.
    cand.append(Grant("/proc/self", "self", "the child's own /proc entry"))
    for p in ("/proc/cpuinfo", "/proc/meminfo", "/proc/stat", "/sys/devices/system/cpu",
              "/sys/devices/system/node"):
        cand.append(Grant(p, "r", "CPU and memory topology (torch, OpenMP)"))
    cand.append(Grant("/proc/sys/kernel/random/boot_id", "r", "boot id (torch inductor cache key)"))
    if policy.network:  # world-readable, no secrets: `localhost`, and the interfaces and PCI
        # devices gloo/NCCL scan when they bootstrap (torchrun rendezvous, DDP on loopback)
        for p in ("/etc/hosts", "/etc/host.conf", "/etc/gai.conf", "/sys/class/net", "/sys/bus/pci", "/sys/devices"):
            cand.append(Grant(p, "r", "loopback name, network interfaces and PCI topology (torchrun, gloo/NCCL)"))
    if policy.gpu:
        for name in sorted(os.listdir("/dev")) if os.path.isdir("/dev") else ():
            if name.startswith("nvidia"):
                cand.append(Grant(f"/dev/{name}", "devio", "NVIDIA device nodes"))
        for p in ("/proc/driver/nvidia", "/sys/bus/pci", "/sys/devices", "/sys/module/nvidia"):
            cand.append(Grant(p, "r", "NVIDIA driver and PCI topology"))
    seen: dict[str, Grant] = {}
    for g in cand:
        if g.path == "/proc/self":   # resolved by the bootstrap, not here (see above)
            seen.setdefault(g.path, g)
            continue
        if not os.path.exists(g.path):
            continue
        real = os.path.realpath(g.path)
        if real not in seen:
            seen[real] = Grant(real, g.kind, g.why)
    # Drop grants that a broader grant already covers (Landlock unions rights down the tree).
    kept = [g for g in seen.values()
            if not any(h is not g and h.path != "/proc/self" and g.path != "/proc/self"
                       and within(g.path, h.path)
                       and not KIND_RIGHTS[g.kind] & ~KIND_RIGHTS[h.kind]
                       for h in seen.values())]
    return tuple(kept)

