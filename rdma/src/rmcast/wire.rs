//! Packet formats of the reliable multicast (little endian, fixed headers).
//!
//! Data goes to the group by UD multicast and may be lost, duplicated or
//! come from a foreign group sharing the QP: everything is checked and a
//! packet that fails a check is ignored, never an error. Acks and nacks go
//! member to member over a reliable channel chosen by the caller.

/// Bytes of a data packet's header; a fragment carries `mtu - DATA_HDR`.
pub const DATA_HDR: usize = 32;
/// Bytes of an ack.
pub const ACK_LEN: usize = 24;
/// Bytes of a nack before its ranges.
pub const NACK_HDR: usize = 20;
/// Bytes of an abort.
pub const ABORT_LEN: usize = 20;
/// Ranges one nack carries at most (keeps a nack under 300 bytes).
pub const NACK_MAX_RANGES: usize = 32;

const VERSION: u8 = 1;
const KIND_DATA: u8 = 0xD1;
const KIND_ACK: u8 = 0xA1;
const KIND_NACK: u8 = 0x5A;
const KIND_ABORT: u8 = 0xAB;

/// Header of one fragment of one broadcast.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataHdr {
    /// Group tag (the communicator's).
    pub group: u32,
    /// Broadcast number within the group (every member counts the same).
    pub bcast: u32,
    /// Member that broadcasts.
    pub root: u32,
    /// Fragment index.
    pub frag: u32,
    /// Fragments of the broadcast.
    pub nfrags: u32,
    /// Bytes of the broadcast.
    pub len: u64,
    /// The root's repair holdoff when it sent this packet, in units of
    /// [`HINT_UNIT`] (0: none yet): receivers wait about that long
    /// before a quiet-time nack (see `Member`'s round-trip estimate).
    pub hint: u16,
}

/// The unit of [`DataHdr::hint`].
pub const HINT_UNIT: std::time::Duration = std::time::Duration::from_micros(16);

/// An ack: everything of `bcast` below fragment `upto` has reached the
/// sender and its whole subtree; `laggard` is the member that holds the
/// minimum (named in a timeout).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ack {
    /// Group tag.
    pub group: u32,
    /// Broadcast number.
    pub bcast: u32,
    /// Sending member.
    pub from: u32,
    /// Fragments received by the whole subtree (a prefix).
    pub upto: u32,
    /// Member of the subtree holding the minimum.
    pub laggard: u32,
}

/// A nack: the sender misses these fragments of `bcast`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Nack {
    /// Group tag.
    pub group: u32,
    /// Broadcast number.
    pub bcast: u32,
    /// Sending member.
    pub from: u32,
    /// Missing fragments as (first, count).
    pub ranges: Vec<(u32, u32)>,
}

/// An abort: the sender failed broadcast `bcast` because member `dead`
/// made no progress; the others stop waiting and fail naming `dead`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Abort {
    /// Group tag.
    pub group: u32,
    /// Broadcast number.
    pub bcast: u32,
    /// Sending member.
    pub from: u32,
    /// The member it lost.
    pub dead: u32,
}

/// A control message (ack, nack or abort).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Control {
    /// See [`Ack`].
    Ack(Ack),
    /// See [`Nack`].
    Nack(Nack),
    /// See [`Abort`].
    Abort(Abort),
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

impl DataHdr {
    /// Write the header into `out[..DATA_HDR]`.
    pub fn write(&self, out: &mut [u8]) {
        out[0] = KIND_DATA;
        out[1] = VERSION;
        out[2..4].copy_from_slice(&self.hint.to_le_bytes());
        out[4..8].copy_from_slice(&self.group.to_le_bytes());
        out[8..12].copy_from_slice(&self.bcast.to_le_bytes());
        out[12..16].copy_from_slice(&self.root.to_le_bytes());
        out[16..20].copy_from_slice(&self.frag.to_le_bytes());
        out[20..24].copy_from_slice(&self.nfrags.to_le_bytes());
        out[24..32].copy_from_slice(&self.len.to_le_bytes());
    }

    /// Parse a data packet: its header and payload, or `None` for anything
    /// that is not a well-formed data packet.
    pub fn parse(p: &[u8]) -> Option<(DataHdr, &[u8])> {
        if p.len() < DATA_HDR || p[0] != KIND_DATA || p[1] != VERSION {
            return None;
        }
        let h = DataHdr {
            group: u32_at(p, 4),
            bcast: u32_at(p, 8),
            root: u32_at(p, 12),
            frag: u32_at(p, 16),
            nfrags: u32_at(p, 20),
            len: u64::from_le_bytes(p[24..32].try_into().expect("8 bytes")),
            hint: u16::from_le_bytes([p[2], p[3]]),
        };
        if h.frag >= h.nfrags {
            return None;
        }
        Some((h, &p[DATA_HDR..]))
    }
}

