#!/usr/bin/env bash
# Launcher overhead: `ibrun -n 8 /bin/true`, and PMI init + one fence +
# finalize over 8 ranks, against the same programs started by MPICH's hydra
# and by a plain shell loop (the cost of fork+exec alone). Uses hyperfine.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p ibcoll-launcher --bins --examples >/dev/null
IB=target/release/ibrun
FENCE=target/release/examples/pmi_fence
N=${N:-8}
command -v hyperfine >/dev/null || { echo "needs hyperfine (apt-get install hyperfine)"; exit 1; }
args=(--warmup 5 --runs "${RUNS:-50}" --export-markdown "${OUT:-/dev/stdout}" -N)
hyperfine "${args[@]}" \
  "sh -c 'for i in \$(seq $N); do /bin/true & done; wait'" \
  "$IB -n $N /bin/true" \
  "$IB -n $N $FENCE" \
  "mpiexec.mpich -n $N /bin/true" \
  "mpiexec.mpich -n $N $FENCE"
