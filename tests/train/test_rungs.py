"""One rung function for SFT and DPO receipts (ledger.train.receipt.rung_of): a rung is claimed
only with the evidence of every rung below it."""

from ledger.train.receipt import rung_of

FELL = [3.0, 2.9, 2.5, 2.0, 1.5, 1.2, 1.0, 0.9, 0.8, 0.7]


def _result(steps, stopped=None, losses=FELL):
    return {"steps_done": steps, "stopped": stopped, "losses": losses, "counters": {"optimizer_steps": steps}}


def test_a_finished_run_whose_loss_fell_learned():
    rung, ev = rung_of(_result(10), {"adapter": "b3:" + "a" * 64}, 10)
    assert rung == "Learned" and list(ev) == ["Emitted", "Ran", "Learned"]
    assert ev["Ran"] == {"optimizer_steps": 10, "all_losses_finite": True} and ev["Learned"]["fell"]


def test_sft_evidence_names_the_checkpoint_and_the_steps_done():
    rung, ev = rung_of(_result(4, losses=[1.0, 1.0]), {"final_checkpoint": "b3:" + "c" * 64}, 4, steps_done=4)
    assert rung == "Ran" and ev["Ran"] == {"optimizer_steps": 4, "steps_done": 4, "all_losses_finite": True}


def test_a_stopped_dpo_run_ran_when_it_took_a_step():
    """DPO writes no adapter when a non-finite loss stops it; its receipt (adapter null, stopped)
    is what it emitted, so it is at Ran after a step and at Emitted on the first (as SFT)."""
    stop = {"reason": "non-finite loss", "step": 3, "loss": None}
    assert rung_of(_result(2, stop), {"adapter": None}, 2)[0] == "Ran"
    assert rung_of(_result(0, stop, []), {"adapter": None}, 0)[0] == "Emitted"
    rung, ev = rung_of(_result(5, stop), {"adapter": None}, 5)
    assert rung == "Ran" and ev["Ran"]["all_losses_finite"] is False  # stopped: never Learned


def test_never_ran_without_emitting():
    assert rung_of(_result(10), None, 10) == ("Checked", {})
