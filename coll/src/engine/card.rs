//! Bootstrap cards and the choice of a transport for a pair of ranks.
//!
//! Every rank publishes one [`Card`] of constant size (at most
//! [`Card::MAX_LEN`] bytes, whatever the size of the job): what any peer
//! needs to reach it. A peer on another node fetches it from the key-value
//! space only when it first talks to this rank; ranks of one node learn
//! what they need of each other through the node segment instead.
//!
//! [`plan`] decides the transport of a pair from the two cards and the
//! configuration alone, so both ends of a pair always agree without
//! talking.

use std::net::IpAddr;

use ibcoll_rdma::UdAddr;

use crate::config::TransportMode;

const CARD_VERSION: u8 = 4;

/// Addresses a card holds at most.
pub const MAX_ADDRS: usize = 4;

/// What every rank publishes about itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Card {
    pub pid: i32,
    pub node: u32,
    pub local_rank: u32,
    /// Single-copy transfers (CMA) work from this process.
    pub cma: bool,
    /// Registered for expedited global memory barriers
    /// (`ibcoll_shm::fences`).
    pub membarrier: bool,
    /// Published a verbs endpoint for its peers on other nodes.
    pub verbs: bool,
    /// Its UD endpoint (with `verbs`): where the rdma connection manager
    /// sends the first datagram of a pair (`transport/rdma_cm.rs`).
    pub ud: Option<UdAddr>,
    /// Kernel and network namespace ([`crate::transport::netif::host_key`]):
    /// equal keys reach each other over loopback and see each other's pids.
    pub host: u64,
    /// The addresses were chosen by the user (`IBCOLL_TCP_HOST`,
    /// `IBCOLL_TCP_IF`): peers use them even from the same host.
    pub explicit: bool,
    /// Port of the tcp listener (0: none).
    pub port: u16,
    /// Addresses of the tcp listener, in the order peers should try them.
    pub addrs: Vec<IpAddr>,
}

impl Card {
    /// Largest encoding.
    pub const MAX_LEN: usize = 1 + 4 + 4 + 4 + 1 + 8 + 2 + 1 + MAX_ADDRS * 17 + UdAddr::WIRE_LEN;

    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(Self::MAX_LEN);
        v.push(CARD_VERSION);
        v.extend_from_slice(&self.pid.to_le_bytes());
        v.extend_from_slice(&self.node.to_le_bytes());
        v.extend_from_slice(&self.local_rank.to_le_bytes());
        let verbs = self.verbs && self.ud.is_some();
        v.push(
            u8::from(self.cma)
                | (u8::from(self.membarrier) << 1)
                | (u8::from(verbs) << 2)
                | (u8::from(self.explicit) << 3),
        );
        v.extend_from_slice(&self.host.to_le_bytes());
        v.extend_from_slice(&self.port.to_le_bytes());
        let addrs = &self.addrs[..self.addrs.len().min(MAX_ADDRS)];
        v.push(addrs.len() as u8);
        for a in addrs {
            match a {
                IpAddr::V4(a) => {
                    v.push(4);
                    v.extend_from_slice(&a.octets());
                }
                IpAddr::V6(a) => {
                    v.push(6);
                    v.extend_from_slice(&a.octets());
                }
            }
        }
        if let (true, Some(ud)) = (verbs, &self.ud) {
            v.extend_from_slice(&ud.to_bytes());
        }
        v
    }

    pub fn decode(b: &[u8]) -> Option<Card> {
        let mut r = Reader(b);
        if r.take(1)?[0] != CARD_VERSION {
            return None;
        }
        let pid = i32::from_le_bytes(r.array()?);
        let node = u32::from_le_bytes(r.array()?);
        let local_rank = u32::from_le_bytes(r.array()?);
        let flags = r.take(1)?[0];
        let host = u64::from_le_bytes(r.array()?);
        let port = u16::from_le_bytes(r.array()?);
        let n = r.take(1)?[0] as usize;
        if n > MAX_ADDRS {
            return None;
        }
        let mut addrs = Vec::with_capacity(n);
        for _ in 0..n {
            addrs.push(match r.take(1)?[0] {
                4 => IpAddr::from(r.array::<4>()?),
                6 => IpAddr::from(r.array::<16>()?),
                _ => return None,
            });
        }
        let ud = if flags & 4 != 0 {
            Some(UdAddr::from_bytes(r.take(UdAddr::WIRE_LEN)?).ok()?)
        } else {
            None
        };
        if !r.0.is_empty() || flags & !15 != 0 {
            return None;
        }
        Some(Card {
            pid,
            node,
            local_rank,
            cma: flags & 1 != 0,
            membarrier: flags & 2 != 0,
            verbs: flags & 4 != 0,
            ud,
            explicit: flags & 8 != 0,
            host,
            port,
            addrs,
        })
    }
}

struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Option<&[u8]> {
        if self.0.len() < n {
            return None;
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Some(a)
    }

    fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.take(N)?.try_into().ok()
    }
}

/// How a pair of ranks talks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Transport {
    Shm,
    Tcp,
    Rdma,
}

impl Transport {
    pub fn name(self) -> &'static str {
        match self {
            Transport::Shm => "shm",
            Transport::Tcp => "tcp",
            Transport::Rdma => "rdma",
        }
    }
}

