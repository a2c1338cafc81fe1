//! Barrier through the node's publication slots: every rank publishes its
//! arrival and waits for everyone else's (one cache line per member).

use crate::error::Result;
use crate::fastpath::FastCall;

pub(crate) fn run(f: &mut FastCall) -> Result<()> {
    f.arrive()?;
    f.wait_all()
}
