//! The rdma connection manager's datagrams and rules: RC queue pairs are
//! connected on first use by a three-way handshake over the process's UD
//! endpoint (`ibcoll_rdma::UdEndpoint`), whose address every rank
//! publishes in its card.
//!
//! ```text
//!  requester (first to send)             responder
//!  create RC QP (RESET)
//!  REQ(qp info, its UD address) ───────▶ create RC QP, connect it (RTR/RTS),
//!                                        post receives
//!                              ◀──────── REP(qp info)
//!  connect (RTR/RTS), post receives;
//!  ready: queued sends go
//!  RDY ─────────────────────────────────▶ ready (or on the first RC receive)
//! ```
//!
//! REQ and REP also carry where the peer is to RDMA-write its credit
//! grants for this pair (the sender's flow word: address and rkey) and the
//! credits the sender grants the peer up front (`transport/rdma_flow.rs`).
//!
//! The same endpoint carries the flow control's datagrams ([`Flow`]): WANT
//! (a sender out of credits asks the receiver for more; resent until the
//! receiver's flow-word write answers it) and WAKE (the receiver granted
//! credits to a sender that asked, which may be asleep in `poll(2)`: the
//! grant itself is in its flow word, this only wakes it; losing it costs
//! at most the sleeper's bounded timeout).
//!
//! Datagrams can be lost: the requester resends REQ and the responder REP
//! (doubling from [`RETRY_FIRST`] to [`RETRY_MAX`]) until the answer comes
//! or the handshake deadline (`IBCOLL_PEER_TIMEOUT_MS`) passes, which fails
//! the pair naming the peer. Every message is idempotent: a repeated REQ for
//! the QP already connected is answered with REP again, a repeated REP with
//! RDY again. When both ranks send first (two REQs cross), the lower rank's
//! request wins ([`keep_request`]): the higher rank connects the QP it
//! already made to the lower's and answers as responder, the lower ignores
//! the higher's REQ. Either way the pair ends with exactly one QP each.

use std::time::Duration;

use ibcoll_rdma::{QpInfo, RemoteBuf, UdAddr};

const MAGIC: u32 = 0x1bc0_c301;
const VERSION: u8 = 2;
const FLOW_MAGIC: u32 = 0x1bc0_f10e;

/// Bytes of every handshake datagram.
pub(crate) const MSG_LEN: usize = 112;
/// Bytes of every flow-control datagram.
pub(crate) const FLOW_LEN: usize = 40;

/// First resend of an unanswered REQ or REP.
pub(crate) const RETRY_FIRST: Duration = Duration::from_millis(200);
/// Longest interval between resends.
pub(crate) const RETRY_MAX: Duration = Duration::from_secs(1);

/// What a handshake datagram is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Connect to my QP; answer at my UD address.
    Req,
    /// My QP is connected to yours: connect yours to it.
    Rep,
    /// Mine is connected too: send.
    Rdy,
}

impl Kind {
    fn code(self) -> u8 {
        match self {
            Kind::Req => 1,
            Kind::Rep => 2,
            Kind::Rdy => 3,
        }
    }
    fn from_code(c: u8) -> Option<Kind> {
        match c {
            1 => Some(Kind::Req),
            2 => Some(Kind::Rep),
            3 => Some(Kind::Rdy),
            _ => None,
        }
    }
}

/// One handshake datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Msg {
    pub kind: Kind,
    /// The job (a datagram from another job on the fabric is ignored).
    pub job: u64,
    pub from: u32,
    pub to: u32,
    /// The sender's pid and host key (for the same-host liveness check).
    pub pid: i32,
    pub host: u64,
    /// Where to answer.
    pub ud: UdAddr,
    /// The sender's RC QP for this pair.
    pub qp: QpInfo,
    /// Where to RDMA-write grants for the sender (its flow word).
    pub word: RemoteBuf,
    /// Credits the sender grants the peer up front.
    pub grant: u32,
}

