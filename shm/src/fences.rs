//! Asymmetric fences for the doorbell protocol.
//!
//! The doorbell handshake (see [`crate::doorbell`]) is the store-buffering
//! pattern: a ringer publishes work then reads the owner's state, a sleeper
//! announces sleep then re-reads the work, and without a full fence on both
//! sides each could miss the other's store. The ringer's fence sits on every
//! message and every collective publication, and costs the round trip that
//! makes its last store visible (the cache line is usually shared with the
//! reader that polls it). Sleeping is rare by comparison.
//!
//! With `membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED)` the sleeper forces a
//! full barrier on every CPU running a registered process, so ringers need
//! only a compiler barrier: a ringer whose store had not drained when the
//! sleeper's barrier ran had it drained by that barrier (the sleeper's
//! re-check sees the work), and a ringer that reads the state after the
//! barrier sees "asleep". This holds only if every process that may ring
//! registered; so ringers stay light only once the caller established that
//! for the whole node ([`set_light_ringers`]), while a registered sleeper
//! always uses the barrier.

use std::sync::atomic::{compiler_fence, fence, AtomicU8, Ordering};

const MEMBARRIER_CMD_QUERY: libc::c_int = 0;
const MEMBARRIER_CMD_GLOBAL_EXPEDITED: libc::c_int = 1 << 1;
const MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED: libc::c_int = 1 << 2;

const REGISTERED: u8 = 1;
const LIGHT: u8 = 2;

static MODE: AtomicU8 = AtomicU8::new(0);

fn membarrier(cmd: libc::c_int) -> libc::c_long {
    // SAFETY: membarrier takes two integers and touches no user memory.
    unsafe { libc::syscall(libc::SYS_membarrier, cmd, 0 as libc::c_int) }
}

/// Registers this process for expedited global barriers; whether it worked
/// (false on kernels before 4.16 or where seccomp forbids the call).
pub fn register() -> bool {
    let cmds = membarrier(MEMBARRIER_CMD_QUERY);
    let want = MEMBARRIER_CMD_GLOBAL_EXPEDITED | MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED;
    if cmds < 0 || (cmds as libc::c_int) & want != want {
        return false;
    }
    if membarrier(MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED) != 0 {
        return false;
    }
    MODE.fetch_or(REGISTERED, Ordering::SeqCst);
    true
}

/// Ringers skip their fence from now on (`on`), or use it again. Call it
/// with `true` only when every process that rings or sleeps on the same
/// doorbells has [`register`]ed.
pub fn set_light_ringers(on: bool) {
    if on && MODE.load(Ordering::SeqCst) & REGISTERED != 0 {
        MODE.fetch_or(LIGHT, Ordering::SeqCst);
    } else {
        MODE.fetch_and(!LIGHT, Ordering::SeqCst);
    }
}

/// Whether ringers are light.
pub fn light_ringers() -> bool {
    MODE.load(Ordering::Relaxed) & LIGHT != 0
}

/// The ringer's side: between publishing work and reading the state.
#[inline]
pub(crate) fn ringer() {
    if MODE.load(Ordering::Relaxed) & LIGHT != 0 {
        compiler_fence(Ordering::SeqCst);
    } else {
        fence(Ordering::SeqCst);
    }
}

/// The sleeper's side: between announcing sleep and re-checking for work.
/// Returns false if the barrier could not be made while ringers may be
/// light (the caller then sleeps briefly: a wake-up may be lost).
pub(crate) fn sleeper() -> bool {
    fence(Ordering::SeqCst);
    if MODE.load(Ordering::Relaxed) & REGISTERED == 0 {
        return true;
    }
    membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED) == 0 || !light_ringers()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registration_and_modes() {
        // Light ringers need registration first.
        set_light_ringers(true);
        let registered = register();
        if registered {
            assert!(!light_ringers() || MODE.load(Ordering::SeqCst) & REGISTERED != 0);
            set_light_ringers(true);
            assert!(light_ringers());
            assert!(sleeper());
            ringer();
            set_light_ringers(false);
            assert!(!light_ringers());
        }
        assert!(sleeper());
    }
}
