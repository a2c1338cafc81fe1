//! `ibcoll-mpicc`: the C compiler with ibcoll's `mpi.h` and library.
#[path = "../wrapper/mod.rs"]
mod wrapper;

fn main() {
    wrapper::run("IBCOLL_MPICC_CC", "cc")
}
