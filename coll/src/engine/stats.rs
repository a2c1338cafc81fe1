//! `IBCOLL_STATS=1`: one line per rank at finalize, saying what the rank
//! cost the job (connections by transport, how they were made, the
//! process manager traffic, memory), like `UCX_STATS` or
//! `NCCL_DEBUG=INFO`. Tests read it to check that costs follow what a rank
//! talks to, not the size of the job.

use super::Engine;
use crate::transport::{Channel, Health};

/// Counts kept as the engine runs.
#[derive(Debug, Default, Clone)]
pub(crate) struct Stats {
    /// Connections this rank dialed, accepted, and rejected (duplicates of
    /// simultaneous first contacts).
    pub dials: u64,
    pub accepted: u64,
    pub rejected: u64,
    /// Peer cards fetched from the key-value space.
    pub cards_fetched: u64,
    /// Process-manager calls the engine made itself (the PMI client's own
    /// counts, when it keeps them, are reported instead).
    pub puts: u64,
    pub gets: u64,
    pub fences: u64,
    pub fetched_bytes: u64,
}

/// Peak resident set of this process, in KiB.
fn peak_rss_kib() -> i64 {
    // SAFETY: getrusage writes the struct it is given.
    unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        if libc::getrusage(libc::RUSAGE_SELF, &mut u) != 0 {
            return -1;
        }
        u.ru_maxrss
    }
}

impl Engine {
    /// The `IBCOLL_STATS` line.
    pub(crate) fn stats_line(&self) -> String {
        let (mut shm, mut tcp, mut rdma) = (0, 0, 0);
        for p in &self.peers.list {
            match &p.chan {
                Channel::Shm(_) => shm += 1,
                Channel::Tcp(_) => tcp += 1,
                Channel::Rdma(_) => rdma += 1,
                Channel::Local(_) | Channel::Connecting(_) => {}
            }
        }
        let failed = self
            .peers
            .list
            .iter()
            .filter(|p| matches!(p.chan.health(), Health::Failed(_)))
            .count();
        let s = &self.stats;
        // The client's own counts cover every request it sent (init's
        // included); the engine's stand in where there is no client.
        let (puts, gets, fences, fetched) = match self.pmi.as_ref().map(|p| p.stats()) {
            Some(p) => (p.puts, p.gets, p.fences, p.bytes_fetched),
            None => (s.puts, s.gets, s.fences, s.fetched_bytes),
        };
        let seg = self
            .node
            .as_ref()
            .map_or(0, |n| n.layout().total_len() as u64);
        let resident = self
            .node
            .as_ref()
            .and_then(|n| n.resident_bytes().ok())
            .unwrap_or(0);
        let registered = self.rdma_registered_bytes();
        let granted = self.shm_inbox.as_ref().map_or(0, |ib| ib.granted());
        let polled = self.shm_polled.borrow().len();
        let verbs = match &self.rdma {
            Some(r) => {
                let c = &r.stats;
                let flow = match r.ctx.shared.borrow().as_ref() {
                    Some(sh) => {
                        let f = &sh.ledger.stats;
                        format!(
                            "srq bufs={} (one for all qps; posted now {} low {}, promised now {}, senders queued now {} max {}, \
                             credit requests {} sent {}, grants written {} piggybacked {}); send bufs={} (free low {}); ",
                            sh.ledger.total(),
                            sh.ledger.posted(),
                            f.low_posted,
                            sh.ledger.promised(),
                            sh.ledger.waiting(),
                            f.fifo_max,
                            f.starved,
                            r.flow_stats.wants,
                            f.writes,
                            f.piggybacked,
                            sh.slots.count(),
                            sh.slots.low_water(),
                        )
                    }
                    None => "srq bufs=0; ".to_string(),
                };
                format!(
                    "rdma qps rc={rdma} ud=1, handshakes={} (requested {}, answered {}, failed {}, resent {}, \
                     first message avg {} us max {} us); rc cq entries={} (one for all qps); {flow}",
                    c.completed,
                    c.requested,
                    c.answered,
                    c.failed,
                    c.resent,
                    c.total_us / c.timed.max(1),
                    c.max_us,
                    r.ctx.cq.capacity(),
                )
            }
            None => String::new(),
        };
        format!(
            "ibcoll stats: rank {} of {} (node {}, local {} of {}): connections shm={shm} tcp={tcp} rdma={rdma} \
             (dialed {}, accepted {}, rejected {}, failed {failed}); peers known {}; \
             pmi puts={} gets={} fences={} fetched={} B (cards {}); {verbs}registered={registered} B; \
             shm segment={seg} B (shm resident={resident} B); shm boxes granted={granted} polled={polled}; peak rss={} KiB",
            self.rank(),
            self.size(),
            self.node_id,
            self.local_rank,
            self.local_size,
            s.dials,
            s.accepted,
            s.rejected,
            self.peers.list.len(),
            puts,
            gets,
            fences,
            fetched,
            s.cards_fetched,
            peak_rss_kib(),
        )
    }
}
