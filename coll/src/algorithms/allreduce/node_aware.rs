//! Node-aware allreduce: binomial reduce inside each node to its leader
//! (lowest rank of the node), recursive-doubling allreduce among the
//! leaders, binomial broadcast inside each node. Inter-node traffic is one
//! vector exchange per leader per round, whatever the ranks per node.

use crate::algorithms::allreduce::recursive_doubling;
use crate::algorithms::{bcast, node_groups, reduce, Args};
use crate::schedule::{Buf, Builder, Schedule};

pub fn build(a: &Args) -> Schedule {
    let (r, count) = (a.rank, a.count);
    let mut b = Builder::new(a.esize);
    b.copy((a.input(), 0, count), (Buf::Recv, 0, count));
    b.end_round();
    let groups = node_groups(&a.nodes, a.size);
    let Some(mine) = groups.iter().find(|g| g.contains(&r)) else {
        return b.finish();
    };
    let me = mine.iter().position(|&x| x == r).unwrap_or(0);
    let all = (Buf::Recv, 0, count);
    reduce::binomial::tree(&mut b, mine, me, 0, all, all);
    if me == 0 {
        let leaders: Vec<usize> = groups.iter().map(|g| g[0]).collect();
        let li = leaders.iter().position(|&x| x == r).unwrap_or(0);
        recursive_doubling::core(&mut b, &leaders, li, Buf::Recv, count);
    }
    bcast::binomial::tree(&mut b, mine, me, 0, all);
    b.finish()
}
