//! RC endpoint: one connected RC queue pair plus the bookkeeping the engine
//! needs (exchangeable address, selective signaling, send-queue accounting).
//!
//! ```text
//! let ep = RcEndpoint::new(&port, &pd, &send_cq, &recv_cq, RcConfig::default())?;
//! publish(ep.local_info().to_hex());          // through PMI put/fence/get
//! ep.connect(&QpInfo::from_hex(&peer_value)?)?;
//! ```

use crate::device::{Gid, LinkLayer, Mtu, SelectedPort};
use crate::error::{Ctx, Error, Result};
use crate::verbs::*;
use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;

/// What a peer needs to connect to one of our RC QPs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpInfo {
    /// QP number (24 bits).
    pub qpn: u32,
    /// Initial send PSN (24 bits).
    pub psn: u32,
    /// Source GID (zero on IB without GRH).
    pub gid: Gid,
    /// LID (0 on RoCE).
    pub lid: u16,
    /// Active MTU of our port.
    pub mtu: Mtu,
}

const QPINFO_MAGIC: [u8; 4] = *b"IBQP";
const QPINFO_VERSION: u8 = 1;

impl QpInfo {
    /// Encoded size in bytes.
    pub const WIRE_LEN: usize = 32;

    /// Fixed 32-byte encoding: "IBQP", version, mtu, lid (LE), qpn (LE),
    /// psn (LE), 2 reserved bytes, gid (16 bytes).
    pub fn to_bytes(&self) -> [u8; Self::WIRE_LEN] {
        let mut b = [0u8; Self::WIRE_LEN];
        b[0..4].copy_from_slice(&QPINFO_MAGIC);
        b[4] = QPINFO_VERSION;
        b[5] = self.mtu.to_ibv() as u8;
        b[6..8].copy_from_slice(&self.lid.to_le_bytes());
        b[8..12].copy_from_slice(&self.qpn.to_le_bytes());
        b[12..16].copy_from_slice(&self.psn.to_le_bytes());
        b[16..32].copy_from_slice(&self.gid.0);
        b
    }

    /// Decode and validate bytes from a peer.
    pub fn from_bytes(b: &[u8]) -> Result<QpInfo> {
        let bad = |reason: String| Error::Decode {
            what: "QpInfo",
            reason,
        };
        if b.len() != Self::WIRE_LEN {
            return Err(bad(format!(
                "expected {} bytes, got {}",
                Self::WIRE_LEN,
                b.len()
            )));
        }
        if b[0..4] != QPINFO_MAGIC {
            return Err(bad(format!("bad magic {:02x?}", &b[0..4])));
        }
        if b[4] != QPINFO_VERSION {
            return Err(bad(format!(
                "unsupported version {} (this build speaks {QPINFO_VERSION})",
                b[4]
            )));
        }
        let mtu =
            Mtu::from_ibv(u32::from(b[5])).ok_or_else(|| bad(format!("bad MTU code {}", b[5])))?;
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        let (qpn, psn) = (u32_at(8), u32_at(12));
        if qpn > 0xff_ffff || psn > 0xff_ffff {
            return Err(bad(format!("qpn {qpn:#x} or psn {psn:#x} exceeds 24 bits")));
        }
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[16..32]);
        Ok(QpInfo {
            qpn,
            psn,
            gid: Gid(gid),
            lid: u16::from_le_bytes([b[6], b[7]]),
            mtu,
        })
    }

    /// Lower-case hex of [`to_bytes`](Self::to_bytes) (for text KVS such as PMI).
    pub fn to_hex(&self) -> String {
        self.to_bytes().iter().map(|x| format!("{x:02x}")).collect()
    }

    /// Inverse of [`to_hex`](Self::to_hex).
    pub fn from_hex(s: &str) -> Result<QpInfo> {
        let s = s.trim();
        if s.len() != 2 * Self::WIRE_LEN || !s.is_ascii() {
            return Err(Error::Decode {
                what: "QpInfo",
                reason: format!("expected {} hex digits, got {:?}", 2 * Self::WIRE_LEN, s),
            });
        }
        let mut b = [0u8; Self::WIRE_LEN];
        for (i, byte) in b.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).map_err(|_| Error::Decode {
                what: "QpInfo",
                reason: format!("bad hex digits at {}", 2 * i),
            })?;
        }
        Self::from_bytes(&b)
    }
}

