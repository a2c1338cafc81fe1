//! RAII wrappers around the verbs objects.
//!
//! Ownership: every object holds an `Arc` of what it was created from
//! (MR → PD → Context, QP → PD + CQs, CQ → Context + channel), so a parent
//! always outlives its children and is destroyed after the last one.
//!
//! Posting work requests is `unsafe`: the hardware reads or writes the
//! described memory asynchronously, so the caller must keep it valid (and,
//! for memory the device writes, unaliased by Rust references) until the
//! request's completion has been polled. Inline sends copy at post time and
//! are safe.

use crate::device::{AsyncEvent, Context, Gid, Mtu};
use crate::error::{Ctx, Error, Result};
use rdma_sys::*;
use std::fmt;
use std::os::raw::c_void;
use std::ptr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Memory access rights of a region (`ibv_access_flags`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Access(pub u32);

impl Access {
    /// The local device may write (receives, RDMA read targets).
    pub const LOCAL_WRITE: Access = Access(ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0);
    /// Peers may RDMA-write.
    pub const REMOTE_WRITE: Access = Access(ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0);
    /// Peers may RDMA-read.
    pub const REMOTE_READ: Access = Access(ibv_access_flags::IBV_ACCESS_REMOTE_READ.0);
    /// Peers may use atomics.
    pub const REMOTE_ATOMIC: Access = Access(ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC.0);
    /// Local write + remote read + remote write: what rendezvous needs.
    pub const RDMA: Access =
        Access(Self::LOCAL_WRITE.0 | Self::REMOTE_WRITE.0 | Self::REMOTE_READ.0);
    /// True when all bits of `o` are set.
    pub fn contains(self, o: Access) -> bool {
        self.0 & o.0 == o.0
    }
}

impl std::ops::BitOr for Access {
    type Output = Access;
    fn bitor(self, o: Access) -> Access {
        Access(self.0 | o.0)
    }
}

// --------------------------------------------------------------------- PD

/// A protection domain.
pub struct ProtectionDomain {
    pub(crate) pd: *mut ibv_pd,
    ctx: Arc<Context>,
}

// SAFETY: verbs objects may be used from any thread (libibverbs is thread-safe).
unsafe impl Send for ProtectionDomain {}
// SAFETY: as above; &self methods only call thread-safe verbs.
unsafe impl Sync for ProtectionDomain {}

impl ProtectionDomain {
    /// `ibv_alloc_pd`.
    pub fn new(ctx: &Arc<Context>) -> Result<Arc<ProtectionDomain>> {
        // SAFETY: the context is open (kept alive by the Arc we store).
        let pd = unsafe { ibv_alloc_pd(ctx.ctx) };
        if pd.is_null() {
            return Err(Error::last_os("ibv_alloc_pd", ctx.dev()));
        }
        Ok(Arc::new(ProtectionDomain {
            pd,
            ctx: ctx.clone(),
        }))
    }
    /// The device.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }
}

impl Drop for ProtectionDomain {
    fn drop(&mut self) {
        // SAFETY: MRs/QPs/AHs hold an Arc to us, so none is left; freed once.
        unsafe { ibv_dealloc_pd(self.pd) };
    }
}

impl fmt::Debug for ProtectionDomain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ProtectionDomain({})", self.ctx.name())
    }
}

// --------------------------------------------------------- completions

/// A completion event channel: lets a thread sleep until a CQ has entries.
pub struct CompletionChannel {
    ch: *mut ibv_comp_channel,
    ctx: Arc<Context>,
}

// SAFETY: the channel is an fd plus libibverbs bookkeeping; thread-safe.
unsafe impl Send for CompletionChannel {}
// SAFETY: as above.
unsafe impl Sync for CompletionChannel {}

impl CompletionChannel {
    /// `ibv_create_comp_channel`; its fd is made non-blocking.
    pub fn new(ctx: &Arc<Context>) -> Result<Arc<CompletionChannel>> {
        // SAFETY: the context is open.
        let ch = unsafe { ibv_create_comp_channel(ctx.ctx) };
        if ch.is_null() {
            return Err(Error::last_os("ibv_create_comp_channel", ctx.dev()));
        }
        let c = CompletionChannel {
            ch,
            ctx: ctx.clone(),
        };
        let fd = c.fd();
        // SAFETY: fcntl on the channel's own fd.
        let ok = unsafe {
            let fl = libc::fcntl(fd, libc::F_GETFL);
            fl >= 0 && libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK) == 0
        };
        if !ok {
            return Err(Error::last_os("fcntl(comp_channel, O_NONBLOCK)", ctx.dev()));
        }
        Ok(Arc::new(c))
    }

    /// The fd to poll for readability (for an external event loop).
    pub fn fd(&self) -> i32 {
        // SAFETY: `ch` is valid for our lifetime.
        unsafe { (*self.ch).fd }
    }

    /// Wait until the fd is readable or `timeout` passes. Returns readiness.
    fn wait_readable(&self, timeout: Option<Duration>) -> Result<bool> {
        let mut pfd = libc::pollfd {
            fd: self.fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = match timeout {
            None => -1,
            Some(t) => t.as_millis().min(i32::MAX as u128) as i32,
        };
        // SAFETY: one valid pollfd.
        let rc = unsafe { libc::poll(&mut pfd, 1, ms) };
        if rc < 0 {
            let e = crate::sys::errno();
            if e == libc::EINTR {
                return Ok(false);
            }
            return Err(Error::verbs("poll(comp_channel)", e, self.ctx.dev()));
        }
        Ok(rc > 0)
    }
}

impl CompletionChannel {
    /// Consume every pending event on the channel (non-blocking) and
    /// acknowledge each at once; for external event loops that poll
    /// [`fd`](Self::fd) themselves and then poll their CQs. Returns how many
    /// events were taken. Re-arm the CQs (`req_notify`) before sleeping again.
    pub fn take_events(&self) -> Result<usize> {
        let mut n = 0;
        loop {
            let mut ev_cq: *mut ibv_cq = ptr::null_mut();
            let mut ev_ctx: *mut c_void = ptr::null_mut();
            // SAFETY: the channel is alive; out-pointers are valid; the fd is
            // non-blocking so this returns EAGAIN instead of sleeping.
            let rc = unsafe { ibv_get_cq_event(self.ch, &mut ev_cq, &mut ev_ctx) };
            if rc != 0 {
                let e = crate::sys::errno();
                if e == libc::EAGAIN || e == libc::EINTR {
                    return Ok(n);
                }
                return Err(Error::verbs("ibv_get_cq_event", e, self.ctx.dev()));
            }
            // SAFETY: an event was just received for `ev_cq`; an unacked
            // event keeps that CQ from being destroyed, so it is alive.
            unsafe { ibv_ack_cq_events(ev_cq, 1) };
            n += 1;
        }
    }
}

impl Drop for CompletionChannel {
    fn drop(&mut self) {
        // SAFETY: CQs using the channel hold an Arc to it, so none is left.
        unsafe { ibv_destroy_comp_channel(self.ch) };
    }
}

/// Completion opcode (`ibv_wc_opcode`); only meaningful on success.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WcOpcode {
    /// Send (incl. with immediate).
    Send,
    /// RDMA write.
    RdmaWrite,
    /// RDMA read.
    RdmaRead,
    /// Atomic compare-and-swap.
    CompSwap,
    /// Atomic fetch-and-add.
    FetchAdd,
    /// Receive.
    Recv,
    /// Receive of an RDMA write with immediate.
    RecvRdmaWithImm,
    /// Anything else.
    Other(u32),
}

impl WcOpcode {
    /// Upper-case name, as used in error messages.
    pub fn name(self) -> &'static str {
        match self {
            WcOpcode::Send => "SEND",
            WcOpcode::RdmaWrite => "RDMA_WRITE",
            WcOpcode::RdmaRead => "RDMA_READ",
            WcOpcode::CompSwap => "COMP_SWAP",
            WcOpcode::FetchAdd => "FETCH_ADD",
            WcOpcode::Recv => "RECV",
            WcOpcode::RecvRdmaWithImm => "RECV_RDMA_WITH_IMM",
            WcOpcode::Other(_) => "OTHER",
        }
    }
}

/// One work completion (`struct ibv_wc`).
#[repr(transparent)]
pub struct WorkCompletion(pub(crate) ibv_wc);

impl Default for WorkCompletion {
    fn default() -> Self {
        // SAFETY: ibv_wc is plain data; all-zero is a valid value.
        WorkCompletion(unsafe { std::mem::zeroed() })
    }
}

