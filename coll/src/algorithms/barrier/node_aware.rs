//! Node-aware barrier: a binomial fan-in inside each node to its leader,
//! a dissemination barrier among the leaders (one inter-node message per
//! leader per round, ceil(log2 nodes) rounds), a binomial fan-out inside
//! each node. With one rank per node it is the dissemination barrier; on
//! one node the tree barrier.

use crate::algorithms::levels::Levels;
use crate::algorithms::{tree_children, tree_parent, Args};
use crate::schedule::{Buf, Builder, Schedule};

pub fn build(a: &Args) -> Schedule {
    let l = Levels::new(a, false);
    let mine = l.mine();
    let mut b = Builder::new(1);
    let z = (Buf::Recv, 0, 0);
    let kids = tree_children(l.me, mine.len());
    for &c in &kids {
        b.recv(mine[c], z);
    }
    b.end_round();
    if let Some(p) = tree_parent(l.me) {
        b.send(mine[p], z);
        b.end_round();
        b.recv(mine[p], z);
        b.end_round();
    } else {
        let leaders = l.leaders();
        let (k, i) = (leaders.len(), l.node);
        let mut d = 1;
        while d < k {
            b.send(leaders[(i + d) % k], z);
            b.recv(leaders[(i + k - d) % k], z);
            b.end_round();
            d <<= 1;
        }
    }
    for &c in kids.iter().rev() {
        b.send(mine[c], z);
    }
    b.finish()
}