impl fmt::Display for QpInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "qpn {:#x} psn {:#x}", self.qpn, self.psn)?;
        if !self.gid.is_zero() {
            write!(f, " gid {}", self.gid)?;
        }
        if self.lid != 0 {
            write!(f, " lid {}", self.lid)?;
        }
        write!(f, " mtu {}", self.mtu.bytes())
    }
}

/// RC endpoint settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RcConfig {
    /// Queue sizes.
    pub caps: QpCaps,
    /// ACK timeout exponent: 4.096 µs × 2^timeout (14 ≈ 67 ms; 0 = infinite).
    pub timeout: u8,
    /// Transport retries before `IBV_WC_RETRY_EXC_ERR` (0..=7).
    pub retry_cnt: u8,
    /// RNR retries (7 = infinite).
    pub rnr_retry: u8,
    /// Minimum RNR NAK timer code (12 ≈ 0.64 ms).
    pub min_rnr_timer: u8,
    /// Path MTU cap; the connection uses min(ours, peer's, this).
    pub mtu: Option<Mtu>,
    /// Initial send PSN; default: derived from the QP number and time.
    pub psn: Option<u32>,
    /// Outstanding RDMA reads (clamped to the device's limit).
    pub max_rd_atomic: u8,
    /// Signal one send WR in this many (selective signaling); 1 = all.
    pub signal_interval: u32,
    /// Rights granted to the peer on our memory.
    pub access: Access,
}

impl Default for RcConfig {
    fn default() -> Self {
        RcConfig {
            caps: QpCaps::default(),
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
            mtu: None,
            psn: None,
            max_rd_atomic: 16,
            signal_interval: 16,
            access: Access::RDMA,
        }
    }
}

/// A connected (or connectable) RC queue pair.
pub struct RcEndpoint {
    port: SelectedPort,
    qp: QueuePair,
    cfg: RcConfig,
    psn: u32,
    remote: Option<QpInfo>,
    /// Send WRs posted so far.
    posted: u64,
    /// Send WRs known complete (all WRs up to the last polled signaled one).
    completed: u64,
    /// Unsignaled WRs since the last signaled one.
    since_signal: u32,
    /// For each outstanding signaled WR: (value of `posted` after it, wr_id).
    signaled: VecDeque<(u64, u64)>,
    /// Recent (wr_id, op) pairs, to name the operation in error messages.
    recent: VecDeque<(u64, &'static str)>,
}

impl fmt::Debug for RcEndpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RcEndpoint")
            .field("qp", &self.qp)
            .field("remote", &self.remote)
            .field("outstanding", &(self.posted - self.completed))
            .finish()
    }
}

fn default_psn(qpn: u32) -> u32 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    (qpn.wrapping_mul(2_654_435_761) ^ t) & 0xff_ffff
}

impl RcEndpoint {
    /// Create the RC QP (in RESET) on `port`.
    pub fn new(
        port: &SelectedPort,
        pd: &Arc<ProtectionDomain>,
        send_cq: &Arc<CompletionQueue>,
        recv_cq: &Arc<CompletionQueue>,
        cfg: RcConfig,
    ) -> Result<RcEndpoint> {
        port.check_pd(pd, "RcEndpoint::new")?;
        let qp = QueuePair::new(pd, send_cq, recv_cq, QpType::Rc, cfg.caps)?;
        Ok(Self::from_qp(port, qp, cfg))
    }

    /// Create the RC QP (in RESET) on `port`, taking its receives from the
    /// shared receive queue `srq` (post them there; `cfg.caps`'s receive
    /// sizes are ignored).
    pub fn with_srq(
        port: &SelectedPort,
        pd: &Arc<ProtectionDomain>,
        send_cq: &Arc<CompletionQueue>,
        recv_cq: &Arc<CompletionQueue>,
        srq: &Arc<SharedReceiveQueue>,
        cfg: RcConfig,
    ) -> Result<RcEndpoint> {
        port.check_pd(pd, "RcEndpoint::with_srq")?;
        let qp = QueuePair::with_srq(pd, send_cq, recv_cq, srq, QpType::Rc, cfg.caps)?;
        Ok(Self::from_qp(port, qp, cfg))
    }

    fn from_qp(port: &SelectedPort, qp: QueuePair, cfg: RcConfig) -> RcEndpoint {
        let psn = cfg.psn.unwrap_or_else(|| default_psn(qp.qpn())) & 0xff_ffff;
        RcEndpoint {
            port: port.clone(),
            qp,
            cfg,
            psn,
            remote: None,
            posted: 0,
            completed: 0,
            since_signal: 0,
            signaled: VecDeque::new(),
            recent: VecDeque::new(),
        }
    }

