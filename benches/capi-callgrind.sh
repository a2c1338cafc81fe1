#!/usr/bin/env bash
# The MPI C interface's own instructions per call on the small paths,
# counted by callgrind (load-independent): benches/mpi/osu_p2p.c latency
# and bw and osu_coll.c (8 B; barrier 0 B) on 2 ranks, ITERS iterations
# (bw: ITERS/10, a window of 64 messages each), built with ibcoll-mpicc.
# For each MPI function: the instructions of the function and of the
# ibcoll_mpi functions it calls (calls into ibcoll excluded), split by
# their DWARF inline chain into the C layer's and ibcoll's (a generic
# ibcoll wrapper such as Comm::bcast inlined into the MPI function, or the
# argument set-up of Comm::send, is ibcoll's: a Rust program calling ibcoll
# pays it too); and ibcoll's calls made from there. MPI_Waitall's row is
# per request. Then bw per message against `ibcoll-bench bw` (the same
# loop on the Rust API): the sender's and the receiver's instructions,
# inclusive, less those of ibcoll's Request::wait (the receiver's spins
# while it waits for the messages: not the code's cost).
#
#   benches/capi-callgrind.sh [ITERS]          (default 20000)
#   env: LIBDIR=dir: run on the libibcoll_mpi.so in dir (LD_LIBRARY_PATH; the
#        programs' RUNPATH is target/release), to count another build
set -euo pipefail
cd "$(dirname "$0")/.."
ITERS=${1:-20000}
R=$PWD/target/release
LIBDIR=${LIBDIR:-$R}
OUT=target/capi-callgrind
rm -rf "$OUT"
mkdir -p "$OUT"
cargo build --release -q -p ibcoll-capi -p ibcoll-launcher -p ibcoll-benches
"$R/ibcoll-mpicc" -O2 -g -Wno-stringop-overflow -o "$OUT/cport_p2p" benches/mpi/osu_p2p.c
"$R/ibcoll-mpicc" -O2 -g -o "$OUT/cport_coll" benches/mpi/osu_coll.c -lm
export LD_LIBRARY_PATH=$LIBDIR
VG=(valgrind --tool=callgrind --dump-instr=yes)
"$R/ibrun" -n 2 "${VG[@]}" --callgrind-out-file="$OUT/cg.latency.%p" \
    "$OUT/cport_p2p" latency -m 8:8 -i "$ITERS" >/dev/null 2>&1
BW_ITERS=$((ITERS / 10))
"$R/ibrun" -n 2 "${VG[@]}" --callgrind-out-file="$OUT/cg.bw.%p" \
    "$OUT/cport_p2p" bw -m 8:8 -i "$BW_ITERS" -x 100 >/dev/null 2>&1
"$R/ibrun" -n 2 "${VG[@]}" --callgrind-out-file="$OUT/cg.rustbw.%p" \
    "$R/ibcoll-bench" bw -m 8:8 -i "$BW_ITERS" -x 100 >/dev/null 2>&1
for c in allreduce bcast alltoall allgather; do
    "$R/ibrun" -n 2 "${VG[@]}" --callgrind-out-file="$OUT/cg.$c.%p" \
        "$OUT/cport_coll" "$c" -m 8:8 -i "$ITERS" >/dev/null 2>&1
done
"$R/ibrun" -n 2 "${VG[@]}" --callgrind-out-file="$OUT/cg.barrier.%p" \
    "$OUT/cport_coll" barrier -m 0:0 -i "$ITERS" >/dev/null 2>&1
python3 - "$OUT" "$LIBDIR/libibcoll_mpi.so" "$BW_ITERS" <<'PY'
import collections, glob, re, subprocess, sys
out, lib, bw_iters = sys.argv[1], sys.argv[2], int(sys.argv[3])
WINDOW = 64

def parse(f):
    """Self cost by (function, instruction address), inclusive cost of
    each call edge, and call counts, from a --dump-instr=yes file."""
    names, selfc = {}, collections.defaultdict(collections.Counter)
    edges, ncall = collections.defaultdict(collections.Counter), collections.Counter()
    def name(tok):
        m = re.match(r"\((\d+)\)(?: (.*))?", tok)
        if m.group(2):
            names[m.group(1)] = m.group(2)
        return names.get(m.group(1), "?")
    cur = cfn = None
    addr, pending = 0, None
    for line in open(f):
        line = line.rstrip("\n")
        if line.startswith("fn="):
            cur = name(line[3:])
        elif line.startswith("cfn="):
            cfn = name(line[4:])
        elif line.startswith("calls="):
            pending = int(line.split("=")[1].split()[0])
        elif line and line[0] in "0123456789+-*":
            p = line.split()
            a = p[0]
            if a.startswith("0x"):
                addr = int(a, 16)
            elif a[0] == "+":
                addr += int(a[1:])
            elif a[0] == "-":
                addr -= int(a[1:])
            cost = int(p[2]) if len(p) > 2 else 0
            if pending is not None:
                edges[cur][cfn] += cost
                ncall[cfn] += pending
                pending = None
            else:
                selfc[cur][addr] += cost
    return selfc, edges, ncall

