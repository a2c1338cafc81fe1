#!/usr/bin/env bash
# Launcher overhead: `ibrun -n 8 /bin/true`, and PMI init + one fence +
# finalize over 8 ranks, against the same programs started by MPICH's hydra
# and by a plain shell loop (the cost of fork+exec alone); then the same at
# 64, 256 and 512 ranks, and a 512-rank `pmi_check ring` job (put, fence,
# two gets, fence). Uses hyperfine.
#   N=8 RUNS=50          the first table
#   SCALE=0              skip the scale table; SCALE_RUNS=5 its runs
#   BASE=DIR             also time DIR/ibrun (and DIR/examples/pmi_fence),
#                        e.g. another checkout's target/release, in each table
#   OUT=FILE OUT_SCALE=FILE   markdown tables (default: stdout)
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p ibcoll-launcher --bins --examples >/dev/null
IB=target/release/ibrun
FENCE=target/release/examples/pmi_fence
CHECK=target/release/examples/pmi_check
N=${N:-8}
BASE=${BASE:-}
command -v hyperfine >/dev/null || { echo "needs hyperfine (apt-get install hyperfine)"; exit 1; }
args=(--warmup 5 --runs "${RUNS:-50}" --export-markdown "${OUT:-/dev/stdout}" -N)
cmds=(
  "sh -c 'for i in \$(seq $N); do /bin/true & done; wait'"
  "$IB -n $N /bin/true"
  "$IB -n $N $FENCE"
)
[ -n "$BASE" ] && cmds+=("$BASE/ibrun -n $N /bin/true" "$BASE/ibrun -n $N $BASE/examples/pmi_fence")
cmds+=("mpiexec.mpich -n $N /bin/true" "mpiexec.mpich -n $N $FENCE")
hyperfine "${args[@]}" "${cmds[@]}"

[ "${SCALE:-1}" = 0 ] && exit 0
scale=()
for n in 64 256 512; do
  scale+=("$IB -n $n /bin/true")
  [ -n "$BASE" ] && scale+=("$BASE/ibrun -n $n /bin/true")
done
scale+=("$IB -n 512 $FENCE")
[ -n "$BASE" ] && scale+=("$BASE/ibrun -n 512 $BASE/examples/pmi_fence")
scale+=("$IB -n 512 $CHECK ring")
hyperfine --warmup 1 --runs "${SCALE_RUNS:-5}" --export-markdown "${OUT_SCALE:-/dev/stdout}" -N \
  "${scale[@]}"
