//! Wake-up FIFOs: a way to wake a rank that blocks in `poll(2)` on other
//! file descriptors (sockets, a verbs completion channel) rather than on its
//! futex doorbell.
//!
//! The owner creates a named FIFO next to the node segment
//! ([`wake_path`]) and opens it read-write and nonblocking (so it never sees
//! end-of-file), then, when it is about to block, announces it on its
//! [`Doorbell`](crate::Doorbell) with
//! [`begin_polling`](crate::Doorbell::begin_polling) and adds
//! [`WakeFifo::fd`] to its poll set. A peer's
//! [`ring_with`](crate::Doorbell::ring_with) sees the announcement and calls
//! [`WakeWriter::poke`], which writes one byte into the FIFO (opening it on
//! first use). Peers write only while the owner said it is polling, so an
//! awake owner costs them nothing, and the FIFO holds at most a few bytes.
//! The FIFO lives under the job's prefix in `/dev/shm`, so
//! [`cleanup_job`](crate::cleanup_job) removes it after a crash.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::error::{Result, ShmError};
use crate::segment::SHM_DIR;

/// Path of the wake-up FIFO of local rank `local` of the node segment named
/// `segment_name`.
pub fn wake_path(segment_name: &str, local: usize) -> PathBuf {
    Path::new(SHM_DIR).join(format!("{segment_name}-w{local}"))
}

fn cpath(path: &Path) -> Result<CString> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| {
        ShmError::Invalid(format!(
            "wake-up FIFO path {} has a NUL byte",
            path.display()
        ))
    })
}

fn io_err(what: &str, path: &Path, e: io::Error) -> ShmError {
    ShmError::Invalid(format!("{what} {}: {e}", path.display()))
}

/// The owner's end of a wake-up FIFO; removes the FIFO when dropped.
#[derive(Debug)]
pub struct WakeFifo {
    fd: OwnedFd,
    path: PathBuf,
}

impl WakeFifo {
    /// Creates the FIFO at `path` (replacing a stale one) and opens it.
    pub fn create(path: &Path) -> Result<WakeFifo> {
        let c = cpath(path)?;
        // A leftover from a crashed run of the same job id: replace it.
        let _ = std::fs::remove_file(path);
        // SAFETY: `c` is a valid NUL-terminated path for the call.
        if unsafe { libc::mkfifo(c.as_ptr(), 0o600) } != 0 {
            return Err(io_err("mkfifo", path, io::Error::last_os_error()));
        }
        // SAFETY: as above; O_RDWR on a FIFO never blocks on Linux and keeps
        // a writer open, so reads see EAGAIN (not EOF) when it is empty.
        let fd = unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_RDWR | libc::O_NONBLOCK | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            let e = io::Error::last_os_error();
            let _ = std::fs::remove_file(path);
            return Err(io_err("open", path, e));
        }
        Ok(WakeFifo {
            // SAFETY: `fd` was just opened and is owned by nobody else.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
            path: path.to_path_buf(),
        })
    }

    /// The descriptor to poll for `POLLIN`.
    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Reads away every pending wake-up byte.
    pub fn drain(&self) {
        let mut buf = [0u8; 64];
        loop {
            // SAFETY: `buf` is a live, writable 64-byte buffer.
            let n = unsafe { libc::read(self.fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if n < buf.len() as isize {
                break;
            }
        }
    }
}

impl Drop for WakeFifo {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// A peer's end of another rank's wake-up FIFO, opened on first use.
#[derive(Debug)]
pub struct WakeWriter {
    path: PathBuf,
    fd: Option<OwnedFd>,
}

impl WakeWriter {
    /// A writer for the FIFO at `path` (nothing is opened yet).
    pub fn new(path: PathBuf) -> WakeWriter {
        WakeWriter { path, fd: None }
    }

    /// Writes one wake-up byte; returns false if the FIFO cannot be opened
    /// (the owner never created it, or is gone). A full FIFO already holds
    /// a pending wake-up, so `EAGAIN` counts as success.
    pub fn poke(&mut self) -> bool {
        if self.fd.is_none() {
            let Ok(c) = cpath(&self.path) else {
                return false;
            };
            // SAFETY: `c` is a valid NUL-terminated path. O_NONBLOCK write
            // opens succeed while the owner holds its read end open.
            let fd = unsafe {
                libc::open(
                    c.as_ptr(),
                    libc::O_WRONLY | libc::O_NONBLOCK | libc::O_CLOEXEC,
                )
            };
            if fd < 0 {
                return false;
            }
            // SAFETY: `fd` was just opened and is owned by nobody else.
            self.fd = Some(unsafe { OwnedFd::from_raw_fd(fd) });
        }
        let Some(fd) = &self.fd else { return false };
        let b = 1u8;
        // SAFETY: writes one byte from a live local.
        let n = unsafe { libc::write(fd.as_raw_fd(), (&b as *const u8).cast(), 1) };
        n == 1 || io::Error::last_os_error().raw_os_error() == Some(libc::EAGAIN)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doorbell::Doorbell;
    use std::time::{Duration, Instant};

    fn poll_in(fd: RawFd, ms: i32) -> bool {
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one live pollfd.
        unsafe { libc::poll(&mut p, 1, ms) == 1 }
    }

    #[test]
    fn poke_wakes_a_poller_and_drain_empties() {
        let path = wake_path(&format!("ibcoll-waketest{}-n0", std::process::id()), 3);
        let fifo = WakeFifo::create(&path).unwrap();
        assert!(!poll_in(fifo.fd(), 0));
        let mut w = WakeWriter::new(path.clone());
        assert!(w.poke());
        assert!(w.poke());
        assert!(poll_in(fifo.fd(), 0));
        fifo.drain();
        assert!(!poll_in(fifo.fd(), 0));
        drop(fifo);
        assert!(!path.exists());
        assert!(!WakeWriter::new(path).poke(), "no FIFO: poke fails");
    }

    #[test]
    fn polling_sleeper_is_woken_through_the_fifo() {
        let path = wake_path(&format!("ibcoll-waketest{}-n1", std::process::id()), 0);
        let fifo = WakeFifo::create(&path).unwrap();
        let bell = Doorbell::new();
        let mut w = WakeWriter::new(path);
        // Not polling: ringing pokes nobody.
        assert!(!bell.ring_with(|| panic!("owner is awake")));
        std::thread::scope(|s| {
            let t0 = Instant::now();
            let h = s.spawn(|| {
                let _ = bell.begin_polling();
                let woken = poll_in(fifo.fd(), 10_000);
                fifo.drain();
                bell.end_polling();
                woken
            });
            // Ring until the sleeper has announced itself and been poked.
            while !bell.ring_with(|| assert!(w.poke())) {
                std::thread::yield_now();
            }
            assert!(h.join().unwrap(), "woken by the FIFO");
            assert!(t0.elapsed() < Duration::from_secs(5));
        });
    }
}
