#!/usr/bin/env bash
# Collectives across simulated hosts (../shared/hosts/: network namespaces
# h1..h9 with their own hostnames, tcp over veth between them, shared memory
# inside each): ibcoll (`ibrun --hosts ADDR:P,... --rsh nsrsh`) vs Open MPI
# (`plm_rsh_agent nsrsh`, yielding), REPS interleaved repetitions, median
# (min-max) of the average call latency, written as a section of
# docs/PERFORMANCE.md (between markers; the rest is kept).
#
#   benches/compare-hosts.sh [REPS]     (default 3; the hosts must be up)
#   env: SHAPES="2x1 2x2 4x2" hosts x ranks per host (up to 9 hosts;
#        8x1 and 8x2 reach the multi-leader rules, from 8 nodes),
#        COLLS="barrier bcast ...", SIZES="8 65536 1048576", DOC=file,
#        IBX="VAR=VAL ..." extra variables exported to the ibcoll ranks
#        (e.g. IBCOLL_ALLREDUCE_ALGORITHM=ring to measure one algorithm),
#        ALGS="node_aware ring": also run ibcoll with each algorithm forced
#        (IBCOLL_<COLL>_ALGORITHM; skipped where the collective lacks it),
#        interleaved with the others, as extra columns,
#        TAG=name: keep the results under target/compare-hosts/TAG and
#        write no doc section (for measuring rules side by side),
#        PLOT=file.png (default $OUT/ratios.png): the ibcoll/Open MPI ratios
#        as bars (ibcoll-bench plot-ratios)
#
# Neither side is pinned (every host would pin its first rank to core 0 of
# the same machine). Open MPI yields when idle; ibcoll runs as it is.
# MPICH is not run: its ranks reach each other through shared memory
# between the namespaces (../shared/hosts/README.md), so it would not
# measure a network.
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${1:-3}
SHAPES=${SHAPES:-"2x1 2x2 4x2"}
COLLS=${COLLS:-"barrier bcast reduce allreduce gather gatherv scatter scatterv allgather allgatherv alltoall alltoallv reduce_scatter reduce_scatter_block scan exscan"}
SIZES=${SIZES:-"8 65536 1048576"}
DOC=${DOC:-docs/PERFORMANCE.md}
H=${IBCOLL_HOSTS_DIR:-$PWD/../shared/hosts}
H=$(cd "$H" && pwd)
IBX=${IBX:-}
TAG=${TAG:-}
ALGS=${ALGS:-}
OUT=target/compare-hosts${TAG:+/$TAG}
PLOT=${PLOT:-$OUT/ratios.png}
ADDRS=(10.251.0.11 10.251.0.12 10.251.0.13 10.251.0.14 10.251.0.15 10.251.0.16 10.251.0.17 10.251.0.18 10.251.0.19)
mkdir -p "$OUT" target/mpi
[ -x "$H/nsrsh" ] || { echo "compare-hosts: $H/nsrsh not found" >&2; exit 1; }
for s in $SHAPES; do
  nh=${s%x*}
  for i in $(seq 0 $((nh - 1))); do
    ip netns list 2>/dev/null | grep -qw "h$((i + 1))" ||
      { echo "compare-hosts: host h$((i + 1)) is not up ($H/hosts-up.sh $nh)" >&2; exit 1; }
  done
