//! The exchange as one collective call.

use ibcoll::{Comm, Result};

/// The nonblocking alltoall, waited for at once: what a code gets when it
/// means to overlap but has nothing to overlap with (it never takes the
/// shared-memory fast path, which only blocking calls do).
pub fn ialltoall(c: &Comm, send: &[f64], recv: &mut [f64]) -> Result<()> {
    ibcoll::scope(|s| c.ialltoall(s, send, recv)?.wait())
}

/// `alltoallv` with equal counts, as codes whose blocks may differ write
/// it (and it selects its algorithm without knowing the sizes).
pub fn alltoallv(c: &Comm, send: &[f64], recv: &mut [f64]) -> Result<()> {
    let n = c.size();
    let b = send.len() / n;
    let counts = vec![b; n];
    let displs: Vec<usize> = (0..n).map(|i| i * b).collect();
    c.alltoallv(send, &counts, &displs, recv, &counts, &displs)
}
