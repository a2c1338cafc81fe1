#!/usr/bin/env bash
# The per-message floor of a small-message tcp stream here: a C sender
# writev()s 24-byte messages with TCP_NODELAY (one syscall per message, as
# ibcoll's tcp channel and Open MPI's tcp BTL do) to a busy-polling
# receiver, over loopback and between two simulated hosts (h1 -> h2, veth;
# ../shared/hosts/hosts-up.sh 2 first). Prints us per message, REPS times.
# Back-to-back 8-byte rooted collectives between two hosts cannot go below
# it with one syscall per message (docs/PERFORMANCE.md).
#
#   benches/tcp-floor.sh [REPS] [N]     (default 3 repetitions, 200000)
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${1:-3}
N=${2:-200000}
mkdir -p target/mpi
cc -O2 -o target/mpi/tcp_writev benches/mpi/tcp_writev.c
B=$PWD/target/mpi/tcp_writev
for r in $(seq "$REPS"); do
  "$B" recv 127.0.0.1 45677 "$N" & pid=$!
  sleep 0.2
  lo=$("$B" send 127.0.0.1 45677 "$N")
  wait $pid
  veth=-
  if ip netns list 2>/dev/null | grep -qw h2; then
    ip netns exec h2 "$B" recv 10.251.0.12 45678 "$N" & pid=$!
    sleep 0.2
    veth=$(ip netns exec h1 "$B" send 10.251.0.12 45678 "$N")
    wait $pid
  fi
  echo "round $r: loopback $lo us, veth h1->h2 $veth us per 24-byte writev"
done
