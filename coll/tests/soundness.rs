//! The nonblocking API's guarantees across real processes
//! (`coll/examples/soundness.rs`): leaked handles of every kind of
//! operation, eager and rendezvous, over shm and tcp; reductions that
//! panic inside blocking and nonblocking collectives; a program that
//! panics with operations in flight.

mod common;

use common::*;

const SHM: &[&str] = &["-n", "2"];
const TCP: &[&str] = &["-n", "2", "--nodes", "2"];
const MIXED: &[&str] = &["-n", "3", "--nodes", "2"];

fn check(launcher: &[&str], args: &[&str]) {
    let out = run_job_ok(150, launcher, "soundness", args);
    assert!(out.contains(&format!("soundness {}: ok", args[0])), "{out}");
}

#[test]
fn leaked_handles_never_touch_memory_the_program_owns() {
    for l in [SHM, TCP, MIXED] {
        check(l, &["forget"]);
    }
}

#[test]
fn a_panicking_reduction_in_a_blocking_collective_poisons_but_never_writes() {
    for l in [SHM, TCP] {
        check(l, &["panic-blocking", "4"]);
        check(l, &["panic-blocking", "131072"]);
    }
}

#[test]
fn a_panicking_reduction_in_a_nonblocking_collective_poisons_but_never_writes() {
    for l in [SHM, TCP] {
        check(l, &["panic-nonblocking"]);
    }
}

#[test]
fn a_program_panicking_with_operations_in_flight_leaves_ibcoll_usable() {
    for l in [SHM, TCP, MIXED] {
        check(l, &["panic-scope"]);
    }
}
