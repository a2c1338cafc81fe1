//! Node-aware barrier: a binomial fan-in inside each node to its leader,
//! a dissemination barrier among the leaders (one inter-node message per
//! leader per round, ceil(log2 nodes) rounds), a binomial fan-out inside
//! each node. With one rank per node it is the dissemination barrier; on
//! one node the tree barrier. It is the multi-leader barrier with one port
//! per node, so it is built by that file.

use crate::algorithms::barrier::multi_leader;
use crate::algorithms::Args;
use crate::schedule::Schedule;

pub fn build(a: &Args) -> Schedule {
    multi_leader::with_ports(a, |_, _| 1)
}