    /// What the peer needs to connect to us.
    pub fn local_info(&self) -> QpInfo {
        QpInfo {
            qpn: self.qp.qpn(),
            psn: self.psn,
            gid: self.port.gid.as_ref().map(|g| g.gid).unwrap_or_default(),
            lid: self.port.attr.lid,
            mtu: self.port.attr.active_mtu,
        }
    }

    /// The peer we are connected to.
    pub fn remote(&self) -> Option<&QpInfo> {
        self.remote.as_ref()
    }

    /// The queue pair.
    pub fn qp(&self) -> &QueuePair {
        &self.qp
    }

    /// The port this endpoint uses.
    pub fn port(&self) -> &SelectedPort {
        &self.port
    }

    fn ctx(&self) -> Ctx {
        Ctx {
            device: Some(self.port.context.name().to_owned()),
            peer: self.remote.map(|r| r.to_string()),
        }
    }

    /// Bring the QP to RTS towards `remote`.
    pub fn connect(&mut self, remote: &QpInfo) -> Result<()> {
        let ethernet = self.port.attr.link_layer == LinkLayer::Ethernet;
        let grh = match (&self.port.gid, remote.gid.is_zero()) {
            (Some(local), false) => Some(Grh {
                dgid: remote.gid,
                sgid_index: local.index as u8,
                hop_limit: 64,
                traffic_class: 0,
                flow_label: 0,
            }),
            _ if ethernet => {
                return Err(Error::invalid(
                    "RcEndpoint::connect",
                    "RoCE needs GIDs on both sides (peer sent none)",
                    Some(self.port.context.name()),
                )
                .with_peer(remote.to_string()))
            }
            _ => None,
        };
        if grh.is_none() && remote.lid == 0 {
            return Err(Error::invalid(
                "RcEndpoint::connect",
                "peer has neither GID nor LID",
                Some(self.port.context.name()),
            )
            .with_peer(remote.to_string()));
        }
        let mut mtu = self.port.attr.active_mtu.min(remote.mtu);
        if let Some(cap) = self.cfg.mtu {
            mtu = mtu.min(cap);
        }
        let dev = self.port.context.attr();
        let attr = RcConnectAttr {
            port: self.port.port,
            access: self.cfg.access,
            mtu,
            dest_qpn: remote.qpn,
            rq_psn: remote.psn,
            sq_psn: self.psn,
            ah: AhAttr {
                port: self.port.port,
                dlid: remote.lid,
                sl: 0,
                grh,
            },
            timeout: self.cfg.timeout,
            retry_cnt: self.cfg.retry_cnt.min(7),
            rnr_retry: self.cfg.rnr_retry.min(7),
            min_rnr_timer: self.cfg.min_rnr_timer.clamp(1, 31),
            max_rd_atomic: (u32::from(self.cfg.max_rd_atomic).min(dev.max_qp_init_rd_atom.max(1)))
                as u8,
            max_dest_rd_atomic: (u32::from(self.cfg.max_rd_atomic).min(dev.max_qp_rd_atom.max(1)))
                as u8,
        };
        self.qp
            .connect_rc(&attr)
            .map_err(|e| e.with_peer(remote.to_string()))?;
        self.remote = Some(*remote);
        Ok(())
    }

    /// Send WRs posted and not yet known complete.
    pub fn outstanding(&self) -> u64 {
        self.posted - self.completed
    }

    /// Free send-queue slots.
    pub fn send_queue_free(&self) -> u32 {
        (u64::from(self.qp.caps().max_send_wr).saturating_sub(self.outstanding())) as u32
    }

    /// Largest inline payload.
    pub fn max_inline(&self) -> u32 {
        self.qp.caps().max_inline_data
    }

    fn next_flags(&mut self, force_signal: bool) -> Result<SendFlags> {
        let free = self.send_queue_free();
        if free == 0 {
            return Err(Error::Invalid {
                op: "post_send",
                reason: format!(
                    "send queue full ({} outstanding); poll send completions first",
                    self.outstanding()
                ),
                ctx: self.ctx(),
            });
        }
        let interval = self.cfg.signal_interval.max(1);
        // Signal every `interval`-th WR, and whenever the queue is about to
        // fill so that a completion will free the slots.
        let signal = force_signal || self.since_signal + 1 >= interval || free <= interval;
        Ok(if signal {
            SendFlags::SIGNALED
        } else {
            SendFlags::NONE
        })
    }

