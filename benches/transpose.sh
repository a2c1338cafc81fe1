#!/usr/bin/env bash
# The transpose protocols side by side: `ibcoll-bench transpose` and the same
# kernel against Open MPI (benches/mpi/transpose.c, built here with
# mpicc.openmpi), ROUNDS runs of each alternated, every grid shape of NP
# ranks; writes one section of docs/PERFORMANCE.md (between markers named
# by LABEL; the rest is kept) and prints it.
#
#   benches/transpose.sh [ROUNDS]          (default 3)
#   env: NP=8, SIZE=64 (N of the N^3 array), ITERS=10 (repetitions per
#        protocol and run), HOSTS=10.251.0.11:2,10.251.0.12:2,... (ranks over
#        the simulated hosts of ../shared/hosts: ibrun --hosts --rsh nsrsh,
#        Open MPI with a hostfile and nsrsh), LABEL (the section's name),
#        DOC=docs/PERFORMANCE.md
#
# One node: ibrun as it is, Open MPI with --oversubscribe when NP > CPUs
# (which makes it yield). Hosts: Open MPI yields (mpi_yield_when_idle), tcp
# on 10.251.0.0/24, no binding (../shared/hosts/README.md).
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
NP=${NP:-8}
SIZE=${SIZE:-64}
ITERS=${ITERS:-10}
HOSTS=${HOSTS:-}
H=${IBCOLL_HOSTS_DIR:-../shared/hosts}
DOC=${DOC:-docs/PERFORMANCE.md}
if [ -n "$HOSTS" ]; then
  LABEL=${LABEL:-"$NP ranks on $(echo "$HOSTS" | tr ',' '\n' | wc -l) simulated hosts"}
else
  LABEL=${LABEL:-"$NP ranks on one node"}
fi
KEY=$(echo "$LABEL" | tr -c 'A-Za-z0-9\n' '-')
OUT=target/transpose
mkdir -p "$OUT" target/mpi
rm -f "$OUT/$KEY".*.txt
cargo build --release -q -p ibcoll-benches -p ibcoll-launcher
mpicc.openmpi -O2 -o target/mpi/transpose_openmpi benches/mpi/transpose.c -lm
ARGS=(--size "$SIZE" -i "$ITERS")
if [ -n "$HOSTS" ]; then
  HF=$OUT/$KEY.hostfile
  echo "$HOSTS" | tr ',' '\n' | sed 's/:\(.*\)/ slots=\1/' >"$HF"
  IB=(target/release/ibrun --timeout 300 -n "$NP" --hosts "$HOSTS" --rsh "$H/nsrsh")
  OM=(mpirun.openmpi --allow-run-as-root -np "$NP" --hostfile "$HF" --mca plm_rsh_agent "$H/nsrsh"
      --mca btl_tcp_if_include 10.251.0.0/24 --mca oob_tcp_if_include 10.251.0.0/24
      --mca mpi_yield_when_idle 1)
else
  IB=(target/release/ibrun --timeout 300 -n "$NP")
  OM=(mpirun.openmpi --allow-run-as-root -np "$NP")
  [ "$NP" -gt "$(nproc)" ] && OM+=(--oversubscribe)
fi
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
for r in $(seq "$ROUNDS"); do
  timeout 300 "${IB[@]}" "$PWD/target/release/ibcoll-bench" transpose "${ARGS[@]}" >"$OUT/$KEY.ibcoll.$r.txt" 2>&1 \
    || { echo "transpose.sh: ibcoll run $r failed:"; cat "$OUT/$KEY.ibcoll.$r.txt"; exit 1; }
  timeout 300 "${OM[@]}" "$PWD/target/mpi/transpose_openmpi" "${ARGS[@]}" >"$OUT/$KEY.openmpi.$r.txt" 2>&1 \
    || { echo "transpose.sh: Open MPI run $r failed:"; cat "$OUT/$KEY.openmpi.$r.txt"; exit 1; }
done
LOAD_AFTER=$(cut -d' ' -f1-3 /proc/loadavg)

python3 - "$OUT" "$KEY" "$LABEL" "$DOC" "$ROUNDS" "$NP" "$SIZE" "$ITERS" "$LOAD_BEFORE" "$LOAD_AFTER" "$(nproc)" <<'PYEOF'
import glob, os, re, statistics as st, sys, datetime
out, key, label, doc, rounds, np_, size, iters, lb, la, ncpu = sys.argv[1:12]
IMPLS = (("ibcoll", "ibcoll"), ("openmpi", "Open MPI"))
# data[impl][grid][protocol] = [median of each round], n[grid] = N
data, nsize, grids = {}, {}, []
for impl, _ in IMPLS:
    for f in sorted(glob.glob(os.path.join(out, f"{key}.{impl}.*.txt"))):
        grid = None
        for line in open(f):
            m = re.match(r"^# grid (\S+): rows of .*N = (\d+)", line)
            if m:
                grid = m.group(1); nsize[grid] = m.group(2)
                if grid not in grids: grids.append(grid)
                continue
            m = re.match(r"^  (\S+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+[\d.]+$", line)
            if m and grid:
                data.setdefault(impl, {}).setdefault(grid, {}).setdefault(m.group(1), []).append(float(m.group(2)))