impl Clone for WorkCompletion {
    fn clone(&self) -> Self {
        // SAFETY: ibv_wc is plain old data (no pointers owned, no Drop).
        WorkCompletion(unsafe { ptr::read(&self.0) })
    }
}

impl WorkCompletion {
    /// The work request id given at post time.
    pub fn wr_id(&self) -> u64 {
        self.0.wr_id
    }
    /// `ibv_wc_status` (0 = success).
    pub fn status(&self) -> u32 {
        self.0.status
    }
    /// True for `IBV_WC_SUCCESS`.
    pub fn is_success(&self) -> bool {
        self.0.status == ibv_wc_status::IBV_WC_SUCCESS
    }
    /// `ibv_wc_status_str(status)`.
    pub fn status_str(&self) -> String {
        status_str(self.0.status)
    }
    /// Opcode (valid only on success).
    pub fn opcode(&self) -> WcOpcode {
        use ibv_wc_opcode::*;
        match self.0.opcode {
            IBV_WC_SEND => WcOpcode::Send,
            IBV_WC_RDMA_WRITE => WcOpcode::RdmaWrite,
            IBV_WC_RDMA_READ => WcOpcode::RdmaRead,
            IBV_WC_COMP_SWAP => WcOpcode::CompSwap,
            IBV_WC_FETCH_ADD => WcOpcode::FetchAdd,
            IBV_WC_RECV => WcOpcode::Recv,
            IBV_WC_RECV_RDMA_WITH_IMM => WcOpcode::RecvRdmaWithImm,
            o => WcOpcode::Other(o),
        }
    }
    /// Bytes received (receives) or transferred.
    pub fn byte_len(&self) -> u32 {
        self.0.byte_len
    }
    /// Immediate data (host order), when the sender attached one.
    pub fn imm_data(&self) -> Option<u32> {
        if self.0.wc_flags & ibv_wc_flags::IBV_WC_WITH_IMM.0 != 0 {
            // SAFETY: the WITH_IMM flag says the union holds imm_data.
            Some(u32::from_be(unsafe {
                self.0.imm_data_invalidated_rkey_union.imm_data
            }))
        } else {
            None
        }
    }
    /// Local QP number.
    pub fn qp_num(&self) -> u32 {
        self.0.qp_num
    }
    /// Remote QP number (UD receives).
    pub fn src_qp(&self) -> u32 {
        self.0.src_qp
    }
    /// Source LID (UD receives on IB; 0 on RoCE).
    pub fn slid(&self) -> u16 {
        self.0.slid
    }
    /// True when the first 40 bytes of a UD receive hold a valid GRH
    /// (`IBV_WC_GRH`; always on RoCE).
    pub fn has_grh(&self) -> bool {
        self.0.wc_flags & ibv_wc_flags::IBV_WC_GRH.0 != 0
    }
    /// Vendor syndrome.
    pub fn vendor_err(&self) -> u32 {
        self.0.vendor_err
    }
    /// `Ok(())` on success, else an [`Error::Completion`] naming `op` (the
    /// opcode is undefined in error completions, so the caller may know better).
    pub fn result(&self, op: Option<&str>, ctx: &Ctx) -> Result<()> {
        if self.is_success() {
            return Ok(());
        }
        Err(Error::Completion {
            op: op.unwrap_or("work request").to_owned(),
            status: self.status(),
            status_str: self.status_str(),
            vendor_err: self.vendor_err(),
            wr_id: self.wr_id(),
            qpn: self.qp_num(),
            ctx: ctx.clone(),
        })
    }
}

impl fmt::Debug for WorkCompletion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkCompletion")
            .field("wr_id", &self.wr_id())
            .field("status", &self.status_str())
            .field("opcode", &self.opcode())
            .field("byte_len", &self.byte_len())
            .field("imm", &self.imm_data())
            .field("qp_num", &self.qp_num())
            .finish()
    }
}

/// `ibv_wc_status_str`.
pub fn status_str(status: u32) -> String {
    // SAFETY: ibv_wc_status_str returns a static string for any value.
    let p = unsafe { ibv_wc_status_str(status) };
    if p.is_null() {
        return format!("status {status}");
    }
    // SAFETY: non-null, NUL-terminated static string.
    unsafe { std::ffi::CStr::from_ptr(p) }
        .to_string_lossy()
        .into_owned()
}

/// A completion queue, optionally bound to a [`CompletionChannel`] for
/// blocking waits.
pub struct CompletionQueue {
    pub(crate) cq: *mut ibv_cq,
    ctx: Arc<Context>,
    channel: Option<Arc<CompletionChannel>>,
    unacked: AtomicU32,
}

// SAFETY: ibv_poll_cq/ibv_req_notify_cq are thread-safe in libibverbs
// providers (they lock internally); no thread-affine state here.
unsafe impl Send for CompletionQueue {}
// SAFETY: as above.
unsafe impl Sync for CompletionQueue {}

const ACK_BATCH: u32 = 32;

impl CompletionQueue {
    /// `ibv_create_cq` with at least `cqe` entries.
    pub fn new(
        ctx: &Arc<Context>,
        cqe: u32,
        channel: Option<&Arc<CompletionChannel>>,
    ) -> Result<Arc<CompletionQueue>> {
        if let Some(ch) = channel {
            if !Arc::ptr_eq(&ch.ctx, ctx) {
                return Err(Error::invalid(
                    "ibv_create_cq",
                    "channel belongs to another device",
                    ctx.dev(),
                ));
            }
        }
        let chp = channel.map_or(ptr::null_mut(), |c| c.ch);
        let cqe = cqe.clamp(1, ctx.attr().max_cqe.max(1));
        // SAFETY: context (and channel, if any) are alive and held below.
        let cq = unsafe { ibv_create_cq(ctx.ctx, cqe as i32, ptr::null_mut(), chp, 0) };
        if cq.is_null() {
            return Err(Error::last_os("ibv_create_cq", ctx.dev()));
        }
        Ok(Arc::new(CompletionQueue {
            cq,
            ctx: ctx.clone(),
            channel: channel.cloned(),
            unacked: AtomicU32::new(0),
        }))
    }

    /// Capacity (entries).
    pub fn capacity(&self) -> u32 {
        // SAFETY: cq is valid for our lifetime.
        unsafe { (*self.cq).cqe.max(0) as u32 }
    }

    /// The device.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// Non-blocking poll of up to `wcs.len()` completions.
    pub fn poll(&self, wcs: &mut [WorkCompletion]) -> Result<usize> {
        if wcs.is_empty() {
            return Ok(0);
        }
        let n = wcs.len().min(i32::MAX as usize) as i32;
        // SAFETY: WorkCompletion is repr(transparent) over ibv_wc, so the
        // slice is `n` writable ibv_wc; the CQ is alive.
        let rc = unsafe { ibv_poll_cq(self.cq, n, wcs.as_mut_ptr().cast::<ibv_wc>()) };
        if rc < 0 {
            return Err(Error::verbs("ibv_poll_cq", -rc, self.ctx.dev()));
        }
        Ok(rc as usize)
    }

    /// `ibv_resize_cq` to at least `cqe` entries (at most the device's
    /// `max_cqe`): a CQ shared by queue pairs made over time grows with
    /// them instead of being sized for the largest job up front.
    pub fn resize(&self, cqe: u32) -> Result<()> {
        let max = self.ctx.attr().max_cqe.max(1);
        if cqe > max {
            return Err(Error::invalid(
                "ibv_resize_cq",
                format!("{cqe} entries wanted, the device allows {max}"),
                self.ctx.dev(),
            ));
        }
        // SAFETY: the CQ is alive; the provider keeps the completions that
        // are in it (the new size is at least the current one here).
        let rc = unsafe { ibv_resize_cq(self.cq, cqe as i32) };
        if rc != 0 {
            return Err(Error::verbs("ibv_resize_cq", rc.abs(), self.ctx.dev()));
        }
        Ok(())
    }

    /// Arm the CQ: the channel gets an event for the next completion.
    pub fn req_notify(&self, solicited_only: bool) -> Result<()> {
        // SAFETY: the CQ is alive.
        let rc = unsafe { ibv_req_notify_cq(self.cq, i32::from(solicited_only)) };
        if rc != 0 {
            return Err(Error::verbs("ibv_req_notify_cq", rc, self.ctx.dev()));
        }
        Ok(())
    }

