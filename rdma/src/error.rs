//! The crate's single error type.
//!
//! Every variant carries enough context to act on the message without a
//! debugger: the verbs operation, the device, the peer where one is known,
//! and for completion errors the verbs status string (`ibv_wc_status_str`).

use std::fmt;

/// Result alias used throughout the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Where an error happened: device and peer, each optional.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ctx {
    /// Device name (`rxe0`, `mlx5_0`), where known.
    pub device: Option<String>,
    /// Peer description (rank, QP number, address), where known.
    pub peer: Option<String>,
}

impl fmt::Display for Ctx {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(d) = &self.device {
            write!(f, " on {d}")?;
        }
        if let Some(p) = &self.peer {
            write!(f, " (peer {p})")?;
        }
        Ok(())
    }
}

/// One error enum for the verbs layer.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A verbs call (`ibv_*`) failed; `errno` is the OS error it reported.
    #[error("{op} failed{ctx}: {} (errno {errno})", std::io::Error::from_raw_os_error(*errno))]
    Verbs {
        /// The verbs function or logical operation.
        op: &'static str,
        /// The errno value (0 when the library gave none).
        errno: i32,
        /// Device/peer context.
        ctx: Ctx,
    },
    /// A work request completed with an error status.
    #[error(
        "{op} completed with error{ctx}: {status_str} (status {status}, vendor_err {vendor_err:#x}, wr_id {wr_id}, qpn {qpn:#x})"
    )]
    Completion {
        /// The completion's opcode as text (`SEND`, `RDMA_WRITE`, `RECV`...).
        op: String,
        /// `ibv_wc_status` value.
        status: u32,
        /// `ibv_wc_status_str(status)`.
        status_str: String,
        /// Vendor syndrome.
        vendor_err: u32,
        /// The work request id.
        wr_id: u64,
        /// Local QP number.
        qpn: u32,
        /// Device/peer context.
        ctx: Ctx,
    },
    /// No (matching) RDMA device.
    #[error("no RDMA device{}: available devices: [{}]", .requested.as_ref().map(|r| format!(" named {r:?}")).unwrap_or_default(), .available.join(", "))]
    NoDevice {
        /// The requested name, if any.
        requested: Option<String>,
        /// Devices that exist.
        available: Vec<String>,
    },
    /// The chosen (or automatically selected) port/GID cannot work.
    #[error("cannot use {what}{ctx}: {reason}\n{table}")]
    Selection {
        /// What was being chosen (`port 2`, `GID index 7`).
        what: String,
        /// Why it cannot work.
        reason: String,
        /// The port's GID table (one line per valid entry), for the user.
        table: String,
        /// Device context.
        ctx: Ctx,
    },
    /// A configuration value (environment variable or parameter) is invalid.
    #[error("invalid configuration {name}={value:?}: {reason}")]
    Config {
        /// Variable or parameter name.
        name: String,
        /// Its value.
        value: String,
        /// Why it is invalid.
        reason: String,
    },
    /// Bytes received from a peer could not be decoded.
    #[error("cannot decode {what}: {reason}")]
    Decode {
        /// What was being decoded.
        what: &'static str,
        /// Why it failed.
        reason: String,
    },
    /// An argument or state error detected before calling into verbs.
    #[error("{op}{ctx}: {reason}")]
    Invalid {
        /// The operation.
        op: &'static str,
        /// Why it was refused.
        reason: String,
        /// Device/peer context.
        ctx: Ctx,
    },
    /// A bounded wait expired.
    #[error("{op} timed out after {after:?}{ctx}")]
    Timeout {
        /// The operation.
        op: &'static str,
        /// How long it waited.
        after: std::time::Duration,
        /// Device/peer context.
        ctx: Ctx,
    },
}

impl Error {
    /// A verbs failure with the current `errno`.
    pub(crate) fn last_os(op: &'static str, device: Option<&str>) -> Self {
        let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
        Self::verbs(op, errno, device)
    }

    /// A verbs failure with an explicit errno (functions returning `-errno` or `errno`).
    pub(crate) fn verbs(op: &'static str, errno: i32, device: Option<&str>) -> Self {
        Error::Verbs {
            op,
            errno: errno.abs(),
            ctx: Ctx {
                device: device.map(str::to_owned),
                peer: None,
            },
        }
    }

    pub(crate) fn invalid(
        op: &'static str,
        reason: impl Into<String>,
        device: Option<&str>,
    ) -> Self {
        Error::Invalid {
            op,
            reason: reason.into(),
            ctx: Ctx {
                device: device.map(str::to_owned),
                peer: None,
            },
        }
    }

    /// Attach a peer description (rank, address) to the error's context.
    pub fn with_peer(mut self, peer: impl Into<String>) -> Self {
        if let Some(ctx) = self.ctx_mut() {
            ctx.peer = Some(peer.into());
        }
        self
    }

    /// The device/peer context, for the variants that have one.
    pub fn ctx(&self) -> Option<&Ctx> {
        match self {
            Error::Verbs { ctx, .. }
            | Error::Completion { ctx, .. }
            | Error::Selection { ctx, .. }
            | Error::Invalid { ctx, .. }
            | Error::Timeout { ctx, .. } => Some(ctx),
            _ => None,
        }
    }

    fn ctx_mut(&mut self) -> Option<&mut Ctx> {
        match self {
            Error::Verbs { ctx, .. }
            | Error::Completion { ctx, .. }
            | Error::Selection { ctx, .. }
            | Error::Invalid { ctx, .. }
            | Error::Timeout { ctx, .. } => Some(ctx),
            _ => None,
        }
    }

    /// The completion status for [`Error::Completion`], else `None`.
    pub fn wc_status(&self) -> Option<u32> {
        match self {
            Error::Completion { status, .. } => Some(*status),
            _ => None,
        }
    }
}