    fn account(&mut self, wr_id: u64, op: &'static str, flags: SendFlags) {
        self.posted += 1;
        if flags.contains(SendFlags::SIGNALED) {
            self.signaled.push_back((self.posted, wr_id));
            self.since_signal = 0;
        } else {
            self.since_signal += 1;
        }
        if self.recent.len() >= 256 {
            self.recent.pop_front();
        }
        self.recent.push_back((wr_id, op));
    }

    /// Post one send-queue operation with selective signaling; small
    /// `Send`/`Write` payloads (≤ `max_inline`) go inline. Returns whether the
    /// WR was signaled (only signaled WRs produce a success completion).
    ///
    /// # Safety
    /// As [`QueuePair::post_send`]: the SGE memory must stay valid (and, for
    /// `Read`, unaliased) until a signaled WR posted at or after this one has
    /// completed and been polled through [`poll_send`](Self::poll_send) /
    /// [`on_send_completion`](Self::on_send_completion).
    pub unsafe fn post(
        &mut self,
        wr_id: u64,
        sges: &[Sge],
        op: SendOp,
        force_signal: bool,
    ) -> Result<bool> {
        let mut flags = self.next_flags(force_signal)?;
        let total: u64 = sges.iter().map(|s| u64::from(s.len)).sum();
        if !matches!(op, SendOp::Read(_)) && total > 0 && total <= u64::from(self.max_inline()) {
            flags = flags | SendFlags::INLINE;
        }
        let wr = SendWr {
            wr_id,
            sges,
            op,
            flags,
            ud: None,
        };
        // SAFETY: forwarded contract.
        unsafe { self.qp.post_send(&[wr]) }.map_err(|e| self.peer_ctx(e))?;
        self.account(wr_id, op.name(), flags);
        Ok(flags.contains(SendFlags::SIGNALED))
    }

    /// Send (or RDMA-write) a small payload inline; safe because it is
    /// copied at post time. `data.len()` must be ≤ [`max_inline`](Self::max_inline).
    pub fn send_inline(
        &mut self,
        wr_id: u64,
        data: &[u8],
        op: SendOp,
        force_signal: bool,
    ) -> Result<bool> {
        let flags = self.next_flags(force_signal)?;
        let signaled = flags.contains(SendFlags::SIGNALED);
        self.qp
            .post_send_inline(wr_id, data, op, signaled)
            .map_err(|e| self.peer_ctx(e))?;
        self.account(wr_id, op.name(), flags | SendFlags::INLINE);
        Ok(signaled)
    }

    /// RDMA write `local` to `remote`.
    ///
    /// # Safety
    /// As [`post`](Self::post).
    pub unsafe fn rdma_write(
        &mut self,
        wr_id: u64,
        local: &[Sge],
        remote: RemoteBuf,
        force_signal: bool,
    ) -> Result<bool> {
        // SAFETY: forwarded contract.
        unsafe { self.post(wr_id, local, SendOp::Write(remote), force_signal) }
    }

    /// RDMA read `remote` into `local`.
    ///
    /// # Safety
    /// As [`post`](Self::post); `local` must also be registered with
    /// `LOCAL_WRITE` and not be read until the completion was polled.
    pub unsafe fn rdma_read(
        &mut self,
        wr_id: u64,
        local: &[Sge],
        remote: RemoteBuf,
        force_signal: bool,
    ) -> Result<bool> {
        // SAFETY: forwarded contract.
        unsafe { self.post(wr_id, local, SendOp::Read(remote), force_signal) }
    }

    /// Post receive buffers in batches.
    ///
    /// # Safety
    /// As [`QueuePair::post_recvs`].
    pub unsafe fn post_recvs(&self, items: &[(u64, Sge)]) -> Result<()> {
        // SAFETY: forwarded contract.
        unsafe { self.qp.post_recvs(items) }.map_err(|e| self.peer_ctx(e))
    }

    fn peer_ctx(&self, e: Error) -> Error {
        match self.remote {
            Some(r) if e.ctx().is_some_and(|c| c.peer.is_none()) => e.with_peer(r.to_string()),
            _ => e,
        }
    }

    /// Account for one completion of this endpoint's send queue (for
    /// engines that poll a shared CQ themselves). An error status becomes an
    /// [`Error::Completion`] naming the operation and the peer.
    pub fn on_send_completion(&mut self, wc: &WorkCompletion) -> Result<()> {
        if !wc.is_success() {
            let op = self
                .recent
                .iter()
                .rev()
                .find(|(id, _)| *id == wc.wr_id())
                .map(|(_, op)| *op);
            return wc.result(op, &self.ctx());
        }
        // Successful completions of signaled WRs arrive in posting order:
        // this one retires every WR up to its own position.
        if let Some((pos, _id)) = self.signaled.pop_front() {
            self.completed = pos;
        }
        Ok(())
    }

