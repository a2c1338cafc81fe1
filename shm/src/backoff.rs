//! The one escalation every wait in ibcoll follows: re-check, spin, yield,
//! then block.
//!
//! A waiter that expects its condition within ~100 ns gains most from
//! polling it alone (a *check*: no other work, just a pause); one that may
//! wait longer does a little work between looks (a *spin*: the engine polls
//! its channels); past that the CPU is better given away (`sched_yield`),
//! and past that the waiter should sleep in whatever way fits it (a futex
//! doorbell, `poll(2)`), which only the caller knows. [`Backoff`] counts the
//! phases and carries out the pause and the yield itself; the caller acts on
//! the phase it is told and calls [`Backoff::reset`] when something happened.
//!
//! ```
//! use ibcoll_shm::backoff::{Backoff, Step};
//! let mut b = Backoff::new(2, 1).with_checks(1);
//! let steps: Vec<Step> = (0..5).map(|_| b.step()).collect();
//! assert_eq!(steps, [Step::Check, Step::Spin, Step::Spin, Step::Yield, Step::Block]);
//! b.reset(); // progress was made: back to spinning, not to the checks
//! assert_eq!(b.step(), Step::Spin);
//! ```

/// One step of a wait.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Paused once; look at the condition alone.
    Check,
    /// Paused once; do a little work, then look.
    Spin,
    /// Yielded the CPU once; do the work, then look.
    Yield,
    /// Time to block until woken (or a bounded timeout), the caller's way.
    Block,
}

/// Counts of the phases of a wait and where it is.
#[derive(Clone, Copy, Debug)]
pub struct Backoff {
    checks: u32,
    spins: u32,
    yields: u32,
    n: u32,
}

impl Backoff {
    /// A wait of `spins` spins and `yields` yields before blocking.
    #[inline]
    pub const fn new(spins: u32, yields: u32) -> Backoff {
        Backoff {
            checks: 0,
            spins,
            yields,
            n: 0,
        }
    }

    /// The same, first looking at the condition alone `checks` times.
    #[inline]
    pub const fn with_checks(mut self, checks: u32) -> Backoff {
        self.checks = checks;
        self
    }

    /// Back to spinning (something happened, so more may follow soon).
    #[inline]
    pub fn reset(&mut self) {
        self.n = self.checks;
    }

    /// The phase the next [`step`](Self::step) will be in.
    #[inline]
    pub fn phase(&self) -> Step {
        let n = self.n;
        if n < self.checks {
            Step::Check
        } else if n - self.checks < self.spins {
            Step::Spin
        } else if n - self.checks - self.spins < self.yields {
            Step::Yield
        } else {
            Step::Block
        }
    }

    /// Takes the next step: pauses (check, spin) or yields here, and says
    /// which it was; at [`Step::Block`] it stays there until reset.
    #[inline]
    pub fn step(&mut self) -> Step {
        let s = self.phase();
        match s {
            Step::Check | Step::Spin => std::hint::spin_loop(),
            Step::Yield => std::thread::yield_now(),
            Step::Block => return s,
        }
        self.n += 1;
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_phase_counts_means_blocking_at_once() {
        let mut b = Backoff::new(0, 0);
        assert_eq!(b.step(), Step::Block);
        assert_eq!(b.step(), Step::Block);
        b.reset();
        assert_eq!(b.phase(), Step::Block);
    }

    #[test]
    fn phases_come_in_order_and_block_stays() {
        let mut b = Backoff::new(1, 2).with_checks(2);
        let s: Vec<Step> = (0..7).map(|_| b.step()).collect();
        assert_eq!(
            s,
            [
                Step::Check,
                Step::Check,
                Step::Spin,
                Step::Yield,
                Step::Yield,
                Step::Block,
                Step::Block
            ]
        );
    }
}
