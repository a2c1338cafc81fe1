//! Devices, ports, GID tables and the automatic choice of device/port/GID.
//!
//! On a host without kernel RDMA support `ibv_get_device_list` returns NULL;
//! [`devices`] turns that into an empty list so that callers can fall back to
//! another transport.

use crate::error::{Ctx, Error, Result};
use crate::sys;
use rdma_sys::*;
use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Environment variable naming the device (`rxe0`, `mlx5_0`).
pub const ENV_DEVICE: &str = "IBCOLL_IB_DEVICE";
/// Environment variable naming the port (1-based).
pub const ENV_PORT: &str = "IBCOLL_IB_PORT";
/// Environment variable naming the GID index.
pub const ENV_GID_INDEX: &str = "IBCOLL_IB_GID_INDEX";

/// A 128-bit GID (an IPv6 address on RoCE).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// All zero: an empty table slot, or "no GID" (IB without GRH).
    pub fn is_zero(&self) -> bool {
        self.0 == [0; 16]
    }
    /// The IPv4 address of an IPv4-mapped GID (`::ffff:a.b.c.d`).
    pub fn ipv4(&self) -> Option<Ipv4Addr> {
        Ipv6Addr::from(self.0).to_ipv4_mapped()
    }
    /// fe80::/10, or an IPv4-mapped 169.254.0.0/16 address.
    pub fn is_link_local(&self) -> bool {
        match self.ipv4() {
            Some(v4) => v4.is_link_local(),
            None => self.0[0] == 0xfe && (self.0[1] & 0xc0) == 0x80,
        }
    }
    pub(crate) fn to_ibv(self) -> ibv_gid {
        ibv_gid { raw: self.0 }
    }
    pub(crate) fn from_ibv(g: &ibv_gid) -> Gid {
        // SAFETY: every bit pattern of the 16-byte union is a valid `[u8; 16]`.
        Gid(unsafe { g.raw })
    }
}

impl fmt::Display for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.ipv4() {
            Some(v4) => write!(f, "::ffff:{v4}"),
            None => write!(f, "{}", Ipv6Addr::from(self.0)),
        }
    }
}

impl fmt::Debug for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Gid({self})")
    }
}

/// The type of a GID table entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GidType {
    /// InfiniBand (also what an IB port reports).
    Ib,
    /// RoCE v1 (Ethernet frames, not routable).
    RoceV1,
    /// RoCE v2 (UDP/IP, routable).
    RoceV2,
}

impl fmt::Display for GidType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            GidType::Ib => "IB",
            GidType::RoceV1 => "RoCE v1",
            GidType::RoceV2 => "RoCE v2",
        })
    }
}

/// One valid GID table entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GidEntry {
    /// Index in the port's table (what `sgid_index` takes).
    pub index: u32,
    /// The address.
    pub gid: Gid,
    /// IB / RoCE v1 / RoCE v2.
    pub gid_type: GidType,
    /// The network device behind a RoCE GID, where known.
    pub netdev: Option<String>,
}

impl fmt::Display for GidEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "[{:>3}] {:<40} {:<8}",
            self.index,
            self.gid.to_string(),
            self.gid_type.to_string()
        )?;
        if let Some(n) = &self.netdev {
            write!(f, " {n}")?;
        }
        Ok(())
    }
}

/// Format a GID table for error messages and tools.
pub fn format_gid_table(table: &[GidEntry]) -> String {
    if table.is_empty() {
        return "  GID table: (no valid entries)".into();
    }
    let mut s = String::from("  GID table:");
    for e in table {
        s.push_str("\n    ");
        s.push_str(&e.to_string());
    }
    s
}

/// Link layer of a port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkLayer {
    /// InfiniBand: addressed by LID.
    Infiniband,
    /// Ethernet (RoCE): addressed by GID.
    Ethernet,
    /// Anything else the library reports.
    Other(u8),
}

/// Path MTU of a port or QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Mtu {
    /// 256 bytes.
    M256 = 1,
    /// 512 bytes.
    M512 = 2,
    /// 1024 bytes.
    M1024 = 3,
    /// 2048 bytes.
    M2048 = 4,
    /// 4096 bytes.
    M4096 = 5,
}