    /// Poll this endpoint's send CQ (when it is not shared) and account.
    /// Returns the number of completions written to `wcs`.
    pub fn poll_send(&mut self, wcs: &mut [WorkCompletion]) -> Result<usize> {
        let n = self.qp.send_cq().poll(wcs)?;
        for wc in &wcs[..n] {
            self.on_send_completion(wc)?;
        }
        Ok(n)
    }

    /// Poll the receive CQ (when not shared). Error statuses become errors.
    pub fn poll_recv(&self, wcs: &mut [WorkCompletion]) -> Result<usize> {
        let n = self.qp.recv_cq().poll(wcs)?;
        for wc in &wcs[..n] {
            wc.result(Some("RECV"), &self.ctx())?;
        }
        Ok(n)
    }

    /// wr_id of the marker WR that [`drain_sends`](Self::drain_sends) posts.
    pub const DRAIN_WR_ID: u64 = u64::MAX;

    fn post_fence_marker(&mut self) -> Result<()> {
        if self.send_queue_free() == 0 {
            // The queue is full, so its last WR was signaled (see next_flags).
            return Ok(());
        }
        let wr = SendWr {
            wr_id: Self::DRAIN_WR_ID,
            sges: &[],
            op: SendOp::Write(RemoteBuf::default()),
            flags: SendFlags::SIGNALED,
            ud: None,
        };
        // SAFETY: no SGEs: the WR reads and writes no local memory.
        unsafe { self.qp.post_send(&[wr]) }.map_err(|e| self.peer_ctx(e))?;
        self.account(
            Self::DRAIN_WR_ID,
            "RDMA_WRITE(drain marker)",
            SendFlags::SIGNALED,
        );
        Ok(())
    }

    /// Wait (blocking on the CQ's channel if it has one) until every posted
    /// send WR is complete, or `timeout`. Unsignaled WRs at the tail are
    /// retired by posting a signaled zero-length RDMA write.
    pub fn drain_sends(&mut self, timeout: std::time::Duration) -> Result<()> {
        let start = std::time::Instant::now();
        let mut wcs: [WorkCompletion; 16] = Default::default();
        while self.outstanding() > 0 {
            if self.since_signal > 0 {
                // Unsignaled WRs at the tail: a signaled zero-length RDMA
                // write behind them retires them (responders skip R_Key/VA
                // checks for zero-length RDMA, IBTA C9-88).
                self.post_fence_marker()?;
            }
            let left = timeout.saturating_sub(start.elapsed());
            if left.is_zero() {
                return Err(Error::Timeout {
                    op: "drain_sends",
                    after: timeout,
                    ctx: self.ctx(),
                });
            }
            let n = self.qp.send_cq().wait(&mut wcs, Some(left))?;
            for wc in &wcs[..n] {
                self.on_send_completion(wc)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qpinfo_roundtrip_and_validation() {
        let q = QpInfo {
            qpn: 0x11,
            psn: 0xabcdef,
            gid: Gid([0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 77, 0, 1]),
            lid: 0,
            mtu: Mtu::M1024,
        };
        let b = q.to_bytes();
        assert_eq!(QpInfo::from_bytes(&b).unwrap(), q);
        assert_eq!(QpInfo::from_hex(&q.to_hex()).unwrap(), q);
        assert_eq!(q.to_hex().len(), 64);
        assert!(q.to_string().contains("::ffff:10.77.0.1"));
        let mut bad = b;
        bad[0] = b'X';
        assert!(QpInfo::from_bytes(&bad)
            .unwrap_err()
            .to_string()
            .contains("magic"));
        let mut bad = b;
        bad[4] = 9;
        assert!(QpInfo::from_bytes(&bad)
            .unwrap_err()
            .to_string()
            .contains("version"));
        let mut bad = b;
        bad[5] = 0;
        assert!(QpInfo::from_bytes(&bad).is_err());
        let mut bad = b;
        bad[11] = 1; // qpn > 24 bits
        assert!(QpInfo::from_bytes(&bad).is_err());
        assert!(QpInfo::from_bytes(&b[..31]).is_err());
        assert!(QpInfo::from_hex("zz").is_err());
        assert!(QpInfo::from_hex(&"g".repeat(64)).is_err());
    }
}