impl Msg {
    /// Fixed layout: magic u32, kind u8, version u8, 2 reserved, job u64,
    /// from u32, to u32, pid i32, 4 reserved, host u64, UD address (22),
    /// 2 reserved, QP info (32), flow word address u64, its rkey u32, the
    /// grant u32; little endian.
    pub fn encode(&self) -> [u8; MSG_LEN] {
        let mut b = [0u8; MSG_LEN];
        put_header(
            &mut b,
            MAGIC,
            self.kind.code(),
            self.job,
            self.from,
            self.to,
        );
        b[24..28].copy_from_slice(&self.pid.to_le_bytes());
        b[32..40].copy_from_slice(&self.host.to_le_bytes());
        b[40..40 + UdAddr::WIRE_LEN].copy_from_slice(&self.ud.to_bytes());
        b[64..96].copy_from_slice(&self.qp.to_bytes());
        b[96..104].copy_from_slice(&self.word.addr.to_le_bytes());
        b[104..108].copy_from_slice(&self.word.rkey.to_le_bytes());
        b[108..112].copy_from_slice(&self.grant.to_le_bytes());
        b
    }

    /// `None` for anything that is not a well-formed handshake datagram of
    /// this version.
    pub fn decode(b: &[u8]) -> Option<Msg> {
        let (kind, job, from, to) = header(b, MSG_LEN, MAGIC)?;
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        Some(Msg {
            kind: Kind::from_code(kind)?,
            job,
            from,
            to,
            pid: u32_at(24) as i32,
            host: u64_at(32),
            ud: UdAddr::from_bytes(&b[40..40 + UdAddr::WIRE_LEN]).ok()?,
            qp: QpInfo::from_bytes(&b[64..96]).ok()?,
            word: RemoteBuf {
                addr: u64_at(96),
                len: ibcoll_rdma::FLOW_WORD_LEN as u64,
                rkey: u32_at(104),
            },
            grant: u32_at(108),
        })
    }
}

/// What a flow-control datagram is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FlowKind {
    /// I am out of credits and have `backlog` records for you: request
    /// `seq`, having used `used` credits.
    Want,
    /// I granted you credits (see your flow word): wake up.
    Wake,
}

/// One flow-control datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Flow {
    pub kind: FlowKind,
    pub job: u64,
    pub from: u32,
    pub to: u32,
    pub seq: u32,
    pub used: u32,
    pub backlog: u32,
}

impl Flow {
    /// Fixed layout: magic u32, kind u8, version u8, 2 reserved, job u64,
    /// from u32, to u32, seq u32, used u32, backlog u32, 4 reserved; little
    /// endian.
    pub fn encode(&self) -> [u8; FLOW_LEN] {
        let mut b = [0u8; FLOW_LEN];
        let kind = match self.kind {
            FlowKind::Want => 1,
            FlowKind::Wake => 2,
        };
        put_header(&mut b, FLOW_MAGIC, kind, self.job, self.from, self.to);
        b[24..28].copy_from_slice(&self.seq.to_le_bytes());
        b[28..32].copy_from_slice(&self.used.to_le_bytes());
        b[32..36].copy_from_slice(&self.backlog.to_le_bytes());
        b
    }

    /// `None` for anything that is not a well-formed flow datagram of this
    /// version.
    pub fn decode(b: &[u8]) -> Option<Flow> {
        let (kind, job, from, to) = header(b, FLOW_LEN, FLOW_MAGIC)?;
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        Some(Flow {
            kind: match kind {
                1 => FlowKind::Want,
                2 => FlowKind::Wake,
                _ => return None,
            },
            job,
            from,
            to,
            seq: u32_at(24),
            used: u32_at(28),
            backlog: u32_at(32),
        })
    }
}

/// Writes the 24 bytes every datagram here starts with: magic u32, kind
/// u8, version u8, 2 reserved, job u64, from u32, to u32 (little endian).
fn put_header(b: &mut [u8], magic: u32, kind: u8, job: u64, from: u32, to: u32) {
    b[0..4].copy_from_slice(&magic.to_le_bytes());
    b[4] = kind;
    b[5] = VERSION;
    b[8..16].copy_from_slice(&job.to_le_bytes());
    b[16..20].copy_from_slice(&from.to_le_bytes());
    b[20..24].copy_from_slice(&to.to_le_bytes());
}

