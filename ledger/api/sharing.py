"""Sharing: bundles, remotes, push, pull, fetch, repair, keys.

Part of ledger.api (see its docstring): import the verbs from there, `from ledger import api`."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from ledger.api._base import Result, StoreLike, Wrapped, take_warnings
from ledger.api._open import open_store
from ledger.errors import BadInput, NotAStore, UnknownRef
from ledger.sharing import bundle, keys, remote
from ledger.sharing import fetch as fetch_mod
from ledger.sharing import push as push_mod
from ledger.sharing import repair as repair_mod
from ledger.store import canonical


@dataclass(frozen=True)
class BundleWritten(Wrapped):
    """ledger.sharing.bundle's create result in `result` (path, objects, bytes, manifest, signed_by)."""


@dataclass(frozen=True)
class Imported(Wrapped):
    """ledger.sharing's import result in `result` (namespace, refs, objects, signers, absent)."""


@dataclass(frozen=True)
class Pulled(Result):
    """The refs one pull brought in under its namespace, and what was new or repaired."""
    imports: tuple[Any, ...]   # one import result per remote ref namespace

    def to_json(self):
        return [r.to_json() for r in self.imports]


@dataclass(frozen=True)
class BundleListing(Wrapped):
    """ledger.sharing.bundle's listing in `result` (header, signers, records)."""


def bundle_create(refs: Sequence[str], output: str | os.PathLike, *, sign: str | None = None, origin: str | None = None,
                  since: Sequence[str] = (), progress=None, store: StoreLike = None) -> BundleWritten:
    """Write the closure of `refs` plus the journal records that made them into one file
    (`sign`: with this key of yours; `origin`: the receiver's suggested namespace; `since`:
    refs or ids the receiver holds — their closure is left out, and of a large object only
    the chunks they lack are carried)."""
    s = open_store(store)
    res = bundle.create(s, list(refs), Path(output), key_name=sign, origin=origin, progress=progress,
                        since=tuple(since))
    return BundleWritten(result=res, warnings=take_warnings(s))


def bundle_import(file: str | os.PathLike, *, namespace: str | None = None, jobs: int = 4, progress=None,
                  store: StoreLike = None) -> Imported:
    """Verify a bundle whole, then import it into a namespace (local HEAD never changes)."""
    s = open_store(store)
    res = bundle.import_bundle(s, Path(file), namespace=namespace, progress=progress, jobs=jobs)
    return Imported(result=res, warnings=take_warnings(s))


def bundle_ls(file: str | os.PathLike, *, store: StoreLike = None) -> BundleListing:
    """A bundle's table of contents, signers and journal segment (imports nothing; without a
    store its signers read as untrusted)."""
    try:
        s = open_store(store)
    except NotAStore:
        s = None  # listing needs no store
    return BundleListing(result=bundle.ls(s, Path(file)), warnings=take_warnings(s))


@dataclass(frozen=True)
class Remote(Wrapped):
    """ledger.sharing.remote's RemoteConfig in `result` (name, url, options)."""


@dataclass(frozen=True)
class Remotes(Result):
    """The configured remotes (names and URLs)."""
    remotes: tuple[Any, ...]

    def to_json(self):
        return [c.to_json() for c in self.remotes]


@dataclass(frozen=True)
class Done(Result):
    """A verb whose answer is a small fixed object (remote remove, key untrust, key require, ...)."""

    body: Mapping

    def to_json(self):
        return self.body


def remote_add(name: str, url: str, *, endpoint_url: str | None = None, options: Sequence[str] = (),
               store: StoreLike = None) -> Remote:
    """Configure a remote (recorded in the journal; credentials are never stored). `options`:
    extra S3 client options as KEY=VALUE."""
    opts = {}
    if endpoint_url:
        opts["endpoint_url"] = endpoint_url
    for o in options:
        k, eq, v = o.partition("=")
        if not eq or not k:
            raise BadInput(f"--option {o!r} is not KEY=VALUE", "e.g. --option region_name=eu-west-1")
        opts[k] = v
    s = open_store(store)
    return Remote(result=remote.add(s, name, url, opts), warnings=take_warnings(s))


def remote_list(*, store: StoreLike = None) -> Remotes:
    """The configured remotes."""
    s = open_store(store)
    return Remotes(tuple(remote.configured(s).values()), warnings=take_warnings(s))


def remote_remove(name: str, *, store: StoreLike = None) -> Done:
    """Forget a remote (a journal record; nothing on the remote is touched)."""
    s = open_store(store)
    remote.remove(s, name)
    return Done({"removed": name}, warnings=take_warnings(s))


def _backend(store, name: str):
    cfg = remote.get(store, name)
    return remote.open_backend(cfg.url, cfg.options)


@dataclass(frozen=True)
class Pushed(Wrapped):
    """ledger.sharing's push result in `result` (up_to_date, objects_sent, bytes_sent, refs, absent)."""

    remote: str = ""


def push(remote_name: str, refs: Sequence[str] = ("HEAD",), *, sign: str | None = None, jobs: int = 4,
         full: bool = False, progress=None, store: StoreLike = None) -> Pushed:
    """Send the closure of `refs` and its journal segment to a remote (only missing objects move;
    a rerun after an interruption resumes)."""
    s = open_store(store)
    res = push_mod.push(s, _backend(s, remote_name), list(refs) or ["HEAD"], key_name=sign, progress=progress,
                        jobs=jobs, full=full)
    return Pushed(result=res, remote=remote_name, warnings=take_warnings(s))