    /// Poll; if nothing is there, sleep on the completion channel until
    /// completions arrive or `timeout` passes. Returns the number polled
    /// (0 only on timeout). Without a channel it busy-polls with yields.
    pub fn wait(&self, wcs: &mut [WorkCompletion], timeout: Option<Duration>) -> Result<usize> {
        let start = Instant::now();
        let left = |start: Instant| timeout.map(|t| t.saturating_sub(start.elapsed()));
        loop {
            let n = self.poll(wcs)?;
            if n > 0 {
                return Ok(n);
            }
            if let Some(l) = left(start) {
                if l.is_zero() {
                    return Ok(0);
                }
            }
            let Some(ch) = &self.channel else {
                std::thread::yield_now();
                continue;
            };
            self.req_notify(false)?;
            // A completion that arrived before arming raises no event.
            let n = self.poll(wcs)?;
            if n > 0 {
                return Ok(n);
            }
            if !ch.wait_readable(left(start))? {
                continue;
            }
            self.take_event(ch)?;
        }
    }

    fn take_event(&self, ch: &CompletionChannel) -> Result<()> {
        let mut ev_cq: *mut ibv_cq = ptr::null_mut();
        let mut ev_ctx: *mut c_void = ptr::null_mut();
        // SAFETY: the channel is alive; out-pointers are valid; the fd is
        // non-blocking so this returns EAGAIN instead of sleeping.
        let rc = unsafe { ibv_get_cq_event(ch.ch, &mut ev_cq, &mut ev_ctx) };
        if rc != 0 {
            let e = crate::sys::errno();
            if e == libc::EAGAIN || e == libc::EINTR {
                return Ok(());
            }
            return Err(Error::verbs("ibv_get_cq_event", e, self.ctx.dev()));
        }
        if ev_cq == self.cq {
            if self.unacked.fetch_add(1, Ordering::Relaxed) + 1 >= ACK_BATCH {
                let n = self.unacked.swap(0, Ordering::Relaxed);
                // SAFETY: acknowledging events we received for our own CQ.
                unsafe { ibv_ack_cq_events(self.cq, n) };
            }
        } else {
            // Another CQ on a shared channel: an unacked event keeps that CQ
            // from being destroyed, so it is alive; ack it at once.
            // SAFETY: see above.
            unsafe { ibv_ack_cq_events(ev_cq, 1) };
        }
        Ok(())
    }
}

impl Drop for CompletionQueue {
    fn drop(&mut self) {
        let n = *self.unacked.get_mut();
        // SAFETY: QPs using this CQ hold an Arc to it, so none is left; all
        // received events are acknowledged before destruction (required).
        unsafe {
            if n > 0 {
                ibv_ack_cq_events(self.cq, n);
            }
            ibv_destroy_cq(self.cq);
        }
    }
}

impl fmt::Debug for CompletionQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "CompletionQueue({}, cqe {})",
            self.ctx.name(),
            self.capacity()
        )
    }
}

// ---------------------------------------------------------------- memory

/// A scatter/gather element; same layout as `struct ibv_sge`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sge {
    /// Virtual address.
    pub addr: u64,
    /// Length in bytes.
    pub len: u32,
    /// Local key of a region covering `[addr, addr + len)`.
    pub lkey: u32,
}

/// A remote buffer: what a peer needs to RDMA-read/-write it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RemoteBuf {
    /// Remote virtual address.
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
    /// Remote key.
    pub rkey: u32,
}

impl RemoteBuf {
    /// Encoded size.
    pub const WIRE_LEN: usize = 20;
    /// Little-endian encoding: addr, len, rkey.
    pub fn to_bytes(&self) -> [u8; Self::WIRE_LEN] {
        let mut b = [0u8; Self::WIRE_LEN];
        b[0..8].copy_from_slice(&self.addr.to_le_bytes());
        b[8..16].copy_from_slice(&self.len.to_le_bytes());
        b[16..20].copy_from_slice(&self.rkey.to_le_bytes());
        b
    }
    /// Inverse of [`to_bytes`](Self::to_bytes).
    pub fn from_bytes(b: &[u8]) -> Result<RemoteBuf> {
        if b.len() != Self::WIRE_LEN {
            return Err(Error::Decode {
                what: "RemoteBuf",
                reason: format!("expected {} bytes, got {}", Self::WIRE_LEN, b.len()),
            });
        }
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        Ok(RemoteBuf {
            addr: u64_at(0),
            len: u64_at(8),
            rkey: u32::from_le_bytes(b[16..20].try_into().expect("4 bytes")),
        })
    }
    /// A sub-range (offset and length relative to this buffer).
    pub fn slice(&self, offset: u64, len: u64) -> Option<RemoteBuf> {
        (offset.checked_add(len)? <= self.len).then_some(RemoteBuf {
            addr: self.addr + offset,
            len,
            rkey: self.rkey,
        })
    }
}

/// A registered memory region (`ibv_reg_mr`). Deregistered on drop.
pub struct MemoryRegion {
    mr: *mut ibv_mr,
    pd: Arc<ProtectionDomain>,
    access: Access,
}

// SAFETY: an MR is an immutable handle after creation; dereg is thread-safe.
unsafe impl Send for MemoryRegion {}
// SAFETY: as above.
unsafe impl Sync for MemoryRegion {}

impl MemoryRegion {
    /// Register `[addr, addr + len)`.
    ///
    /// # Safety
    /// The range must be mapped memory of this process. Registration pins
    /// its pages: if the range is later unmapped and something else mapped at
    /// the same address, this region still refers to the OLD pages (see
    /// [`crate::cache`]); it must not be used for the new mapping.
    pub unsafe fn register_raw(
        pd: &Arc<ProtectionDomain>,
        addr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<MemoryRegion> {
        if len == 0 {
            return Err(Error::invalid(
                "ibv_reg_mr",
                "zero-length region",
                pd.ctx.dev(),
            ));
        }
        // SAFETY: the caller guarantees the range is mapped; the PD is alive.
        let mr = unsafe { ibv_reg_mr(pd.pd, addr.cast::<c_void>(), len, access.0 as i32) };
        if mr.is_null() {
            return Err(Error::last_os("ibv_reg_mr", pd.ctx.dev()));
        }
        Ok(MemoryRegion {
            mr,
            pd: pd.clone(),
            access,
        })
    }

    /// Register a slice the caller keeps alive. The borrow ends here, so the
    /// same contract as [`register_raw`](Self::register_raw) applies to later use.
    pub fn register_slice(
        pd: &Arc<ProtectionDomain>,
        buf: &mut [u8],
        access: Access,
    ) -> Result<MemoryRegion> {
        // SAFETY: a live slice is mapped memory of this process.
        unsafe { Self::register_raw(pd, buf.as_mut_ptr(), buf.len(), access) }
    }

    /// Start address.
    pub fn addr(&self) -> u64 {
        // SAFETY: mr is valid for our lifetime.
        unsafe { (*self.mr).addr as u64 }
    }
    /// Length in bytes.
    pub fn len(&self) -> usize {
        // SAFETY: as above.
        unsafe { (*self.mr).length }
    }
    /// Never true (zero-length registration is refused).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Local key.
    pub fn lkey(&self) -> u32 {
        // SAFETY: as above.
        unsafe { (*self.mr).lkey }
    }
    /// Remote key.
    pub fn rkey(&self) -> u32 {
        // SAFETY: as above.
        unsafe { (*self.mr).rkey }
    }
    /// Access rights it was registered with.
    pub fn access(&self) -> Access {
        self.access
    }
    /// The PD.
    pub fn pd(&self) -> &Arc<ProtectionDomain> {
        &self.pd
    }
    /// True when `[addr, addr + len)` lies inside the region.
    pub fn contains(&self, addr: u64, len: u64) -> bool {
        addr >= self.addr()
            && addr
                .checked_add(len)
                .is_some_and(|e| e <= self.addr() + self.len() as u64)
    }
    /// An SGE for `[addr, addr + len)`, if inside the region.
    pub fn sge_at(&self, addr: u64, len: u32) -> Option<Sge> {
        self.contains(addr, u64::from(len)).then_some(Sge {
            addr,
            len,
            lkey: self.lkey(),
        })
    }
    /// An SGE for `len` bytes at `offset` from the start.
    pub fn sge(&self, offset: usize, len: u32) -> Option<Sge> {
        self.sge_at(self.addr().checked_add(offset as u64)?, len)
    }
    /// The remote descriptor of `len` bytes at `offset` from the start.
    pub fn remote(&self, offset: usize, len: usize) -> Option<RemoteBuf> {
        RemoteBuf {
            addr: self.addr(),
            len: self.len() as u64,
            rkey: self.rkey(),
        }
        .slice(offset as u64, len as u64)
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        // SAFETY: registered by us, deregistered once.
        let rc = unsafe { ibv_dereg_mr(self.mr) };
        debug_assert_eq!(rc, 0, "ibv_dereg_mr failed");
    }
}

impl fmt::Debug for MemoryRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "MemoryRegion({:#x}+{}, lkey {:#x}, rkey {:#x})",
            self.addr(),
            self.len(),
            self.lkey(),
            self.rkey()
        )
    }
}