impl Control {
    /// Encode into `out` (cleared first).
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.clear();
        match self {
            Control::Ack(a) => {
                out.extend_from_slice(&[KIND_ACK, VERSION, 0, 0]);
                for v in [a.group, a.bcast, a.from, a.upto, a.laggard] {
                    out.extend_from_slice(&v.to_le_bytes());
                }
            }
            Control::Nack(n) => {
                let k = n.ranges.len().min(NACK_MAX_RANGES) as u16;
                out.extend_from_slice(&[KIND_NACK, VERSION]);
                out.extend_from_slice(&k.to_le_bytes());
                for v in [n.group, n.bcast, n.from, 0] {
                    out.extend_from_slice(&v.to_le_bytes());
                }
                for &(a, c) in &n.ranges[..k as usize] {
                    out.extend_from_slice(&a.to_le_bytes());
                    out.extend_from_slice(&c.to_le_bytes());
                }
            }
            Control::Abort(a) => {
                out.extend_from_slice(&[KIND_ABORT, VERSION, 0, 0]);
                for v in [a.group, a.bcast, a.from, a.dead] {
                    out.extend_from_slice(&v.to_le_bytes());
                }
            }
        }
    }

    /// Decode; `None` for anything malformed.
    pub fn decode(p: &[u8]) -> Option<Control> {
        if p.len() < 4 || p[1] != VERSION {
            return None;
        }
        match p[0] {
            KIND_ACK if p.len() == ACK_LEN => Some(Control::Ack(Ack {
                group: u32_at(p, 4),
                bcast: u32_at(p, 8),
                from: u32_at(p, 12),
                upto: u32_at(p, 16),
                laggard: u32_at(p, 20),
            })),
            KIND_ABORT if p.len() == ABORT_LEN => Some(Control::Abort(Abort {
                group: u32_at(p, 4),
                bcast: u32_at(p, 8),
                from: u32_at(p, 12),
                dead: u32_at(p, 16),
            })),
            KIND_NACK if p.len() >= NACK_HDR => {
                let k = u16::from_le_bytes([p[2], p[3]]) as usize;
                if k > NACK_MAX_RANGES || p.len() != NACK_HDR + 8 * k {
                    return None;
                }
                let ranges = (0..k)
                    .map(|i| {
                        let at = NACK_HDR + 8 * i;
                        (u32_at(p, at), u32_at(p, at + 4))
                    })
                    .collect();
                Some(Control::Nack(Nack {
                    group: u32_at(p, 4),
                    bcast: u32_at(p, 8),
                    from: u32_at(p, 12),
                    ranges,
                }))
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_round_trip_and_rejects() {
        let h = DataHdr {
            group: 7,
            bcast: 0xffff_fffe,
            root: 3,
            frag: 4,
            nfrags: 5,
            len: 1 << 40,
            hint: 0x1234,
        };
        let mut p = vec![0u8; DATA_HDR + 3];
        h.write(&mut p);
        p[DATA_HDR..].copy_from_slice(b"abc");
        let (g, pay) = DataHdr::parse(&p).unwrap();
        assert_eq!(g, h);
        assert_eq!(pay, b"abc");
        assert!(DataHdr::parse(&p[..DATA_HDR - 1]).is_none());
        let mut bad = p.clone();
        bad[0] = KIND_ACK;
        assert!(DataHdr::parse(&bad).is_none());
        let mut bad = p.clone();
        bad[16..20].copy_from_slice(&5u32.to_le_bytes()); // frag == nfrags
        assert!(DataHdr::parse(&bad).is_none());
    }

    #[test]
    fn control_round_trip_and_rejects() {
        let mut buf = Vec::new();
        let a = Control::Ack(Ack {
            group: 1,
            bcast: 2,
            from: 3,
            upto: 4,
            laggard: 5,
        });
        a.encode(&mut buf);
        assert_eq!(buf.len(), ACK_LEN);
        assert_eq!(Control::decode(&buf), Some(a));
        let n = Control::Nack(Nack {
            group: 9,
            bcast: 8,
            from: 7,
            ranges: vec![(1, 2), (10, 30)],
        });
        n.encode(&mut buf);
        assert_eq!(Control::decode(&buf), Some(n.clone()));
        let ab = Control::Abort(Abort {
            group: 6,
            bcast: 5,
            from: 4,
            dead: 3,
        });
        ab.encode(&mut buf);
        assert_eq!(buf.len(), ABORT_LEN);
        assert_eq!(Control::decode(&buf), Some(ab));
        n.encode(&mut buf);
        buf.pop();
        assert_eq!(Control::decode(&buf), None);
        assert_eq!(Control::decode(&[]), None);
        // Too many ranges are cut at the encoder.
        let many = Control::Nack(Nack {
            group: 0,
            bcast: 0,
            from: 0,
            ranges: (0..100).map(|i| (i, 1)).collect(),
        });
        many.encode(&mut buf);
        match Control::decode(&buf) {
            Some(Control::Nack(n)) => assert_eq!(n.ranges.len(), NACK_MAX_RANGES),
            other => panic!("{other:?}"),
        }
    }
}
