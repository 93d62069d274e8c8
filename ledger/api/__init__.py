"""The porcelain: one function per verb the `ledger` CLI offers, for Python users and for the CLI.

    from ledger import api
    api.init("project")
    api.add("data/train.jsonl", kind="dataset", name="train", store="project")
    res = api.run_cycle(api.LearnOptions(min_hours=0), store="project")
    print(res.to_json())

Every verb takes `store=`: a Store, a store folder (DIR or DIR/.ledger), or None for the store
found from the current folder or any parent (like git; LEDGER_DIR when set). Every verb returns a
frozen dataclass (a `Result`) whose `to_json()` is exactly what `ledger VERB --json` prints
(schemas: docs/json.md); `warnings` holds what the store warned about on the way, and
`failure()` the error the CLI raises after printing the result (a training run stopped by a
non-finite loss, a reproduction that diverged, a cycle that was not due, ...): a Python caller
may raise it or read the result. Errors are LedgerError subclasses (ledger/errors.py). The verbs
are listed in docs/store-api.md.

The CLI (ledger/cli/) calls only this package: it parses arguments and renders results.

Why the verbs live in submodules, loaded on first use (`api.log` imports ledger.api.journal):
each verb's result is a frozen dataclass, and creating the ~50 of them costs ~30 ms (measured
with `python -X importtime`), and the domain modules behind every verb ~0.5 s, while `ledger log
-n 20` takes ~0.06 s in all and `ledger --help` ~0.05 s. So `from ledger import api` loads this
file only; a submodule, with its domain modules imported at its top, loads when one of its names
is first used. VERBS below is that map (tests/cli/test_api.py checks it against the submodules).
"""

from __future__ import annotations

import importlib

# Names of ledger.api's shared parts, also loaded on first use: even the Result base class and
# the options (four dataclasses) cost `ledger --help` a few ms it does not need.
SHARED: dict[str, tuple[str, ...]] = {
    "ledger.api._base": ("MAX_INLINE_BYTES", "Result", "Wrapped", "human_bytes"),
    "ledger.options": ("LearnOptions", "ServeOptions"),
}

# submodule -> the public names it defines (verbs, their results, constants)
VERBS: dict[str, tuple[str, ...]] = {
    "about": (
        "version",
    ),
    "adoption": (
        "Adopted", "adopt",
    ),
    "capabilities": (
        "CapabilityAdmitted", "capability_add", "Granted", "capability_grant", "Called", "capability_call",
        "Capabilities", "capability_list",
    ),
    "experience": (
        "Recorded", "read_text", "record", "Exported", "export",
    ),
    "gate": (
        "Sealed", "Restored", "seal", "seal_restore", "write_demo_suite", "Judged", "judge", "DpoTrained",
        "dpo", "Reported", "report", "report_html",
    ),
    "generations": (
        "RolledBack", "rollback", "CheckedOut", "checkout",
    ),
    "history": (
        "Gens", "gens", "Diff", "diff",
    ),
    "image": (
        "ImageStatus", "serve", "Acted", "act", "image_status", "image_stop",
    ),
    "journal": (
        "RECEIPT_RECORDS", "Log", "log", "last_record",
    ),
    "charts": (
        "sparkline",
    ),
    "kernels": (
        "Kernels", "kernel_list", "KernelRecorded", "KernelGated", "kernel_build", "kernel_test",
        "kernel_bench", "kernel_gate",
    ),
    "learn": (
        "Cycle", "run_cycle", "genesis", "Answers", "answer", "FIXTURE_PACKAGE", "fixture_install_command",
        "real_model_fixture",
    ),
    "outcomes": (
        "Outcome", "outcome",
    ),
    "plans": (
        "Targets", "targets", "Compiled", "compile", "plan_ref",
    ),
    "runlist": (
        "RUN_FIELDS", "RunsResult", "runs", "csv_cell",
    ),
    "sharing": (
        "BundleWritten", "Imported", "Pulled", "BundleListing", "bundle_create", "bundle_import", "bundle_ls",
        "Remote", "Remotes", "Done", "remote_add", "remote_list", "remote_remove", "Pushed", "push", "pull",
        "Fetched", "fetch", "Repaired", "repair", "KeyCreated", "key_create", "Keys", "key_list",
        "KeyExported", "key_export", "key_trust", "key_untrust", "key_require",
    ),
    "store": (
        "Initialised", "init", "Added", "tree_size", "add", "Catted", "cat", "Shown", "show", "read_json",
        "Verified", "verify", "Collected", "gc", "Repacked", "repack", "QueryResult", "query", "Rebuilt",
        "index_rebuild",
        "Unlocked", "unlock",
    ),
    "training": (
        "Trained", "train", "parse_override", "Reproduced", "reproduce", "ImportedBase", "import_base",
    ),
}
_WHERE = {name: f"ledger.api.{module}" for module, names in VERBS.items() for name in names}
_WHERE.update({name: module for module, names in SHARED.items() for name in names})

__all__ = sorted(_WHERE)


def __getattr__(name: str):
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'ledger.api' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value   # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