def times(impl, g):  # protocol -> median over rounds of its per-run median
    return {p: st.median(v) for p, v in data.get(impl, {}).get(g, {}).items()}
def summary(t):
    s = sorted(t.items(), key=lambda kv: kv[1]); v = [x for _, x in s]; b = v[0]
    w = "/".join(str(sum(x <= b * (1 + f) for x in v)) for f in (0.01, 0.05, 0.25))
    return (f"{len(v)} | {b:.0f} | {(st.mean(v) - b) / b:.3f} | {(st.median(v) - b) / b:.3f} | "
            f"{(v[-1] - b) / b:.3f} | {w} | {', '.join(p for p, _ in s[:3])}")
def best_per_round(impl, g):
    d = data.get(impl, {}).get(g, {})
    return [min(d, key=lambda p: d[p][r]) for r in range(min(len(x) for x in d.values()))], \
           [min(d[p][r] for p in d) for r in range(min(len(x) for x in d.values()))]
L = [f"<!-- transpose:{key}:begin -->", f"### {label}", "",
     f"`benches/transpose.sh {rounds}` on {datetime.date.today()} ({ncpu} CPUs; load average before {lb}, after {la}):",
     f"{np_} ranks, N = {size} (N^3 f64; rounded up per grid to a multiple of R and C), {iters} interleaved",
     f"repetitions of each protocol per run, {rounds} runs of ibcoll and Open MPI alternated. A protocol's",
     "time is the median over runs of its median over repetitions (the slowest rank's time for a transpose",
     "to x-pencils and back, us); every result was checked.", "",
     "Best protocol per grid, side by side (time: median (min-max) over runs of the run's best; the",
     "winning protocols with how many runs each won):", "",
     "| grid | N | ibcoll best (us) | ibcoll's winners | Open MPI best (us) | Open MPI's winners | ibcoll / Open MPI |",
     "|---|---:|---:|---|---:|---|---:|"]
for g in grids:
    row, meds = [g, nsize[g]], []
    for impl, _ in IMPLS:
        if g not in data.get(impl, {}):
            row += ["-", "-"]; continue
        names, bests = best_per_round(impl, g)
        meds.append(st.median(bests))
        row.append(f"{st.median(bests):.0f} ({min(bests):.0f}-{max(bests):.0f})")
        row.append(", ".join(f"{p} ({names.count(p)})" for p in sorted(set(names), key=lambda p: -names.count(p))))
    row.append(f"{meds[0] / meds[1]:.2f}" if len(meds) == 2 else "-")
    L.append("| " + " | ".join(row) + " |")
L += ["", "PSTSWM summary per grid (over the protocols' times):", "",
      "| grid | library | protocols | min (us) | (mean-min)/min | (median-min)/min | (max-min)/min | within 1/5/25% | fastest three |",
      "|---|---|---:|---:|---:|---:|---:|---:|---|"]
for g in grids:
    for impl, name in IMPLS:
        if g in data.get(impl, {}):
            L.append(f"| {g} | {name} | {summary(times(impl, g))} |")
L += ["", "Every protocol, ibcoll / Open MPI (us; `-` where MPI has no such protocol):", "",
      "| protocol | " + " | ".join(grids) + " |", "|---|" + "---:|" * len(grids)]
protos = list(data.get("ibcoll", {}).get(grids[0], {}).keys()) if grids else []
order = sorted(protos, key=lambda p: st.median(times("ibcoll", g).get(p, 0) for g in grids))
for p in order:
    cells = []
    for g in grids:
        a, b = times("ibcoll", g).get(p), times("openmpi", g).get(p)
        cells.append(f"{a:.0f} / {b:.0f}" if a and b else (f"{a:.0f} / -" if a else "-"))
    L.append(f"| {p} | " + " | ".join(cells) + " |")
L.append(f"<!-- transpose:{key}:end -->")
block = "\n".join(L) + "\n"
text = open(doc).read() if os.path.exists(doc) else ""
mark = f"<!-- transpose:{key}:begin -->"
if mark in text:
    text = re.sub(re.escape(mark) + r".*?" + re.escape(f"<!-- transpose:{key}:end -->") + r"\n?", lambda m: block, text, flags=re.S)
elif "<!-- transpose:sections-end -->" in text:
    text = text.replace("<!-- transpose:sections-end -->", block + "\n<!-- transpose:sections-end -->", 1)
else:
    text = text.rstrip("\n") + "\n\n" + block
open(doc, "w").write(text)
print(block)
PYEOF
