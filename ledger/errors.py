"""One error hierarchy, rooted at LedgerError, each type carrying its exit code.

Exit codes (docs/commands.md):
  0 ok, 1 internal error, 2 usage or bad input, 3 rejected/refused by a check,
  4 store corrupt or tampered, 5 locked.

Every error renders as one line plus a hint. The CLI maps these to exit codes and
prints a traceback only when LEDGER_DEBUG=1.

Crossing a process boundary (a training child, the image's keeper, the image's socket) has one
way: the side that fails writes `e.to_json()`, the side that reads calls `LedgerError.from_json(data)`
(or `read_error_file(path)` for a file a child wrote). The reading side treats the JSON as hostile:
- its size is bounded (MAX_ERROR_JSON_BYTES) and it is only parsed as JSON, never imported or run;
- the class is looked up by name among LedgerError's subclasses, never imported by name from the
  JSON; an unknown or ambiguous name becomes InternalError (exit 1) naming the claim;
- the exit code comes from the class, never from the claimed `exit_code`;
- message and hint are cut to one printable line of at most MAX_ERROR_TEXT characters (a child
  must not be able to write terminal escapes or fake extra lines into the user's terminal);
- details keep at most MAX_ERROR_DETAILS JSON scalars (or short lists of them), cut to size;
- a caller names classes a process may not claim (`demote=`): a training child cannot report the
  parent's store as corrupt, say; such a claim becomes InternalError naming it.
"""

from __future__ import annotations

import json
import os
import signal
import stat

MAX_ERROR_JSON_BYTES = 64 * 1024  # a real error report is a few hundred bytes
MAX_ERROR_TEXT = 2000             # characters of a message or hint after reading
MAX_ERROR_DETAILS = 32            # detail entries kept after reading
_MAX_DETAIL_KEY = 64
_MAX_DETAIL_LIST = 32


class LedgerError(Exception):
    exit_code = 1
    default_hint = "rerun with LEDGER_DEBUG=1 for a traceback and report it"

    def __init__(self, message: str, hint: str | None = None, **details):
        super().__init__(message)
        self.message = message
        self.hint = hint if hint is not None else self.default_hint
        self.details = details

    def to_json(self) -> dict:
        """The error as a JSON object: what `--json` prints and what crosses a process boundary."""
        return {"error": type(self).__name__, "message": self.message, "hint": self.hint,
                "exit_code": self.exit_code, **({"details": self.details} if self.details else {})}

    @classmethod
    def from_json(cls, data: object, *, origin: str = "another process",
                  demote: tuple[type[LedgerError], ...] = ()) -> LedgerError:
        """Rebuild the typed error that `to_json()` wrote, from untrusted `data` (a dict, or its JSON
        text as str/bytes). Never raises: unreadable input gives an InternalError saying so. `origin`
        names the writer in messages about a bad report; classes under `demote` are refused."""
        if isinstance(data, (str, bytes, bytearray)):
            if len(data) > MAX_ERROR_JSON_BYTES:
                return InternalError(f"{origin} failed and its error report is larger than "
                                     f"{MAX_ERROR_JSON_BYTES} bytes; it was not read")
            try:
                data = json.loads(data)
            except (ValueError, RecursionError):
                return InternalError(f"{origin} failed and its error report is not JSON")
        if not isinstance(data, dict):
            return InternalError(f"{origin} failed and its error report is not a JSON object")
        message = _one_line(data.get("message")) or f"{origin} failed without saying why"
        hint = _one_line(data.get("hint"))
        details = _bounded_details(data.get("details"))
        name = data.get("error")
        target = _error_classes().get(name) if isinstance(name, str) else None
        claimed = _one_line(name)[:_MAX_DETAIL_KEY] if isinstance(name, str) else None
        if target is None:
            return InternalError(f"{origin} failed with an unknown error type {claimed!r}: {message}",
                                 claimed_error=claimed, **_prefixed(details))
        if demote and issubclass(target, demote):
            return InternalError(f"{origin} claimed {claimed}, which it may not report: {message}",
                                 claimed_error=claimed, **_prefixed(details))
        e = target.__new__(target)
        LedgerError.__init__(e, message, hint or None)
        e.details = details  # set whole: a detail named "message" or "hint" must not clash with the arguments
        e._restore()
        return e

    def _restore(self) -> None:
        """Re-derive attributes a subclass's constructor sets from its details (see from_json)."""