impl Mtu {
    /// From the `ibv_mtu` enum value.
    pub fn from_ibv(v: u32) -> Option<Mtu> {
        Some(match v {
            1 => Mtu::M256,
            2 => Mtu::M512,
            3 => Mtu::M1024,
            4 => Mtu::M2048,
            5 => Mtu::M4096,
            _ => return None,
        })
    }
    /// The `ibv_mtu` enum value.
    pub fn to_ibv(self) -> u32 {
        self as u32
    }
    /// In bytes.
    pub fn bytes(self) -> usize {
        128 << (self as u32)
    }
    /// From a size in bytes (256..4096, a power of two).
    pub fn from_bytes(b: usize) -> Option<Mtu> {
        Some(match b {
            256 => Mtu::M256,
            512 => Mtu::M512,
            1024 => Mtu::M1024,
            2048 => Mtu::M2048,
            4096 => Mtu::M4096,
            _ => return None,
        })
    }
}

/// Port state (`ibv_port_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortState(pub u32);

impl PortState {
    /// `IBV_PORT_ACTIVE`.
    pub const ACTIVE: PortState = PortState(ibv_port_state::IBV_PORT_ACTIVE);
    /// Short name.
    pub fn name(self) -> &'static str {
        match self.0 {
            0 => "NOP",
            1 => "DOWN",
            2 => "INIT",
            3 => "ARMED",
            4 => "ACTIVE",
            5 => "ACTIVE_DEFER",
            _ => "UNKNOWN",
        }
    }
}

/// What `ibv_query_port` reports, reduced to what the library uses.
#[derive(Debug, Clone)]
pub struct PortAttr {
    /// Port number (1-based).
    pub port: u8,
    /// Logical state.
    pub state: PortState,
    /// Largest supported MTU.
    pub max_mtu: Mtu,
    /// Active MTU.
    pub active_mtu: Mtu,
    /// InfiniBand or Ethernet.
    pub link_layer: LinkLayer,
    /// LID (IB; 0 on RoCE).
    pub lid: u16,
    /// Size of the GID table.
    pub gid_tbl_len: u32,
    /// Largest message.
    pub max_msg_sz: u32,
}

/// Device limits, from `ibv_query_device`.
#[derive(Debug, Clone)]
pub struct DeviceAttr {
    /// Ports on the device.
    pub phys_port_cnt: u8,
    /// Work requests per queue.
    pub max_qp_wr: u32,
    /// Scatter/gather entries per WR.
    pub max_sge: u32,
    /// CQ entries.
    pub max_cqe: u32,
    /// Largest memory region.
    pub max_mr_size: u64,
    /// Outstanding RDMA reads/atomics per QP (as responder).
    pub max_qp_rd_atom: u32,
    /// Outstanding RDMA reads/atomics per QP (as initiator).
    pub max_qp_init_rd_atom: u32,
    /// Multicast groups.
    pub max_mcast_grp: u32,
    /// Shared receive queues.
    pub max_srq: u32,
    /// Receives one shared receive queue can hold posted.
    pub max_srq_wr: u32,
    /// Firmware version string.
    pub fw_ver: String,
}

/// A device as listed by `ibv_get_device_list`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Kernel device name (`rxe0`).
    pub name: String,
    /// Its sysfs directory (`/sys/class/infiniband/rxe0`).
    pub ibdev_path: PathBuf,
}

/// RAII wrapper around `ibv_get_device_list` / `ibv_free_device_list`.
struct DeviceList {
    list: *mut *mut ibv_device,
    len: usize,
}

impl DeviceList {
    fn get() -> DeviceList {
        let mut n: i32 = 0;
        // SAFETY: `n` is a valid out-pointer; the returned array (or NULL) is
        // owned by us and freed in Drop.
        let list = unsafe { ibv_get_device_list(&mut n) };
        if list.is_null() {
            // No kernel support (ENOSYS) or no devices: "none", not an error.
            return DeviceList { list, len: 0 };
        }
        DeviceList {
            list,
            len: n.max(0) as usize,
        }
    }

    fn devices(&self) -> &[*mut ibv_device] {
        if self.list.is_null() {
            return &[];
        }
        // SAFETY: libibverbs returned an array of `len` valid device pointers
        // (NULL-terminated), alive until ibv_free_device_list in Drop.
        unsafe { std::slice::from_raw_parts(self.list, self.len) }
    }

    fn info(dev: *mut ibv_device) -> DeviceInfo {
        // SAFETY: `dev` comes from a live device list; the struct fields are
        // NUL-terminated arrays filled by libibverbs.
        let d = unsafe { &*dev };
        DeviceInfo {
            name: sys::cstr_array(&d.name),
            ibdev_path: PathBuf::from(sys::cstr_array(&d.ibdev_path)),
        }
    }
}

