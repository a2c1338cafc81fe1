//! UD endpoint: one unreliable-datagram queue pair per process, with its
//! own registered send and receive slots and the address handles of the
//! peers it has sent to.
//!
//! It carries small control messages (the RC connection manager, multicast)
//! to any peer whose [`UdAddr`] is known, without a connection per peer:
//! the memory it pins is fixed (`(send_bufs + recv_bufs)` slots of one path
//! MTU), and only the address-handle cache grows, by one small handle per
//! peer actually addressed.
//!
//! ```text
//! let mut ud = UdEndpoint::new(&port, &pd, None, UdConfig::default())?;
//! publish(ud.local_addr().to_bytes());            // e.g. in a bootstrap card
//! ud.send(&peer_addr, b"hello")?;                 // false: no free slot now
//! ud.poll(|d| handle(d.src_qpn, d.data))?;        // receives are reposted
//! ```
//!
//! Datagrams are at most [`max_payload`](UdEndpoint::max_payload) bytes (the
//! port's active MTU): UD does not fragment. Every receive buffer starts with
//! the 40 bytes the device reserves for the GRH; [`Datagram::data`] starts
//! after them and [`Datagram::src_gid`] decodes the source from them (an IB
//! GRH, or on RoCE v2 over IPv4 the IPv4 header in its last 20 bytes).
//!
//! UD is unreliable: datagrams may be lost (and, across switches,
//! reordered). Callers retry; [`UdConfig::drop_one_in`] injects loss for tests.

use crate::device::{Gid, SelectedPort};
use crate::error::{Ctx, Error, Result};
use crate::verbs::*;
use std::collections::HashMap;
use std::fmt;
use std::net::Ipv4Addr;
use std::sync::Arc;

/// Bytes at the start of every UD receive reserved for the GRH.
pub const GRH_LEN: usize = 40;

/// QP number that addresses a multicast group.
pub const MULTICAST_QPN: u32 = 0xff_ffff;

/// Where a UD endpoint can be reached: enough to build an address handle
/// and address a datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct UdAddr {
    /// Port GID (zero on IB without GRH; always set on RoCE).
    pub gid: Gid,
    /// LID (0 on RoCE).
    pub lid: u16,
    /// QP number (24 bits), or [`MULTICAST_QPN`] for a group.
    pub qpn: u32,
}

impl UdAddr {
    /// Encoded size in bytes.
    pub const WIRE_LEN: usize = 22;

    /// Fixed encoding: gid (16 bytes), lid (LE), qpn (LE, 4 bytes).
    pub fn to_bytes(&self) -> [u8; Self::WIRE_LEN] {
        let mut b = [0u8; Self::WIRE_LEN];
        b[0..16].copy_from_slice(&self.gid.0);
        b[16..18].copy_from_slice(&self.lid.to_le_bytes());
        b[18..22].copy_from_slice(&self.qpn.to_le_bytes());
        b
    }

    /// Decode and validate bytes from a peer.
    pub fn from_bytes(b: &[u8]) -> Result<UdAddr> {
        let bad = |reason: String| Error::Decode {
            what: "UdAddr",
            reason,
        };
        if b.len() != Self::WIRE_LEN {
            return Err(bad(format!(
                "expected {} bytes, got {}",
                Self::WIRE_LEN,
                b.len()
            )));
        }
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[0..16]);
        let lid = u16::from_le_bytes([b[16], b[17]]);
        let qpn = u32::from_le_bytes(b[18..22].try_into().expect("4 bytes"));
        if qpn > 0xff_ffff {
            return Err(bad(format!("qpn {qpn:#x} exceeds 24 bits")));
        }
        let gid = Gid(gid);
        if gid.is_zero() && lid == 0 {
            return Err(bad("neither GID nor LID".into()));
        }
        Ok(UdAddr { gid, lid, qpn })
    }

    /// The address of a multicast group (its GID and, on IB, its MLID).
    pub fn multicast(gid: Gid, mlid: u16) -> UdAddr {
        UdAddr {
            gid,
            lid: mlid,
            qpn: MULTICAST_QPN,
        }
    }
}

impl fmt::Display for UdAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ud qpn {:#x}", self.qpn)?;
        if !self.gid.is_zero() {
            write!(f, " gid {}", self.gid)?;
        }
        if self.lid != 0 {
            write!(f, " lid {}", self.lid)?;
        }
        Ok(())
    }
}

