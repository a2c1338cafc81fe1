#!/usr/bin/env bash
# The nonblocking point-to-point path of the MPI C interface against
# ibcoll's own Rust API, timed in interleaved runs: `ibcoll-bench bw` (a
# window of 64 isend/irecv in a scope, wait_all, a 4-byte ack), OSU 5.3's
# osu_bw built with ibcoll-mpicc (the same loop: 64 MPI_Isend/MPI_Irecv,
# MPI_Waitall, ack), and benches/mpi/osu_p2p.c bw (ibcoll-bench's loop in
# C). 2 ranks pinned to cores 0 and 1; each repetition runs the three (and
# osu_bw on BASE's library) back to back, seconds apart (this VM switches
# between a fast and a slow state every few seconds: compare within a
# repetition). Prints the best and median MB/s over the repetitions, and
# the median of the per-repetition ratios ibcoll-bench / C program (above
# 1: the C interface is slower).
#
#   benches/capi-bw.sh [REPS] [realapps folder]     (default 10)
#   env: BASE=dir: also run osu_bw on the libibcoll_mpi.so in dir (an older
#        build: LD_LIBRARY_PATH over the binary's RUNPATH)
#        SIZES="8 1024": the sizes in the table
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${1:-10}
APPS=${2:-../shared/realapps}
SIZES=${SIZES:-"1 8 64 1024 8192"}
OUT=target/capi-bw
rm -rf "$OUT"
mkdir -p "$OUT/raw" "$OUT/bin"
cargo build --release -q -p ibcoll-benches -p ibcoll-launcher -p ibcoll-capi
S=$APPS/osu-micro-benchmarks/mpi
R=target/release
"$R/ibcoll-mpicc" -O2 -I"$S/pt2pt" -o "$OUT/bin/osu_bw" "$S/pt2pt/osu_bw.c" "$S/pt2pt/osu_pt2pt.c"
"$R/ibcoll-mpicc" -O2 -Wno-stringop-overflow -o "$OUT/bin/cport_p2p" benches/mpi/osu_p2p.c
IBRUN=("$R/ibrun" -n 2 --bind-to core)
impls="bench osu cport"
[ -n "${BASE:-}" ] && impls="$impls osubase"
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
for rep in $(seq 1 "$REPS"); do
  for impl in $impls; do
    f="$OUT/raw/$impl.$rep.txt"
    case $impl in
      bench) "${IBRUN[@]}" "$R/ibcoll-bench" bw -m 1:8192 >"$f" ;;
      osu) "${IBRUN[@]}" "$OUT/bin/osu_bw" >"$f" ;;
      cport) "${IBRUN[@]}" "$OUT/bin/cport_p2p" bw -m 1:8192 >"$f" ;;
      osubase) LD_LIBRARY_PATH=$BASE "${IBRUN[@]}" "$OUT/bin/osu_bw" >"$f" ;;
    esac
  done
done
echo "capi-bw: $REPS repetitions interleaved; load average before $LOAD_BEFORE, after $(cut -d' ' -f1-3 /proc/loadavg)"
echo
python3 - "$OUT" "$REPS" "$SIZES" "$impls" <<'PY'
import collections, glob, statistics, sys
out, reps, sizes, impls = sys.argv[1], int(sys.argv[2]), [int(s) for s in sys.argv[3].split()], sys.argv[4].split()
data = collections.defaultdict(dict)  # (impl, size) -> {rep: MB/s}
for f in glob.glob(f"{out}/raw/*.txt"):
    impl, rep = f.split("/")[-1].split(".")[:2]
    for line in open(f):
        p = line.split()
        if len(p) >= 2 and p[0].isdigit():
            try:
                data[(impl, int(p[0]))][int(rep)] = float(p[1])
            except ValueError:
                pass
names = {"bench": "ibcoll-bench", "osu": "osu_bw", "cport": "C port", "osubase": "osu_bw, BASE library"}
print("MB/s, best (highest) / median over the repetitions; ratios: ibcoll-bench / the C program, "
      "median over the repetitions of the ratio within each (first-third quartile)")
print()
print("| bytes | " + " | ".join(names[i] for i in impls) + " | "
      + " | ".join(f"ibcoll-bench / {names[i]}" for i in impls[1:]) + " |")
print("|---:|" + "---:|" * (2 * len(impls) - 1))
def q(v):
    if len(v) < 2:
        return f"{v[0]:.2f}" if v else "-"
    qs = statistics.quantiles(v, n=4)
    return f"{statistics.median(v):.2f} ({qs[0]:.2f}-{qs[2]:.2f})"
for s in sizes:
    cells = []
    for i in impls:
        v = list(data.get((i, s), {}).values())
        cells.append(f"{max(v):.2f} / {statistics.median(v):.2f}" if v else "-")
    ratios = []
    b = data.get(("bench", s), {})
    for i in impls[1:]:
        o = data.get((i, s), {})
        ratios.append(q([b[r] / o[r] for r in b if r in o and o[r] > 0]))
    print(f"| {s} | " + " | ".join(cells) + " | " + " | ".join(ratios) + " |")
PY
