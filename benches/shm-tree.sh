#!/usr/bin/env bash
# Where the shared-memory fast paths should switch from flat to the 4-ary
# tree (IBCOLL_SHM_TREE_MIN), measured on this machine: every fast path that
# has a tree, at each rank count, once flat and once with the tree, REPS
# interleaved repetitions, medians (min-max) of ibcoll-bench's average
# latency, the ratio tree / flat, and the smallest rank count from which the
# tree wins for every collective (the value to give IBCOLL_SHM_TREE_MIN, or
# to compare with what `auto` picks: 16 with a CPU per rank, never when
# oversubscribed).
#
#   benches/shm-tree.sh [REPS]          (default 5)
#   env: NPS="4 8 16" ranks on this node (bound one per core up to the
#        number of CPUs, oversubscribed above), COLLS="barrier bcast reduce
#        allreduce gather scatter", SIZES="8 4096", OUT=target/shm-tree
#
# The flat and tree runs of one cell alternate, the first of the pair
# rotating, so neither always runs after the other.
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${1:-5}
NPS=${NPS:-"4 8 16"}
COLLS=${COLLS:-"barrier bcast reduce allreduce gather scatter"}
SIZES=${SIZES:-"8 4096"}
OUT=${OUT:-target/shm-tree}
rm -rf "$OUT"
mkdir -p "$OUT"
cargo build --release -q -p ibcoll-benches -p ibcoll-launcher
NCPU=$(nproc)
echo "shm-tree: $NCPU CPUs, load before $(cut -d' ' -f1-3 /proc/loadavg)"

one() { # shape np coll size rep
  local shape=$1 np=$2 coll=$3 size=$4 min bind=()
  [ "$np" -le "$NCPU" ] && bind=(--bind-to core)
  # 2 is the smallest value the variable takes; u32::MAX keeps it flat.
  if [ "$shape" = tree ]; then min=2; else min=4294967295; fi
  IBCOLL_SHM_TREE_MIN=$min timeout 300 target/release/ibrun -n "$np" "${bind[@]}" \
    target/release/ibcoll-bench "$coll" -m "$size:$size" \
    >"$OUT/$shape.$np.$coll.$size.$5.txt" 2>&1 ||
    echo "# failed" >>"$OUT/$shape.$np.$coll.$size.$5.txt"
}

for np in $NPS; do
  for coll in $COLLS; do
    for size in $SIZES; do
      [ "$coll" = barrier ] && [ "$size" != "${SIZES%% *}" ] && continue
      for rep in $(seq "$REPS"); do
        if [ $((rep % 2)) = 1 ]; then order="flat tree"; else order="tree flat"; fi
        for shape in $order; do one "$shape" "$np" "$coll" "$size" "$rep"; done
      done
    done
  done
done
echo "shm-tree: load after $(cut -d' ' -f1-3 /proc/loadavg)"

python3 - "$OUT" "$NCPU" <<'PYEOF'
import glob, os, re, statistics, sys
out, ncpu = sys.argv[1], int(sys.argv[2])
data = {}
for f in glob.glob(os.path.join(out, "*.txt")):
    shape, np, coll, size, _rep, _ = os.path.basename(f).split(".")
    text = open(f).read()
    if "# failed" in text:
        print(f"shm-tree: {f} failed", file=sys.stderr)
        continue
    for line in text.splitlines():
        m = re.match(r"\s*(\d+)\s+([\d.]+)", line)
        if m and (m.group(1) == size or coll == "barrier"):
            data.setdefault((int(np), coll, int(size), shape), []).append(float(m.group(2)))
def cell(v):
    return f"{statistics.median(v):.2f} ({min(v):.2f}-{max(v):.2f})"
print("| ranks | collective | size (B) | flat (us) | tree (us) | tree / flat |")
print("|---:|---|---:|---:|---:|---:|")
wins = {}
for key in sorted({k[:3] for k in data}):
    f, t = data.get(key + ("flat",)), data.get(key + ("tree",))
    if not f or not t:
        continue
    r = statistics.median(t) / statistics.median(f)
    wins.setdefault(key[0], []).append(r < 1.0)
    over = " (oversubscribed)" if key[0] > ncpu else ""
    print(f"| {key[0]}{over} | {key[1]} | {key[2]} | {cell(f)} | {cell(t)} | {r:.2f} |")
nps = sorted(wins)
first = next((n for i, n in enumerate(nps) if all(all(wins[m]) for m in nps[i:])), None)
if first is None:
    print(f"\nshm-tree: flat won a cell at every rank count measured ({', '.join(map(str, nps))}): "
          "keep the tree off at these sizes (IBCOLL_SHM_TREE_MIN above the largest)")
else:
    print(f"\nshm-tree: the tree won every cell from {first} ranks on: IBCOLL_SHM_TREE_MIN={first}")
PYEOF
