//! Futex doorbells for blocking waits, and [`Waiter`]: the common
//! [`Backoff`](crate::backoff::Backoff) ending in a sleep on a doorbell.
//!
//! Each local rank owns one [`Doorbell`] in the node segment and is the only
//! one that sleeps on it; any peer that makes work for it (pushes a record,
//! fills a pipe slot) rings it. The protocol is the store-buffering pattern
//! with a SeqCst fence on each side:
//!
//! ```text
//! sleeper                          ringer
//! state = ASLEEP                   publish work (Release)
//! fence(SeqCst)                    fence(SeqCst)
//! if ready() { return }            if state == ASLEEP: CAS to AWAKE, futex_wake
//! futex_wait(state, ASLEEP)
//! ```
//! (With every process of the node registered for `membarrier`, the
//! sleeper's fence becomes a global barrier and the ringer's a compiler
//! barrier: [`crate::fences`].)
//! Either the sleeper sees the work, or the ringer sees ASLEEP; and a ringer
//! that sets AWAKE before the sleeper enters the kernel makes `futex_wait`
//! return at once, so no wake-up is lost. A ringer costs one load when the
//! owner is awake: no syscall and no write to the owner's line.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use crate::backoff::{Backoff, Step};
use crate::layout::FALSE_SHARING_STRIDE;

/// Longest sleep when the sleeper's barrier failed while ringers skip
/// their fence (a wake-up may be lost; see [`crate::fences`]).
const LOSSY_SLEEP: Duration = Duration::from_millis(1);

const AWAKE: u32 = 0;
const ASLEEP: u32 = 1;
/// Blocked in `poll(2)` with its wake-up FIFO (see [`crate::wake`]).
const POLLING: u32 = 2;

/// A doorbell word, alone in its 128 bytes. Zeroed memory is a valid,
/// awake doorbell, so a fresh segment needs no initialisation.
#[repr(C, align(128))]
#[derive(Debug, Default)]
pub struct Doorbell {
    state: AtomicU32,
}

const _: () = assert!(std::mem::size_of::<Doorbell>() == FALSE_SHARING_STRIDE);

/// How a [`Doorbell::sleep`] ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SleepOutcome {
    /// The condition held on the re-check; no syscall was made.
    Ready,
    /// Returned from the kernel before the timeout (rung, or spurious).
    Woken,
    /// The timeout expired: a good moment to check peer liveness.
    TimedOut,
}

impl Doorbell {
    /// An awake doorbell, for use outside shared memory (tests, threads).
    pub const fn new() -> Doorbell {
        Doorbell {
            state: AtomicU32::new(AWAKE),
        }
    }

    /// The doorbell at `ptr` in a shared segment.
    ///
    /// # Safety
    /// `ptr` is 128-byte aligned, points at `size_of::<Doorbell>()` bytes
    /// that are zeroed or hold a doorbell, that stay mapped for `'a`, and
    /// that are only accessed through `Doorbell`.
    pub unsafe fn from_ptr<'a>(ptr: *mut u8) -> &'a Doorbell {
        debug_assert_eq!(ptr as usize % FALSE_SHARING_STRIDE, 0);
        // SAFETY: the caller guarantees alignment, validity and lifetime;
        // `Doorbell` is a single atomic, so any bit pattern in it is valid
        // and shared access is sound.
        unsafe { &*(ptr as *const Doorbell) }
    }

    /// Wakes the owner if it said it is asleep on the futex; returns whether
    /// a wake syscall was made. Call it after publishing the work. An owner
    /// blocked in `poll(2)` ([`sleep_polling`](Self::sleep_polling)) needs
    /// [`ring_with`](Self::ring_with).
    #[inline]
    pub fn ring(&self) -> bool {
        crate::fences::ringer();
        if self.state.load(Ordering::Relaxed) != ASLEEP {
            return false;
        }
        self.wake_futex()
    }

    /// Like [`ring`](Self::ring), and if the owner is blocked in `poll(2)`
    /// calls `poke` (which writes the owner's wake-up FIFO). Returns whether
    /// a sleeper was woken.
    #[inline]
    pub fn ring_with(&self, poke: impl FnOnce()) -> bool {
        crate::fences::ringer();
        match self.state.load(Ordering::Relaxed) {
            AWAKE => false,
            ASLEEP => self.wake_futex(),
            s => {
                // Of several ringers only the one that flips the state pokes.
                let won = self
                    .state
                    .compare_exchange(s, AWAKE, Ordering::SeqCst, Ordering::Relaxed)
                    .is_ok();
                if won {
                    poke();
                }
                won
            }
        }
    }

    #[cold]
    fn wake_futex(&self) -> bool {
        // Of several ringers only the one that flips the state wakes.
        if self
            .state
            .compare_exchange(ASLEEP, AWAKE, Ordering::SeqCst, Ordering::Relaxed)
            .is_err()
        {
            return false;
        }
        futex_wake(&self.state);
        true
    }

    /// Owner only: announces that it is about to block in `poll(2)` on
    /// its wake-up FIFO (see [`crate::wake`]); ringers that use
    /// [`ring_with`](Self::ring_with) poke the FIFO from now on. Re-check
    /// for work after this (as [`sleep`](Self::sleep) does), then poll, then
    /// call [`end_polling`](Self::end_polling).
    /// Returns false if a wake-up may be lost (see [`crate::fences`]):
    /// the caller then polls with a short timeout.
    pub fn begin_polling(&self) -> bool {
        self.state.store(POLLING, Ordering::Relaxed);
        crate::fences::sleeper()
    }

    /// Owner only: awake again after [`begin_polling`](Self::begin_polling).
    pub fn end_polling(&self) {
        self.state.store(AWAKE, Ordering::Relaxed);
    }

