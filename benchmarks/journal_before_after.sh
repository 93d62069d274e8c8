#!/bin/bash
# The journal before issue 18 (commit $OLD) against the working tree, on copies of one synthetic
# store, one command after the other. Produces RESULTS.md's "Journal at scale" before/after table.
#   benchmarks/journal_before_after.sh [N=1000000] [OLD=0c04a7b] [DIR=/tmp/journal-ba]
set -e
N=${1:-1000000}; OLD=${2:-0c04a7b}; DIR=${3:-/tmp/journal-ba}
HERE=$(cd "$(dirname "$0")/.." && pwd); PY=$HERE/.venv/bin/python
export OMP_NUM_THREADS=1
mkdir -p $DIR/old
[ -d $DIR/old/ledger ] || git -C $HERE archive $OLD ledger | tar -x -C $DIR/old
[ -d $DIR/new ] || (cd $HERE && $PY benchmarks/synth_journal.py $DIR/new $N)
[ -d $DIR/oldstore ] || cp -a $DIR/new $DIR/oldstore
t() { /usr/bin/time -f "$1: %e s wall %U s user %M KiB" "${@:2}" >/dev/null 2>$DIR/err || true; tail -1 $DIR/err; }
tx="from ledger.store import Store
s = Store.open('.ledger')
with s.transaction('t') as tx: tx.payload['x'] = 1"
for who in old new; do
  if [ $who = old ]; then pp=$DIR/old; st=$DIR/oldstore; else pp=$HERE; st=$DIR/new; fi
  cd $st
  for i in 0 1 2 3; do t "$who tx $i (0: the first writer re-checks once)" env PYTHONPATH=$pp $PY -c "$tx"; done
  rm -f .ledger/refs.json
  for i in 1 2; do t "$who show n5, refs.json deleted, read $i" env PYTHONPATH=$pp $PY -m ledger.cli.main show n5; done
  t "$who verify (old: always full)" env PYTHONPATH=$pp $PY -m ledger.cli.main verify
  if [ $who = new ]; then
    t "new verify --full" env PYTHONPATH=$pp $PY -m ledger.cli.main verify --full
    env PYTHONPATH=$pp $PY -m ledger.cli.main add /etc/hostname >/dev/null 2>&1
    for i in 1 2 3; do t "new verify (incremental after one add)" env PYTHONPATH=$pp $PY -m ledger.cli.main verify; done
  fi
done
