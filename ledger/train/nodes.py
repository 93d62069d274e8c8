"""Node agents for `[train] nodes = N`: N torchrun agents meeting at one c10d rendezvous.

    python -E -m ledger.train.nodes --nodes N --nproc-per-node D --endpoint HOST:PORT --id RUN -- CMD...

Each agent is `torchrun --nnodes=N --nproc-per-node=D --rdzv-backend=c10d` at the same endpoint
and id, so the N x D ranks form one world whose node ranks the rendezvous assigns (GROUP_RANK in
each worker). Here all N agents run on this host and reach each other over loopback -- the form
CI tests on the CPU (gloo) and the one `ledger train` starts: the sandbox then runs this
launcher, its agents and their ranks in a network namespace of loopback alone
(ledger.sandbox.privileges.loopback_net), so the rendezvous and the collectives can reach this
host and nothing else. Agent 0 hosts the rendezvous store (`is_host`), the others connect to it,
and every agent names itself 127.0.0.1 (`--local-addr`), so the workers' MASTER_ADDR is loopback
too.

It runs UNconfined, with ledger's authority, like torchrun itself (ledger.train.run.torchrun):
it reads none of the run's inputs. Lifetimes: the sandbox's bootstrap armed this process to die
with ledger; each agent is armed (PR_SET_PDEATHSIG) to die with this process; each rank dies with
its agent. Failures: no restarts; when one agent exits with an error, the others are stopped
(SIGTERM, then SIGKILL after 10 s) so no node waits at a collective for a peer that is gone, and
this process exits with the first failure's status. torchrun's own failure summary stays on
stderr (ledger.train.run._last_words quotes it).

Stdlib only: it is started with `python -E` and must not load the sandbox's audit hook.
"""

from __future__ import annotations

import argparse
import ctypes
import signal
import subprocess
import sys
import time

_PR_SET_PDEATHSIG = 1


def agent_argv(*, nodes: int, nproc: int, endpoint: str, run_id: str, host: bool, argv: list[str]) -> list[str]:
    """One node's torchrun: c10d rendezvous at `endpoint` under `run_id`, no restarts."""
    return [sys.executable, "-E", "-m", "torch.distributed.run", f"--nnodes={nodes}", f"--nproc-per-node={nproc}",
            "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}", f"--rdzv-id={run_id}",
            f"--rdzv-conf=is_host={'true' if host else 'false'},join_timeout=120",
            "--local-addr=127.0.0.1", "--max-restarts=0", "--monitor-interval=0.1", "--no-python", *argv]


def _die_with_parent() -> None:
    # preexec_fn, which docs/sandbox.md warns against in a multi-threaded parent: this process is
    # a fresh single-threaded interpreter (exec'd by the sandbox's --launcher), so no lock can be
    # held by another thread at fork time.
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, ctypes.c_ulong(signal.SIGKILL), ctypes.c_ulong(0),
                                            ctypes.c_ulong(0), ctypes.c_ulong(0))


def main(args: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m ledger.train.nodes")
    ap.add_argument("--nodes", type=int, required=True)
    ap.add_argument("--nproc-per-node", type=int, required=True)
    ap.add_argument("--endpoint", required=True)
    ap.add_argument("--id", required=True)
    ap.add_argument("argv", nargs=argparse.REMAINDER)
    ns = ap.parse_args(args)
    argv = ns.argv[1:] if ns.argv[:1] == ["--"] else ns.argv
    if ns.nodes < 1 or ns.nproc_per_node < 1 or not argv:
        ap.error("--nodes and --nproc-per-node must be >= 1, and a command must follow --")
    agents = [subprocess.Popen(agent_argv(nodes=ns.nodes, nproc=ns.nproc_per_node, endpoint=ns.endpoint,
                                          run_id=ns.id, host=i == 0, argv=argv), preexec_fn=_die_with_parent)
              for i in range(ns.nodes)]
    first_failure = None
    try:
        while True:
            codes = [a.poll() for a in agents]
            failed = [c for c in codes if c not in (None, 0)]
            if failed:
                first_failure = failed[0]
                break
            if all(c == 0 for c in codes):
                return 0
            time.sleep(0.1)
    finally:
        _stop(agents)
    print(f"ledger.train.nodes: a node agent exited with status {first_failure}; the other nodes were stopped",
          file=sys.stderr)
    return first_failure if 0 < first_failure < 256 else 1


def _stop(agents) -> None:
    """SIGTERM every agent still running (torchrun then stops its ranks), SIGKILL after 10 s."""
    live = [a for a in agents if a.poll() is None]
    for a in live:
        a.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 10
    for a in live:
        try:
            a.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            a.kill()
            a.wait()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
