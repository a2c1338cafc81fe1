//! Multicast groups: one per communicator that broadcasts by multicast.
//!
//! A [`McastGroup`] owns the UD endpoint that receives the group's traffic
//! (its own QP and receive slots, so one group's burst never starves
//! another's or the connection manager's), the QP's attachment to the
//! group's MGID, and on RoCE the IP multicast membership on the port's
//! netdev. Everything is undone on drop, in order (detach, destroy the QP,
//! leave the IP group), and on every error path of [`McastGroup::join`]
//! (whatever was set up is dropped).
//!
//! * MGID: [`group_gid`] derives it from a job key and the communicator,
//!   the same on every member without any exchange. On RoCE v2 it is the
//!   IPv4-mapped GID of an administratively scoped group, `239.x.y.z`.
//! * RoCE: `ibv_attach_mcast` programs the device, but the netdev must
//!   also accept the group's frames: the process joins the IP group on a
//!   UDP socket bound to the port's address (`IP_ADD_MEMBERSHIP`), which
//!   also announces it (IGMP) to switches that snoop. Soft-RoCE delivers
//!   nothing without that join (`../shared/softroce/README.md`).
//! * InfiniBand: a group must be created/joined through the subnet
//!   administrator (an SA MCMember record, as `rdma_join_multicast` does);
//!   ibcoll does not speak SA, so `join` fails there with a clear error and
//!   callers fall back to point-to-point trees.

use crate::device::{Gid, LinkLayer, SelectedPort};
use crate::error::{Ctx, Error, Result};
use crate::ud::{Datagram, UdAddr, UdConfig, UdEndpoint};
use crate::verbs::ProtectionDomain;
use std::net::Ipv4Addr;
use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::Arc;

/// The MGID of a group for communicator `comm` of the job `job` (any
/// bytes every member knows the same: the PMI job name): the IPv4-mapped
/// GID of `239.a.b.c`, `a` in 1..=254 (so never 239.0/16 nor 239.255/16,
/// which other software uses), `b.c` and `a` from a 64-bit FNV-1a hash.
pub fn group_gid(job: &[u8], comm: u64) -> Gid {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in job.iter().chain(comm.to_le_bytes().iter()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h ^= h >> 29;
    let ip = Ipv4Addr::new(239, 1 + (h % 254) as u8, (h >> 8) as u8, (h >> 16) as u8);
    Gid(ip.to_ipv6_mapped().octets())
}

/// Membership in an IPv4 multicast group on one interface; closing the
/// socket leaves the group.
#[derive(Debug)]
struct IpMembership {
    _fd: OwnedFd,
}

impl IpMembership {
    fn join(group: Ipv4Addr, iface: Ipv4Addr, dev: &str) -> Result<IpMembership> {
        // SAFETY: plain socket(2) call; the result is checked.
        let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            return Err(Error::last_os(
                "socket(AF_INET) for the IP multicast join",
                Some(dev),
            ));
        }
        // SAFETY: `fd` is a fresh descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let m = libc::ip_mreq {
            imr_multiaddr: libc::in_addr {
                s_addr: u32::from_ne_bytes(group.octets()),
            },
            imr_interface: libc::in_addr {
                s_addr: u32::from_ne_bytes(iface.octets()),
            },
        };
        use std::os::fd::AsRawFd;
        // SAFETY: `m` is a valid ip_mreq for the duration of the call and
        // its size is passed with it.
        let rc = unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::IPPROTO_IP,
                libc::IP_ADD_MEMBERSHIP,
                (&m as *const libc::ip_mreq).cast(),
                std::mem::size_of::<libc::ip_mreq>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
            return Err(Error::Verbs {
                op: "IP_ADD_MEMBERSHIP (joining the IP multicast group)",
                errno,
                ctx: Ctx {
                    device: Some(dev.to_owned()),
                    peer: Some(format!("group {group} on interface {iface}")),
                },
            });
        }
        Ok(IpMembership { _fd: fd })
    }
}

/// A joined multicast group and the UD endpoint that receives it.
pub struct McastGroup {
    /// Dropped after `Drop::drop` detached it (field order: the QP is
    /// destroyed before the IP membership is left). `None` only inside
    /// `leave`.
    ep: Option<UdEndpoint>,
    mgid: Gid,
    mlid: u16,
    _ip: Option<IpMembership>,
    attached: bool,
}

impl std::fmt::Debug for McastGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "McastGroup({} on {:?})", self.mgid, self.ep.as_ref())
    }
}

