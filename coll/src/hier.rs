//! Two-level collectives composed of calls on two sub-communicators
//! (algorithm `hier`, as in Open MPI's han): the node's ranks (one whole
//! node, so its small calls take the shared-memory fast path's slots, not
//! messages) and the node leaders (the lowest rank of each node; their
//! calls go between nodes with whatever the table picks there).
//!
//! The sub-communicators are made on a communicator's first such call (a
//! collective `split`, [`Comm::levels`]) and kept. A communicator with
//! fewer than two nodes, or one rank on every node (nothing to gain inside
//! a node), keeps none: the call runs the algorithm's schedule, the
//! node-aware one, as do nonblocking calls. The sub-communicators never
//! compose again: theirs is marked off, and a one-node communicator never
//! takes a forced `hier` (`select`), so their calls use the table.

use crate::algorithms::Collective;
use crate::collectives::ReduceArgs;
use crate::comm::{Comm, UNDEFINED};
use crate::error::{Error, Op, Result};
use crate::ops::ReduceOp;

/// A communicator's node and leaders communicators.
pub(crate) struct Levels {
    /// This rank's node.
    pub node: Comm,
    /// The node leaders (leaders only).
    pub leaders: Option<Comm>,
    /// Node of every rank (as numbered in the node map).
    pub node_of: Vec<u32>,
    /// Each node's leader as a leaders-communicator rank.
    pub leader_rank_of_node: Vec<u32>,
    /// Every rank's index in its node communicator.
    pub local_index: Vec<u32>,
}

/// What a communicator knows about its two levels after first use.
pub(crate) enum State {
    /// Not composed: run the schedule.
    Off,
    On(Box<Levels>),
}

impl Comm {
    /// Splits this communicator by node `nodes[rank]` (collective): `None`
    /// where it spans fewer than two nodes. Errors name `op`.
    pub(crate) fn levels(&self, nodes: &[usize], op: Op) -> Result<Option<Levels>> {
        let mut lowest: Vec<Option<usize>> = Vec::new();
        for (r, &nd) in nodes.iter().enumerate() {
            if lowest.len() <= nd {
                lowest.resize(nd + 1, None);
            }
            lowest[nd].get_or_insert(r);
        }
        let mut leaders: Vec<usize> = lowest.iter().flatten().copied().collect();
        leaders.sort_unstable();
        if leaders.len() < 2 {
            return Ok(None);
        }
        let me = self.rank();
        let my_node = nodes[me];
        let is_leader = lowest[my_node] == Some(me);
        let node = self
            .split(my_node as i32, me as i32)
            .map_err(|e| e.with_op(op))?
            .ok_or_else(|| Error::InvalidArgument {
                rank: self.world_rank(me).unwrap_or(0),
                op,
                detail: "no node communicator".into(),
            })?;
        let leaders_comm = self
            .split(if is_leader { 0 } else { UNDEFINED }, me as i32)
            .map_err(|e| e.with_op(op))?;
        // Their own calls never compose again (no recursion).
        *node.hier.borrow_mut() = Some(State::Off);
        *node.mcast.borrow_mut() = Some(crate::mcast::State::Off);
        if let Some(l) = &leaders_comm {
            *l.hier.borrow_mut() = Some(State::Off);
            *l.mcast.borrow_mut() = Some(crate::mcast::State::Off);
        }
        let mut leader_rank_of_node = vec![u32::MAX; lowest.len()];
        for (i, &l) in leaders.iter().enumerate() {
            leader_rank_of_node[nodes[l]] = i as u32;
        }
        let mut count = vec![0u32; lowest.len()];
        let local_index = nodes
            .iter()
            .map(|&nd| {
                count[nd] += 1;
                count[nd] - 1
            })
            .collect();
        Ok(Some(Levels {
            node,
            leaders: leaders_comm,
            node_of: nodes.iter().map(|&x| x as u32).collect(),
            leader_rank_of_node,
            local_index,
        }))
    }