def split(f, func, per=1):
    selfc, edges, ncall = parse(f)
    fns, todo = {func}, [func]
    while todo:
        for c in edges[todo.pop()]:
            if c.startswith("ibcoll_mpi::") and c not in fns:
                fns.add(c)
                todo.append(c)
    cost = collections.Counter()
    for g in fns:
        cost.update(selfc[g])
    addrs = sorted(cost)
    a2l = subprocess.run(["addr2line", "-i", "-a", "-e", lib] + [hex(a) for a in addrs],
                         capture_output=True, text=True, check=True).stdout
    chain, cur = collections.defaultdict(list), None
    for l in a2l.splitlines():
        if l.startswith("0x"):
            cur = int(l, 16)
        else:
            chain[cur].append(l)
    ibcoll = sum(cost[a] for a in addrs if any("/coll/src/" in x or "/shm/src/" in x for x in chain[a]))
    calls = sum(v for g in fns for c, v in edges[g].items() if c not in fns)
    n = (ncall[func] or 1) * per
    return ncall[func], (sum(cost.values()) - ibcoll) / n, ibcoll / n, calls / n

def inclusive(f, funcs):
    """Inclusive instructions of every call of each of `funcs`."""
    selfc, edges, ncall = parse(f)
    return [sum(e.get(fn, 0) for e in edges.values()) for fn in funcs]

print(f"| function | calls | C layer | ibcoll inlined | ibcoll's calls |")
print(f"|---|---:|---:|---:|---:|")
for bench, funcs in [("latency", ["MPI_Send", "MPI_Recv"]), ("allreduce", ["MPI_Allreduce"]),
                     ("bcast", ["MPI_Bcast"]), ("alltoall", ["MPI_Alltoall"]),
                     ("allgather", ["MPI_Allgather"]), ("barrier", ["MPI_Barrier", "MPI_Wtime"])]:
    f = sorted(glob.glob(f"{out}/cg.{bench}.*"))[0]  # rank 0
    for func in funcs:
        n, c, i, k = split(f, func)
        print(f"| {func} | {n} | {c:.0f} | {i:.0f} | {k:.0f} |")
# bw: rank 0 sends (MPI_Isend), rank 1 receives (MPI_Irecv); MPI_Waitall per request.
def by_role(files, sender_fn):
    """(sender's file, receiver's file): the sender is the rank that calls sender_fn."""
    calls = [parse(f)[2][sender_fn] for f in files]
    return (files[0], files[1]) if calls[0] >= calls[1] else (files[1], files[0])
send, recv = by_role(glob.glob(f"{out}/cg.bw.*"), "MPI_Isend")
for f, func, per in [(send, "MPI_Isend", 1), (send, "MPI_Waitall", WINDOW),
                     (recv, "MPI_Irecv", 1), (recv, "MPI_Waitall", WINDOW)]:
    n, c, i, k = split(f, func, per)
    side = "sender" if f == send else "receiver"
    print(f"| {func} ({side}{', per request' if per > 1 else ''}) | {n * per} | {c:.0f} | {i:.0f} | {k:.0f} |")
print()
WAIT = "ibcoll::request::Request::wait"
msgs = (bw_iters + 100) * WINDOW
print("bw 8 B, instructions per message, inclusive, less ibcoll's Request::wait")
print()
print("| side | ibcoll-bench (Rust) | osu_p2p.c bw (C) | C / Rust |")
print("|---|---:|---:|---:|")
rust = by_role(glob.glob(f"{out}/cg.rustbw.*"), "ibcoll::comm::Comm::isend_on")
for side, cf, rf, cfuncs in [("sender (Isend, Waitall)", send, rust[0], ["MPI_Isend", "MPI_Waitall"]),
                             ("receiver (Irecv, Waitall)", recv, rust[1], ["MPI_Irecv", "MPI_Waitall"])]:
    c = sum(inclusive(cf, cfuncs)) - inclusive(cf, [WAIT])[0]
    r = inclusive(rf, ["ibcoll::scope::scope"])[0] - inclusive(rf, [WAIT])[0]
    print(f"| {side} | {r / msgs:.0f} | {c / msgs:.0f} | {c / r:.2f} |")
PY