impl McastGroup {
    /// Create a UD endpoint on `port` and join it to the group `mgid`.
    pub fn join(
        port: &SelectedPort,
        pd: &Arc<ProtectionDomain>,
        mgid: Gid,
        cfg: UdConfig,
    ) -> Result<McastGroup> {
        let dev = port.context.name();
        let refuse = |reason: String| Error::invalid("McastGroup::join", reason, Some(dev));
        match port.attr.link_layer {
            LinkLayer::Ethernet => {}
            LinkLayer::Infiniband => {
                return Err(refuse(
                    "InfiniBand multicast groups are joined through the subnet manager \
                     (SA MCMember records), which ibcoll does not do"
                        .into(),
                ))
            }
            other => return Err(refuse(format!("link layer {other:?} has no multicast"))),
        }
        let group_ip = mgid.ipv4().filter(|ip| ip.is_multicast()).ok_or_else(|| {
            refuse(format!(
                "MGID {mgid} is not an IPv4-mapped multicast address"
            ))
        })?;
        let local_ip = port
            .gid
            .as_ref()
            .and_then(|g| g.gid.ipv4())
            .ok_or_else(|| {
                refuse(
                    "RoCE multicast needs an IPv4-mapped (RoCE v2) source GID; choose one with \
                 IBCOLL_IB_GID_INDEX"
                        .into(),
                )
            })?;
        let ep = UdEndpoint::new(port, pd, None, cfg)?;
        let ip = IpMembership::join(group_ip, local_ip, dev)?;
        ep.attach_mcast(&mgid, 0)
            .map_err(|e| e.with_peer(format!("multicast group {mgid}")))?;
        Ok(McastGroup {
            ep: Some(ep),
            mgid,
            mlid: 0,
            _ip: Some(ip),
            attached: true,
        })
    }

    /// The group's MGID.
    pub fn mgid(&self) -> Gid {
        self.mgid
    }

    /// The address datagrams to the group are sent to.
    pub fn addr(&self) -> UdAddr {
        UdAddr::multicast(self.mgid, self.mlid)
    }

    /// The endpoint (its own QP, attached to the group).
    pub fn endpoint(&self) -> &UdEndpoint {
        self.ep.as_ref().expect("endpoint present until leave")
    }

    fn ep_mut(&mut self) -> &mut UdEndpoint {
        self.ep.as_mut().expect("endpoint present until leave")
    }

    /// Largest datagram payload.
    pub fn max_payload(&self) -> usize {
        self.endpoint().max_payload()
    }

    /// Send one datagram to the group (every attached QP but, depending on
    /// the device, possibly not this one); `Ok(false)`: no send slot free,
    /// poll and retry.
    pub fn send(&mut self, data: &[u8]) -> Result<bool> {
        let to = self.addr();
        self.ep_mut().send(&to, data)
    }

    /// Send one datagram to one endpoint (not the group).
    pub fn send_to(&mut self, to: &UdAddr, data: &[u8]) -> Result<bool> {
        self.ep_mut().send(to, data)
    }

    /// Poll the endpoint: receives go to `on_recv`, sends free their slots.
    pub fn poll(&mut self, on_recv: impl FnMut(Datagram<'_>)) -> Result<usize> {
        self.ep_mut().poll(on_recv)
    }

    /// Leave the group, reporting a failed detach; the endpoint is handed
    /// back, no longer attached and out of the IP group.
    pub fn leave(mut self) -> Result<UdEndpoint> {
        self.attached = false;
        let ep = self.ep.take().expect("endpoint present until leave");
        let r = ep.detach_mcast(&self.mgid, self.mlid);
        drop(self); // the IP membership
        r.map(|()| ep)
    }
}

impl Drop for McastGroup {
    fn drop(&mut self) {
        if let (true, Some(ep)) = (self.attached, &self.ep) {
            // Some providers refuse to destroy a QP still attached (EBUSY).
            let _ = ep.detach_mcast(&self.mgid, self.mlid);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_gids() {
        let a = group_gid(b"kvs_1234", 1);
        let ip = a.ipv4().unwrap();
        assert!(ip.is_multicast());
        assert_eq!(ip.octets()[0], 239);
        assert!((1..=254).contains(&ip.octets()[1]));
        assert_eq!(a, group_gid(b"kvs_1234", 1));
        assert_ne!(a, group_gid(b"kvs_1234", 2));
        assert_ne!(a, group_gid(b"kvs_1235", 1));
        // Few collisions among a job's communicators.
        let mut seen = std::collections::HashSet::new();
        for c in 0..1000u64 {
            seen.insert(group_gid(b"job", c));
        }
        assert!(seen.len() > 990, "{}", seen.len());
    }
}
