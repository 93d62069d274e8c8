"""Adapters from training frameworks to `ledger.track` (docs/tracking.md).

`ledger.integrations.transformers.LedgerCallback` for a Hugging Face `Trainer`;
`ledger.integrations.lightning.LedgerLogger` for a Lightning `Trainer`. Each is a thin shell over a
tracked run: the framework's logged scalars become metrics, its hyper-parameters the run's params.
"""