/// [`put_header`]'s (kind, job, from, to) of a datagram of `len` bytes
/// with `magic` and this version; `None` for anything else.
fn header(b: &[u8], len: usize, magic: u32) -> Option<(u8, u64, u32, u32)> {
    if b.len() != len || b[0..4] != magic.to_le_bytes() || b[5] != VERSION {
        return None;
    }
    let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
    Some((
        b[4],
        u64::from_le_bytes(b[8..16].try_into().expect("8 bytes")),
        u32_at(16),
        u32_at(20),
    ))
}

/// Whether rank `me`, which has sent its own REQ to `peer` and not yet had
/// an answer, answers `peer`'s crossing REQ (and gives up its own
/// request): only when `peer` is the lower rank. The two ranks decide
/// opposite ways, so exactly one request of the pair is answered.
pub(crate) fn keep_request(me: usize, peer: usize) -> bool {
    peer < me
}

/// The resend interval after `tries` sends.
pub(crate) fn retry_after(tries: u32) -> Duration {
    RETRY_FIRST
        .saturating_mul(1u32 << tries.saturating_sub(1).min(8))
        .min(RETRY_MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ibcoll_rdma::{Gid, Mtu};

    fn msg(kind: Kind) -> Msg {
        Msg {
            kind,
            job: 0xfeed_beef_0123,
            from: 7,
            to: 3,
            pid: 4242,
            host: 99,
            ud: UdAddr {
                gid: Gid([0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 77, 0, 2]),
                lid: 0,
                qpn: 0x11,
            },
            qp: QpInfo {
                qpn: 0x12,
                psn: 0xabc,
                gid: Gid([3; 16]),
                lid: 0,
                mtu: Mtu::M1024,
            },
            word: RemoteBuf {
                addr: 0x7f00_1234_5670,
                len: ibcoll_rdma::FLOW_WORD_LEN as u64,
                rkey: 0x4242,
            },
            grant: 4,
        }
    }

    #[test]
    fn roundtrip_and_garbage() {
        for k in [Kind::Req, Kind::Rep, Kind::Rdy] {
            let m = msg(k);
            assert_eq!(Msg::decode(&m.encode()), Some(m));
        }
        let b = msg(Kind::Req).encode();
        assert_eq!(Msg::decode(&b[..MSG_LEN - 1]), None);
        let mut bad = b;
        bad[0] ^= 1;
        assert_eq!(Msg::decode(&bad), None);
        let mut bad = b;
        bad[4] = 9;
        assert_eq!(Msg::decode(&bad), None);
        let mut bad = b;
        bad[5] = VERSION + 1;
        assert_eq!(Msg::decode(&bad), None);
        let mut bad = b;
        bad[64] = b'X'; // QP info magic
        assert_eq!(Msg::decode(&bad), None);
    }

    #[test]
    fn flow_datagrams_roundtrip() {
        for kind in [FlowKind::Want, FlowKind::Wake] {
            let f = Flow {
                kind,
                job: 9,
                from: 3,
                to: 0,
                seq: 17,
                used: 4000,
                backlog: 12,
            };
            assert_eq!(Flow::decode(&f.encode()), Some(f));
            // Never mistaken for a handshake datagram, nor the reverse.
            assert_eq!(Msg::decode(&f.encode()), None);
        }
        assert_eq!(Flow::decode(&msg(Kind::Req).encode()), None);
        let mut bad = Flow {
            kind: FlowKind::Want,
            job: 1,
            from: 1,
            to: 2,
            seq: 1,
            used: 0,
            backlog: 1,
        }
        .encode();
        bad[4] = 7;
        assert_eq!(Flow::decode(&bad), None);
    }

    #[test]
    fn crossing_requests_keep_exactly_one() {
        for a in 0..6 {
            for b in 0..6 {
                if a != b {
                    assert_ne!(keep_request(a, b), keep_request(b, a), "{a} {b}");
                }
            }
        }
        assert!(keep_request(5, 1) && !keep_request(1, 5));
    }

    #[test]
    fn retries_back_off_to_a_ceiling() {
        assert_eq!(retry_after(1), RETRY_FIRST);
        assert_eq!(retry_after(2), RETRY_FIRST * 2);
        assert_eq!(retry_after(30), RETRY_MAX);
        assert!((1..40).all(|t| retry_after(t) <= retry_after(t + 1)));
    }
}