def pull(remote_name: str, refs: Sequence[str] | None = None, *, namespace: str | None = None, jobs: int = 4,
         progress=None, store: StoreLike = None) -> Pulled:
    """Fetch refs (default all) from a remote into REMOTE/… (or NAMESPACE/…); local HEAD never
    changes. Every object is verified on arrival; signatures are checked against trusted keys."""
    s = open_store(store)
    res = fetch_mod.pull(s, _backend(s, remote_name), list(refs) if refs else None, namespace=namespace or remote_name,
                         source=remote_name, progress=progress, jobs=jobs)
    return Pulled(tuple(res), warnings=take_warnings(s))


@dataclass(frozen=True)
class Fetched(Wrapped):
    """ledger.sharing's fetch result in `result` (imports, fetched_objects, fetched_bytes, missing)."""


def fetch(source: str, ids: Sequence[str], *, namespace: str | None = None, jobs: int = 4, progress=None,
          store: StoreLike = None) -> Fetched:
    """Bring the closure of `ids` (such as a colleague's receipt) here from a remote, bundle file,
    remote folder or s3:// URL, verified."""
    s = open_store(store)
    res = fetch_mod.fetch_closure(s, source, list(ids), namespace=namespace, progress=progress, jobs=jobs)
    return Fetched(result=res, warnings=take_warnings(s))


@dataclass(frozen=True)
class Repaired(Wrapped):
    """ledger.sharing.repair's result in `result` (repaired, not_held, refused, remaining);
    fails with StoreCorrupt (exit 4) while damage remains."""

    def failure(self):
        return repair_mod.failure(self.result)


def repair(source: str, *, jobs: int = 4, progress=None, store: StoreLike = None) -> Repaired:
    """Replace every missing or damaged object `verify --read-data` finds with a verified copy
    from `source` (a configured remote, a bundle file, a remote folder or an s3:// URL)."""
    s = open_store(store)
    res = repair_mod.repair(s, fetch_mod.open_source(s, source), progress=progress, jobs=jobs)
    return Repaired(result=res, warnings=take_warnings(s))


@dataclass(frozen=True)
class KeyCreated(Result):
    """A new signing key: its name, public key and the record that stored it."""
    key: Any   # the PublicKey

    def to_json(self):
        return {**self.key.to_json(), "fingerprint": self.key.fingerprint, "id": self.key.id}


def key_create(name: str, *, store: StoreLike = None) -> KeyCreated:
    """Create an ed25519 key pair; the private half stays in .ledger/keys/ (0600)."""
    s = open_store(store)
    pub = keys.create(s, name)
    return KeyCreated(pub, warnings=take_warnings(s))


@dataclass(frozen=True)
class Keys(Result):
    """The store's own signing keys and the keys it trusts."""
    own: tuple[Mapping, ...]
    trusted: tuple[Mapping, ...]
    require_signatures: bool

    def to_json(self):
        return {"own": list(self.own), "trusted": list(self.trusted), "require_signatures": self.require_signatures}


def key_list(*, store: StoreLike = None) -> Keys:
    """Your keys and the keys you trust."""
    s = open_store(store)
    own = keys.own_keys(s)
    mine = {o.fingerprint for o in own.values()}
    trusted = {fp: k for fp, k in keys.trusted_keys(s).items() if fp not in mine}
    return Keys(tuple({"name": k.name, "fingerprint": k.fingerprint,
                       "private": (keys.keys_dir(s) / f"{k.name}.ed25519").is_file()} for k in own.values()),
                tuple({"name": k.name, "fingerprint": k.fingerprint} for k in trusted.values()),
                keys.signatures_required(s), warnings=take_warnings(s))


@dataclass(frozen=True)
class KeyExported(Result):
    """Where a public key was written, for a colleague to trust."""
    data: bytes           # the public key file's bytes
    fingerprint: str
    written: str | None   # the file written, or None

    def to_json(self):
        return {"written": self.written, "fingerprint": self.fingerprint}


def key_export(name: str, output: str | os.PathLike | None = None, *, store: StoreLike = None) -> KeyExported:
    """Your public key as a file for colleagues' `ledger key trust` (written to `output` if given)."""
    s = open_store(store)
    own = keys.own_keys(s)
    if name not in own:
        raise UnknownRef(f"no key named {name!r}", "see `ledger key list`")
    data = canonical.dumps(own[name].to_json()) + b"\n"
    if output:
        Path(output).write_bytes(data)
    return KeyExported(data, own[name].fingerprint, str(output) if output else None, warnings=take_warnings(s))


def key_trust(file: str | os.PathLike, *, name: str | None = None, store: StoreLike = None) -> Done:
    """Trust a colleague's public key file (or a PEM/OpenSSH ed25519 key with `name`)."""
    s = open_store(store)
    pub = keys.read_public_key_file(Path(file), name)
    keys.trust(s, pub)
    return Done({"name": pub.name, "fingerprint": pub.fingerprint}, warnings=take_warnings(s))


def key_untrust(fingerprint: str, *, store: StoreLike = None) -> Done:
    """Stop trusting a key (by fingerprint or a unique prefix of it)."""
    s = open_store(store)
    keys.untrust(s, fingerprint)
    return Done({"untrusted": fingerprint}, warnings=take_warnings(s))


def key_require(on: bool, *, store: StoreLike = None) -> Done:
    """Require (or stop requiring) a trusted signature on every bundle import and pull."""
    s = open_store(store)
    keys.set_signatures_required(s, on)
    return Done({"require_signatures": on}, warnings=take_warnings(s))
