//! The one message header every channel carries (32 bytes, little endian).
//!
//! ```text
//! 0   kind u8        1 eager, 2 RTS, 3 CTS, 4 DATA, 5 FIN, 6 BYE
//! 1   version u8     VERSION
//! 2   stamp lo u16   low half of the collective call's stamp (0: none)
//! 4   src u32        sender's rank in the communicator of `ctx`
//! 8   tag i32
//! 12  ctx u32        communicator context id
//! 16  len u48        message length (eager, RTS); bytes wanted (CTS); frame length (DATA)
//! 22  stamp hi u16   high half of the stamp
//! 24  seq u64        eager: per-channel sequence; RTS/FIN: sender's token; CTS: sender's token; DATA: receiver's token
//! ```
//!
//! The stamp says which collective call a message belongs to beyond its
//! tag (collective, root, reduction operation and element type: see
//! `schedule::stamp`), so that a receiver whose own call disagrees notices
//! it from the message it gets, at no cost beyond these bytes. The engine
//! only carries it; point-to-point messages have none. Lengths stop at
//! 2^48 bytes (256 TiB), which no buffer reaches.
//!
//! What follows the header ("payload") depends on the kind: eager and DATA
//! carry `len` bytes; RTS carries 8 bytes (the sender's buffer address for a
//! single-copy read, 0 otherwise); CTS carries 8 bytes (the receiver's
//! token); FIN and BYE carry nothing.

/// Encoded size of a [`Header`].
pub const HEADER_LEN: usize = 32;

/// Protocol version written in every header.
pub const VERSION: u8 = 2;

/// Largest length a header carries (48 bits).
pub const MAX_LEN: u64 = (1 << 48) - 1;

/// What a message is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// A whole message, payload included.
    Eager = 1,
    /// Request to send: a rendezvous message's envelope.
    Rts = 2,
    /// Clear to send: the receiver wants the data streamed.
    Cts = 3,
    /// A frame of streamed rendezvous data.
    Data = 4,
    /// The receiver has read the data itself (single copy); the send is done.
    Fin = 5,
    /// The sender is leaving cleanly; nothing more comes on this channel.
    Bye = 6,
}

impl Kind {
    fn from_u8(b: u8) -> Option<Kind> {
        Some(match b {
            1 => Kind::Eager,
            2 => Kind::Rts,
            3 => Kind::Cts,
            4 => Kind::Data,
            5 => Kind::Fin,
            6 => Kind::Bye,
            _ => return None,
        })
    }
}

/// A decoded header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub kind: Kind,
    pub src: u32,
    pub tag: i32,
    pub ctx: u32,
    pub len: u64,
    pub seq: u64,
    /// The collective call's stamp (0: none, a point-to-point message or
    /// a control record).
    pub stamp: u32,
}

/// Why bytes are not a header.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    #[error("header needs {HEADER_LEN} bytes, got {0}")]
    Short(usize),
    #[error("unknown message kind {0}")]
    Kind(u8),
    #[error("protocol version {0}, this build speaks {VERSION}")]
    Version(u8),
}

impl Header {
    /// A header of `kind` with every other field zero.
    pub const fn new(kind: Kind) -> Header {
        Header {
            kind,
            src: 0,
            tag: 0,
            ctx: 0,
            len: 0,
            seq: 0,
            stamp: 0,
        }
    }

    /// The wire form.
    #[inline]
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        debug_assert!(
            self.len <= MAX_LEN,
            "header length {} over 48 bits",
            self.len
        );
        b[0] = self.kind as u8;
        b[1] = VERSION;
        b[2..4].copy_from_slice(&(self.stamp as u16).to_le_bytes());
        b[4..8].copy_from_slice(&self.src.to_le_bytes());
        b[8..12].copy_from_slice(&self.tag.to_le_bytes());
        b[12..16].copy_from_slice(&self.ctx.to_le_bytes());
        let len = (self.len & MAX_LEN) | (u64::from(self.stamp >> 16) << 48);
        b[16..24].copy_from_slice(&len.to_le_bytes());
        b[24..32].copy_from_slice(&self.seq.to_le_bytes());
        b
    }

    /// Parses the first [`HEADER_LEN`] bytes of `b`; never panics.
    #[inline]
    pub fn decode(b: &[u8]) -> Result<Header, HeaderError> {
        let Some(b) = b.get(..HEADER_LEN) else {
            return Err(HeaderError::Short(b.len()));
        };
        let kind = Kind::from_u8(b[0]).ok_or(HeaderError::Kind(b[0]))?;
        if b[1] != VERSION {
            return Err(HeaderError::Version(b[1]));
        }
        let lo = u16::from_le_bytes([b[2], b[3]]);
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let u64_at = |i: usize| u64::from(u32_at(i)) | (u64::from(u32_at(i + 4)) << 32);
        let len = u64_at(16);
        Ok(Header {
            kind,
            src: u32_at(4),
            tag: u32_at(8) as i32,
            ctx: u32_at(12),
            len: len & MAX_LEN,
            seq: u64_at(24),
            stamp: u32::from(lo) | ((len >> 48) as u32) << 16,
        })
    }

    /// Bytes that follow this header on a byte stream, or `None` for a
    /// length that cannot be right (callers bound eager and DATA lengths
    /// themselves).
    pub fn payload_len(&self) -> u64 {
        match self.kind {
            Kind::Eager | Kind::Data => self.len,
            Kind::Rts | Kind::Cts => 8,
            Kind::Fin | Kind::Bye => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn roundtrip_examples() {
        let h = Header {
            kind: Kind::Rts,
            src: 7,
            tag: -3,
            ctx: 42,
            len: 1 << 40,
            seq: u64::MAX,
            stamp: 0xdead_beef,
        };
        assert_eq!(Header::decode(&h.encode()), Ok(h));
        assert_eq!(h.payload_len(), 8);
        assert_eq!(Header::new(Kind::Fin).payload_len(), 0);
    }

    #[test]
    fn rejects_garbage() {
        assert_eq!(Header::decode(&[1; 5]), Err(HeaderError::Short(5)));
        let mut b = Header::new(Kind::Eager).encode();
        b[0] = 0;
        assert_eq!(Header::decode(&b), Err(HeaderError::Kind(0)));
        b[0] = 1;
        b[1] = 9;
        assert_eq!(Header::decode(&b), Err(HeaderError::Version(9)));
        b[1] = VERSION;
        b[3] = 1;
        assert_eq!(Header::decode(&b).map(|h| h.stamp), Ok(0x100));
    }

    fn kind() -> impl Strategy<Value = Kind> {
        prop_oneof![
            Just(Kind::Eager),
            Just(Kind::Rts),
            Just(Kind::Cts),
            Just(Kind::Data),
            Just(Kind::Fin),
            Just(Kind::Bye)
        ]
    }

    proptest! {
        #[test]
        fn any_bytes_give_error_or_value(b in proptest::collection::vec(any::<u8>(), 0..80)) {
            if let Ok(h) = Header::decode(&b) {
                prop_assert_eq!(&h.encode()[..], &b[..HEADER_LEN]);
            }
        }

        #[test]
        fn encode_decode_roundtrip(k in kind(), src: u32, tag: i32, ctx: u32, len in 0..=MAX_LEN, seq: u64, stamp: u32) {
            let h = Header { kind: k, src, tag, ctx, len, seq, stamp };
            prop_assert_eq!(Header::decode(&h.encode()), Ok(h));
        }
    }
}