/// Page-aligned memory owned together with its registration (eager rings,
/// bounce buffers, test buffers). The region is deregistered before the
/// memory is freed.
pub struct RegisteredBuffer {
    mr: std::mem::ManuallyDrop<MemoryRegion>,
    ptr: *mut u8,
    layout: std::alloc::Layout,
    len: usize,
}

// SAFETY: owns its memory exclusively; the MR is Send + Sync.
unsafe impl Send for RegisteredBuffer {}
// SAFETY: shared access only reads (or hands out raw addresses).
unsafe impl Sync for RegisteredBuffer {}

impl RegisteredBuffer {
    /// Allocate `len` zeroed bytes (page-aligned) and register them.
    pub fn new(pd: &Arc<ProtectionDomain>, len: usize, access: Access) -> Result<RegisteredBuffer> {
        let page = 4096;
        let size = len.max(1).div_ceil(page) * page;
        let layout = std::alloc::Layout::from_size_align(size, page)
            .map_err(|e| Error::invalid("RegisteredBuffer::new", e.to_string(), pd.ctx.dev()))?;
        // SAFETY: non-zero size layout.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(Error::invalid(
                "RegisteredBuffer::new",
                format!("cannot allocate {size} bytes"),
                pd.ctx.dev(),
            ));
        }
        // SAFETY: `ptr..ptr+size` is our live allocation.
        match unsafe { MemoryRegion::register_raw(pd, ptr, size, access) } {
            Ok(mr) => Ok(RegisteredBuffer {
                mr: std::mem::ManuallyDrop::new(mr),
                ptr,
                layout,
                len,
            }),
            Err(e) => {
                // SAFETY: allocated above with this layout.
                unsafe { std::alloc::dealloc(ptr, layout) };
                Err(e)
            }
        }
    }
    /// The registration.
    pub fn mr(&self) -> &MemoryRegion {
        &self.mr
    }
    /// Usable length (as requested).
    pub fn len(&self) -> usize {
        self.len
    }
    /// True when zero-length.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Start address.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }
    /// The contents. The device may write them concurrently only through
    /// requests the caller posted (an `unsafe` contract of the post calls).
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` is our live allocation of at least `len` bytes.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
    /// Mutable contents.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` gives exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
    /// SGE for `len` bytes at `offset`.
    pub fn sge(&self, offset: usize, len: u32) -> Option<Sge> {
        (offset.checked_add(len as usize)? <= self.len)
            .then(|| self.mr.sge(offset, len))
            .flatten()
    }
    /// Remote descriptor for `len` bytes at `offset`.
    pub fn remote(&self, offset: usize, len: usize) -> Option<RemoteBuf> {
        (offset.checked_add(len)? <= self.len)
            .then(|| self.mr.remote(offset, len))
            .flatten()
    }
}

impl Drop for RegisteredBuffer {
    fn drop(&mut self) {
        // SAFETY: deregister first (the device can no longer touch the
        // memory), then free what we allocated with `layout`.
        unsafe {
            std::mem::ManuallyDrop::drop(&mut self.mr);
            std::alloc::dealloc(self.ptr, self.layout);
        }
    }
}

impl fmt::Debug for RegisteredBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RegisteredBuffer({} bytes, {:?})", self.len, *self.mr)
    }
}

// ------------------------------------------------------------------- AH

/// Global routing header fields of an address handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grh {
    /// Destination GID.
    pub dgid: Gid,
    /// Local GID index to send from.
    pub sgid_index: u8,
    /// Hop limit (64 is customary).
    pub hop_limit: u8,
    /// Traffic class.
    pub traffic_class: u8,
    /// Flow label.
    pub flow_label: u32,
}

/// Address attributes (`ibv_ah_attr`), for UD sends and RC connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AhAttr {
    /// Local port.
    pub port: u8,
    /// Destination LID (IB; 0 on RoCE).
    pub dlid: u16,
    /// Service level.
    pub sl: u8,
    /// GRH (required on RoCE).
    pub grh: Option<Grh>,
}

impl AhAttr {
    pub(crate) fn to_ibv(self) -> ibv_ah_attr {
        // SAFETY: plain C struct; zero is valid for every field.
        let mut a: ibv_ah_attr = unsafe { std::mem::zeroed() };
        a.port_num = self.port;
        a.dlid = self.dlid;
        a.sl = self.sl;
        if let Some(g) = self.grh {
            a.is_global = 1;
            a.grh.dgid = g.dgid.to_ibv();
            a.grh.sgid_index = g.sgid_index;
            a.grh.hop_limit = g.hop_limit;
            a.grh.traffic_class = g.traffic_class;
            a.grh.flow_label = g.flow_label;
        }
        a
    }
}

/// An address handle (UD destinations).
pub struct AddressHandle {
    ah: *mut ibv_ah,
    _pd: Arc<ProtectionDomain>,
}

// SAFETY: immutable handle after creation.
unsafe impl Send for AddressHandle {}
// SAFETY: as above.
unsafe impl Sync for AddressHandle {}

impl AddressHandle {
    /// `ibv_create_ah`.
    pub fn new(pd: &Arc<ProtectionDomain>, attr: &AhAttr) -> Result<AddressHandle> {
        let mut a = attr.to_ibv();
        // SAFETY: PD alive; `a` fully initialised.
        let ah = unsafe { ibv_create_ah(pd.pd, &mut a) };
        if ah.is_null() {
            return Err(Error::last_os("ibv_create_ah", pd.ctx.dev()));
        }
        Ok(AddressHandle {
            ah,
            _pd: pd.clone(),
        })
    }
}

impl Drop for AddressHandle {
    fn drop(&mut self) {
        // SAFETY: created by us, destroyed once; UD sends referencing it must
        // have completed (contract of `post_send`).
        unsafe { ibv_destroy_ah(self.ah) };
    }
}

// ------------------------------------------------------------------ SRQ

/// A shared receive queue: one pool of posted receives that every RC queue
/// pair made on it ([`QueuePair::with_srq`]) consumes from, so receive
/// buffers are per process, not per connection. A receive completion
/// names the queue pair it arrived on (`qp_num`) and the `wr_id` of the
/// buffer it filled.
///
/// The registered memory its receives point into can be handed to the SRQ
/// ([`new`](Self::new)'s `mem`): it is then deregistered only after the SRQ
/// is destroyed, which happens only after the last queue pair using it
/// (each holds an `Arc`), so the device can never write into freed memory.
pub struct SharedReceiveQueue {
    pub(crate) srq: *mut ibv_srq,
    pd: Arc<ProtectionDomain>,
    max_wr: u32,
    /// Dropped (deregistered, freed) after `Drop::drop` destroyed the SRQ.
    mem: Option<RegisteredBuffer>,
}

// SAFETY: ibv_post_srq_recv/ibv_modify_srq are thread-safe in libibverbs
// providers (they lock internally); the wrapper holds no thread-affine
// state, and `mem` is Send + Sync.
unsafe impl Send for SharedReceiveQueue {}
// SAFETY: as above.
unsafe impl Sync for SharedReceiveQueue {}