impl Drop for DeviceList {
    fn drop(&mut self) {
        if !self.list.is_null() {
            // SAFETY: the list came from ibv_get_device_list and is freed once.
            unsafe { ibv_free_device_list(self.list) };
        }
    }
}

/// All RDMA devices. An empty list when the kernel has no RDMA support.
pub fn devices() -> Vec<DeviceInfo> {
    let list = DeviceList::get();
    list.devices()
        .iter()
        .map(|&d| DeviceList::info(d))
        .collect()
}

/// An asynchronous event of a device ([`Context::async_event`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AsyncEvent {
    /// The `ibv_event_type` value.
    pub kind: u32,
    /// The address of the object it is about (CQ, QP, SRQ), or the port
    /// number; only compared, never dereferenced.
    pub(crate) object: usize,
}

impl AsyncEvent {
    /// `IBV_EVENT_SRQ_LIMIT_REACHED`.
    pub const SRQ_LIMIT_REACHED: u32 = ibv_event_type::IBV_EVENT_SRQ_LIMIT_REACHED as u32;

    /// The event's name (`ibv_event_type_str`'s words).
    pub fn name(&self) -> &'static str {
        match self.kind {
            0 => "CQ error",
            1 => "local work queue catastrophic error",
            2 => "invalid request local work queue error",
            3 => "local access violation work queue error",
            4 => "communication established",
            5 => "send queue drained",
            6 => "path migrated",
            7 => "path migration request error",
            8 => "local catastrophic error",
            9 => "port active",
            10 => "port error",
            11 => "LID change",
            12 => "P_Key change",
            13 => "SM change",
            14 => "SRQ catastrophic error",
            15 => "SRQ limit reached",
            16 => "last WQE reached",
            17 => "client reregistration",
            18 => "GID table change",
            _ => "unknown event",
        }
    }
}

/// An open device (`ibv_context`). Shared by `Arc`: every object created
/// from it keeps it alive.
pub struct Context {
    pub(crate) ctx: *mut ibv_context,
    info: DeviceInfo,
    attr: DeviceAttr,
}

// SAFETY: libibverbs contexts are thread-safe (all verbs may be called from
// any thread); the wrapper holds no thread-affine state.
unsafe impl Send for Context {}
// SAFETY: see Send; shared access only calls thread-safe verbs.
unsafe impl Sync for Context {}

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Context")
            .field("name", &self.info.name)
            .finish()
    }
}

impl Context {
    /// Open the device `name`, or the first device when `None`.
    pub fn open(name: Option<&str>) -> Result<Arc<Context>> {
        let list = DeviceList::get();
        let devs = list.devices();
        let found = devs.iter().copied().find(|&d| match name {
            Some(n) => DeviceList::info(d).name == n,
            None => true,
        });
        let Some(dev) = found else {
            return Err(Error::NoDevice {
                requested: name.map(str::to_owned),
                available: devs.iter().map(|&d| DeviceList::info(d).name).collect(),
            });
        };
        let info = DeviceList::info(dev);
        // SAFETY: `dev` is a live entry of `list`; the context stays valid
        // after the list is freed (libibverbs documents this).
        let ctx = unsafe { ibv_open_device(dev) };
        if ctx.is_null() {
            return Err(Error::last_os("ibv_open_device", Some(&info.name)));
        }
        // SAFETY: zeroed is a valid initial value for this plain C struct.
        let mut a: ibv_device_attr = unsafe { std::mem::zeroed() };
        // SAFETY: `ctx` is open; `a` is a valid out-pointer.
        let rc = unsafe { ibv_query_device(ctx, &mut a) };
        if rc != 0 {
            // SAFETY: closing the context we just opened.
            unsafe { ibv_close_device(ctx) };
            return Err(Error::verbs("ibv_query_device", rc, Some(&info.name)));
        }
        let attr = DeviceAttr {
            phys_port_cnt: a.phys_port_cnt,
            max_qp_wr: a.max_qp_wr.max(0) as u32,
            max_sge: a.max_sge.max(0) as u32,
            max_cqe: a.max_cqe.max(0) as u32,
            max_mr_size: a.max_mr_size,
            max_qp_rd_atom: a.max_qp_rd_atom.max(0) as u32,
            max_qp_init_rd_atom: a.max_qp_init_rd_atom.max(0) as u32,
            max_mcast_grp: a.max_mcast_grp.max(0) as u32,
            max_srq: a.max_srq.max(0) as u32,
            max_srq_wr: a.max_srq_wr.max(0) as u32,
            fw_ver: sys::cstr_array(&a.fw_ver),
        };
        Ok(Arc::new(Context { ctx, info, attr }))
    }

