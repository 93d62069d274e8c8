"""The Hugging Face Trainer callback and the Lightning logger, in real (tiny) training runs."""

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def _tiny_llama():
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=32)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg)


class _Repeat(torch.utils.data.Dataset):
    """One short sequence over and over: a model learns it in a few steps, so the loss falls."""

    def __len__(self):
        return 64

    def __getitem__(self, i):
        ids = torch.tensor([1, 5, 9, 13, 17, 21, 25, 29] * 2)
        return {"input_ids": ids, "labels": ids.clone()}


def test_trainer_callback_logs_a_real_trainer_run(store, tmp_path):
    from ledger.integrations.transformers import LedgerCallback

    torch.set_num_threads(1)
    cb = LedgerCallback("hf-tiny", store=store, params={"dataset": "repeat"})
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=12, learning_rate=3e-3,
                                          per_device_train_batch_size=4, logging_steps=1, report_to=[],
                                          save_strategy="no", use_cpu=True, seed=3, disable_tqdm=True)
    trainer = transformers.Trainer(model=_tiny_llama(), args=args, train_dataset=_Repeat(), callbacks=[cb])
    trainer.train()
    [end] = [r for r in store.journal.scan().records if r["kind"] == "track"]
    body = store.get_json(end["payload"]["receipt"])
    assert body["trainer"] == "tracked" and body["status"] == "finished"
    assert body["params"]["learning_rate"] == 3e-3 and body["params"]["seed"] == 3
    assert body["params"]["per_device_train_batch_size"] == 4 and body["params"]["dataset"] == "repeat"
    assert body["seeds"] == {"seed": 3}
    assert len(body["losses"]) == 12 and body["losses"][-1] < body["losses"][0]
    assert body["rung"] == "Learned"
    assert "learning_rate" in body["metrics"]["final"] and "torch" in body["versions"]


def test_lightning_logger_logs_a_real_lightning_run(store):
    lightning = pytest.importorskip("lightning")
    from ledger.integrations.lightning import LedgerLogger

    torch.set_num_threads(1)

    class Regress(lightning.LightningModule):
        def __init__(self):
            super().__init__()
            self.save_hyperparameters({"lr": 0.1, "width": 4})
            self.lin = torch.nn.Linear(4, 1)

        def training_step(self, batch, _):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.lin(x), y)
            self.log("train_loss", loss, on_step=True)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)

    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 4, generator=g)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8)
    trainer = lightning.Trainer(logger=LedgerLogger("pl-tiny", store=store), max_epochs=3, log_every_n_steps=1,
                                enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                                accelerator="cpu", devices=1)
    trainer.fit(Regress(), loader)
    [end] = [r for r in store.journal.scan().records if r["kind"] == "track"]
    body = store.get_json(end["payload"]["receipt"])
    assert body["status"] == "finished" and body["params"] == {"lr": 0.1, "width": 4}
    assert len(body["losses"]) == 24 and body["rung"] == "Learned"