/// UD endpoint settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdConfig {
    /// Q_Key of the QP and of every datagram it sends.
    pub qkey: u32,
    /// Posted receive slots (datagrams that may arrive between two polls).
    pub recv_bufs: u32,
    /// Send slots (datagrams in flight).
    pub send_bufs: u32,
    /// Top byte of every wr_id this endpoint posts, so that an engine
    /// polling a shared CQ can tell its completions apart
    /// ([`UdEndpoint::owns`]).
    pub wr_tag: u8,
    /// Test hook: silently drop one datagram in this many sends (the
    /// `n`-th, `2n`-th, ...), reporting success as the network would.
    /// 0 = never.
    pub drop_one_in: u32,
}

impl Default for UdConfig {
    fn default() -> Self {
        UdConfig {
            qkey: DEFAULT_QKEY,
            recv_bufs: 64,
            send_bufs: 32,
            wr_tag: DEFAULT_WR_TAG,
            drop_one_in: 0,
        }
    }
}

/// Default [`UdConfig::qkey`] (any value works if both ends agree; the
/// high bit must be clear, IBTA reserves controlled Q_Keys).
pub const DEFAULT_QKEY: u32 = 0x1bc0_11ec;

/// Default [`UdConfig::wr_tag`]: top nibble 15, clear of small tags an
/// engine uses for its own work requests.
pub const DEFAULT_WR_TAG: u8 = 0xf0;

const KIND_RECV: u64 = 0;
const KIND_SEND: u64 = 1;

/// One received datagram, valid for the duration of the callback.
#[derive(Debug, Clone, Copy)]
pub struct Datagram<'a> {
    /// The sender's QP number.
    pub src_qpn: u32,
    /// The sender's LID (IB; 0 on RoCE).
    pub slid: u16,
    /// The sender's GID, when the datagram carried a GRH (always on RoCE).
    pub src_gid: Option<Gid>,
    /// Immediate data, if the sender attached some.
    pub imm: Option<u32>,
    /// The payload (after the GRH area).
    pub data: &'a [u8],
}

impl Datagram<'_> {
    /// The sender's address (its GID or LID and QP number).
    pub fn src(&self) -> UdAddr {
        UdAddr {
            gid: self.src_gid.unwrap_or_default(),
            lid: self.slid,
            qpn: self.src_qpn,
        }
    }
}

/// Decode the source GID from the 40-byte GRH area of a receive. On RoCE v2
/// over IPv4 the device stores 20 zero bytes and then the IPv4 header
/// (the source address at offset 32), else an IB/IPv6 GRH (SGID at 8..24).
pub fn grh_source(grh: &[u8; GRH_LEN]) -> Gid {
    if grh[..20].iter().all(|&b| b == 0) && grh[20] >> 4 == 4 {
        let ip = Ipv4Addr::new(grh[32], grh[33], grh[34], grh[35]);
        return Gid(ip.to_ipv6_mapped().octets());
    }
    let mut g = [0u8; 16];
    g.copy_from_slice(&grh[8..24]);
    Gid(g)
}

/// Counters of one endpoint.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UdStats {
    /// Datagrams posted (including injected drops).
    pub sent: u64,
    /// Datagrams received.
    pub received: u64,
    /// Datagrams dropped by [`UdConfig::drop_one_in`].
    pub dropped: u64,
    /// Address handles created (one per distinct destination GID/LID).
    pub address_handles: usize,
}

/// The UD queue pair of a process, with its buffers and address handles.
pub struct UdEndpoint {
    port: SelectedPort,
    pd: Arc<ProtectionDomain>,
    cq: Arc<CompletionQueue>,
    /// Declared before the buffers and handles: dropped (destroyed) first,
    /// so the device never touches them afterwards.
    qp: QueuePair,
    cfg: UdConfig,
    /// Payload bytes per datagram (the active MTU).
    mtu: usize,
    /// `recv_bufs` slots of `GRH_LEN + mtu`; all posted except while one is
    /// being handed to a callback.
    rbuf: RegisteredBuffer,
    /// `send_bufs` slots of `mtu`.
    sbuf: RegisteredBuffer,
    free_send: Vec<u32>,
    /// Keyed by destination GID and LID (the QP number is per datagram).
    ahs: HashMap<(Gid, u16), AddressHandle>,
    stats: UdStats,
}

impl fmt::Debug for UdEndpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UdEndpoint")
            .field("qp", &self.qp)
            .field("mtu", &self.mtu)
            .field("stats", &self.stats)
            .finish()
    }
}

