#!/usr/bin/env bash
# The MPI C interface's cost, side by side: the same OSU 5.3 sources
# (osu_latency, osu_bw, osu_allreduce, osu_bcast, osu_alltoall) built with
# ibcoll-mpicc (on libibcoll_mpi), mpicc.openmpi and mpicc.mpich; and the
# C layer's own cost: ibcoll-bench next to benches/mpi/osu_p2p.c and
# osu_coll.c (the same loops as ibcoll-bench, in C) built with ibcoll-mpicc,
# same sizes. 2 ranks pinned to cores 0 and 1, REPS repetitions
# interleaved; prints medians (min-max) (us; bw in MB/s) as two markdown tables.
#
#   benches/capi-compare.sh [REPS] [realapps folder]     (default 5)
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${1:-5}
APPS=${2:-../shared/realapps}
OUT=target/capi-compare
rm -rf "$OUT"
mkdir -p "$OUT/raw" "$OUT/bin"
# Libraries and binaries (not --bins alone: a clean tree would then have no
# libibcoll_mpi to link).
cargo build --release -q -p ibcoll-benches -p ibcoll-launcher -p ibcoll-capi
S=$APPS/osu-micro-benchmarks/mpi
for impl in ibcoll openmpi mpich; do
  case $impl in
    ibcoll) CC=target/release/ibcoll-mpicc ;;
    openmpi) CC=mpicc.openmpi ;;
    mpich) CC=mpicc.mpich ;;
  esac
  for p in latency bw; do
    $CC -O2 -I"$S/pt2pt" -o "$OUT/bin/osu_$p.$impl" "$S/pt2pt/osu_$p.c" "$S/pt2pt/osu_pt2pt.c"
  done
  for c in allreduce bcast alltoall; do
    $CC -O2 -I"$S/collective" -o "$OUT/bin/osu_$c.$impl" "$S/collective/osu_$c.c" "$S/collective/osu_coll.c" -lm
  done
done
target/release/ibcoll-mpicc -O2 -Wno-stringop-overflow -o "$OUT/bin/cport_p2p" benches/mpi/osu_p2p.c
target/release/ibcoll-mpicc -O2 -o "$OUT/bin/cport_coll" benches/mpi/osu_coll.c -lm
IBRUN=(target/release/ibrun -n 2 --bind-to core)
run_one() { # impl bench rep
  local impl=$1 b=$2 rep=$3 f="$OUT/raw/$1.$2.$3.txt" args=()
  case $b in latency | bw) ;; *) args=(-m 1:1048576) ;; esac
  case $impl in
    bench) "${IBRUN[@]}" target/release/ibcoll-bench "$b" -m "${args[1]:-0:1048576}" >"$f" ;;
    # OSU 5.3's collective loops end every timed call with a barrier;
    # ibcoll-bench does so with --barrier (osu_latency has no barrier).
    benchb) case $b in latency | bw) return 0 ;; esac
            "${IBRUN[@]}" target/release/ibcoll-bench "$b" --barrier -m 1:1048576 >"$f" ;;
    cport) case $b in
             latency | bw) "${IBRUN[@]}" "$OUT/bin/cport_p2p" "$b" -m "${args[1]:-0:1048576}" >"$f" ;;
             *) "${IBRUN[@]}" "$OUT/bin/cport_coll" "$b" -m 1:1048576 >"$f" ;;
           esac ;;
    ibcoll) "${IBRUN[@]}" "$OUT/bin/osu_$b.ibcoll" "${args[@]}" >"$f" ;;
    openmpi) mpirun.openmpi --allow-run-as-root --bind-to core -np 2 "$OUT/bin/osu_$b.openmpi" "${args[@]}" >"$f" 2>/dev/null ;;
    mpich) mpiexec.mpich -np 2 -bind-to core "$OUT/bin/osu_$b.mpich" "${args[@]}" >"$f" 2>/dev/null ;;
  esac
}
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
for rep in $(seq 1 "$REPS"); do
  for b in latency bw allreduce bcast alltoall; do
    for impl in bench benchb cport ibcoll openmpi mpich; do run_one "$impl" "$b" "$rep"; done
  done
done
echo "capi-compare: $REPS repetitions interleaved; load average before $LOAD_BEFORE, after $(cut -d' ' -f1-3 /proc/loadavg)"
echo
python3 - "$OUT" "$REPS" <<'PY'
import glob, statistics, sys, collections
out, reps = sys.argv[1], int(sys.argv[2])
data = collections.defaultdict(list)
for f in glob.glob(f"{out}/raw/*.txt"):
    impl, bench, rep, _ = f.split("/")[-1].split(".")
    for line in open(f):
        p = line.split()
        if len(p) >= 2 and p[0].isdigit():
            try:
                data[(bench, impl, int(p[0]))].append(float(p[1]))
            except ValueError:
                pass
sizes = {"latency": [0, 8, 1024, 65536, 1048576], "bw": [8, 1024, 65536, 1048576],
         "allreduce": [8, 1024, 65536, 1048576],
         "bcast": [8, 1024, 65536, 1048576], "alltoall": [8, 1024, 65536, 1048576]}
def cell(v):
    return f"{statistics.median(v):.2f} ({min(v):.2f}-{max(v):.2f})" if v else "-"
def med(v):
    return statistics.median(v) if v else None
def ratio(a, b):
    return f"{med(a) / med(b):.2f}" if a and b and med(b) > 0 else "-"
# Bandwidth (MB/s) is better higher: its ratios are taken the other way,
# so that every ratio reads as the C layer's (or ibcoll's) time over the other's.
def tratio(bench, a, b):
    return ratio(b, a) if bench == "bw" else ratio(a, b)
print("C layer's cost: the same loops in Rust (ibcoll-bench) and in C on libibcoll_mpi;")
print("OSU 5.3 against ibcoll-bench with OSU's loop (--barrier: a barrier after every timed")
print("collective call; osu_latency's and osu_bw's loops are ibcoll-bench's). Latency rows in us,")
print("bw rows in MB/s; every ratio is a time ratio (for bw: Rust's MB/s over C's)")
print()
print("| benchmark | bytes | ibcoll-bench | C port on libibcoll_mpi | C port / Rust | ibcoll-bench --barrier | OSU 5.3 on libibcoll_mpi | OSU / Rust (same loop) |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
for b, ss in sizes.items():
    for s in ss:
        r, c, o = data.get((b, "bench", s), []), data.get((b, "cport", s), []), data.get((b, "ibcoll", s), [])
        rb = r if b in ("latency", "bw") else data.get((b, "benchb", s), [])
        print(f"| {b} | {s} | {cell(r)} | {cell(c)} | {tratio(b, c, r)} | {cell(rb)} | {cell(o)} | {tratio(b, o, rb)} |")
print()
print("OSU 5.3, the same sources on three MPI libraries")
print()
print("| benchmark | bytes | libibcoll_mpi | Open MPI | MPICH | ibcoll / Open MPI | ibcoll / MPICH |")
print("|---|---:|---:|---:|---:|---:|---:|")
for b, ss in sizes.items():
    for s in ss:
        r = {i: data.get((b, i, s), []) for i in ("ibcoll", "openmpi", "mpich")}
        print(f"| {b} | {s} | {cell(r['ibcoll'])} | {cell(r['openmpi'])} | {cell(r['mpich'])} | {tratio(b, r['ibcoll'], r['openmpi'])} | {tratio(b, r['ibcoll'], r['mpich'])} |")
PY
