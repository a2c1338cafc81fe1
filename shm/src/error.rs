//! The crate's one error type.

use std::io;

/// Everything that can go wrong in the intra-node transport, with enough
/// context (segment name, peer pid, operation) to act on it.
#[derive(Debug, thiserror::Error)]
pub enum ShmError {
    /// A system call on a segment failed.
    #[error("shm segment {name}: {op} failed: {source}")]
    Segment {
        /// Segment name (file name under `/dev/shm`).
        name: String,
        /// What was being done (`create`, `open`, `mmap`, ...).
        op: &'static str,
        /// The underlying OS error.
        #[source]
        source: io::Error,
    },

    /// `Segment::create` found a file of that name already; a previous job
    /// with the same id probably crashed (see `cleanup_job`).
    #[error("shm segment {name} already exists (stale job? run cleanup_job)")]
    Exists {
        /// Segment name.
        name: String,
    },

    /// The segment's size is not what the layout expects: the creator has not
    /// sized it yet, or the two sides disagree on the configuration.
    #[error("shm segment {name}: size is {actual} bytes, expected {expected}")]
    SizeMismatch {
        /// Segment name.
        name: String,
        /// Size the caller expected.
        expected: usize,
        /// Size found.
        actual: usize,
    },

    /// The segment header does not match this rank's layout.
    #[error("shm segment {name}: bad header: {reason}")]
    BadHeader {
        /// Segment name.
        name: String,
        /// Which field disagrees.
        reason: String,
    },

    /// Parameters that cannot describe a valid layout, ring, pipe or name.
    #[error("invalid shm parameter: {0}")]
    Invalid(String),

    /// The kernel refuses cross-process memory access (EPERM, EACCES, ENOSYS):
    /// the caller should fall back to the pipelined copy.
    #[error("cma {op} with pid {pid} not permitted ({source}); use pipelined copy")]
    CmaUnavailable {
        /// `read` or `write`.
        op: &'static str,
        /// Peer process.
        pid: i32,
        /// The underlying OS error.
        #[source]
        source: io::Error,
    },

    /// The peer process no longer exists.
    #[error("{op}: peer pid {pid} is gone")]
    PeerGone {
        /// What was being done.
        op: &'static str,
        /// Peer process.
        pid: i32,
    },

    /// Any other failure of a single-copy transfer (bad address, ...).
    #[error("cma {op} pid {pid} addr {addr:#x} len {len}: {source}")]
    Cma {
        /// `read` or `write`.
        op: &'static str,
        /// Peer process.
        pid: i32,
        /// Remote address of the failed chunk.
        addr: usize,
        /// Bytes still to transfer at the failure.
        len: usize,
        /// The underlying OS error.
        #[source]
        source: io::Error,
    },
}

/// Result with [`ShmError`].
pub type Result<T> = std::result::Result<T, ShmError>;