impl UdEndpoint {
    /// Create the UD QP on `port`, bring it to RTS and post every receive.
    /// `cq` is used for both send and receive completions; it may be shared
    /// with other QPs (then dispatch with [`owns`](Self::owns) and
    /// [`on_completion`](Self::on_completion)) and must have room for
    /// `send_bufs + recv_bufs` entries besides theirs. `None` creates a
    /// private CQ of that size (then [`poll`](Self::poll) may be used).
    pub fn new(
        port: &SelectedPort,
        pd: &Arc<ProtectionDomain>,
        cq: Option<&Arc<CompletionQueue>>,
        cfg: UdConfig,
    ) -> Result<UdEndpoint> {
        let dev = Some(port.context.name());
        port.check_pd(pd, "UdEndpoint::new")?;
        if cfg.recv_bufs == 0 || cfg.send_bufs == 0 {
            return Err(Error::invalid(
                "UdEndpoint::new",
                format!(
                    "needs send and receive slots (send_bufs {}, recv_bufs {})",
                    cfg.send_bufs, cfg.recv_bufs
                ),
                dev,
            ));
        }
        if cfg.qkey & 0x8000_0000 != 0 {
            return Err(Error::invalid(
                "UdEndpoint::new",
                format!("Q_Key {:#x} has the (controlled) high bit set", cfg.qkey),
                dev,
            ));
        }
        let cq = match cq {
            Some(cq) => cq.clone(),
            None => CompletionQueue::new(&port.context, cfg.send_bufs + cfg.recv_bufs, None)?,
        };
        let caps = QpCaps {
            max_send_wr: cfg.send_bufs,
            max_recv_wr: cfg.recv_bufs,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let qp = QueuePair::new(pd, &cq, &cq, QpType::Ud, caps)?;
        qp.activate_ud(port.port, cfg.qkey, 0)?;
        let mtu = port.attr.active_mtu.bytes();
        let rbuf = RegisteredBuffer::new(
            pd,
            cfg.recv_bufs as usize * (GRH_LEN + mtu),
            Access::LOCAL_WRITE,
        )?;
        let sbuf = RegisteredBuffer::new(pd, cfg.send_bufs as usize * mtu, Access::LOCAL_WRITE)?;
        let ep = UdEndpoint {
            port: port.clone(),
            pd: pd.clone(),
            cq,
            qp,
            cfg,
            mtu,
            rbuf,
            sbuf,
            free_send: (0..cfg.send_bufs).rev().collect(),
            ahs: HashMap::new(),
            stats: UdStats::default(),
        };
        let items: Vec<(u64, Sge)> = (0..cfg.recv_bufs).map(|i| ep.recv_item(i)).collect();
        // SAFETY: every SGE lies in `rbuf` (registered LOCAL_WRITE), which
        // lives as long as the QP (dropped after it); Rust code reads a slot
        // only after its completion was polled and before it is reposted.
        unsafe { ep.qp.post_recvs(&items) }?;
        Ok(ep)
    }

    fn wr_id(&self, kind: u64, idx: u32) -> u64 {
        (u64::from(self.cfg.wr_tag) << 56) | (kind << 48) | u64::from(idx)
    }

    fn recv_item(&self, idx: u32) -> (u64, Sge) {
        let slot = GRH_LEN + self.mtu;
        let sge = self
            .rbuf
            .sge(idx as usize * slot, slot as u32)
            .expect("receive slot inside its buffer");
        (self.wr_id(KIND_RECV, idx), sge)
    }

    /// True when `wr_id` belongs to one of this endpoint's work requests.
    pub fn owns(&self, wr_id: u64) -> bool {
        (wr_id >> 56) as u8 == self.cfg.wr_tag
    }

    /// Our address, for peers.
    pub fn local_addr(&self) -> UdAddr {
        UdAddr {
            gid: self.port.gid.as_ref().map(|g| g.gid).unwrap_or_default(),
            lid: self.port.attr.lid,
            qpn: self.qp.qpn(),
        }
    }

    /// Largest datagram payload (the port's active MTU).
    pub fn max_payload(&self) -> usize {
        self.mtu
    }

    /// Send slots free now (a send with none free returns `Ok(false)`).
    pub fn send_slots_free(&self) -> usize {
        self.free_send.len()
    }

    /// Bytes of memory this endpoint has registered.
    pub fn registered_bytes(&self) -> usize {
        self.rbuf.mr().len() + self.sbuf.mr().len()
    }

    /// Counters.
    pub fn stats(&self) -> UdStats {
        UdStats {
            address_handles: self.ahs.len(),
            ..self.stats
        }
    }

    /// The queue pair (multicast attach/detach, QP number).
    pub fn qp(&self) -> &QueuePair {
        &self.qp
    }

    /// The completion queue it posts to.
    pub fn cq(&self) -> &Arc<CompletionQueue> {
        &self.cq
    }

    /// The port.
    pub fn port(&self) -> &SelectedPort {
        &self.port
    }

    /// The protection domain.
    pub fn pd(&self) -> &Arc<ProtectionDomain> {
        &self.pd
    }

    /// Join a multicast group: datagrams sent to
    /// `UdAddr::multicast(gid, mlid)` reach this QP. (On RoCE the process
    /// must also join the IP group on the netdev for the NIC to accept it.)
    pub fn attach_mcast(&self, gid: &Gid, mlid: u16) -> Result<()> {
        self.qp.attach_mcast(gid, mlid)
    }

    /// Leave a multicast group.
    pub fn detach_mcast(&self, gid: &Gid, mlid: u16) -> Result<()> {
        self.qp.detach_mcast(gid, mlid)
    }

    fn ctx(&self, peer: Option<&UdAddr>) -> Ctx {
        Ctx {
            device: Some(self.port.context.name().to_owned()),
            peer: peer.map(|p| p.to_string()),
        }
    }

    /// Create (once) and cache the address handle for `dest`; returns its key.
    fn address_handle(&mut self, dest: &UdAddr) -> Result<(Gid, u16)> {
        let key = (dest.gid, dest.lid);
        if !self.ahs.contains_key(&key) {
            let grh = match (&self.port.gid, dest.gid.is_zero()) {
                (Some(local), false) => Some(Grh {
                    dgid: dest.gid,
                    sgid_index: local.index as u8,
                    hop_limit: 64,
                    traffic_class: 0,
                    flow_label: 0,
                }),
                (None, true) => None,
                _ => {
                    return Err(Error::Invalid {
                        op: "UdEndpoint::send",
                        reason: "destination and port disagree on GIDs (RoCE needs both, \
                                 IB without GRH neither)"
                            .into(),
                        ctx: self.ctx(Some(dest)),
                    })
                }
            };
            let attr = AhAttr {
                port: self.port.port,
                dlid: dest.lid,
                sl: 0,
                grh,
            };
            let ah =
                AddressHandle::new(&self.pd, &attr).map_err(|e| e.with_peer(dest.to_string()))?;
            self.ahs.insert(key, ah);
        }
        Ok(key)
    }

    /// Send one datagram of at most [`max_payload`](Self::max_payload)
    /// bytes to `dest` (copied into a registered slot: `data` may be reused
    /// at once). `Ok(false)` when every send slot is in flight: poll
    /// completions, then retry.
    pub fn send(&mut self, dest: &UdAddr, data: &[u8]) -> Result<bool> {
        self.send_imm(dest, data, None)
    }

    /// [`send`](Self::send) with optional immediate data.
    pub fn send_imm(&mut self, dest: &UdAddr, data: &[u8], imm: Option<u32>) -> Result<bool> {
        if data.len() > self.mtu {
            return Err(Error::Invalid {
                op: "UdEndpoint::send",
                reason: format!(
                    "{} bytes > the path MTU {} (datagrams are not fragmented)",
                    data.len(),
                    self.mtu
                ),
                ctx: self.ctx(Some(dest)),
            });
        }
        let Some(&idx) = self.free_send.last() else {
            return Ok(false);
        };
        self.stats.sent += 1;
        let n = self.cfg.drop_one_in;
        if n > 0 && self.stats.sent % u64::from(n) == 0 {
            self.stats.dropped += 1;
            return Ok(true);
        }
        let off = idx as usize * self.mtu;
        self.sbuf.as_mut_slice()[off..off + data.len()].copy_from_slice(data);
        let sge = self
            .sbuf
            .sge(off, data.len() as u32)
            .expect("send slot inside its buffer");
        let (qkey, wr_id) = (self.cfg.qkey, self.wr_id(KIND_SEND, idx));
        let key = self.address_handle(dest)?;
        let ah = &self.ahs[&key];
        let sges = [sge];
        let wr = SendWr {
            wr_id,
            sges: if data.is_empty() { &[] } else { &sges },
            op: imm.map_or(SendOp::Send, SendOp::SendImm),
            flags: SendFlags::SIGNALED,
            ud: Some(UdDest {
                ah,
                qpn: dest.qpn,
                qkey,
            }),
        };
        // SAFETY: the slot lies in `sbuf` (registered with our PD) and is not
        // written again until its completion returns it to `free_send`; the
        // address handle stays in the cache (never evicted) and `sbuf` lives
        // until after the QP is destroyed.
        unsafe { self.qp.post_send(&[wr]) }.map_err(|e| e.with_peer(dest.to_string()))?;
        self.free_send.pop();
        Ok(true)
    }

    /// Handle one completion of this endpoint (one for which
    /// [`owns`](Self::owns) is true), polled from a shared CQ. A receive is
    /// handed to `on_recv` and its slot reposted; a send frees its slot.
    pub fn on_completion(
        &mut self,
        wc: &WorkCompletion,
        mut on_recv: impl FnMut(Datagram<'_>),
    ) -> Result<()> {
        let id = wc.wr_id();
        if !self.owns(id) {
            return Err(Error::Invalid {
                op: "UdEndpoint::on_completion",
                reason: format!("wr_id {id:#x} is not this endpoint's"),
                ctx: self.ctx(None),
            });
        }
        let kind = (id >> 48) & 0xff;
        let idx = (id & 0xffff_ffff) as u32;
        if kind == KIND_SEND {
            if idx < self.cfg.send_bufs {
                self.free_send.push(idx);
            }
            return wc.result(Some("UD SEND"), &self.ctx(None));
        }
        if idx >= self.cfg.recv_bufs {
            return Err(Error::Invalid {
                op: "UdEndpoint::on_completion",
                reason: format!("receive slot {idx} out of range"),
                ctx: self.ctx(None),
            });
        }
        // A flushed or failed receive is not reposted: the QP is in error.
        wc.result(Some("UD RECV"), &self.ctx(None))?;
        let slot = GRH_LEN + self.mtu;
        let off = idx as usize * slot;
        let len = (wc.byte_len() as usize).clamp(GRH_LEN, slot);
        {
            let s = &self.rbuf.as_slice()[off..off + slot];
            let grh: &[u8; GRH_LEN] = s[..GRH_LEN].try_into().expect("40 bytes");
            self.stats.received += 1;
            on_recv(Datagram {
                src_qpn: wc.src_qp(),
                slid: wc.slid(),
                src_gid: wc.has_grh().then(|| grh_source(grh)),
                imm: wc.imm_data(),
                data: &s[GRH_LEN..len],
            });
        }
        let item = self.recv_item(idx);
        // SAFETY: as in `new`: the slot is ours again (its completion was
        // polled) and the borrow handed to the callback has ended.
        unsafe { self.qp.post_recvs(&[item]) }
    }

    /// Poll the endpoint's CQ (one it does not share) and handle up to 32
    /// completions; returns how many, or the first error (a failed send, a
    /// flushed receive) after handling them all. A completion of another QP is an error:
    /// with a shared CQ use [`on_completion`](Self::on_completion).
    pub fn poll(&mut self, mut on_recv: impl FnMut(Datagram<'_>)) -> Result<usize> {
        let mut wcs: [WorkCompletion; 32] = Default::default();
        let n = self.cq.poll(&mut wcs)?;
        // Every completion is handled (slots freed, receives reposted) even
        // after one failed; the first error is returned.
        let mut first = None;
        for wc in &wcs[..n] {
            if let Err(e) = self.on_completion(wc, &mut on_recv) {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(n), Err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn udaddr_roundtrip_and_validation() {
        let a = UdAddr {
            gid: Gid(Ipv4Addr::new(10, 77, 0, 2).to_ipv6_mapped().octets()),
            lid: 0,
            qpn: 0x12_3456,
        };
        assert_eq!(UdAddr::from_bytes(&a.to_bytes()).unwrap(), a);
        assert!(a.to_string().contains("10.77.0.2"));
        assert!(UdAddr::from_bytes(&a.to_bytes()[..21]).is_err());
        let mut b = a.to_bytes();
        b[21] = 1; // qpn > 24 bits
        assert!(UdAddr::from_bytes(&b).is_err());
        let none = UdAddr {
            gid: Gid::default(),
            lid: 0,
            qpn: 1,
        };
        assert!(UdAddr::from_bytes(&none.to_bytes()).is_err());
        assert_eq!(UdAddr::multicast(a.gid, 7).qpn, MULTICAST_QPN);
    }

    #[test]
    fn grh_source_ipv4_and_ib() {
        let mut g = [0u8; GRH_LEN];
        g[20] = 0x45;
        g[32..36].copy_from_slice(&[10, 77, 0, 1]);
        assert_eq!(grh_source(&g).ipv4(), Some(Ipv4Addr::new(10, 77, 0, 1)));
        let mut g = [0u8; GRH_LEN];
        g[0] = 0x60;
        g[8..24].copy_from_slice(&[0xfe, 0x80, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(grh_source(&g).0[0], 0xfe);
        assert_eq!(grh_source(&g).0[15], 8);
    }
}
