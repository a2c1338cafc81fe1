#!/usr/bin/env bash
# Before/after: this tree's ibcoll-bench against the one of another commit,
# REPS interleaved repetitions, 2 ranks pinned one per core, median (min-max)
# per benchmark and size, and the ratio after/before of the medians.
#
#   benches/ab.sh REV [REPS]          (default 5)
#   env: AFTER=REV2 compares REV with REV2 instead of this tree;
#        BENCHES="latency allreduce bcast barrier ..." (default: latency and
#        bw, and every collective), SIZES="8 65536 1048576", NP=2, LAUNCH=
#        extra ibrun options (e.g. "--nodes 2" for tcp between two virtual
#        nodes)
#
# REV is built in target/ab/<rev> (a git worktree, release profile) so its
# binaries never mix with this tree's.
set -euo pipefail
cd "$(dirname "$0")/.."
REV=${1:?usage: benches/ab.sh REV [REPS]}
REPS=${2:-5}
NP=${NP:-2}
SIZES=${SIZES:-"8 65536 1048576"}
BENCHES=${BENCHES:-"latency bw barrier bcast reduce allreduce gather gatherv scatter scatterv allgather allgatherv alltoall alltoallv reduce_scatter reduce_scatter_block scan exscan"}
read -r -a LAUNCH <<<"${LAUNCH:-}"
OUT=target/ab/out
SHA=$(git rev-parse --short "$REV")
OLD=target/ab/$SHA
mkdir -p "$OUT" target/ab
rm -f "$OUT"/*.txt

. benches/rev.sh
build_rev "$SHA" "$OLD"
NEW=.
NEW_NAME="$(git rev-parse --short HEAD) (working tree)"
if [ -n "${AFTER:-}" ]; then
  ASHA=$(git rev-parse --short "$AFTER")
  NEW=target/ab/$ASHA
  NEW_NAME=$ASHA
  build_rev "$ASHA" "$NEW"
else
  cargo build --release -q -p ibcoll-benches -p ibcoll-launcher
fi

one() { # which bench size rep
  local dir=$NEW f="$OUT/$1.$2.$3.$4.txt" bind=()
  [ "$1" = before ] && dir=$OLD
  [ "$NP" -le "$(nproc)" ] && bind=(--bind-to core)
  timeout 300 "$dir/target/release/ibrun" -n "$NP" "${bind[@]}" "${LAUNCH[@]}" \
    "$dir/target/release/ibcoll-bench" "$2" -m "$3:$3" >"$f" 2>&1 || echo "# failed" >>"$f"
}

for b in $BENCHES; do
  for size in $SIZES; do
    [ "$b" = barrier ] && [ "$size" != "${SIZES%% *}" ] && continue
    for rep in $(seq "$REPS"); do
      # Alternate which goes first, so neither always gets the warmer cache.
      if [ $((rep % 2)) = 1 ]; then one before "$b" "$size" "$rep"; one after "$b" "$size" "$rep";
      else one after "$b" "$size" "$rep"; one before "$b" "$size" "$rep"; fi
    done
  done
done

python3 - "$OUT" "$SHA" "$NEW_NAME" "$REPS" <<'PYEOF'
import glob, os, statistics, sys
out, old, new, reps = sys.argv[1:5]
data = {}
for f in glob.glob(os.path.join(out, "*.txt")):
    which, bench, size, _ = os.path.basename(f)[:-len(".txt")].split(".")
    for line in open(f):
        p = line.split()
        if len(p) >= 2 and not line.startswith("#") and p[0].isdigit():
            data.setdefault((bench, int(size)), {}).setdefault(which, []).append(float(p[1]))
            break
print(f"# before = {old}, after = {new}, {reps} interleaved repetitions")
print("# bw in MB/s (higher is better), everything else in us; ratio = after/before of the medians")
print(f"{'benchmark':<22}{'size':>9}  {'before':>22}  {'after':>22}  ratio")
fmt = lambda v: f"{statistics.median(v):.3f} ({min(v):.3f}-{max(v):.3f})" if v else "-"
for (bench, size) in sorted(data):
    d = data[(bench, size)]
    b, a = d.get("before", []), d.get("after", [])
    r = statistics.median(a) / statistics.median(b) if a and b and statistics.median(b) > 0 else float("nan")
    print(f"{bench:<22}{size:>9}  {fmt(b):>22}  {fmt(a):>22}  {r:.2f}")
PYEOF