impl SharedReceiveQueue {
    /// `ibv_create_srq` with room for `max_wr` posted receives of one SGE
    /// each (at most the device's `max_srq_wr`), owning `mem` (the memory
    /// its receives will point into) if given.
    pub fn new(
        pd: &Arc<ProtectionDomain>,
        max_wr: u32,
        mem: Option<RegisteredBuffer>,
    ) -> Result<Arc<SharedReceiveQueue>> {
        let dev_max = pd.ctx.attr().max_srq_wr;
        if max_wr == 0 || (dev_max > 0 && max_wr > dev_max) {
            return Err(Error::invalid(
                "ibv_create_srq",
                format!("{max_wr} receives wanted, the device allows 1..={dev_max}"),
                pd.ctx.dev(),
            ));
        }
        if let Some(m) = &mem {
            if !Arc::ptr_eq(m.mr().pd(), pd) {
                return Err(Error::invalid(
                    "ibv_create_srq",
                    "its memory is registered with another protection domain",
                    pd.ctx.dev(),
                ));
            }
        }
        // SAFETY: plain C struct; zero is valid.
        let mut init: ibv_srq_init_attr = unsafe { std::mem::zeroed() };
        init.attr.max_wr = max_wr;
        init.attr.max_sge = 1;
        // SAFETY: the PD is alive (held below); `init` is initialised.
        let srq = unsafe { ibv_create_srq(pd.pd, &mut init) };
        if srq.is_null() {
            return Err(Error::last_os("ibv_create_srq", pd.ctx.dev()));
        }
        Ok(Arc::new(SharedReceiveQueue {
            srq,
            pd: pd.clone(),
            // The provider may round up; it reports the real size back.
            max_wr: init.attr.max_wr.max(max_wr),
            mem,
        }))
    }

    /// Receives it can hold posted at once.
    pub fn max_wr(&self) -> u32 {
        self.max_wr
    }

    /// The PD.
    pub fn pd(&self) -> &Arc<ProtectionDomain> {
        &self.pd
    }

    /// The memory it owns (see [`new`](Self::new)).
    pub fn mem(&self) -> Option<&RegisteredBuffer> {
        self.mem.as_ref()
    }

    fn dev(&self) -> Option<&str> {
        self.pd.ctx.dev()
    }

    /// Arms the limit event: once fewer than `limit` receives are posted,
    /// the device raises `IBV_EVENT_SRQ_LIMIT_REACHED` once (on the
    /// context's async event queue, [`Context::async_event`]) and disarms;
    /// 0 disarms.
    pub fn arm_limit(&self, limit: u32) -> Result<()> {
        let mut a = ibv_srq_attr {
            max_wr: 0,
            max_sge: 0,
            srq_limit: limit,
        };
        // SAFETY: the SRQ is alive; `a` is initialised for the masked field.
        let rc = unsafe {
            ibv_modify_srq(
                self.srq,
                &mut a,
                ibv_srq_attr_mask::IBV_SRQ_LIMIT.0 as std::os::raw::c_int,
            )
        };
        if rc != 0 {
            return Err(Error::verbs("ibv_modify_srq(limit)", rc.abs(), self.dev()));
        }
        Ok(())
    }

    /// `ibv_query_srq`: (max_wr, armed limit).
    pub fn query(&self) -> Result<(u32, u32)> {
        // SAFETY: plain C struct; zero is valid.
        let mut a: ibv_srq_attr = unsafe { std::mem::zeroed() };
        // SAFETY: the SRQ is alive; `a` is a valid out-pointer.
        let rc = unsafe { ibv_query_srq(self.srq, &mut a) };
        if rc != 0 {
            return Err(Error::verbs("ibv_query_srq", rc.abs(), self.dev()));
        }
        Ok((a.max_wr, a.srq_limit))
    }

    /// True when `event` ([`Context::async_event`]) is about this SRQ.
    pub fn is_event_source(&self, event: &AsyncEvent) -> bool {
        event.object == self.srq as usize
    }

    /// Post many single-SGE receives, one `ibv_post_srq_recv` call per 32.
    ///
    /// # Safety
    /// Every SGE must be covered by a live registration with `LOCAL_WRITE`
    /// of this SRQ's PD, and the memory must stay valid and unaliased by
    /// Rust references until the receive completes (or is flushed) and has
    /// been polled, or the SRQ is destroyed (memory the SRQ owns, `mem`,
    /// lives exactly that long).
    pub unsafe fn post_recvs(&self, items: &[(u64, Sge)]) -> Result<()> {
        post_recv_chains::<32>(items, |wr| {
            let mut bad = ptr::null_mut();
            // SAFETY: a well-formed NULL-terminated chain whose SGE arrays
            // live for the call (the provider copies them into the queue);
            // the caller upholds the memory contract. `ibv_post_srq_recv` is
            // an inline that calls the provider through the context's ops
            // table, which is set for every context that could make this SRQ.
            unsafe { ibv_post_srq_recv(self.srq, wr, &mut bad) }
        })
        .map_err(|rc| Error::verbs("ibv_post_srq_recv", rc.abs(), self.dev()))
    }
}

impl Drop for SharedReceiveQueue {
    fn drop(&mut self) {
        // SAFETY: created by us and destroyed once; every QP made on it
        // holds an Arc, so none is left (destroying an SRQ that QPs still
        // use fails with EBUSY). `mem` is dropped after this, so the
        // device never writes deregistered memory.
        unsafe { ibv_destroy_srq(self.srq) };
    }
}

impl fmt::Debug for SharedReceiveQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "SharedReceiveQueue({}, max_wr {})",
            self.pd.ctx.name(),
            self.max_wr
        )
    }
}

// ------------------------------------------------------------------- QP

/// Transport type of a queue pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QpType {
    /// Reliable connected.
    Rc,
    /// Unreliable datagram (multicast capable).
    Ud,
}

/// Queue sizes requested at creation (the device may round up).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpCaps {
    /// Send queue depth.
    pub max_send_wr: u32,
    /// Receive queue depth.
    pub max_recv_wr: u32,
    /// SGEs per send WR.
    pub max_send_sge: u32,
    /// SGEs per receive WR.
    pub max_recv_sge: u32,
    /// Bytes of inline data per send WR.
    pub max_inline_data: u32,
}

impl Default for QpCaps {
    fn default() -> Self {
        QpCaps {
            max_send_wr: 256,
            max_recv_wr: 256,
            max_send_sge: 4,
            max_recv_sge: 1,
            max_inline_data: 64,
        }
    }
}

/// Flags of a send WR (`ibv_send_flags`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SendFlags(pub u32);

impl SendFlags {
    /// No flags: unsignaled (no completion unless it fails).
    pub const NONE: SendFlags = SendFlags(0);
    /// Generate a completion.
    pub const SIGNALED: SendFlags = SendFlags(ibv_send_flags::IBV_SEND_SIGNALED.0);
    /// Copy the payload into the WQE at post time (small messages).
    pub const INLINE: SendFlags = SendFlags(ibv_send_flags::IBV_SEND_INLINE.0);
    /// Raise a solicited event at the receiver.
    pub const SOLICITED: SendFlags = SendFlags(ibv_send_flags::IBV_SEND_SOLICITED.0);
    /// Wait for earlier RDMA reads/atomics first.
    pub const FENCE: SendFlags = SendFlags(ibv_send_flags::IBV_SEND_FENCE.0);
    /// True when all bits of `o` are set.
    pub fn contains(self, o: SendFlags) -> bool {
        self.0 & o.0 == o.0
    }
}

impl std::ops::BitOr for SendFlags {
    type Output = SendFlags;
    fn bitor(self, o: SendFlags) -> SendFlags {
        SendFlags(self.0 | o.0)
    }
}

/// What a send WR does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendOp {
    /// Two-sided send.
    Send,
    /// Send with 32-bit immediate data.
    SendImm(u32),
    /// RDMA write to `remote`.
    Write(RemoteBuf),
    /// RDMA write with immediate (consumes a receive at the target).
    WriteImm(RemoteBuf, u32),
    /// RDMA read from `remote` into the local SGEs.
    Read(RemoteBuf),
}

impl SendOp {
    /// Upper-case name, for error messages.
    pub fn name(&self) -> &'static str {
        match self {
            SendOp::Send => "SEND",
            SendOp::SendImm(_) => "SEND_WITH_IMM",
            SendOp::Write(_) => "RDMA_WRITE",
            SendOp::WriteImm(..) => "RDMA_WRITE_WITH_IMM",
            SendOp::Read(_) => "RDMA_READ",
        }
    }
}

/// UD destination of a send.
#[derive(Clone, Copy)]
pub struct UdDest<'a> {
    /// Address handle of the destination (or multicast group).
    pub ah: &'a AddressHandle,
    /// Remote QP number (0xFFFFFF for multicast).
    pub qpn: u32,
    /// Remote Q_Key.
    pub qkey: u32,
}

/// One send work request.
#[derive(Clone, Copy)]
pub struct SendWr<'a> {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Local memory (for inline sends, only addr/len are used).
    pub sges: &'a [Sge],
    /// Operation.
    pub op: SendOp,
    /// Flags.
    pub flags: SendFlags,
    /// UD destination (UD QPs only).
    pub ud: Option<UdDest<'a>>,
}