    /// Device name.
    pub fn name(&self) -> &str {
        &self.info.name
    }

    /// Device name and sysfs path.
    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }

    /// Device limits.
    pub fn attr(&self) -> &DeviceAttr {
        &self.attr
    }

    pub(crate) fn dev(&self) -> Option<&str> {
        Some(&self.info.name)
    }

    /// The next asynchronous event of the device (`ibv_get_async_event`:
    /// an SRQ's limit reached, a QP's fatal error, a port change), waiting
    /// at most `timeout` for one; `None` when none came. The event is
    /// acknowledged before it is returned (its object may be destroyed
    /// afterwards).
    pub fn async_event(&self, timeout: Duration) -> Result<Option<AsyncEvent>> {
        // SAFETY: the context is open for our lifetime.
        let fd = unsafe { (*self.ctx).async_fd };
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: one valid pollfd.
        let rc = unsafe { libc::poll(&mut pfd, 1, ms) };
        if rc < 0 {
            let e = sys::errno();
            if e == libc::EINTR {
                return Ok(None);
            }
            return Err(Error::verbs("poll(async_fd)", e, self.dev()));
        }
        if rc == 0 {
            return Ok(None);
        }
        // SAFETY: plain C struct; zero is a valid value of every field
        // (event type 0 is IBV_EVENT_CQ_ERR).
        let mut ev: ibv_async_event = unsafe { std::mem::zeroed() };
        // SAFETY: the context is open; `ev` is a valid out-pointer; the fd
        // is readable, so this does not block.
        let rc = unsafe { ibv_get_async_event(self.ctx, &mut ev) };
        if rc != 0 {
            return Err(Error::last_os("ibv_get_async_event", self.dev()));
        }
        // The type is read as the integer the provider wrote, so a value
        // this binding's enum lacks is not undefined behaviour.
        // SAFETY: `event_type` is a repr(u32) field of `ev`.
        let kind = unsafe { std::ptr::addr_of!(ev.event_type).cast::<u32>().read() };
        // SAFETY: every member of the union is pointer-sized or smaller and
        // was written by the provider; the pointer is only compared.
        let object = unsafe { ev.element.srq } as usize;
        // SAFETY: acknowledging the event we received, once.
        unsafe { ibv_ack_async_event(&mut ev) };
        Ok(Some(AsyncEvent { kind, object }))
    }

    pub(crate) fn ctx(&self) -> Ctx {
        Ctx {
            device: Some(self.info.name.clone()),
            peer: None,
        }
    }

    /// `ibv_query_port`.
    pub fn query_port(&self, port: u8) -> Result<PortAttr> {
        if port == 0 || port > self.attr.phys_port_cnt {
            return Err(Error::invalid(
                "ibv_query_port",
                format!(
                    "port {port} does not exist (device has {} port(s))",
                    self.attr.phys_port_cnt
                ),
                self.dev(),
            ));
        }
        // SAFETY: zeroed is a valid initial value for this plain C struct.
        let mut a: ibv_port_attr = unsafe { std::mem::zeroed() };
        // SAFETY: `self.ctx` is open; `a` is a valid, correctly sized
        // out-pointer (the inline helper passes sizeof to the provider).
        let rc = unsafe { ___ibv_query_port(self.ctx, port, &mut a) };
        if rc != 0 {
            return Err(Error::verbs("ibv_query_port", rc, self.dev()));
        }
        Ok(PortAttr {
            port,
            state: PortState(a.state),
            max_mtu: Mtu::from_ibv(a.max_mtu).unwrap_or(Mtu::M1024),
            active_mtu: Mtu::from_ibv(a.active_mtu).unwrap_or(Mtu::M1024),
            link_layer: match a.link_layer {
                sys::IBV_LINK_LAYER_INFINIBAND => LinkLayer::Infiniband,
                sys::IBV_LINK_LAYER_ETHERNET => LinkLayer::Ethernet,
                // "unspecified" is what old drivers report for IB.
                0 => LinkLayer::Infiniband,
                o => LinkLayer::Other(o),
            },
            lid: a.lid,
            gid_tbl_len: a.gid_tbl_len.max(0) as u32,
            max_msg_sz: a.max_msg_sz,
        })
    }

    /// The valid entries of a port's GID table, with their types.
    ///
    /// Uses `ibv_query_gid_table` (one ioctl, types and netdevs included);
    /// falls back to `ibv_query_gid` plus sysfs
    /// (`<ibdev>/ports/<p>/gid_attrs/{types,ndevs}/<idx>`) on old kernels.
    pub fn gid_table(&self, port: u8) -> Result<Vec<GidEntry>> {
        let pa = self.query_port(port)?;
        match self.gid_table_ioctl(port) {
            Ok(t) => Ok(t),
            Err(_) => self.gid_table_sysfs(&pa),
        }
    }

    fn gid_table_ioctl(&self, port: u8) -> Result<Vec<GidEntry>> {
        let total: usize = (1..=self.attr.phys_port_cnt)
            .map(|p| {
                self.query_port(p)
                    .map(|a| a.gid_tbl_len as usize)
                    .unwrap_or(0)
            })
            .sum::<usize>()
            .max(1);
        // SAFETY: zeroed is a valid value for this plain C struct.
        let mut buf: Vec<ibv_gid_entry> =
            (0..total).map(|_| unsafe { std::mem::zeroed() }).collect();
        // SAFETY: `buf` holds `total` entries of the size we pass; the context is open.
        let n = unsafe {
            sys::_ibv_query_gid_table(
                self.ctx,
                buf.as_mut_ptr(),
                total,
                0,
                std::mem::size_of::<ibv_gid_entry>(),
            )
        };
        if n < 0 {
            return Err(Error::verbs("ibv_query_gid_table", n as i32, self.dev()));
        }
        buf.truncate(n as usize);
        let mut out: Vec<GidEntry> = buf
            .iter()
            .filter(|e| e.port_num == u32::from(port))
            .map(|e| GidEntry {
                index: e.gid_index,
                gid: Gid::from_ibv(&e.gid),
                gid_type: match e.gid_type {
                    IBV_GID_TYPE_ROCE_V1 => GidType::RoceV1,
                    IBV_GID_TYPE_ROCE_V2 => GidType::RoceV2,
                    _ => GidType::Ib,
                },
                netdev: if e.ndev_ifindex != 0 {
                    ifname(e.ndev_ifindex)
                } else {
                    None
                },
            })
            .filter(|e| !e.gid.is_zero())
            .collect();
        out.sort_by_key(|e| e.index);
        Ok(out)
    }

    fn gid_table_sysfs(&self, pa: &PortAttr) -> Result<Vec<GidEntry>> {
        let attrs = self
            .info
            .ibdev_path
            .join(format!("ports/{}/gid_attrs", pa.port));
        let mut out = Vec::new();
        for idx in 0..pa.gid_tbl_len {
            // SAFETY: zeroed is a valid value for the 16-byte union.
            let mut g: ibv_gid = unsafe { std::mem::zeroed() };
            // SAFETY: the context is open; `g` is a valid out-pointer.
            let rc = unsafe { ibv_query_gid(self.ctx, pa.port, idx as i32, &mut g) };
            if rc != 0 {
                continue;
            }
            let gid = Gid::from_ibv(&g);
            if gid.is_zero() {
                continue;
            }
            let read = |kind: &str| {
                std::fs::read_to_string(attrs.join(kind).join(idx.to_string()))
                    .ok()
                    .map(|s| s.trim().to_owned())
            };
            let gid_type = match read("types").as_deref() {
                Some(t) if t.eq_ignore_ascii_case("RoCE v2") => GidType::RoceV2,
                Some(t) if t.to_ascii_lowercase().contains("roce") => GidType::RoceV1,
                Some(_) => GidType::Ib,
                None if pa.link_layer == LinkLayer::Ethernet => GidType::RoceV1,
                None => GidType::Ib,
            };
            out.push(GidEntry {
                index: idx,
                gid,
                gid_type,
                netdev: read("ndevs").filter(|s| !s.is_empty()),
            });
        }
        Ok(out)
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: every child object holds an Arc<Context>, so none is left
        // when the last Arc drops; the context is closed exactly once.
        unsafe { ibv_close_device(self.ctx) };
    }
}