/// The transport between the ranks of cards `a` and `b` (two different
/// ranks) under `mode`; `shm` says whether this job uses node segments at
/// all. The same for `(a, b)` and `(b, a)`. An error names what the two
/// cards disagree on, or what the configuration asks for that they cannot
/// give.
pub(crate) fn plan(
    a: &Card,
    b: &Card,
    mode: TransportMode,
    shm: bool,
) -> Result<Transport, String> {
    let same_node = a.node == b.node;
    if same_node && a.host != b.host {
        return Err(format!(
            "both are on node {} but not on the same host (different kernels or network namespaces)",
            a.node
        ));
    }
    match mode {
        TransportMode::Tcp => Ok(Transport::Tcp),
        TransportMode::Rdma if a.verbs && b.verbs => Ok(Transport::Rdma),
        TransportMode::Rdma => Err(format!(
            "IBCOLL_TRANSPORT=rdma, but {} has no verbs endpoint (no usable device there?)",
            if a.verbs { "the peer" } else { "this rank" }
        )),
        TransportMode::Auto if same_node && shm => Ok(Transport::Shm),
        TransportMode::Auto if !same_node && a.verbs && b.verbs => Ok(Transport::Rdma),
        TransportMode::Auto => Ok(Transport::Tcp),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn card(node: u32, host: u64, verbs: bool) -> Card {
        Card {
            pid: 1000 + node as i32,
            node,
            local_rank: 0,
            cma: true,
            membarrier: false,
            verbs,
            ud: verbs.then_some(UdAddr {
                gid: ibcoll_rdma::Gid([7; 16]),
                lid: 0,
                qpn: 0x11 + node,
            }),
            explicit: node == 3,
            host,
            port: 4000,
            addrs: vec!["10.0.0.1".parse().unwrap(), "fe80::2".parse().unwrap()],
        }
    }

    #[test]
    fn roundtrip_constant_size_and_garbage() {
        let c = card(3, 77, true);
        let b = c.encode();
        assert!(b.len() <= Card::MAX_LEN);
        assert_eq!(Card::decode(&b), Some(c.clone()));
        for i in 0..b.len() {
            assert_eq!(Card::decode(&b[..i]), None, "prefix {i}");
        }
        let mut long = b.clone();
        long.push(0);
        assert_eq!(Card::decode(&long), None);
        let mut many = c.clone();
        many.addrs = vec!["10.0.0.9".parse().unwrap(); 9];
        assert_eq!(Card::decode(&many.encode()).unwrap().addrs.len(), MAX_ADDRS);
        assert_eq!(Card::decode(&[9, 9, 9]), None);
    }

    use TransportMode::{Auto, Rdma, Tcp};
    type Row = (
        u32,
        u64,
        bool,
        u32,
        u64,
        bool,
        TransportMode,
        bool,
        Option<Transport>,
    );

    /// (node a, host a, verbs a, node b, host b, verbs b, mode, shm) ->
    /// transport, or None for an error.
    const TABLE: &[Row] = &[
        // Same node.
        (0, 1, false, 0, 1, false, Auto, true, Some(Transport::Shm)),
        (0, 1, true, 0, 1, true, Auto, true, Some(Transport::Shm)),
        (0, 1, false, 0, 1, false, Auto, false, Some(Transport::Tcp)),
        (0, 1, true, 0, 1, true, Tcp, true, Some(Transport::Tcp)),
        (0, 1, true, 0, 1, true, Rdma, true, Some(Transport::Rdma)),
        (0, 1, true, 0, 1, false, Rdma, true, None),
        // Other node, with and without verbs.
        (0, 1, true, 1, 2, true, Auto, true, Some(Transport::Rdma)),
        (0, 1, true, 1, 2, false, Auto, true, Some(Transport::Tcp)),
        (0, 1, false, 1, 2, false, Auto, true, Some(Transport::Tcp)),
        (0, 1, true, 1, 2, true, Tcp, true, Some(Transport::Tcp)),
        (0, 1, true, 1, 2, true, Rdma, true, Some(Transport::Rdma)),
        (0, 1, false, 1, 2, true, Rdma, true, None),
        // Virtual nodes: other node, same host.
        (0, 1, false, 1, 1, false, Auto, true, Some(Transport::Tcp)),
        (0, 1, true, 1, 1, true, Auto, true, Some(Transport::Rdma)),
        // Cards that disagree: one node, two hosts.
        (0, 1, false, 0, 2, false, Auto, true, None),
        (0, 1, false, 0, 2, false, Tcp, true, None),
    ];

    #[test]
    fn every_combination_and_both_directions() {
        for (i, &(na, ha, va, nb, hb, vb, mode, shm, want)) in TABLE.iter().enumerate() {
            let (a, b) = (card(na, ha, va), card(nb, hb, vb));
            let ab = plan(&a, &b, mode, shm);
            let ba = plan(&b, &a, mode, shm);
            assert_eq!(ab.clone().ok(), want, "row {i}: {ab:?}");
            assert_eq!(ab.is_ok(), ba.is_ok(), "row {i}: asymmetric");
            assert_eq!(ab.ok(), ba.ok(), "row {i}: asymmetric");
        }
    }

    #[test]
    fn errors_say_what_is_wrong() {
        let e = plan(&card(0, 1, false), &card(0, 2, false), Auto, true).unwrap_err();
        assert!(e.contains("node 0") && e.contains("same host"), "{e}");
        let e = plan(&card(0, 1, true), &card(1, 2, false), Rdma, true).unwrap_err();
        assert!(e.contains("the peer has no verbs"), "{e}");
    }
}
