//! Forwarding the ranks' output line by line, so lines of different ranks
//! never interleave mid-line.

use std::io::{Read, Write};
use std::os::fd::{AsFd, BorrowedFd};

/// A nonblocking pipe from a rank, cut into lines.
pub struct PipeLines<R> {
    pipe: R,
    partial: Vec<u8>,
}

/// Longest line kept whole; longer output is forwarded in pieces of this size
/// so a rank printing without newlines cannot grow ibrun's memory.
const MAX_LINE: usize = 1 << 20;

impl<R: Read + AsFd> PipeLines<R> {
    pub fn new(pipe: R) -> Self {
        PipeLines {
            pipe,
            partial: Vec::new(),
        }
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.pipe.as_fd()
    }

    /// Reads what is available; returns the complete lines (without their
    /// newline; a piece ending in a lone carriage return counts as a line
    /// and keeps it) and whether the pipe reached end-of-file, in which case the
    /// last unterminated piece is returned as a line too.
    pub fn read_lines(&mut self, buf: &mut [u8]) -> (Vec<Vec<u8>>, bool) {
        let mut eof = false;
        loop {
            match self.pipe.read(buf) {
                Ok(0) => {
                    eof = true;
                    break;
                }
                Ok(n) => self.partial.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(_) => {
                    eof = true;
                    break;
                }
            }
            if self.partial.len() > 4 * MAX_LINE {
                break;
            }
        }
        let mut lines = Vec::new();
        let mut start = 0;
        for (i, &b) in self.partial.iter().enumerate() {
            if b == b'\n' {
                lines.push(self.partial[start..i].to_vec());
                start = i + 1;
            } else if b == b'\r' && self.partial.get(i + 1) != Some(&b'\n') {
                // A progress line redraws itself after a carriage return and
                // never ends: forward it now, the `\r` kept.
                lines.push(self.partial[start..=i].to_vec());
                start = i + 1;
            } else if i + 1 - start >= MAX_LINE {
                lines.push(self.partial[start..=i].to_vec());
                start = i + 1;
            }
        }
        self.partial.drain(..start);
        if eof && !self.partial.is_empty() {
            lines.push(std::mem::take(&mut self.partial));
        }
        (lines, eof)
    }

    /// The unterminated rest, when giving up on the pipe.
    pub fn finish(mut self) -> Vec<Vec<u8>> {
        let mut buf = vec![0u8; 4096];
        let (mut lines, eof) = self.read_lines(&mut buf);
        if !eof && !self.partial.is_empty() {
            lines.push(std::mem::take(&mut self.partial));
        }
        lines
    }
}

/// Where forwarded lines and ibrun's own messages go.
pub struct OutputSink {
    pub tag: bool,
}

impl OutputSink {
    pub fn line(&self, rank: usize, is_err: bool, line: &[u8]) {
        let mut out = Vec::with_capacity(line.len() + 8);
        if self.tag {
            out.extend_from_slice(format!("[{rank}] ").as_bytes());
        }
        out.extend_from_slice(line);
        if line.last() != Some(&b'\r') {
            out.push(b'\n');
        }
        // A closed stdout (e.g. `ibrun ... | head`) must not kill the job.
        if is_err {
            let _ = std::io::stderr().lock().write_all(&out);
        } else {
            let _ = std::io::stdout().lock().write_all(&out);
        }
    }

    pub fn diag(&self, msg: &str) {
        let _ = writeln!(std::io::stderr().lock(), "ibrun: {msg}");
    }

    pub fn flush(&self) {
        let _ = std::io::stdout().flush();
        let _ = std::io::stderr().flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::net::UnixStream;

    fn lines_of(writes: &[&[u8]]) -> Vec<Vec<u8>> {
        let (mut w, r) = UnixStream::pair().unwrap();
        r.set_nonblocking(true).unwrap();
        let mut p = PipeLines::new(r);
        let mut buf = vec![0u8; 4096];
        let mut all = Vec::new();
        for chunk in writes {
            w.write_all(chunk).unwrap();
            all.extend(p.read_lines(&mut buf).0);
        }
        drop(w);
        let (rest, eof) = p.read_lines(&mut buf);
        assert!(eof);
        all.extend(rest);
        all
    }

    #[test]
    fn carriage_returns_are_forwarded_at_once() {
        let v = lines_of(&[b"a\nstep 1\r", b"step 2\rdone\n", b"win\r\n", b"tail"]);
        let want: [&[u8]; 6] = [b"a", b"step 1\r", b"step 2\r", b"done", b"win\r", b"tail"];
        assert_eq!(v, want.map(|l| l.to_vec()).to_vec());
        // A CRLF split between two reads comes out as the same bytes.
        let v = lines_of(&[b"x\r", b"\ny\n"]);
        assert_eq!(v, vec![b"x\r".to_vec(), b"".to_vec(), b"y".to_vec()]);
    }
}