/// Attributes for the RESET→INIT→RTR→RTS transitions of an RC QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RcConnectAttr {
    /// Local port.
    pub port: u8,
    /// Access rights granted to the peer.
    pub access: Access,
    /// Path MTU.
    pub mtu: Mtu,
    /// Remote QP number.
    pub dest_qpn: u32,
    /// Remote's initial send PSN (our receive PSN).
    pub rq_psn: u32,
    /// Our initial send PSN.
    pub sq_psn: u32,
    /// Address of the peer.
    pub ah: AhAttr,
    /// Local ACK timeout exponent: 4.096 µs × 2^timeout (0 = infinite).
    pub timeout: u8,
    /// Transport retries (0..=7).
    pub retry_cnt: u8,
    /// RNR retries (0..=7, 7 = infinite).
    pub rnr_retry: u8,
    /// Minimum RNR NAK timer (encoded, 1..=31; 12 ≈ 0.64 ms).
    pub min_rnr_timer: u8,
    /// Outstanding RDMA reads/atomics we issue.
    pub max_rd_atomic: u8,
    /// Outstanding RDMA reads/atomics we serve.
    pub max_dest_rd_atomic: u8,
}

/// A queue pair (RC or UD).
pub struct QueuePair {
    pub(crate) qp: *mut ibv_qp,
    pd: Arc<ProtectionDomain>,
    send_cq: Arc<CompletionQueue>,
    recv_cq: Arc<CompletionQueue>,
    qp_type: QpType,
    caps: QpCaps,
    /// The shared receive queue its receives come from, if any (released
    /// after the QP is destroyed).
    srq: Option<Arc<SharedReceiveQueue>>,
}

// SAFETY: ibv_post_send/recv and ibv_modify_qp are thread-safe in libibverbs
// providers; the wrapper holds no thread-affine state.
unsafe impl Send for QueuePair {}
// SAFETY: as above.
unsafe impl Sync for QueuePair {}

impl QueuePair {
    /// `ibv_create_qp`.
    pub fn new(
        pd: &Arc<ProtectionDomain>,
        send_cq: &Arc<CompletionQueue>,
        recv_cq: &Arc<CompletionQueue>,
        qp_type: QpType,
        caps: QpCaps,
    ) -> Result<QueuePair> {
        Self::make(pd, send_cq, recv_cq, qp_type, caps, None)
    }

    /// `ibv_create_qp` of a queue pair whose receives come from `srq`
    /// (`caps.max_recv_wr`/`max_recv_sge` are ignored: it has no receive
    /// queue of its own, and [`post_recv`](Self::post_recv) fails on it).
    /// Receive completions go to `recv_cq` and carry this QP's number.
    pub fn with_srq(
        pd: &Arc<ProtectionDomain>,
        send_cq: &Arc<CompletionQueue>,
        recv_cq: &Arc<CompletionQueue>,
        srq: &Arc<SharedReceiveQueue>,
        qp_type: QpType,
        caps: QpCaps,
    ) -> Result<QueuePair> {
        if !Arc::ptr_eq(srq.pd(), pd) {
            return Err(Error::invalid(
                "ibv_create_qp",
                "the shared receive queue belongs to another protection domain",
                pd.ctx.dev(),
            ));
        }
        Self::make(pd, send_cq, recv_cq, qp_type, caps, Some(srq))
    }

    fn make(
        pd: &Arc<ProtectionDomain>,
        send_cq: &Arc<CompletionQueue>,
        recv_cq: &Arc<CompletionQueue>,
        qp_type: QpType,
        mut caps: QpCaps,
        srq: Option<&Arc<SharedReceiveQueue>>,
    ) -> Result<QueuePair> {
        // SAFETY: plain C struct; zero is valid.
        let mut init: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        init.send_cq = send_cq.cq;
        init.recv_cq = recv_cq.cq;
        if let Some(srq) = srq {
            init.srq = srq.srq;
            caps.max_recv_wr = 0;
            caps.max_recv_sge = 0;
        }
        init.qp_type = match qp_type {
            QpType::Rc => ibv_qp_type::IBV_QPT_RC,
            QpType::Ud => ibv_qp_type::IBV_QPT_UD,
        };
        init.cap = ibv_qp_cap {
            max_send_wr: caps.max_send_wr,
            max_recv_wr: caps.max_recv_wr,
            max_send_sge: caps.max_send_sge,
            max_recv_sge: caps.max_recv_sge,
            max_inline_data: caps.max_inline_data,
        };
        // SAFETY: PD, CQs and SRQ are alive (held below); `init` initialised.
        let qp = unsafe { ibv_create_qp(pd.pd, &mut init) };
        if qp.is_null() {
            return Err(Error::last_os("ibv_create_qp", pd.ctx.dev()));
        }
        let c = init.cap;
        Ok(QueuePair {
            qp,
            pd: pd.clone(),
            send_cq: send_cq.clone(),
            recv_cq: recv_cq.clone(),
            qp_type,
            caps: QpCaps {
                max_send_wr: c.max_send_wr,
                max_recv_wr: c.max_recv_wr,
                max_send_sge: c.max_send_sge,
                max_recv_sge: c.max_recv_sge,
                max_inline_data: c.max_inline_data,
            },
            srq: srq.cloned(),
        })
    }

    /// The shared receive queue its receives come from, if any.
    pub fn srq(&self) -> Option<&Arc<SharedReceiveQueue>> {
        self.srq.as_ref()
    }

    /// QP number.
    pub fn qpn(&self) -> u32 {
        // SAFETY: qp valid for our lifetime.
        unsafe { (*self.qp).qp_num }
    }
    /// RC or UD.
    pub fn qp_type(&self) -> QpType {
        self.qp_type
    }
    /// Actual capabilities.
    pub fn caps(&self) -> QpCaps {
        self.caps
    }
    /// The PD.
    pub fn pd(&self) -> &Arc<ProtectionDomain> {
        &self.pd
    }
    /// The send CQ.
    pub fn send_cq(&self) -> &Arc<CompletionQueue> {
        &self.send_cq
    }
    /// The receive CQ.
    pub fn recv_cq(&self) -> &Arc<CompletionQueue> {
        &self.recv_cq
    }
    fn dev(&self) -> Option<&str> {
        self.pd.ctx.dev()
    }

    fn modify(&self, attr: &mut ibv_qp_attr, mask: u32, what: &'static str) -> Result<()> {
        // SAFETY: qp alive; attr initialised for the fields in `mask`.
        let rc = unsafe { ibv_modify_qp(self.qp, attr, mask as i32) };
        if rc != 0 {
            return Err(Error::verbs(what, rc, self.dev()));
        }
        Ok(())
    }

    /// Current state (`ibv_qp_state` value: 0 RESET .. 3 RTS, 6 ERR).
    pub fn state(&self) -> Result<u32> {
        // SAFETY: plain C structs; zero is valid.
        let (mut a, mut i): (ibv_qp_attr, ibv_qp_init_attr) =
            unsafe { (std::mem::zeroed(), std::mem::zeroed()) };
        // SAFETY: qp alive; valid out-pointers.
        let rc = unsafe {
            ibv_query_qp(
                self.qp,
                &mut a,
                ibv_qp_attr_mask::IBV_QP_STATE.0 as i32,
                &mut i,
            )
        };
        if rc != 0 {
            return Err(Error::verbs("ibv_query_qp", rc, self.dev()));
        }
        Ok(a.qp_state)
    }

