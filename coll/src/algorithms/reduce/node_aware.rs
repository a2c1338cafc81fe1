//! Node-aware reduce: a binomial reduce inside every node to its leader
//! (the root in the root's node), then a binomial reduce among the leaders
//! to the root. Each node's partial result crosses the network once.

use crate::algorithms::levels::Levels;
use crate::algorithms::{reduce, Args};
use crate::schedule::{Buf, Builder, Schedule};

pub fn build(a: &Args) -> Schedule {
    let l = Levels::new(a, true);
    let mut b = Builder::new(a.esize);
    let count = a.count;
    let inp = (a.input(), 0, count);
    let out = (Buf::Recv, 0, count);
    let lead = l.lead[l.node];
    if l.groups.len() == 1 {
        reduce::binomial::tree(&mut b, l.mine(), l.me, lead, inp, out);
        return b.finish();
    }
    let part = (b.scratch(count), 0, count);
    reduce::binomial::tree(&mut b, l.mine(), l.me, lead, inp, part);
    if l.leads() {
        let leaders = l.leaders();
        reduce::binomial::tree(&mut b, &leaders, l.node, l.root_node, part, out);
    }
    b.finish()
}