done
for f in "$OUT"/*.txt; do
  [ -e "$f" ] || continue
  for s in $SHAPES; do [ "$(basename "$f" | cut -d. -f2)" = "$s" ] && rm -f "$f"; done
done

cargo build --release -q -p ibcoll-benches -p ibcoll-launcher
# ibcoll-info lists the algorithms that ALGS= may force: built from this tree too.
cargo build --release -q -p ibcoll --bin ibcoll-info
mpicc.openmpi -O2 -o target/mpi/osu_coll_openmpi benches/mpi/osu_coll.c -lm
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
XS=()
for v in $IBX; do XS+=(-x "$v"); done

# Fewer iterations for large data keep a run of every shape and size under
# a few minutes per repetition; the averages still cover 20+ calls.
iters() { case $1 in 8) echo "1000 100" ;; 65536) echo "200 20" ;; *) echo "40 5" ;; esac; }

one() { # impl shape coll size rep
  local impl=$1 shape=$2 coll=$3 size=$4 f="$OUT/$1.$2.$3.$4.$5.txt"
  local nh=${shape%x*} ppn=${shape#*x} hl="" np it wu
  np=$((nh * ppn))
  read -r it wu < <(iters "$size")
  : >"$OUT/hostfile.$shape"
  for i in $(seq 0 $((nh - 1))); do
    hl+="${hl:+,}${ADDRS[$i]}:$ppn"
    echo "${ADDRS[$i]} slots=$ppn" >>"$OUT/hostfile.$shape"
  done
  local env=()
  case $impl in ibcoll~*)
    local alg=${impl#ibcoll~} var
    var=IBCOLL_$(echo "$coll" | tr a-z A-Z)_ALGORITHM
    env=(-x "$var=$alg"); impl=ibcoll ;;
  esac
  case $impl in
    ibcoll) timeout 300 target/release/ibrun --timeout 280 --rsh "$H/nsrsh" -n "$np" --hosts "$hl" \
      "${XS[@]}" "${env[@]}" "$PWD/target/release/ibcoll-bench" "$coll" -m "$size:$size" -i "$it" -x "$wu" >"$f" 2>&1 ;;
    openmpi) timeout 300 mpirun.openmpi --allow-run-as-root --hostfile "$OUT/hostfile.$shape" -np "$np" \
      --bind-to none --mca plm_rsh_agent "$H/nsrsh" --mca btl_tcp_if_include 10.251.0.0/24 \
      --mca oob_tcp_if_include 10.251.0.0/24 --mca mpi_yield_when_idle 1 \
      "$PWD/target/mpi/osu_coll_openmpi" "$coll" -m "$size:$size" -i "$it" -x "$wu" >"$f" 2>/dev/null ;;
  esac || echo "# failed: $impl $shape $coll $size" >>"$f"
}

for shape in $SHAPES; do
  for coll in $COLLS; do
    for size in $SIZES; do
      [ "$coll" = barrier ] && [ "$size" != "$(echo $SIZES | cut -d' ' -f1)" ] && continue
      for rep in $(seq "$REPS"); do
        for impl in ibcoll $(for a in $ALGS; do
            target/release/ibcoll-info 2>/dev/null | grep -q "IBCOLL_$(echo "$coll" | tr a-z A-Z)_ALGORITHM .*[ ,]$a[,) ]" && echo "ibcoll~$a"
          done) openmpi; do one $impl "$shape" "$coll" "$size" "$rep"; done
      done
    done
  done
done
LOAD_AFTER=$(cut -d' ' -f1-3 /proc/loadavg)
grep -h "^# failed" "$OUT"/*.txt >&2 || true

python3 - "$OUT" "$DOC" "$REPS" "$LOAD_BEFORE" "$LOAD_AFTER" "$(nproc)" "$TAG" "$IBX" <<'PYEOF'
import glob, os, re, statistics, sys, datetime
out, doc, reps, lb, la, ncpu, tag, ibx = sys.argv[1:9]
data = {}
for f in glob.glob(os.path.join(out, "*.txt")):
    impl, shape, coll, size, rep = os.path.basename(f)[:-4].split(".")
    impl = impl.replace("~", " ")
    for line in open(f):
        m = re.match(r"^(\d+)\s+([\d.]+)", line)
        if m:
            data.setdefault((shape, coll, int(size) if coll != "barrier" else 0), {}).setdefault(impl, []).append(float(m.group(2)))
def cell(v):
    if not v: return "-"
    return f"{statistics.median(v):.1f} ({min(v):.1f}-{max(v):.1f})"
def order(s):
    h, p = s.split("x")
    return (int(h) * int(p), int(h))
lines = ["<!-- compare-hosts:begin -->",
         "# Collectives across simulated hosts: ibcoll vs Open MPI",
         "",
         f"Generated by `benches/compare-hosts.sh` on {datetime.date.today()} ({ncpu} CPUs shared by every host),",
         f"{reps} repetitions interleaved; each cell is the median (min-max) over repetitions of the average",
         "call latency in us (`ibcoll-bench <collective>` / `benches/mpi/osu_coll.c`; bytes per rank, floats",
         "for reductions). Hosts are the network namespaces of `../shared/hosts/` (tcp over veth between",
         "them, shared memory inside); ibcoll starts with `ibrun --hosts ADDR:P,... --rsh nsrsh`, Open MPI",
         "4.1 with `plm_rsh_agent nsrsh` and `mpi_yield_when_idle 1`, neither pinned. Shapes are hosts x",
         f"ranks per host. Load average before {lb}, after {la}." + (f" ibcoll ran with `{ibx}`." if ibx else ""),
         "The last column is ibcoll's median over Open MPI's (<= 1.00 meets the target).",
         ""]
extra = sorted({i for d in data.values() for i in d if i.startswith("ibcoll ")})
for shape in sorted({k[0] for k in data}, key=order):
    head = "| collective | size (B) | ibcoll | " + "".join(f"{e} | " for e in extra) + "Open MPI | ibcoll / Open MPI |"
    lines += [f"## {shape} ({order(shape)[0]} ranks)", "", head, "|---|---:|" + "---:|" * (len(extra) + 3)]
    for (s, coll, size) in sorted(k for k in data if k[0] == shape):
        d = data[(s, coll, size)]
        ratio = f"{statistics.median(d['ibcoll']) / statistics.median(d['openmpi']):.2f}" if d.get("ibcoll") and d.get("openmpi") else "-"
        lines.append(f"| {coll} | {size} | {cell(d.get('ibcoll'))} | " + "".join(f"{cell(d.get(e))} | " for e in extra) + f"{cell(d.get('openmpi'))} | {ratio} |")
    lines.append("")
lines.append("<!-- compare-hosts:end -->")
# The same medians as ratios, one bar a line, for ibcoll-bench plot-ratios.
with open(os.path.join(out, "ratios.tsv"), "w") as t:
    t.write("# panel\tlabel\tseries\tratio (ibcoll median / Open MPI median)\n")
    for (s, coll, size) in sorted(data, key=lambda k: (order(k[0]), k[1], k[2])):
        d = data[(s, coll, size)]
        for impl in ["ibcoll"] + extra:
            r = statistics.median(d[impl]) / statistics.median(d["openmpi"]) if d.get(impl) and d.get("openmpi") else None
            t.write(f"{s}\t{coll} {size} B\t{impl} / Open MPI\t" + (f"{r:.3f}\n" if r else "-\n"))
block = "\n".join(lines) + "\n"
if not tag:
    text = open(doc).read() if os.path.exists(doc) else ""
    if "<!-- compare-hosts:begin -->" in text:
        text = re.sub(r"<!-- compare-hosts:begin -->.*?<!-- compare-hosts:end -->\n?", block, text, flags=re.S)
    else:
        text = text.rstrip("\n") + "\n\n" + block
    open(doc, "w").write(text)
print(block)
PYEOF
target/release/ibcoll-bench plot-ratios "$OUT/ratios.tsv" --out "$PLOT" \
  --title "ibcoll / Open MPI across simulated hosts, median call latency (below 1: ibcoll faster)"
echo "compare-hosts: drew $PLOT"
