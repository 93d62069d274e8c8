"""The training child: `python -m ledger.train.child WORKDIR` runs the SFT recipe (train/sft.py).

It runs inside the sandbox (ledger.sandbox), granted only WORKDIR/inputs (read) and WORKDIR/out
and WORKDIR/scratch (read-write). It reads the job the parent wrote, trains, and writes everything
it produced into out/; it never opens the store. Its contract with the parent (ledger/train/job.py,
which reads out/ as hostile: no links, regular files only, sizes bounded by the plan):

  inputs/job.json      plan body, paths of base / dataset / checkpoint to resume from
  out/progress.jsonl   one JSON line per optimizer step (step, loss, tokens/s), flushed
  out/checkpoints/step-NNNNNNNN/   complete checkpoints (see artefacts/checkpoint.py)
  out/adapter/         adapter_model.safetensors + adapter_config.json (finite runs only)
  out/final/           the end-of-run checkpoint (optimizer, RNG, cursor)
  out/result.json      losses, counters, timings, memory, versions, stop reason
  out/error.json       a typed error (then the exit code is 3)
"""

from __future__ import annotations

import sys

from ledger.train import recipe, sft


def main(argv: list[str]) -> int:
    return recipe.child_main(argv, "ledger.train.child", sft.SftRecipe)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