fn ifname(ifindex: u32) -> Option<String> {
    let mut buf = [0 as std::os::raw::c_char; libc::IF_NAMESIZE];
    // SAFETY: `buf` has IF_NAMESIZE bytes as if_indextoname requires.
    let p = unsafe { libc::if_indextoname(ifindex, buf.as_mut_ptr()) };
    if p.is_null() {
        None
    } else {
        Some(sys::cstr_array(&buf))
    }
}

/// Which device/port/GID to use. `None` fields are chosen automatically.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceSelection {
    /// Device name; default: the first device with an active, usable port.
    pub device: Option<String>,
    /// Port number (1-based); default: the first active port.
    pub port: Option<u8>,
    /// GID index; default on RoCE: a RoCE v2 GID with a non-link-local
    /// IPv4-mapped address (then other RoCE v2, then RoCE v1); on IB: none
    /// (the LID is used).
    pub gid_index: Option<u32>,
}

impl DeviceSelection {
    /// Read `IBCOLL_IB_DEVICE`, `IBCOLL_IB_PORT`, `IBCOLL_IB_GID_INDEX`.
    /// Unset or empty variables mean "automatic".
    pub fn from_env() -> Result<DeviceSelection> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// Like [`from_env`](Self::from_env) with a custom variable lookup.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<DeviceSelection> {
        let get = |k: &str| {
            get(k)
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
        };
        let mut sel = DeviceSelection {
            device: get(ENV_DEVICE),
            ..Default::default()
        };
        if let Some(v) = get(ENV_PORT) {
            sel.port =
                Some(
                    v.parse::<u8>()
                        .ok()
                        .filter(|&p| p >= 1)
                        .ok_or_else(|| Error::Config {
                            name: ENV_PORT.into(),
                            value: v.clone(),
                            reason: "expected a port number 1..=255".into(),
                        })?,
                );
        }
        if let Some(v) = get(ENV_GID_INDEX) {
            sel.gid_index = Some(v.parse::<u32>().map_err(|_| Error::Config {
                name: ENV_GID_INDEX.into(),
                value: v.clone(),
                reason: "expected a non-negative integer".into(),
            })?);
        }
        Ok(sel)
    }

    /// Open and validate the selection.
    pub fn select(&self) -> Result<SelectedPort> {
        let devs = devices();
        if devs.is_empty() {
            return Err(Error::NoDevice {
                requested: self.device.clone(),
                available: vec![],
            });
        }
        let candidates: Vec<&DeviceInfo> = match &self.device {
            Some(n) => {
                let d: Vec<_> = devs.iter().filter(|d| &d.name == n).collect();
                if d.is_empty() {
                    return Err(Error::NoDevice {
                        requested: Some(n.clone()),
                        available: devs.iter().map(|d| d.name.clone()).collect(),
                    });
                }
                d
            }
            None => devs.iter().collect(),
        };
        let mut reasons = Vec::new();
        for d in candidates {
            let ctx = match Context::open(Some(&d.name)) {
                Ok(c) => c,
                Err(e) if self.device.is_some() => return Err(e),
                Err(e) => {
                    reasons.push(format!("{}: {e}", d.name));
                    continue;
                }
            };
            match self.select_on(&ctx) {
                Ok(s) => return Ok(s),
                // An explicit device/port/GID that cannot work is an error.
                Err(e)
                    if self.device.is_some() || self.port.is_some() || self.gid_index.is_some() =>
                {
                    return Err(e)
                }
                Err(e) => reasons.push(format!("{}: {e}", d.name)),
            }
        }
        Err(Error::Selection {
            what: "any device".into(),
            reason: "no device has an active port with a usable address".into(),
            table: reasons.join("\n"),
            ctx: Ctx::default(),
        })
    }

    /// Validate the selection on one open device.
    pub fn select_on(&self, ctx: &Arc<Context>) -> Result<SelectedPort> {
        let ports: Vec<u8> = match self.port {
            Some(p) => vec![p],
            None => (1..=ctx.attr().phys_port_cnt).collect(),
        };
        let mut last_err = None;
        for p in ports {
            match self.select_port(ctx, p) {
                Ok(s) => return Ok(s),
                Err(e) => last_err = Some(e),
            }
        }
        Err(last_err
            .unwrap_or_else(|| Error::invalid("select port", "device has no ports", ctx.dev())))
    }

    fn select_port(&self, ctx: &Arc<Context>, port: u8) -> Result<SelectedPort> {
        let attr = ctx.query_port(port)?;
        let table = ctx.gid_table(port)?;
        let fail = |what: String, reason: String| Error::Selection {
            what,
            reason,
            table: format_gid_table(&table),
            ctx: ctx.ctx(),
        };
        if attr.state != PortState::ACTIVE {
            return Err(fail(
                format!("port {port}"),
                format!("port state is {} (needs ACTIVE)", attr.state.name()),
            ));
        }
        let gid = match self.gid_index {
            Some(idx) => {
                let Some(e) = table.iter().find(|e| e.index == idx) else {
                    let reason = if idx >= attr.gid_tbl_len {
                        format!(
                            "index out of range (the table has {} slots)",
                            attr.gid_tbl_len
                        )
                    } else {
                        "the entry is empty (no address assigned)".into()
                    };
                    return Err(fail(format!("GID index {idx} on port {port}"), reason));
                };
                match (attr.link_layer, e.gid_type) {
                    (LinkLayer::Ethernet, GidType::Ib) => {
                        return Err(fail(
                            format!("GID index {idx} on port {port}"),
                            "an IB-type GID on an Ethernet (RoCE) port".into(),
                        ))
                    }
                    (LinkLayer::Infiniband, GidType::RoceV1 | GidType::RoceV2) => {
                        return Err(fail(
                            format!("GID index {idx} on port {port}"),
                            "a RoCE GID on an InfiniBand port".into(),
                        ))
                    }
                    _ => {}
                }
                Some(e.clone())
            }
            None => match attr.link_layer {
                LinkLayer::Ethernet => match best_roce_gid(&table) {
                    Some(e) => Some(e.clone()),
                    None => {
                        return Err(fail(
                            format!("port {port}"),
                            "RoCE port without a usable GID (no address on its netdev?)".into(),
                        ))
                    }
                },
                _ => None,
            },
        };
        if attr.link_layer != LinkLayer::Ethernet && gid.is_none() && attr.lid == 0 {
            return Err(fail(
                format!("port {port}"),
                "InfiniBand port with LID 0 (is a subnet manager running?)".into(),
            ));
        }
        Ok(SelectedPort {
            context: ctx.clone(),
            port,
            attr,
            gid,
            table,
        })
    }
}