    /// RC: RESET→INIT→RTR→RTS in one call.
    pub fn connect_rc(&self, c: &RcConnectAttr) -> Result<()> {
        use ibv_qp_attr_mask as m;
        if self.qp_type != QpType::Rc {
            return Err(Error::invalid("connect_rc", "not an RC QP", self.dev()));
        }
        // SAFETY: plain C struct; zero is valid.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ibv_qp_state::IBV_QPS_INIT;
        a.pkey_index = 0;
        a.port_num = c.port;
        a.qp_access_flags = c.access.0;
        self.modify(
            &mut a,
            (m::IBV_QP_STATE | m::IBV_QP_PKEY_INDEX | m::IBV_QP_PORT | m::IBV_QP_ACCESS_FLAGS).0,
            "ibv_modify_qp(RESET->INIT)",
        )?;

        // SAFETY: as above.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ibv_qp_state::IBV_QPS_RTR;
        a.path_mtu = c.mtu.to_ibv();
        a.dest_qp_num = c.dest_qpn;
        a.rq_psn = c.rq_psn & 0xff_ffff;
        a.max_dest_rd_atomic = c.max_dest_rd_atomic;
        a.min_rnr_timer = c.min_rnr_timer;
        a.ah_attr = c.ah.to_ibv();
        self.modify(
            &mut a,
            (m::IBV_QP_STATE
                | m::IBV_QP_AV
                | m::IBV_QP_PATH_MTU
                | m::IBV_QP_DEST_QPN
                | m::IBV_QP_RQ_PSN
                | m::IBV_QP_MAX_DEST_RD_ATOMIC
                | m::IBV_QP_MIN_RNR_TIMER)
                .0,
            "ibv_modify_qp(INIT->RTR)",
        )?;

        // SAFETY: as above.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ibv_qp_state::IBV_QPS_RTS;
        a.sq_psn = c.sq_psn & 0xff_ffff;
        a.timeout = c.timeout;
        a.retry_cnt = c.retry_cnt;
        a.rnr_retry = c.rnr_retry;
        a.max_rd_atomic = c.max_rd_atomic;
        self.modify(
            &mut a,
            (m::IBV_QP_STATE
                | m::IBV_QP_SQ_PSN
                | m::IBV_QP_TIMEOUT
                | m::IBV_QP_RETRY_CNT
                | m::IBV_QP_RNR_RETRY
                | m::IBV_QP_MAX_QP_RD_ATOMIC)
                .0,
            "ibv_modify_qp(RTR->RTS)",
        )
    }

    /// UD: RESET→INIT→RTR→RTS with the given Q_Key and send PSN.
    pub fn activate_ud(&self, port: u8, qkey: u32, sq_psn: u32) -> Result<()> {
        use ibv_qp_attr_mask as m;
        if self.qp_type != QpType::Ud {
            return Err(Error::invalid("activate_ud", "not a UD QP", self.dev()));
        }
        // SAFETY: plain C struct; zero is valid.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ibv_qp_state::IBV_QPS_INIT;
        a.port_num = port;
        a.qkey = qkey;
        self.modify(
            &mut a,
            (m::IBV_QP_STATE | m::IBV_QP_PKEY_INDEX | m::IBV_QP_PORT | m::IBV_QP_QKEY).0,
            "ibv_modify_qp(UD RESET->INIT)",
        )?;
        // SAFETY: as above.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ibv_qp_state::IBV_QPS_RTR;
        self.modify(&mut a, m::IBV_QP_STATE.0, "ibv_modify_qp(UD INIT->RTR)")?;
        // SAFETY: as above.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ibv_qp_state::IBV_QPS_RTS;
        a.sq_psn = sq_psn & 0xff_ffff;
        self.modify(
            &mut a,
            (m::IBV_QP_STATE | m::IBV_QP_SQ_PSN).0,
            "ibv_modify_qp(UD RTR->RTS)",
        )
    }

    /// Move to the error state: outstanding WRs complete with
    /// `IBV_WC_WR_FLUSH_ERR`.
    pub fn set_error(&self) -> Result<()> {
        // SAFETY: plain C struct; zero is valid.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ibv_qp_state::IBV_QPS_ERR;
        self.modify(
            &mut a,
            ibv_qp_attr_mask::IBV_QP_STATE.0,
            "ibv_modify_qp(->ERR)",
        )
    }

