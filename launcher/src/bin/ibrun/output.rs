//! Forwarding the ranks' output line by line, so lines of different ranks
//! never interleave mid-line.

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, RawFd};

/// A nonblocking pipe from a rank, cut into lines.
pub struct PipeLines<R> {
    pipe: R,
    partial: Vec<u8>,
}

/// Longest line kept whole; longer output is forwarded in pieces of this size
/// so a rank printing without newlines cannot grow ibrun's memory.
const MAX_LINE: usize = 1 << 20;

impl<R: Read + AsRawFd> PipeLines<R> {
    pub fn new(pipe: R) -> Self {
        PipeLines {
            pipe,
            partial: Vec::new(),
        }
    }

    pub fn raw(&self) -> RawFd {
        self.pipe.as_raw_fd()
    }

    /// Reads what is available; returns the complete lines (without their
    /// newline) and whether the pipe reached end-of-file, in which case the
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
        out.push(b'\n');
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
