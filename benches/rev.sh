# Sourced by the before/after benchmarks (ab.sh, compare-coll.sh): builds
# the release ibcoll-bench and ibrun of commit SHA in DIR, a detached git
# worktree (target/ab/<sha> by convention), unless they are there already,
# so an older build never mixes with this tree's binaries.
build_rev() { # sha dir
  if [ ! -x "$2/target/release/ibcoll-bench" ]; then
    [ -d "$2" ] || git worktree add --detach -q "$2" "$1"
    (cd "$2" && cargo build --release -q -p ibcoll-benches -p ibcoll-launcher)
  fi
}