    /// Owner only: announces sleep, re-checks `ready`, and blocks until rung
    /// or `timeout` passes. `ready` must read the conditions that ringers
    /// publish before they ring (with Acquire loads).
    pub fn sleep(&self, mut ready: impl FnMut() -> bool, timeout: Duration) -> SleepOutcome {
        self.state.store(ASLEEP, Ordering::Relaxed);
        let timeout = if crate::fences::sleeper() {
            timeout
        } else {
            timeout.min(LOSSY_SLEEP)
        };
        if ready() {
            self.state.store(AWAKE, Ordering::Relaxed);
            return SleepOutcome::Ready;
        }
        let timed_out = futex_wait(&self.state, ASLEEP, timeout);
        self.state.store(AWAKE, Ordering::Relaxed);
        if timed_out {
            SleepOutcome::TimedOut
        } else {
            SleepOutcome::Woken
        }
    }
}

/// Blocks while `*word == expected`, at most `timeout`; true if it timed out.
fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) -> bool {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: `word` is a live, aligned u32 and `ts` outlives the call. The
    // futex is not FUTEX_PRIVATE because the word is shared between
    // processes.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
        )
    };
    rc == -1 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ETIMEDOUT)
}

fn futex_wake(word: &AtomicU32) {
    // SAFETY: `word` is a live, aligned u32; FUTEX_WAKE only reads its address.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX);
    }
}

/// Counts for the [`Waiter`]'s three phases.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WaitPolicy {
    /// Busy-poll iterations before yielding.
    pub spins: u32,
    /// `sched_yield` calls before blocking.
    pub yields: u32,
    /// Longest single block on the doorbell; between blocks the caller can
    /// check that its peers are alive.
    pub block_timeout: Duration,
}

/// Few yields by default: with more runnable threads than CPUs a
/// `sched_yield` can cost a whole time slice, while a futex wake-up hands
/// the CPU over at once.
impl Default for WaitPolicy {
    fn default() -> Self {
        WaitPolicy {
            spins: 2000,
            yields: 10,
            block_timeout: Duration::from_millis(50),
        }
    }
}

/// What one [`Waiter::step`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitStep {
    /// One busy-poll iteration.
    Spun,
    /// One `sched_yield`.
    Yielded,
    /// Blocked on the doorbell, or found the condition true before blocking.
    Slept,
    /// Blocked for the whole timeout: check peer liveness, then go on.
    TimedOut,
}

/// Escalating wait ([`Backoff`]): spin, then yield, then block on a
/// doorbell, each phase a configured number of times. The caller owns the loop, so it can make
/// progress and check liveness between steps:
///
/// ```no_run
/// # use ibcoll_shm::{Doorbell, WaitPolicy, WaitStep, Waiter};
/// # let bell = Doorbell::new();
/// # let ready = || true;
/// # let peer_alive = || true;
/// let mut w = Waiter::new(WaitPolicy::default());
/// while !ready() {
///     if w.step(&bell, ready) == WaitStep::TimedOut && !peer_alive() {
///         break; // report the lost peer
///     }
/// }
/// ```
#[derive(Clone, Debug)]
pub struct Waiter {
    policy: WaitPolicy,
    backoff: Backoff,
}

impl Waiter {
    /// A waiter at the start of its spin phase.
    pub fn new(policy: WaitPolicy) -> Waiter {
        Waiter {
            policy,
            backoff: Backoff::new(policy.spins, policy.yields),
        }
    }

    /// The policy in force.
    pub fn policy(&self) -> &WaitPolicy {
        &self.policy
    }

    /// Back to spinning; call when progress was made.
    pub fn reset(&mut self) {
        self.backoff.reset();
    }

    /// Waits a little, per the current phase ([`Backoff`]). `ready` is only
    /// called in the blocking phase, for the re-check after announcing
    /// sleep on `bell`.
    pub fn step(&mut self, bell: &Doorbell, ready: impl FnMut() -> bool) -> WaitStep {
        match self.backoff.step() {
            Step::Check | Step::Spin => WaitStep::Spun,
            Step::Yield => WaitStep::Yielded,
            Step::Block => match bell.sleep(ready, self.policy.block_timeout) {
                SleepOutcome::TimedOut => WaitStep::TimedOut,
                SleepOutcome::Ready | SleepOutcome::Woken => WaitStep::Slept,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_without_sleeper_is_free() {
        let bell = Doorbell::new();
        assert!(!bell.ring());
    }

    #[test]
    fn sleep_returns_ready_without_blocking() {
        let bell = Doorbell::new();
        assert_eq!(
            bell.sleep(|| true, Duration::from_secs(60)),
            SleepOutcome::Ready
        );
        assert!(!bell.ring(), "state must be awake again");
    }

    #[test]
    fn sleep_times_out() {
        let bell = Doorbell::new();
        assert_eq!(
            bell.sleep(|| false, Duration::from_millis(1)),
            SleepOutcome::TimedOut
        );
    }

    #[test]
    fn waiter_escalates_through_phases() {
        let bell = Doorbell::new();
        let mut w = Waiter::new(WaitPolicy {
            spins: 2,
            yields: 1,
            block_timeout: Duration::from_millis(1),
        });
        let steps: Vec<_> = (0..4).map(|_| w.step(&bell, || false)).collect();
        assert_eq!(
            steps,
            [
                WaitStep::Spun,
                WaitStep::Spun,
                WaitStep::Yielded,
                WaitStep::TimedOut
            ]
        );
        assert_eq!(w.step(&bell, || true), WaitStep::Slept);
        w.reset();
        assert_eq!(w.step(&bell, || false), WaitStep::Spun);
    }
}