/// Preference order for RoCE GIDs; lower is better, `None` = unusable.
fn roce_rank(e: &GidEntry) -> Option<u8> {
    let v2 = match e.gid_type {
        GidType::RoceV2 => true,
        GidType::RoceV1 => false,
        GidType::Ib => return None,
    };
    let v4 = e.gid.ipv4().is_some();
    let ll = e.gid.is_link_local();
    Some(match (v2, v4, ll) {
        (true, true, false) => 0,
        (true, false, false) => 1,
        (false, true, false) => 2,
        (false, false, false) => 3,
        (true, _, true) => 4,
        (false, _, true) => 5,
    })
}

/// The best RoCE GID of a table (see [`DeviceSelection::gid_index`]).
pub fn best_roce_gid(table: &[GidEntry]) -> Option<&GidEntry> {
    table
        .iter()
        .filter_map(|e| roce_rank(e).map(|r| (r, e)))
        .min_by_key(|(r, e)| (*r, e.index))
        .map(|(_, e)| e)
}

/// A validated device/port/GID choice: what QPs are created against.
#[derive(Debug, Clone)]
pub struct SelectedPort {
    /// The open device.
    pub context: Arc<Context>,
    /// Port number (1-based).
    pub port: u8,
    /// The port's attributes at selection time.
    pub attr: PortAttr,
    /// The source GID (always on RoCE; `None` on IB, where the LID is used).
    pub gid: Option<GidEntry>,
    /// The port's GID table at selection time.
    pub table: Vec<GidEntry>,
}