    /// The two levels, made on first use (collective).
    fn hier_state(&self, nodes: &[usize], op: Op) -> Result<std::cell::Ref<'_, State>> {
        if self.hier.borrow().is_none() {
            // Some node with two ranks or more (else nothing to gain).
            let mut distinct = nodes.to_vec();
            distinct.sort_unstable();
            distinct.dedup();
            let shared = distinct.len() < nodes.len();
            let st = match shared
                .then(|| self.levels(nodes, op))
                .transpose()?
                .flatten()
            {
                Some(l) => State::On(Box::new(l)),
                None => State::Off,
            };
            *self.hier.borrow_mut() = Some(st);
        }
        Ok(std::cell::Ref::map(self.hier.borrow(), |s| {
            s.as_ref().expect("set above")
        }))
    }

    /// Barrier: arrivals go to the node's leader as a one-byte reduce (a
    /// member publishes and goes on), the leaders meet, each leader's
    /// one-byte bcast releases its node (members wait for it).
    /// `Ok(false)`: not composed here.
    pub(crate) fn barrier_hier(&self, nodes: &[usize]) -> Result<bool> {
        const OP: Op = Op::Collective(Collective::Barrier);
        let st = self.hier_state(nodes, OP)?;
        let State::On(l) = &*st else {
            return Ok(false);
        };
        let mut b = [0u8; 1];
        l.node
            .reduce_in_place(&mut b, ReduceOp::Max, 0)
            .map_err(|e| e.with_op(OP))?;
        if let Some(lc) = &l.leaders {
            lc.barrier().map_err(|e| e.with_op(OP))?;
        }
        l.node.bcast(&mut b, 0).map_err(|e| e.with_op(OP))?;
        Ok(true)
    }

    /// Bcast (`Levels::bcast_around` with the leaders' bcast).
    /// `Ok(false)`: not composed here.
    pub(crate) fn bcast_hier(&self, buf: &mut [u8], root: usize, nodes: &[usize]) -> Result<bool> {
        const OP: Op = Op::Collective(Collective::Bcast);
        let st = self.hier_state(nodes, OP)?;
        let State::On(l) = &*st else {
            return Ok(false);
        };
        l.bcast_around(self.rank(), buf, root, OP, |lc, buf, lroot| {
            lc.bcast(buf, lroot)
        })?;
        Ok(true)
    }

    /// Allreduce with a commutative operation: reduce in the node to its
    /// leader, allreduce among the leaders, bcast in the node.
    /// `Ok(false)`: not composed here.
    pub(crate) fn allreduce_hier(&self, mut a: ReduceArgs<'_>, nodes: &[usize]) -> Result<bool> {
        const OP: Op = Op::Collective(Collective::Allreduce);
        let st = self.hier_state(nodes, OP)?;
        let State::On(l) = &*st else {
            return Ok(false);
        };
        l.reduce_to_leaders(&mut a, None, OP)?;
        l.node.bcast(a.recv, 0).map_err(|e| e.with_op(OP))?;
        Ok(true)
    }
}

impl Levels {
    /// A bcast of `buf` from communicator rank `root`, as seen by rank
    /// `me`: inside the root's node from the root, then `lead(leaders
    /// communicator, buf, its rank of the root's node's leader)` on the
    /// leaders, then inside every other node from its leader. Errors name
    /// `op`.
    pub(crate) fn bcast_around(
        &self,
        me: usize,
        buf: &mut [u8],
        root: usize,
        op: Op,
        lead: impl FnOnce(&Comm, &mut [u8], usize) -> Result<()>,
    ) -> Result<()> {
        let root_node = self.node_of[root] as usize;
        let in_root_node = self.node_of[me] as usize == root_node;
        if in_root_node {
            self.node
                .bcast(buf, self.local_index[root] as usize)
                .map_err(|e| e.with_op(op))?;
        }
        if let Some(lc) = &self.leaders {
            lead(lc, buf, self.leader_rank_of_node[root_node] as usize)
                .map_err(|e| e.with_op(op))?;
        }
        if !in_root_node {
            self.node.bcast(buf, 0).map_err(|e| e.with_op(op))?;
        }
        Ok(())
    }

    /// The reduce phases of a two-level allreduce: the node's reduce of
    /// `a` to its leader, then among the leaders a reduce to leader
    /// `to` (or with `None` an allreduce), in place. Errors name `op`.
    pub(crate) fn reduce_to_leaders(
        &self,
        a: &mut ReduceArgs<'_>,
        to: Option<usize>,
        op: Op,
    ) -> Result<()> {
        self.node
            .reduce_bytes(a, Some(0))
            .map_err(|e| e.with_op(op))?;
        if let Some(lc) = &self.leaders {
            a.send = None;
            lc.reduce_bytes(a, to).map_err(|e| e.with_op(op))?;
        }
        Ok(())
    }
}