    /// Post a chain of send WRs.
    ///
    /// # Safety
    /// Every SGE must describe memory covered by a live registration of this
    /// QP's PD (or, with `INLINE`, any readable memory). Memory the device
    /// reads must stay valid and unmodified, and memory it writes (RDMA read
    /// targets) must stay valid and unaliased by Rust references, until the
    /// WR's completion — or that of a later signaled WR — has been polled or
    /// the QP has been destroyed. Address handles must outlive the WR.
    pub unsafe fn post_send(&self, wrs: &[SendWr<'_>]) -> Result<()> {
        if wrs.len() == 1 {
            // The common case: no 16-entry array to zero on the hot path.
            // SAFETY: forwarded contract.
            return unsafe { self.post_send_n::<1>(wrs) };
        }
        // SAFETY: forwarded contract.
        unsafe { self.post_send_n::<16>(wrs) }
    }

    /// [`post_send`](Self::post_send) in chains of at most `CHUNK` WRs.
    ///
    /// # Safety
    /// As [`post_send`](Self::post_send).
    unsafe fn post_send_n<const CHUNK: usize>(&self, wrs: &[SendWr<'_>]) -> Result<()> {
        for chunk in wrs.chunks(CHUNK) {
            // SAFETY: plain C structs; zero is valid for every field.
            let mut raw: [ibv_send_wr; CHUNK] =
                std::array::from_fn(|_| unsafe { std::mem::zeroed() });
            let n = chunk.len();
            for (i, w) in chunk.iter().enumerate() {
                if w.sges.len() > self.caps.max_send_sge as usize
                    && !w.flags.contains(SendFlags::INLINE)
                {
                    return Err(Error::invalid(
                        "ibv_post_send",
                        format!(
                            "{} SGEs > max_send_sge {}",
                            w.sges.len(),
                            self.caps.max_send_sge
                        ),
                        self.dev(),
                    ));
                }
                if w.flags.contains(SendFlags::INLINE) {
                    let total: u64 = w.sges.iter().map(|s| u64::from(s.len)).sum();
                    if total > u64::from(self.caps.max_inline_data) {
                        return Err(Error::invalid(
                            "ibv_post_send",
                            format!(
                                "{total} inline bytes > max_inline_data {}",
                                self.caps.max_inline_data
                            ),
                            self.dev(),
                        ));
                    }
                }
                let r = &mut raw[i];
                r.wr_id = w.wr_id;
                // Sge is repr(C) with ibv_sge's layout; the device only reads it.
                r.sg_list = w.sges.as_ptr() as *mut ibv_sge;
                r.num_sge = w.sges.len() as i32;
                r.send_flags = w.flags.0;
                let (opcode, remote, imm) = match w.op {
                    SendOp::Send => (ibv_wr_opcode::IBV_WR_SEND, None, None),
                    SendOp::SendImm(v) => (ibv_wr_opcode::IBV_WR_SEND_WITH_IMM, None, Some(v)),
                    SendOp::Write(rb) => (ibv_wr_opcode::IBV_WR_RDMA_WRITE, Some(rb), None),
                    SendOp::WriteImm(rb, v) => {
                        (ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM, Some(rb), Some(v))
                    }
                    SendOp::Read(rb) => (ibv_wr_opcode::IBV_WR_RDMA_READ, Some(rb), None),
                };
                r.opcode = opcode;
                if let Some(v) = imm {
                    r.imm_data_invalidated_rkey_union.imm_data = v.to_be();
                }
                if let Some(rb) = remote {
                    r.wr.rdma = rdma_t {
                        remote_addr: rb.addr,
                        rkey: rb.rkey,
                    };
                }
                if let Some(ud) = w.ud {
                    r.wr.ud = ud_t {
                        ah: ud.ah.ah,
                        remote_qpn: ud.qpn,
                        remote_qkey: ud.qkey,
                    };
                }
            }
            for i in 0..n.saturating_sub(1) {
                let next: *mut ibv_send_wr = &mut raw[i + 1];
                raw[i].next = next;
            }
            let mut bad: *mut ibv_send_wr = ptr::null_mut();
            // SAFETY: `raw[..n]` is a well-formed, NULL-terminated chain; the
            // caller upholds the memory contract for the SGEs it points to.
            let rc = unsafe { ibv_post_send(self.qp, raw.as_mut_ptr(), &mut bad) };
            if rc != 0 {
                let idx = if bad.is_null() {
                    0
                } else {
                    (bad as usize - raw.as_ptr() as usize) / std::mem::size_of::<ibv_send_wr>()
                };
                return Err(Error::Verbs {
                    op: "ibv_post_send",
                    errno: rc.abs(),
                    ctx: Ctx {
                        device: self.dev().map(str::to_owned),
                        peer: Some(format!(
                            "qpn {:#x}, failed at WR {} ({})",
                            self.qpn(),
                            idx,
                            chunk.get(idx).map_or("?", |w| w.op.name())
                        )),
                    },
                });
            }
        }
        Ok(())
    }

    /// Post one receive WR.
    ///
    /// # Safety
    /// The SGEs must be covered by a live registration with `LOCAL_WRITE`,
    /// and the memory must stay valid and unaliased by Rust references until
    /// the receive completes (or is flushed) and has been polled.
    pub unsafe fn post_recv(&self, wr_id: u64, sges: &[Sge]) -> Result<()> {
        self.no_srq("ibv_post_recv")?;
        if sges.len() == 1 {
            // SAFETY: forwarded contract.
            return unsafe { self.post_recvs(&[(wr_id, sges[0])]) };
        }
        // SAFETY: plain C struct; zero is valid.
        let mut w: ibv_recv_wr = unsafe { std::mem::zeroed() };
        w.wr_id = wr_id;
        w.sg_list = sges.as_ptr() as *mut ibv_sge;
        w.num_sge = sges.len() as i32;
        let mut bad = ptr::null_mut();
        // SAFETY: one well-formed WR (the device only reads the SGE array,
        // which outlives the call); the caller upholds the memory contract.
        let rc = unsafe { ibv_post_recv(self.qp, &mut w, &mut bad) };
        if rc != 0 {
            return Err(Error::verbs("ibv_post_recv", rc, self.dev()));
        }
        Ok(())
    }

    /// Post many single-SGE receives with one `ibv_post_recv` call per 32.
    ///
    /// # Safety
    /// As for [`post_recv`](Self::post_recv), for every entry.
    pub unsafe fn post_recvs(&self, items: &[(u64, Sge)]) -> Result<()> {
        self.no_srq("ibv_post_recv")?;
        if items.len() <= 8 {
            // SAFETY: forwarded contract.
            return unsafe { self.post_recvs_n::<8>(items) };
        }
        // SAFETY: forwarded contract.
        unsafe { self.post_recvs_n::<32>(items) }
    }

    fn no_srq(&self, op: &'static str) -> Result<()> {
        if self.srq.is_some() {
            return Err(Error::invalid(
                op,
                format!(
                    "qpn {:#x} takes its receives from a shared receive queue: post them there",
                    self.qpn()
                ),
                self.dev(),
            ));
        }
        Ok(())
    }

    /// [`post_recvs`](Self::post_recvs) in chains of at most `CHUNK` WRs.
    ///
    /// # Safety
    /// As [`post_recvs`](Self::post_recvs).
    unsafe fn post_recvs_n<const CHUNK: usize>(&self, items: &[(u64, Sge)]) -> Result<()> {
        post_recv_chains::<CHUNK>(items, |wr| {
            let mut bad = ptr::null_mut();
            // SAFETY: a well-formed NULL-terminated chain whose SGE arrays
            // live for the call; the caller upholds the memory contract.
            unsafe { ibv_post_recv(self.qp, wr, &mut bad) }
        })
        .map_err(|rc| Error::verbs("ibv_post_recv", rc, self.dev()))
    }

    /// Copy `data` into the send queue and send it (`IBV_SEND_INLINE`) on
    /// an RC QP. Safe: the payload is copied during the call, no
    /// registration is needed, and nothing is referenced afterwards.
    pub fn post_send_inline(
        &self,
        wr_id: u64,
        data: &[u8],
        op: SendOp,
        signaled: bool,
    ) -> Result<()> {
        if matches!(op, SendOp::Read(_)) {
            return Err(Error::invalid(
                "post_send_inline",
                "RDMA read cannot be inline",
                self.dev(),
            ));
        }
        if self.qp_type != QpType::Rc {
            return Err(Error::invalid(
                "post_send_inline",
                "UD sends need an address handle: use post_send",
                self.dev(),
            ));
        }
        let sge = [Sge {
            addr: data.as_ptr() as u64,
            len: data.len() as u32,
            lkey: 0,
        }];
        let flags = if signaled {
            SendFlags::INLINE | SendFlags::SIGNALED
        } else {
            SendFlags::INLINE
        };
        // SAFETY: with INLINE the provider copies `data` into the WQE during
        // the call (the size is checked against max_inline_data in post_send),
        // so no memory is accessed after return; no AH is involved (RC).
        unsafe {
            self.post_send(&[SendWr {
                wr_id,
                sges: if data.is_empty() { &[] } else { &sge },
                op,
                flags,
                ud: None,
            }])
        }
    }

    /// Attach a UD QP to a multicast group.
    pub fn attach_mcast(&self, gid: &Gid, lid: u16) -> Result<()> {
        let g = gid.to_ibv();
        // SAFETY: qp alive; gid is a valid pointer for the call.
        let rc = unsafe { ibv_attach_mcast(self.qp, &g, lid) };
        if rc != 0 {
            return Err(Error::verbs("ibv_attach_mcast", rc, self.dev()));
        }
        Ok(())
    }

    /// Detach from a multicast group.
    pub fn detach_mcast(&self, gid: &Gid, lid: u16) -> Result<()> {
        let g = gid.to_ibv();
        // SAFETY: as above.
        let rc = unsafe { ibv_detach_mcast(self.qp, &g, lid) };
        if rc != 0 {
            return Err(Error::verbs("ibv_detach_mcast", rc, self.dev()));
        }
        Ok(())
    }
}

impl Drop for QueuePair {
    fn drop(&mut self) {
        // SAFETY: created by us, destroyed once; the CQs/PD/SRQ it uses are
        // kept alive by our Arcs until after this call.
        unsafe { ibv_destroy_qp(self.qp) };
    }
}

impl fmt::Debug for QueuePair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "QueuePair({:?} qpn {:#x} on {})",
            self.qp_type,
            self.qpn(),
            self.pd.ctx.name()
        )
    }
}

/// Hands `items` (single-SGE receives) to `post` (`ibv_post_recv` on a QP,
/// `ibv_post_srq_recv` on an SRQ) as NULL-terminated chains of at most
/// `CHUNK` work requests built on this stack frame, which outlives each
/// call; stops at the first non-zero result and returns it.
fn post_recv_chains<const CHUNK: usize>(
    items: &[(u64, Sge)],
    mut post: impl FnMut(*mut ibv_recv_wr) -> i32,
) -> std::result::Result<(), i32> {
    for chunk in items.chunks(CHUNK) {
        // SAFETY: plain C structs; zero is valid.
        let mut raw: [ibv_recv_wr; CHUNK] = std::array::from_fn(|_| unsafe { std::mem::zeroed() });
        let mut sg: [Sge; CHUNK] = [Sge {
            addr: 0,
            len: 0,
            lkey: 0,
        }; CHUNK];
        let n = chunk.len();
        for (i, (id, s)) in chunk.iter().enumerate() {
            sg[i] = *s;
            raw[i].wr_id = *id;
            raw[i].num_sge = 1;
        }
        for i in 0..n {
            raw[i].sg_list = (&mut sg[i] as *mut Sge).cast::<ibv_sge>();
            if i + 1 < n {
                let next: *mut ibv_recv_wr = &mut raw[i + 1];
                raw[i].next = next;
            }
        }
        let rc = post(raw.as_mut_ptr());
        if rc != 0 {
            return Err(rc);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sge_layout_matches_ibv_sge() {
        assert_eq!(std::mem::size_of::<Sge>(), std::mem::size_of::<ibv_sge>());
        assert_eq!(std::mem::align_of::<Sge>(), std::mem::align_of::<ibv_sge>());
        assert_eq!(
            std::mem::size_of::<WorkCompletion>(),
            std::mem::size_of::<ibv_wc>()
        );
    }

    #[test]
    fn remote_buf_codec() {
        let r = RemoteBuf {
            addr: 0x1234_5678_9abc,
            len: 4096,
            rkey: 0xdead,
        };
        assert_eq!(RemoteBuf::from_bytes(&r.to_bytes()).unwrap(), r);
        assert!(RemoteBuf::from_bytes(&[0; 3]).is_err());
        assert_eq!(r.slice(4000, 96).unwrap().addr, r.addr + 4000);
        assert!(r.slice(4000, 97).is_none());
    }

    #[test]
    fn status_strings() {
        assert_eq!(status_str(ibv_wc_status::IBV_WC_SUCCESS), "success");
        assert_eq!(
            status_str(ibv_wc_status::IBV_WC_REM_ACCESS_ERR),
            "remote access error"
        );
        assert_eq!(
            status_str(ibv_wc_status::IBV_WC_RETRY_EXC_ERR),
            "transport retry counter exceeded"
        );
        let wc = WorkCompletion::default();
        assert!(wc.is_success());
        assert!(wc.result(None, &Ctx::default()).is_ok());
    }
}
