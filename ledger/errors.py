"""One error hierarchy, rooted at LedgerError, each type carrying its exit code.

Exit codes (DESIGN.md, CLI contract):
  0 ok, 1 internal error, 2 usage or bad input, 3 rejected/refused by a check,
  4 store corrupt or tampered, 5 locked.

Every error renders as one line plus a hint. The CLI maps these to exit codes and
prints a traceback only when LEDGER_DEBUG=1.
"""

from __future__ import annotations


class LedgerError(Exception):
    exit_code = 1
    default_hint = "rerun with LEDGER_DEBUG=1 for a traceback and report it"

    def __init__(self, message: str, hint: str | None = None, **details):
        super().__init__(message)
        self.message = message
        self.hint = hint if hint is not None else self.default_hint
        self.details = details

    def to_json(self) -> dict:
        return {"error": type(self).__name__, "message": self.message, "hint": self.hint,
                "exit_code": self.exit_code, **({"details": self.details} if self.details else {})}


class InternalError(LedgerError):
    exit_code = 1


class RemoteError(LedgerError):
    """A remote (directory or S3) could not be read or written; what moved is kept."""
    exit_code = 1
    default_hint = "check the remote's URL, credentials and reachability; rerun to resume where it stopped"


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


class SandboxUnavailable(Refused):
    default_hint = "pass --unsandboxed to run without the sandbox (this is recorded)"


class RealizationUnavailable(Refused):
    default_hint = "compile for a target that can run here; ledger never falls back silently"


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


class MissingObject(StoreCorrupt):
    def __init__(self, oid: str, message: str | None = None, hint: str | None = None):
        super().__init__(message or f"object {oid} is missing from the store",
                         hint or "restore it from a remote or bundle (`ledger pull`)", id=oid)
        self.oid = oid


class JournalCorrupt(StoreCorrupt):
    default_hint = "the journal was edited; restore .ledger/journal from a backup or bundle"


# --- 5: locked ---------------------------------------------------------------------------
class Locked(LedgerError):
    exit_code = 5
    default_hint = "another ledger process is writing; retry, or `ledger unlock` if its holder is dead"


EXIT_CODES = {0: "ok", 1: "internal error", 2: "usage or bad input", 3: "rejected or refused by a check",
              4: "store corrupt or tampered", 5: "locked"}
