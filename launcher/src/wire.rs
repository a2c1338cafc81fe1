//! The PMI-1 wire format: one command per line, `cmd=NAME key=value ...\n`.
//!
//! Both sides of the protocol (the server inside `ibrun` and the client in every
//! rank) go through this module, so that a line from another process is parsed
//! in exactly one place. Parsing never panics: any byte string gives either a
//! [`Command`] or a [`WireError`].

use std::fmt;

/// Longest line either side accepts. MPICH's simple PMI uses 1 KiB lines for
/// PMI-1 and 64 KiB for PMI-2; a peer that sends more is broken or hostile.
pub const MAX_LINE: usize = 64 * 1024;

/// One parsed PMI line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Command {
    /// The value of the leading `cmd=` (or `mcmd=`) token.
    pub name: String,
    /// True when the line started with `mcmd=` (PMI-1 multi-line spawn commands).
    pub multi: bool,
    /// The remaining `key=value` tokens, in order.
    pub args: Vec<(String, String)>,
}

/// Why a line could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("empty PMI line")]
    Empty,
    #[error("PMI line of {0} bytes exceeds the {MAX_LINE}-byte limit")]
    TooLong(usize),
    #[error("PMI line is not valid UTF-8")]
    NotUtf8,
    #[error("PMI line does not start with cmd= or mcmd=: {0:?}")]
    NoCommand(String),
    #[error("PMI token without '=': {0:?}")]
    BadToken(String),
    #[error("PMI reply is missing the key {0:?}")]
    MissingKey(&'static str),
    #[error("PMI value for {key:?} is not a number: {value:?}")]
    NotANumber { key: &'static str, value: String },
}

impl Command {
    /// A command with no arguments.
    pub fn new(name: &str) -> Self {
        Command {
            name: name.to_string(),
            multi: false,
            args: Vec::new(),
        }
    }

    /// Builder-style argument append.
    pub fn arg(mut self, key: &str, value: impl fmt::Display) -> Self {
        self.args.push((key.to_string(), value.to_string()));
        self
    }

    /// The first value of `key`, if present.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.args
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// The value of `key`, or an error naming it.
    pub fn require(&self, key: &'static str) -> Result<&str, WireError> {
        self.get(key).ok_or(WireError::MissingKey(key))
    }

    /// The value of `key` parsed as an integer.
    pub fn require_int(&self, key: &'static str) -> Result<i64, WireError> {
        let v = self.require(key)?;
        v.trim().parse().map_err(|_| WireError::NotANumber {
            key,
            value: v.to_string(),
        })
    }

    /// Serializes to one line including the trailing newline.
    pub fn to_line(&self) -> String {
        let mut s = String::with_capacity(32 + self.args.len() * 16);
        s.push_str(if self.multi { "mcmd=" } else { "cmd=" });
        s.push_str(&self.name);
        for (k, v) in &self.args {
            s.push(' ');
            s.push_str(k);
            s.push('=');
            s.push_str(v);
        }
        s.push('\n');
        s
    }
}

/// A value or key can travel on the wire only if it has no separator bytes.
pub fn is_wire_safe(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_graphic() && b != b'=' && b != b'\\')
}

/// Parses one line (with or without its trailing newline).
pub fn parse_line(raw: &[u8]) -> Result<Command, WireError> {
    if raw.len() > MAX_LINE {
        return Err(WireError::TooLong(raw.len()));
    }
    let text = std::str::from_utf8(raw).map_err(|_| WireError::NotUtf8)?;
    let text = text.trim_end_matches(['\n', '\r']);
    let mut tokens = text.split(' ').filter(|t| !t.is_empty());
    let first = tokens.next().ok_or(WireError::Empty)?;
    let (multi, name) = if let Some(n) = first.strip_prefix("cmd=") {
        (false, n)
    } else if let Some(n) = first.strip_prefix("mcmd=") {
        (true, n)
    } else {
        return Err(WireError::NoCommand(truncate(first)));
    };
    if name.is_empty() {
        return Err(WireError::NoCommand(truncate(first)));
    }
    let mut args = Vec::new();
    for tok in tokens {
        // Values may themselves contain '=' (MPICH splits at the first one).
        let (k, v) = tok
            .split_once('=')
            .ok_or_else(|| WireError::BadToken(truncate(tok)))?;
        if k.is_empty() {
            return Err(WireError::BadToken(truncate(tok)));
        }
        args.push((k.to_string(), v.to_string()));
    }
    Ok(Command {
        name: name.to_string(),
        multi,
        args,
    })
}

fn truncate(s: &str) -> String {
    s.chars().take(80).collect()
}

/// Accumulates bytes from a stream and yields complete lines.
///
/// Used by the server's event loop (nonblocking reads of arbitrary size) and by
/// the client (blocking reads), so that a line split across reads or several
/// lines in one read are handled the same way. Taking a line costs its own
/// length: consumed bytes are dropped only once they make up most of the
/// buffer, and a partial line is scanned for its newline only once.
#[derive(Default, Debug)]
pub struct LineBuffer {
    buf: Vec<u8>,
    /// Start of the first byte not yet returned.
    start: usize,
    /// Bytes from `start` known to hold no newline.
    scanned: usize,
}

impl LineBuffer {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn extend(&mut self, data: &[u8]) {
        if self.start > 0 && self.start * 2 >= self.buf.len() {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        self.buf.extend_from_slice(data);
    }

