//! The tuner's progress line on stderr: redrawn in place after a carriage
//! return, shown only where a person watches (see [`Progress::new`]).

use std::io::IsTerminal;
use std::time::Instant;

pub struct Progress {
    on: bool,
    total: usize,
    done: usize,
    start: Instant,
}

impl Progress {
    /// On for rank 0 when its stderr is a terminal, or when ibrun says its
    /// own is (`IBCOLL_STDERR_TTY=1`: a rank's stderr is then a pipe to
    /// ibrun, which forwards a piece ending in `\r` at once).
    pub fn new(rank: usize, total: usize) -> Progress {
        let tty = std::io::stderr().is_terminal()
            || std::env::var("IBCOLL_STDERR_TTY").is_ok_and(|v| v == "1");
        Progress {
            on: rank == 0 && tty,
            total: total.max(1),
            done: 0,
            start: Instant::now(),
        }
    }

    /// Before measuring `what` (e.g. "allreduce 3/16, 64 KiB 5/20"): one
    /// more point of `total` starts.
    pub fn step(&mut self, what: &str) {
        if self.on {
            let pct = 100 * self.done / self.total;
            // Clear to the end of the line first: the previous draw may
            // have been longer.
            eprint!(
                "\x1b[Ktune: {what}, point {}/{} ({pct}%, {:.0} s)\r",
                self.done + 1,
                self.total,
                self.start.elapsed().as_secs_f64()
            );
        }
        self.done += 1;
    }

    /// Replaces the line with a last one that stays.
    pub fn finish(&self) {
        if self.on {
            eprintln!(
                "\x1b[Ktune: {} points in {:.0} s",
                self.done,
                self.start.elapsed().as_secs_f64()
            );
        }
    }
}
