//! Binary-safe values for the PMI key-value store.
//!
//! PMI values travel inside `key=value` tokens, so they may not contain spaces,
//! newlines or `=`; Slurm limits them to 1024 bytes. Binary values are encoded
//! with the URL-safe base64 alphabet (no padding) behind a one-letter tag, and
//! values longer than the server's limit are split over several keys.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;

/// Tag of a value held in one key.
pub const TAG_INLINE: char = 'b';
/// Tag of a value split over `<key>.<i>` chunk keys; the text after the tag is
/// the chunk count.
pub const TAG_CHUNKED: char = 'c';

/// Encodes bytes with URL-safe base64, no padding.
pub fn encode(data: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(data)
}

/// Decodes [`encode`]'s output; `None` for any other input.
///
/// The engine rejects padding and non-canonical trailing bits, so that
/// decode(encode(x)) is the only way to get x.
pub fn decode(text: &str) -> Option<Vec<u8>> {
    URL_SAFE_NO_PAD.decode(text).ok()
}

/// How a value of `len` encoded bytes is stored under a limit of `max` bytes
/// per PMI value.
pub fn chunk_texts(data: &[u8], max_value: usize) -> Vec<String> {
    let enc = encode(data);
    // Chunk boundaries fall on 4-character groups, so each chunk decodes alone.
    let per = ((max_value.saturating_sub(1)) / 4).max(1) * 4;
    enc.as_bytes()
        .chunks(per)
        .map(|c| String::from_utf8_lossy(c).into_owned())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The hand-written encoder ibcoll used before the base64 crate: the
    /// wire format must not change, or values put by ranks of an older
    /// build would no longer decode.
    fn previous_encode(data: &[u8]) -> String {
        const ALPHABET: &[u8; 64] =
            b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
        let mut out = String::new();
        for chunk in data.chunks(3) {
            let b = [
                chunk[0],
                *chunk.get(1).unwrap_or(&0),
                *chunk.get(2).unwrap_or(&0),
            ];
            let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
            for i in 0..chunk.len() + 1 {
                out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
            }
        }
        out
    }

    #[test]
    fn known_vectors() {
        assert_eq!(encode(b""), "");
        assert_eq!(encode(b"f"), "Zg");
        assert_eq!(encode(b"fo"), "Zm8");
        assert_eq!(encode(b"foo"), "Zm9v");
        assert_eq!(encode(&[0xfb, 0xff]), "-_8");
        assert_eq!(decode("Zm9v").unwrap(), b"foo");
        assert_eq!(decode("Zg").unwrap(), b"f");
    }

    #[test]
    fn rejects_bad_text() {
        assert_eq!(decode("Z"), None);
        assert_eq!(decode("Z=="), None);
        assert_eq!(decode("a b"), None);
        assert_eq!(decode("Zh"), None, "non-canonical trailing bits");
    }

    proptest! {
        #[test]
        fn round_trips(data in proptest::collection::vec(any::<u8>(), 0..300)) {
            let e = encode(&data);
            prop_assert!(crate::wire::is_wire_safe(&e) || e.is_empty());
            prop_assert_eq!(decode(&e).unwrap(), data);
        }

        #[test]
        fn same_wire_format_as_before(data in proptest::collection::vec(any::<u8>(), 0..300)) {
            prop_assert_eq!(encode(&data), previous_encode(&data));
        }

        #[test]
        fn decode_never_panics(s in "\\PC{0,64}") {
            let _ = decode(&s);
        }

        /// Random bytes: an error, or the one canonical text of what it
        /// decodes to.
        #[test]
        fn any_bytes_decode_canonically_or_not(b in proptest::collection::vec(any::<u8>(), 0..64)) {
            let text = String::from_utf8_lossy(&b);
            if let Some(v) = decode(&text) {
                prop_assert_eq!(encode(&v), text.into_owned());
            }
        }

        #[test]
        fn chunks_decode_alone(data in proptest::collection::vec(any::<u8>(), 0..2000), max in 5usize..300) {
            let parts = chunk_texts(&data, max);
            let mut joined = Vec::new();
            for p in &parts {
                prop_assert!(p.len() < max);
                joined.extend(decode(p).unwrap());
            }
            prop_assert_eq!(joined, data);
        }
    }
}