impl SelectedPort {
    /// Refuses (as `op`) a protection domain of another device than this
    /// port's: queue pairs are made on both.
    pub(crate) fn check_pd(
        &self,
        pd: &crate::verbs::ProtectionDomain,
        op: &'static str,
    ) -> Result<()> {
        if Arc::ptr_eq(pd.context(), &self.context) {
            Ok(())
        } else {
            Err(Error::invalid(
                op,
                "PD and port belong to different devices",
                Some(self.context.name()),
            ))
        }
    }

    /// The chosen GID index, if any.
    pub fn gid_index(&self) -> Option<u32> {
        self.gid.as_ref().map(|g| g.index)
    }
    /// LID (0 on RoCE).
    pub fn lid(&self) -> u16 {
        self.attr.lid
    }
    /// One-line description: `rxe0:1 gid[1]=::ffff:10.77.0.1 (RoCE v2) mtu 1024`.
    pub fn describe(&self) -> String {
        let mut s = format!("{}:{}", self.context.name(), self.port);
        match &self.gid {
            Some(g) => s.push_str(&format!(" gid[{}]={} ({})", g.index, g.gid, g.gid_type)),
            None => s.push_str(&format!(" lid {}", self.attr.lid)),
        }
        s.push_str(&format!(" mtu {}", self.attr.active_mtu.bytes()));
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(index: u32, gid: Gid, t: GidType) -> GidEntry {
        GidEntry {
            index,
            gid,
            gid_type: t,
            netdev: None,
        }
    }

    fn v4(a: [u8; 4]) -> Gid {
        Gid(Ipv4Addr::from(a).to_ipv6_mapped().octets())
    }

    #[test]
    fn gid_display_and_classes() {
        let g = v4([10, 77, 0, 1]);
        assert_eq!(g.to_string(), "::ffff:10.77.0.1");
        assert_eq!(g.ipv4(), Some(Ipv4Addr::new(10, 77, 0, 1)));
        assert!(!g.is_link_local());
        assert!(v4([169, 254, 3, 4]).is_link_local());
        let ll: Ipv6Addr = "fe80::306b:59ff:fe20:e692".parse().unwrap();
        assert!(Gid(ll.octets()).is_link_local());
        assert!(Gid::default().is_zero());
    }

    #[test]
    fn roce_preference() {
        let ll = Gid("fe80::1".parse::<Ipv6Addr>().unwrap().octets());
        let glob6 = Gid("2001:db8::1".parse::<Ipv6Addr>().unwrap().octets());
        let t = vec![
            e(0, ll, GidType::RoceV1),
            e(1, ll, GidType::RoceV2),
            e(2, v4([169, 254, 0, 1]), GidType::RoceV2),
            e(3, v4([10, 0, 0, 1]), GidType::RoceV1),
            e(4, glob6, GidType::RoceV2),
            e(5, v4([10, 0, 0, 1]), GidType::RoceV2),
        ];
        assert_eq!(best_roce_gid(&t).unwrap().index, 5);
        assert_eq!(best_roce_gid(&t[..5]).unwrap().index, 4);
        assert_eq!(best_roce_gid(&t[..4]).unwrap().index, 3);
        assert_eq!(best_roce_gid(&t[..3]).unwrap().index, 1);
        assert!(best_roce_gid(&[e(0, ll, GidType::Ib)]).is_none());
        let s = format_gid_table(&t);
        assert!(s.contains("[  5] ::ffff:10.0.0.1"), "{s}");
    }

    #[test]
    fn selection_from_vars() {
        let vars = |k: &str| match k {
            ENV_DEVICE => Some("rxe1".to_string()),
            ENV_PORT => Some("1".to_string()),
            ENV_GID_INDEX => Some(" 3 ".to_string()),
            _ => None,
        };
        let s = DeviceSelection::from_lookup(vars).unwrap();
        assert_eq!(
            s,
            DeviceSelection {
                device: Some("rxe1".into()),
                port: Some(1),
                gid_index: Some(3)
            }
        );
        assert_eq!(
            DeviceSelection::from_lookup(|_| Some(String::new())).unwrap(),
            DeviceSelection::default()
        );
        let bad = DeviceSelection::from_lookup(|k| (k == ENV_PORT).then(|| "0".to_string()));
        assert!(matches!(bad, Err(Error::Config { .. })), "{bad:?}");
        let bad = DeviceSelection::from_lookup(|k| (k == ENV_GID_INDEX).then(|| "x".to_string()));
        assert!(bad.unwrap_err().to_string().contains(ENV_GID_INDEX));
    }

    #[test]
    fn mtu_roundtrip() {
        for m in [Mtu::M256, Mtu::M512, Mtu::M1024, Mtu::M2048, Mtu::M4096] {
            assert_eq!(Mtu::from_ibv(m.to_ibv()), Some(m));
            assert_eq!(Mtu::from_bytes(m.bytes()), Some(m));
        }
        assert_eq!(Mtu::M1024.bytes(), 1024);
    }

    #[test]
    fn no_device_is_empty_list_not_error() {
        // On a host without RDMA this is empty; with devices, names are set.
        for d in devices() {
            assert!(!d.name.is_empty());
        }
    }
}