def read_error_file(path, *, origin: str = "a child process",
                    demote: tuple[type[LedgerError], ...] = ()) -> LedgerError | None:
    """The typed error a child wrote to `path` with `to_json()`, or None when it wrote none.

    The child is hostile: the file is opened without following a link and without blocking on a
    FIFO, must be a regular file, and is read up to MAX_ERROR_JSON_BYTES + 1 bytes; anything else
    is an InternalError saying what the file was (returned, like every other result)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as e:
        return InternalError(f"{origin} failed and its error report {path} could not be opened: "
                             f"{e.strerror or e} (a link or special file is never followed)")
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return InternalError(f"{origin} failed and its error report {path} is not a regular file")
        chunks, left = [], MAX_ERROR_JSON_BYTES + 1
        while left > 0:
            b = os.read(fd, left)
            if not b:
                break
            chunks.append(b)
            left -= len(b)
    except OSError as e:
        return InternalError(f"{origin} failed and its error report {path} could not be read: {e.strerror or e}")
    finally:
        os.close(fd)
    return LedgerError.from_json(b"".join(chunks), origin=origin, demote=demote)


def _error_classes() -> dict[str, type[LedgerError]]:
    """Every LedgerError subclass by class name (walked now, so subclasses defined in other modules
    count once imported); a name two classes share is left out, so it reads as unknown."""
    seen: dict[str, type[LedgerError]] = {}
    clash: set[str] = set()
    todo = [LedgerError]
    while todo:
        c = todo.pop()
        if c.__name__ in seen and seen[c.__name__] is not c:
            clash.add(c.__name__)
        seen[c.__name__] = c
        todo.extend(c.__subclasses__())
    return {k: v for k, v in seen.items() if k not in clash}


def _one_line(v: object) -> str:
    """`v` as one printable line of at most MAX_ERROR_TEXT characters ("" unless a string)."""
    if not isinstance(v, str):
        return ""
    text = "".join(c if c.isprintable() else " " for c in v[:MAX_ERROR_TEXT + 1]).strip()
    return text if len(text) <= MAX_ERROR_TEXT else text[:MAX_ERROR_TEXT - 1] + "…"


def _scalar(v: object):
    if v is None or isinstance(v, (bool, float)):
        return v
    if isinstance(v, int):
        return v if abs(v) < 1 << 63 else _one_line(str(v)[:40])  # a 64-bit range, like the store's counters
    if isinstance(v, str):
        return _one_line(v)
    return _one_line(type(v).__name__)  # nested objects are not carried across: only what kind they were


def _bounded_details(v: object) -> dict:
    if not isinstance(v, dict):
        return {}
    out = {}
    for k, x in list(v.items())[:MAX_ERROR_DETAILS]:
        key = _one_line(k)[:_MAX_DETAIL_KEY] if isinstance(k, str) else ""
        if not key:
            continue
        out[key] = [_scalar(i) for i in x[:_MAX_DETAIL_LIST]] if isinstance(x, list) else _scalar(x)
    return out


def _prefixed(details: dict) -> dict:
    """A refused report's details, kept under `reported_` names so none can pose as the parent's own."""
    return {f"reported_{k}": v for k, v in details.items()}


class InternalError(LedgerError):
    exit_code = 1


class RemoteError(LedgerError):
    """A remote could not be read or written; what moved is kept. Exit 6: the environment failed
    (unreachable, permissions, I/O), not ledger."""
    exit_code = 6
    default_hint = "check the remote's URL, credentials and reachability; rerun to resume where it stopped"


class ResourceExhausted(LedgerError):
    """A bounded resource ran out (the index's capped memory); nothing was left half-written.
    Exit 6, as for the disk: the environment's limits, not a bug of ledger's."""
    exit_code = 6
    default_hint = "the store was left as it was; free the resource and retry"


# --- 2: usage or bad input -------------------------------------------------------------
class BadInput(LedgerError):
    exit_code = 2
    default_hint = "check the input named above"


class NotAStore(BadInput):
    default_hint = "run `ledger init` here, or pass --store DIR / set LEDGER_DIR"


class UnknownRef(BadInput):
    default_hint = "see `ledger log` or `ledger gens` for valid names; ids need 8+ hex chars"


class AmbiguousRef(BadInput):
    default_hint = "give more hex characters of the id"


class SpecError(BadInput):
    default_hint = "fix the field named above in the spec"


class UnsupportedFormat(BadInput):
    default_hint = "upgrade ledger to a version that understands this store format"


# --- 3: rejected or refused by a check ---------------------------------------------------
class Rejected(LedgerError):
    exit_code = 3
    default_hint = "the check above said no; change the input and retry"


class CompileRejected(Rejected):
    default_hint = "use the nearest configuration that fits, shown above"


class Refused(Rejected):
    pass


class CycleRefused(Refused):
    """A learn cycle ran and the gate said no: HEAD is unchanged, the verdict is kept. Exit 3, like
    every refusal (`ledger run --refusal-ok` exits 0 for scripts that take a refusal as an answer)."""
    default_hint = "the verdict and its reasons are kept (`ledger log --kind refusal`); HEAD is unchanged"


class SandboxUnavailable(Refused):
    default_hint = "pass --unsandboxed to run without the sandbox (this is recorded)"


class SandboxViolation(Refused):
    """A child wrote something its parent must not read where ledger reads its outputs (a link, a
    special file, a hard link, a file over the plan's bound, an unexpected entry): the run fails,
    nothing of it is committed, and a sandbox-violation record names it (ledger/train/job.py)."""
    default_hint = ("a training child may write regular files only, within the plan's sizes; nothing from "
                    "this run is committed or resumed from (see the sandbox-violation record in `ledger log`)")


class RealizationUnavailable(Refused):
    default_hint = "compile for a target that can run here; ledger never falls back silently"


class CompileCacheRefused(Refused):
    """A compile cache (ledger/train/compile_cache.py) built for another plan shape, device or
    torch/triton/CUDA version was handed to a run: refused before anything is compiled, never
    used; details name each field that differs."""
    default_hint = ("train without it (a matching cache is looked up by itself), or build one on this machine "
                    "with these library versions")


class CapabilityTrapped(Refused):
    """A wasm capability trapped or hit a limit (fuel, time, memory, stack); details name the trap."""
    default_hint = "the capability ran out of a limit or trapped; see its manifest's [limits] and tests"


class ImageUnavailable(Refused):
    """No image (`ledger serve`) answers for this store: not started, stopped, or still paused by a
    learn cycle when the client's timeout ran out."""
    default_hint = "start one with `ledger serve` (or `ledger serve --detach`); see `ledger image status`"


# --- 4: store corrupt or tampered --------------------------------------------------------
class StoreCorrupt(LedgerError):
    exit_code = 4
    default_hint = "run `ledger verify` to see every fault"


class CorruptObject(StoreCorrupt):
    def __init__(self, oid: str, message: str | None = None, hint: str | None = None):
        super().__init__(message or f"object {oid} is corrupt: its content does not hash to its id",
                         hint or "restore it from a remote or bundle (`ledger pull`); then `ledger verify --read-data`",
                         id=oid)
        self.oid = oid

    def _restore(self) -> None:
        oid = self.details.get("id")
        self.oid = oid if isinstance(oid, str) else ""


class MissingObject(StoreCorrupt):
    def __init__(self, oid: str, message: str | None = None, hint: str | None = None):
        super().__init__(message or f"object {oid} is missing from the store",
                         hint or "restore it from a remote or bundle (`ledger pull`)", id=oid)
        self.oid = oid

    def _restore(self) -> None:
        oid = self.details.get("id")
        self.oid = oid if isinstance(oid, str) else ""


class JournalCorrupt(StoreCorrupt):
    default_hint = "the journal was edited; restore .ledger/journal from a backup or bundle"


# --- 5: locked ---------------------------------------------------------------------------
class Locked(LedgerError):
    exit_code = 5
    default_hint = "another ledger process is writing; retry, or `ledger unlock` if its holder is dead"


class JournalConflict(Locked):
    """Compare-and-append lost: another writer committed after this one read the journal."""
    default_hint = "another writer committed meanwhile; retry the command"


# What a sandboxed child (training, DPO, reproduce) may never report: it holds no lock and never
# opens the parent's store, so a claim of store corruption or of a lock is a lie or a bug.
NOT_FROM_A_CHILD: tuple[type[LedgerError], ...] = (StoreCorrupt, Locked)

EXIT_CODES = {0: "ok", 1: "internal error", 2: "usage or bad input", 3: "rejected or refused by a check",
              4: "store corrupt or tampered", 5: "locked", 6: "the environment failed"}


# --- Ctrl-C -------------------------------------------------------------------------------------
# A Ctrl-C that some library swallowed still stops the next commit (store-format.md, rule 24).
#
# Python turns SIGINT into KeyboardInterrupt, but a library that checks for signals while it works
# may consume that exception and raise an ordinary one instead: DuckDB turns it into
# RuntimeError('Query interrupted'). Any `except Exception` around such a call (the index treats
# an unreadable index as a cache to rebuild or walk around) then carries on as if the user had
# never pressed Ctrl-C, and a cycle went on to train, judge and commit. Two defences, because the
# second must not depend on finding every such library:
# - the index's DuckDB connections give the KeyboardInterrupt back at the call (store/index.py's
#   _Connection);
# - the CLI's process installs `_note_interrupt` for SIGINT: it notes the request, then raises as
#   Python's own handler does. Once noted, `check_interrupt()` raises KeyboardInterrupt again: a
#   transaction calls it before it appends its record, and the training wait loop every 0.2 s, so
#   a swallowed Ctrl-C costs at most the work up to the next commit, never a commit the user
#   asked to stop.
# A library caller that keeps Python's handler is covered by the first defence only. This lives
# here, on the floor every room may import, because the store, training and the CLI all use it.
_interrupt_requested = False


def _note_interrupt(signum, frame) -> None:
    global _interrupt_requested
    _interrupt_requested = True
    raise KeyboardInterrupt


def install_interrupt_handler() -> None:
    """Note every Ctrl-C (the CLI's process calls this), unless SIGINT is ignored (a parent asked
    for that) or another handler was installed on purpose."""
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _note_interrupt)


def interrupt_requested() -> bool:
    """Whether a Ctrl-C reached this process through the installed handler."""
    return _interrupt_requested


def check_interrupt() -> None:
    """Raise KeyboardInterrupt if a Ctrl-C was noted, whatever became of the first one."""
    if _interrupt_requested:
        raise KeyboardInterrupt
