//! Single-copy transfers between processes (Cross Memory Attach:
//! `process_vm_readv` / `process_vm_writev`) and peer liveness.
//!
//! The kernel allows these calls when the caller may ptrace the target.
//! Under Yama `ptrace_scope = 1` that excludes siblings (ranks of one job
//! are siblings) unless the target opted in, which [`allow_peer_access`]
//! does. A refusal surfaces as [`ShmError::CmaUnavailable`] so the engine
//! can switch that peer to the pipelined copy.

use std::io;

use crate::error::{Result, ShmError};

#[derive(Clone, Copy)]
enum Dir {
    Read,
    Write,
}

impl Dir {
    fn name(self) -> &'static str {
        match self {
            Dir::Read => "read",
            Dir::Write => "write",
        }
    }
}

/// Copies `buf.len()` bytes from address `remote_addr` of process `pid` into
/// `buf`, looping over partial transfers.
pub fn cma_read(pid: i32, remote_addr: usize, buf: &mut [u8]) -> Result<()> {
    transfer(Dir::Read, pid, remote_addr, buf.as_mut_ptr(), buf.len())
}

/// Copies `buf` to address `remote_addr` of process `pid`, looping over
/// partial transfers.
pub fn cma_write(pid: i32, remote_addr: usize, buf: &[u8]) -> Result<()> {
    // The pointer is only read from: process_vm_writev takes its local
    // iovec as `*mut` for symmetry with readv.
    transfer(
        Dir::Write,
        pid,
        remote_addr,
        buf.as_ptr() as *mut u8,
        buf.len(),
    )
}

fn transfer(dir: Dir, pid: i32, remote_addr: usize, local: *mut u8, len: usize) -> Result<()> {
    let mut done = 0;
    while done < len {
        let left = len - done;
        let liov = libc::iovec {
            // SAFETY: done < len, so the pointer stays inside the caller's
            // buffer.
            iov_base: unsafe { local.add(done) }.cast(),
            iov_len: left,
        };
        let riov = libc::iovec {
            iov_base: (remote_addr + done) as *mut libc::c_void,
            iov_len: left,
        };
        // SAFETY: the local iovec covers `left` bytes of the caller's live
        // buffer (writable for reads); the remote iovec is only interpreted
        // by the kernel, which checks it against the target's mappings.
        let n = unsafe {
            match dir {
                Dir::Read => libc::process_vm_readv(pid, &liov, 1, &riov, 1, 0),
                Dir::Write => libc::process_vm_writev(pid, &liov, 1, &riov, 1, 0),
            }
        };
        if n < 0 {
            let err = io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return Err(classify(dir, pid, remote_addr + done, left, err));
        }
        if n == 0 {
            // The kernel stops at the first unmapped remote page.
            return Err(ShmError::Cma {
                op: dir.name(),
                pid,
                addr: remote_addr + done,
                len: left,
                source: io::Error::from_raw_os_error(libc::EFAULT),
            });
        }
        done += n as usize;
    }
    Ok(())
}

fn classify(dir: Dir, pid: i32, addr: usize, len: usize, source: io::Error) -> ShmError {
    match source.raw_os_error() {
        Some(libc::EPERM | libc::EACCES | libc::ENOSYS) => ShmError::CmaUnavailable {
            op: dir.name(),
            pid,
            source,
        },
        Some(libc::ESRCH) => ShmError::PeerGone {
            op: dir.name(),
            pid,
        },
        _ => ShmError::Cma {
            op: dir.name(),
            pid,
            addr,
            len,
            source,
        },
    }
}

/// Tells whether single-copy transfers can work here: the syscalls exist
/// and are not filtered (a read from this process), and Yama does not
/// forbid them outright. `Err(CmaUnavailable)` means use the pipeline.
///
/// This cannot see a peer's own restrictions; the engine must still treat
/// `CmaUnavailable` from the first real transfer to a peer as "fall back".
pub fn cma_probe() -> Result<()> {
    let pid = std::process::id() as i32;
    let src = 0x1bc0_11c0_u64.to_ne_bytes();
    let mut dst = [0u8; 8];
    cma_read(pid, src.as_ptr() as usize, &mut dst)?;
    if dst != src {
        return Err(ShmError::Cma {
            op: "read",
            pid,
            addr: src.as_ptr() as usize,
            len: 8,
            source: io::Error::other("probe read back wrong bytes"),
        });
    }
    // Scope 2 admits only CAP_SYS_PTRACE (approximated by root), 3 nobody.
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    match yama_scope() {
        Some(3) => Err(yama_denied(pid)),
        Some(2) if !root => Err(yama_denied(pid)),
        _ => Ok(()),
    }
}

fn yama_scope() -> Option<u32> {
    std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope")
        .ok()?
        .trim()
        .parse()
        .ok()
}

fn yama_denied(pid: i32) -> ShmError {
    ShmError::CmaUnavailable {
        op: "probe",
        pid,
        source: io::Error::new(
            io::ErrorKind::PermissionDenied,
            "kernel.yama.ptrace_scope forbids access",
        ),
    }
}

/// Lets any process of this user read and write this process's memory by
/// CMA even under Yama `ptrace_scope = 1` (where only ancestors may);
/// every rank calls it at init. Without Yama it does nothing.
pub fn allow_peer_access() -> io::Result<()> {
    // SAFETY: PR_SET_PTRACER takes a pid-or-constant argument and touches
    // no memory of ours.
    let rc = unsafe { libc::prctl(libc::PR_SET_PTRACER, libc::PR_SET_PTRACER_ANY, 0, 0, 0) };
    if rc == 0 {
        return Ok(());
    }
    let err = io::Error::last_os_error();
    // EINVAL: Yama is not built in, so there is nothing to opt into.
    if err.raw_os_error() == Some(libc::EINVAL) {
        Ok(())
    } else {
        Err(err)
    }
}

/// True while process `pid` exists (`kill(pid, 0)`; EPERM still means it
/// exists). A zombie counts as alive until its parent reaps it; ranks are
/// siblings whose parent (the launcher) reaps them promptly.
pub fn pid_alive(pid: i32) -> bool {
    if pid <= 0 {
        return false;
    }
    // SAFETY: signal 0 only checks for existence and permission.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_and_self_transfer() {
        if let Err(e) = cma_probe() {
            println!("note: CMA unavailable here, skipping: {e}");
            return;
        }
        let pid = std::process::id() as i32;
        let src: Vec<u8> = (0..300_000u32).map(|i| (i * 7) as u8).collect();
        let mut dst = vec![0u8; src.len()];
        cma_read(pid, src.as_ptr() as usize, &mut dst).unwrap();
        assert_eq!(src, dst);
        let mut target = vec![0u8; 1000];
        cma_write(pid, target.as_mut_ptr() as usize, &src[..1000]).unwrap();
        assert_eq!(&target[..], &src[..1000]);
        cma_read(pid, 0, &mut []).unwrap();
    }

    #[test]
    fn bad_address_and_missing_pid_are_distinct_errors() {
        if cma_probe().is_err() {
            return;
        }
        let pid = std::process::id() as i32;
        let mut buf = [0u8; 16];
        assert!(matches!(
            cma_read(pid, 8, &mut buf),
            Err(ShmError::Cma { .. })
        ));
        assert!(matches!(
            cma_read(i32::MAX, 4096, &mut buf),
            Err(ShmError::PeerGone { .. })
        ));
    }

    #[test]
    fn liveness() {
        assert!(pid_alive(std::process::id() as i32));
        assert!(!pid_alive(i32::MAX));
        assert!(!pid_alive(0));
        allow_peer_access().unwrap();
    }
}
