#!/usr/bin/env bash
# Startup at scale: init + barrier + finalize of N ranks, oversubscribed on
# this machine, ibcoll (as virtual nodes of 2 ranks, and on one node) next
# to Open MPI (mpirun --oversubscribe, one node), REPS interleaved
# repetitions, medians (min-max). Per N: wall time, CPU seconds per rank
# (user + system of the whole job, launcher included, divided by N), and
# from ibcoll's IBCOLL_STATS lines the PMI gets, connections and peak RSS
# per rank (medians over ranks); the growth factor of each from one N to
# the next. Written as a section of docs/PERFORMANCE.md.
#
#   benches/scale.sh [REPS]      (default 3)
#   env: VNODES="16 64 256 512" RING="16 64 256 512" ONENODE="16 64 128"
#        OMPI="16 64 256 512"
#        OMPI_TIMEOUT=300 DOC=docs/PERFORMANCE.md
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${1:-3}
VNODES=${VNODES:-"16 64 256 512"}
ONENODE=${ONENODE:-"16 64 128"}
RING=${RING:-"16 64 256 512"}
OMPI=${OMPI:-"16 64 256 512"}
OMPI_TIMEOUT=${OMPI_TIMEOUT:-300}
DOC=${DOC:-docs/PERFORMANCE.md}
OUT=target/scale
mkdir -p "$OUT" target/mpi
rm -f "$OUT"/*.txt
cargo build --release -q -p ibcoll-launcher -p ibcoll --examples
mpicc.openmpi -O2 -o target/mpi/hello_openmpi benches/mpi/hello.c
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)

# Appends "wall user sys" (seconds) as the first line of $f, then the output.
timed() { # file timeout cmd...
  local f=$1 to=$2; shift 2
  local t0 t1
  t0=$(date +%s.%N)
  if /usr/bin/time -f "%U %S" -o "$f.time" timeout -k 10 "$to" "$@" >"$f.out" 2>&1; then
    t1=$(date +%s.%N)
    echo "$(awk "BEGIN{print $t1 - $t0}") $(cat "$f.time")" >"$f"
  else
    echo "fail $to" >"$f"
  fi
  cat "$f.out" >>"$f"; rm -f "$f.out" "$f.time"
}

for rep in $(seq "$REPS"); do
  for n in $VNODES; do
    timed "$OUT/vnodes.$n.$rep.txt" 600 target/release/ibrun -n "$n" --nodes $((n / 2)) -x IBCOLL_STATS=1 \
      target/release/examples/scale_check barrier
  done
  # A program whose ranks talk to two peers each (a ring exchange instead
  # of the barrier): its cost per rank must not grow with N.
  for n in $RING; do
    timed "$OUT/ring.$n.$rep.txt" 600 target/release/ibrun -n "$n" --nodes $((n / 2)) -x IBCOLL_STATS=1 \
      target/release/examples/scale_check ring
  done
  for n in $ONENODE; do
    timed "$OUT/onenode.$n.$rep.txt" 600 target/release/ibrun -n "$n" -x IBCOLL_STATS=1 \
      target/release/examples/scale_check barrier
  done
  for n in $OMPI; do
    timed "$OUT/openmpi.$n.$rep.txt" "$OMPI_TIMEOUT" mpirun.openmpi --allow-run-as-root --oversubscribe \
      --mca mpi_yield_when_idle 1 -np "$n" target/mpi/hello_openmpi
  done
done
LOAD_AFTER=$(cut -d' ' -f1-3 /proc/loadavg)

python3 - "$OUT" "$DOC" "$REPS" "$LOAD_BEFORE" "$LOAD_AFTER" "$OMPI_TIMEOUT" <<'PYEOF'
import glob, os, re, statistics, sys, datetime
out, doc, reps, lb, la, ompi_to = sys.argv[1:7]
runs = {}
for f in glob.glob(os.path.join(out, "*.txt")):
    kind, n, _ = os.path.basename(f).split(".")[:3]
    lines = open(f).read().splitlines()
    head = lines[0].split()
    r = runs.setdefault((kind, int(n)), [])
    if head[0] == "fail":
        r.append(None)
        continue
    wall, user, sys_ = map(float, head)
    st = [l for l in lines if l.startswith("ibcoll stats: ")]
    def per_rank(pat):
        v = [int(m.group(1)) for l in st for m in [re.search(pat, l)] if m]
        return statistics.median(v) if v else None
    conns = [sum(int(x) for x in re.findall(r"(?:shm|tcp|rdma)=(\d+)", l.split("(dialed")[0])) for l in st]
    r.append(dict(wall=wall, cpu=(user + sys_) / int(n), gets=per_rank(r"gets=(\d+)"),
                  conns=statistics.median(conns) if conns else None, rss=per_rank(r"peak rss=(\d+)")))

def med(vals):
    vals = [v for v in vals if v is not None]
    if not vals:
        return None, None, None
    return statistics.median(vals), min(vals), max(vals)

def fmt(m, digits=2):
    v, lo, hi = m
    if v is None:
        return "-"
    if lo == hi:
        return f"{v:.{digits}f}"
    return f"{v:.{digits}f} ({lo:.{digits}f}-{hi:.{digits}f})"

rows = []
label = {"vnodes": "ibcoll, virtual nodes of 2", "ring": "ibcoll ring exchange (2 peers), virtual nodes of 2",
         "onenode": "ibcoll, one node", "openmpi": "Open MPI, one node"}
for kind in ["vnodes", "ring", "onenode", "openmpi"]:
    ns = sorted(n for k, n in runs if k == kind)
    prev = None
    for n in ns:
        rs = runs[(kind, n)]
        ok = [r for r in rs if r]
        failed = len(rs) - len(ok)
        wall = med([r["wall"] for r in ok])
        cpu = med([r["cpu"] for r in ok])
        gets = med([r["gets"] for r in ok])
        conns = med([r["conns"] for r in ok])
        rss = med([r["rss"] for r in ok])
        grow = ""
        if prev and cpu[0] and prev[0]:
            grow = f"{cpu[0] / prev[0]:.2f}"
        wall_s = fmt(wall) if ok else f"> {ompi_to} (timeout)"
        if failed and ok:
            wall_s += f", {failed} of {len(rs)} timed out"
        rows.append(f"| {label[kind]} | {n} | {wall_s} | {fmt((cpu[0]*1e3 if cpu[0] else None, cpu[1]*1e3 if cpu[1] else None, cpu[2]*1e3 if cpu[2] else None), 1)} | {grow} | {fmt(gets, 0)} | {fmt(conns, 0)} | {fmt((rss[0]/1024 if rss[0] else None, rss[1]/1024 if rss[1] else None, rss[2]/1024 if rss[2] else None), 1)} |")
        prev = cpu
table = "\n".join(rows)
section = f"""<!-- scale:begin -->
## Startup at scale (`benches/scale.sh`)

{datetime.date.today()}, {reps} interleaved repetitions, medians (min-max); load average before {lb}, after {la}; 2 cores, every job oversubscribed.
Init + one barrier + finalize (the ring rows: init + a neighbour exchange + finalize, a program whose ranks talk to two peers). CPU per rank = user + system time of the whole job (launcher and daemons included) / N;
growth = CPU per rank at N over the N before; gets, connections and peak RSS per rank from `IBCOLL_STATS` (median over ranks; ibcoll only).

| job | N | wall (s) | CPU per rank (ms) | growth | PMI gets per rank | connections per rank | peak RSS per rank (MiB) |
|---|---|---|---|---|---|---|---|
{table}
<!-- scale:end -->"""
text = open(doc).read() if os.path.exists(doc) else ""
if "<!-- scale:begin -->" in text:
    text = re.sub(r"<!-- scale:begin -->.*?<!-- scale:end -->", section, text, flags=re.S)
else:
    text = text.rstrip() + "\n\n" + section + "\n"
open(doc, "w").write(text)
print(section)
PYEOF
