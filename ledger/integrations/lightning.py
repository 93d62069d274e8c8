"""A Lightning logger that writes a Lightning `Trainer` run into a tracked run.

    from ledger.integrations.lightning import LedgerLogger
    trainer = lightning.Trainer(logger=LedgerLogger("resnet-sweep"), max_epochs=3)
    trainer.fit(model, loader)   # the run ends when Lightning finalizes the logger

`log_hyperparams` becomes the run's params (it must come before the first metric: Lightning calls
it at the start of `fit`); `log_metrics` becomes metrics at Lightning's step. `finalize("success")`
ends the run as finished, any other status as failed.
"""

from __future__ import annotations

from argparse import Namespace

from lightning.pytorch.loggers.logger import Logger, rank_zero_experiment
from lightning.pytorch.utilities import rank_zero_only

from ledger.errors import BadInput
from ledger.train.track import Run, track


class LedgerLogger(Logger):
    """Lightning logger backed by `ledger.track`."""

    def __init__(self, name: str, *, store=None, loss: str = "train_loss", params: dict | None = None):
        super().__init__()
        self._name, self._store, self._loss = name, store, loss
        self._params: dict = dict(params or {})
        self._run: Run | None = None

    @property
    def name(self) -> str:
        return self._name

    @property
    def version(self) -> str:
        return self._run.id if self._run is not None and self._run.id else "pending"

    @property
    @rank_zero_experiment
    def experiment(self) -> Run | None:
        """The tracked run once it has started (at the first metric), else None. Lightning reads
        this before it logs the hyper-parameters, so reading it must not start the run."""
        return self._run

    def _started(self) -> Run:
        if self._run is None:
            self._run = track(self._name, params=self._params, store=self._store, loss=self._loss)
            self._run.__enter__()
        return self._run

    @rank_zero_only
    def log_hyperparams(self, params, *args, **kwargs) -> None:
        if isinstance(params, Namespace):
            params = vars(params)
        flat = {str(k): (v if isinstance(v, (bool, int, float, str)) or v is None else str(v))
                for k, v in dict(params).items()}
        if self._run is not None:
            # params are bound when the run starts; a later call would change nothing honestly
            raise BadInput("log_hyperparams after the run started", "log hyper-parameters before the first metric")
        self._params.update(flat)

    @rank_zero_only
    def log_metrics(self, metrics: dict, step: int | None = None) -> None:
        values = {k: float(v) for k, v in metrics.items() if k != "epoch"}
        if values:
            self._started().log(int(step or 0), **values)

    @rank_zero_only
    def finalize(self, status: str) -> None:
        if self._run is None:
            return
        run, self._run = self._run, None
        if status == "success":
            run.__exit__(None, None, None)
        else:
            err = RuntimeError(f"lightning finished with status {status!r}")
            run.__exit__(RuntimeError, err, None)
