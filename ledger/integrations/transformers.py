"""A `transformers.TrainerCallback` that logs a Hugging Face `Trainer` into a tracked run.

    from ledger.integrations.transformers import LedgerCallback
    trainer = Trainer(model=model, args=args, train_dataset=ds, callbacks=[LedgerCallback("sft-r16")])
    trainer.train()          # the run starts at on_train_begin and ends at on_train_end

The run's params are the TrainingArguments that decide the result (learning rate, batch sizes,
epochs/steps, seed, scheduler, precision) plus the model's name and, for a peft model, its LoRA
settings; every scalar the Trainer logs (loss, learning_rate, grad_norm, eval_*) becomes a metric
at the Trainer's global step. With `save_model=True` the final model folder is stored as an artifact.
"""

from __future__ import annotations

import tempfile

from transformers import TrainerCallback

from ledger.train.track import Run, track

ARG_FIELDS = ("learning_rate", "per_device_train_batch_size", "gradient_accumulation_steps", "num_train_epochs",
              "max_steps", "seed", "data_seed", "lr_scheduler_type", "warmup_steps", "weight_decay", "bf16", "fp16",
              "optim", "max_grad_norm")


def _lora(model) -> dict:
    cfg = getattr(model, "peft_config", None)
    if not cfg:
        return {}
    c = next(iter(cfg.values()))
    # peft keeps target_modules as a set: sort it, so equal settings give equal params
    targets = c.target_modules
    targets = sorted(targets) if isinstance(targets, (set, frozenset, list, tuple)) else targets
    return {"r": c.r, "alpha": c.lora_alpha, "lora_dropout": c.lora_dropout, "target_modules": targets}


class LedgerCallback(TrainerCallback):
    """Log a `Trainer` run into the ledger as a tracked run named `name`."""

    def __init__(self, name: str, *, store=None, params: dict | None = None, loss: str = "loss",
                 save_model: bool = False, data: dict | None = None):
        self.name, self.store, self.extra, self.loss = name, store, dict(params or {}), loss
        self.save_model, self.data = save_model, dict(data or {})
        self.run: Run | None = None

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if not state.is_world_process_zero:
            return
        params = {k: getattr(args, k) for k in ARG_FIELDS if hasattr(args, k)}
        if model is not None:
            params["model"] = getattr(getattr(model, "config", None), "_name_or_path", None) or type(model).__name__
            params.update(_lora(model))
        params.update(self.extra)
        self.run = track(self.name, params=params, seeds={"seed": args.seed}, loss=self.loss, store=self.store,
                         data=self.data)
        self.run.__enter__()

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.run is None or not logs:
            return
        # numbers only (the Trainer also logs strings such as a run's total_flos text); a
        # non-finite loss is kept, as a gap, and denies the run the Learned rung
        scalars = {k: float(v) for k, v in logs.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        if scalars:
            self.run.log(state.global_step, **scalars)

    def on_train_end(self, args, state, control, model=None, **kwargs):
        if self.run is None:
            return
        run, self.run = self.run, None
        try:
            if self.save_model and model is not None:
                with tempfile.TemporaryDirectory() as d:
                    model.save_pretrained(d)
                    run.artifact(d, name="model")
        except BaseException as e:
            run.__exit__(type(e), e, e.__traceback__)
            raise
        run.__exit__(None, None, None)