    /// The next complete line without its newline; `Err` when the pending,
    /// unterminated data already exceeds [`MAX_LINE`].
    pub fn next_line(&mut self) -> Result<Option<Vec<u8>>, WireError> {
        let from = self.start + self.scanned;
        match self.buf[from..].iter().position(|&b| b == b'\n') {
            Some(pos) => {
                let end = from + pos;
                let line = self.buf[self.start..end].to_vec();
                self.start = end + 1;
                self.scanned = 0;
                if self.start == self.buf.len() {
                    self.buf.clear();
                    self.start = 0;
                }
                Ok(Some(line))
            }
            None if self.buf.len() - self.start > MAX_LINE => {
                let n = self.buf.len() - self.start;
                self.buf.clear();
                self.start = 0;
                self.scanned = 0;
                Err(WireError::TooLong(n))
            }
            None => {
                self.scanned = self.buf.len() - self.start;
                Ok(None)
            }
        }
    }

    pub fn is_empty(&self) -> bool {
        self.start == self.buf.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_init() {
        let c = parse_line(b"cmd=init pmi_version=1 pmi_subversion=1\n").unwrap();
        assert_eq!(c.name, "init");
        assert_eq!(c.get("pmi_version"), Some("1"));
        assert_eq!(c.require_int("pmi_subversion").unwrap(), 1);
        assert!(!c.multi);
    }

    #[test]
    fn value_may_contain_equals() {
        let c = parse_line(b"cmd=put kvsname=k key=a value=x=y").unwrap();
        assert_eq!(c.get("value"), Some("x=y"));
    }

    #[test]
    fn round_trip() {
        let c = Command::new("get_result").arg("rc", 0).arg("value", "abc");
        assert_eq!(c.to_line(), "cmd=get_result rc=0 value=abc\n");
        assert_eq!(parse_line(c.to_line().as_bytes()).unwrap(), c);
    }

    #[test]
    fn rejects_garbage() {
        assert_eq!(parse_line(b""), Err(WireError::Empty));
        assert_eq!(parse_line(b"   \n"), Err(WireError::Empty));
        assert!(matches!(parse_line(b"hello"), Err(WireError::NoCommand(_))));
        assert!(matches!(parse_line(b"cmd="), Err(WireError::NoCommand(_))));
        assert!(matches!(
            parse_line(b"cmd=put novalue"),
            Err(WireError::BadToken(_))
        ));
        assert!(matches!(
            parse_line(b"cmd=x =v"),
            Err(WireError::BadToken(_))
        ));
        assert_eq!(parse_line(&[0xff, 0xfe]), Err(WireError::NotUtf8));
        let long = vec![b'a'; MAX_LINE + 1];
        assert!(matches!(parse_line(&long), Err(WireError::TooLong(_))));
    }

    #[test]
    fn line_buffer_splits_and_joins() {
        let mut lb = LineBuffer::new();
        lb.extend(b"cmd=a\ncmd=");
        assert_eq!(lb.next_line().unwrap().unwrap(), b"cmd=a");
        assert_eq!(lb.next_line().unwrap(), None);
        lb.extend(b"b x=1\n");
        assert_eq!(lb.next_line().unwrap().unwrap(), b"cmd=b x=1");
        assert!(lb.is_empty());
    }

    #[test]
    fn line_buffer_many_lines_and_pieces() {
        let mut lb = LineBuffer::new();
        let text: String = (0..1000).map(|i| format!("cmd=x i={i}\n")).collect();
        for piece in text.as_bytes().chunks(7) {
            lb.extend(piece);
        }
        for i in 0..1000 {
            assert_eq!(
                lb.next_line().unwrap().unwrap(),
                format!("cmd=x i={i}").as_bytes()
            );
        }
        assert_eq!(lb.next_line().unwrap(), None);
        assert!(lb.is_empty());
        // A line arriving byte by byte after some were taken.
        lb.extend(b"a\nb");
        assert_eq!(lb.next_line().unwrap().unwrap(), b"a");
        assert_eq!(lb.next_line().unwrap(), None);
        lb.extend(b"c");
        assert_eq!(lb.next_line().unwrap(), None);
        lb.extend(b"\n");
        assert_eq!(lb.next_line().unwrap().unwrap(), b"bc");
    }

    #[test]
    fn line_buffer_bounds_unterminated_data() {
        let mut lb = LineBuffer::new();
        lb.extend(&vec![b'x'; MAX_LINE + 10]);
        assert!(lb.next_line().is_err());
        assert!(lb.is_empty());
    }

    proptest! {
        #[test]
        fn any_bytes_parse_or_error(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = parse_line(&bytes);
        }

        #[test]
        fn any_bytes_through_line_buffer(chunks in proptest::collection::vec(
            proptest::collection::vec(any::<u8>(), 0..64), 0..16)) {
            let mut lb = LineBuffer::new();
            for c in &chunks {
                lb.extend(c);
                while let Ok(Some(line)) = lb.next_line() {
                    let _ = parse_line(&line);
                }
            }
        }

        #[test]
        fn serialized_commands_parse_back(
            name in "[a-z_]{1,16}",
            args in proptest::collection::vec(("[a-z_]{1,8}", "[A-Za-z0-9_.:-]{0,20}"), 0..6)
        ) {
            let mut c = Command::new(&name);
            for (k, v) in &args { c = c.arg(k, v); }
            let back = parse_line(c.to_line().as_bytes()).unwrap();
            prop_assert_eq!(back, c);
        }
    }
}
