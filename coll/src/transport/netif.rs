//! Which addresses this rank publishes for its tcp listener.
//!
//! Peers connect to addresses, never to host names: cluster nodes (and the
//! simulated hosts of the tests) often have names that do not resolve.
//! The choice, in order:
//! 1. `IBCOLL_TCP_HOST`: one address (or a name, resolved here, once) given
//!    outright;
//! 2. `IBCOLL_TCP_IF`: a comma list of interface names or IPv4/IPv6 CIDR
//!    blocks (as Open MPI's `btl_tcp_if_include` and NCCL's
//!    `NCCL_SOCKET_IFNAME`); `^name` excludes an interface; every address
//!    of every interface that matches, in the order of the list;
//! 3. the address this host uses to reach the job's launcher (ibrun's
//!    `PMI_PORT` for remote ranks, Slurm's `SLURM_LAUNCH_NODE_IPADDR`), found
//!    without sending anything (a UDP socket's `connect`): the interface
//!    that reaches the launcher reaches the other nodes;
//! 4. the first interface that is up, not loopback and not a container
//!    bridge;
//! 5. loopback (a job on one host).
//!
//! Peers on the same host (same kernel and network namespace, see
//! [`host_key`]) connect over loopback whatever was published.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, ToSocketAddrs, UdpSocket};

/// One interface address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IfAddr {
    pub name: String,
    pub addr: IpAddr,
    pub up: bool,
    pub loopback: bool,
}

/// Every address of every interface (IPv4 and IPv6).
pub fn interfaces() -> Vec<IfAddr> {
    let mut out = Vec::new();
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a list head we free below with freeifaddrs.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return out;
    }
    let mut p = head;
    while !p.is_null() {
        // SAFETY: `p` is a node of the list getifaddrs returned, alive until
        // freeifaddrs; its name is a NUL-terminated string and its address,
        // when not null, a sockaddr of the family it names.
        unsafe {
            let ifa = &*p;
            p = ifa.ifa_next;
            if ifa.ifa_addr.is_null() || ifa.ifa_name.is_null() {
                continue;
            }
            let name = std::ffi::CStr::from_ptr(ifa.ifa_name)
                .to_string_lossy()
                .into_owned();
            let fam = i32::from((*ifa.ifa_addr).sa_family);
            let addr = if fam == libc::AF_INET {
                let sin = &*(ifa.ifa_addr as *const libc::sockaddr_in);
                IpAddr::from(u32::from_be(sin.sin_addr.s_addr).to_be_bytes())
            } else if fam == libc::AF_INET6 {
                let sin6 = &*(ifa.ifa_addr as *const libc::sockaddr_in6);
                IpAddr::from(sin6.sin6_addr.s6_addr)
            } else {
                continue;
            };
            let flags = ifa.ifa_flags;
            out.push(IfAddr {
                name,
                addr,
                up: flags & libc::IFF_UP as u32 != 0,
                loopback: flags & libc::IFF_LOOPBACK as u32 != 0,
            });
        }
    }
    // SAFETY: `head` came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(head) };
    out
}

/// One entry of `IBCOLL_TCP_IF`.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Pattern {
    Name(String),
    Cidr(IpAddr, u8),
}

/// Parses `IBCOLL_TCP_IF`: includes and `^`-excludes.
fn parse_if_list(spec: &str) -> Result<(Vec<Pattern>, Vec<Pattern>), String> {
    let (mut inc, mut exc) = (Vec::new(), Vec::new());
    for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (neg, item) = match item.strip_prefix('^') {
            Some(rest) => (true, rest),
            None => (false, item),
        };
        let p = match item.split_once('/') {
            Some((a, bits)) => {
                let a: IpAddr = a
                    .parse()
                    .map_err(|_| format!("{item:?} is not a CIDR block (address/bits)"))?;
                let max = if a.is_ipv4() { 32 } else { 128 };
                let bits: u8 = bits
                    .parse()
                    .ok()
                    .filter(|&b| b <= max)
                    .ok_or_else(|| format!("{item:?}: prefix length must be 0-{max}"))?;
                Pattern::Cidr(a, bits)
            }
            None => Pattern::Name(item.to_string()),
        };
        if neg {
            exc.push(p);
        } else {
            inc.push(p);
        }
    }
    Ok((inc, exc))
}

fn in_cidr(a: IpAddr, net: IpAddr, bits: u8) -> bool {
    let (a, net, width) = match (a, net) {
        (IpAddr::V4(a), IpAddr::V4(n)) => (u32::from(a) as u128, u32::from(n) as u128, 32),
        (IpAddr::V6(a), IpAddr::V6(n)) => (u128::from(a), u128::from(n), 128),
        _ => return false,
    };
    let bits = u32::from(bits);
    if bits == 0 {
        return true;
    }
    let shift = width - bits;
    (a >> shift) == (net >> shift)
}

fn matches(p: &Pattern, i: &IfAddr) -> bool {
    match p {
        Pattern::Name(n) => &i.name == n,
        Pattern::Cidr(net, bits) => in_cidr(i.addr, *net, *bits),
    }
}

/// The addresses `spec` (`IBCOLL_TCP_IF`) selects among `ifs`, in the
/// order of the list; excludes alone select every other up interface.
pub fn select(spec: &str, ifs: &[IfAddr]) -> Result<Vec<IpAddr>, String> {
    let (inc, exc) = parse_if_list(spec)?;
    let ok = |i: &IfAddr| i.up && !exc.iter().any(|p| matches(p, i));
    let mut out: Vec<IpAddr> = Vec::new();
    if inc.is_empty() {
        out.extend(ifs.iter().filter(|i| ok(i) && !i.loopback).map(|i| i.addr));
    } else {
        for p in &inc {
            for i in ifs.iter().filter(|i| ok(i) && matches(p, i)) {
                if !out.contains(&i.addr) {
                    out.push(i.addr);
                }
            }
        }
    }
    if out.is_empty() {
        let have: Vec<String> = ifs
            .iter()
            .map(|i| format!("{} {}", i.name, i.addr))
            .collect();
        return Err(format!(
            "IBCOLL_TCP_IF={spec:?} matches no address of an interface that is up (interfaces: {})",
            have.join(", ")
        ));
    }
    Ok(out)
}

/// Interfaces that carry no traffic between hosts.
fn is_local_bridge(name: &str) -> bool {
    ["docker", "virbr", "veth", "br-", "lxcbr", "cni", "flannel"]
        .iter()
        .any(|p| name.starts_with(p))
}

/// The source address this host would use to reach `target`, found by
/// connecting a UDP socket (which sends nothing).
fn route_to(target: SocketAddr) -> Option<IpAddr> {
    let bind: SocketAddr = if target.is_ipv4() {
        (Ipv4Addr::UNSPECIFIED, 0).into()
    } else {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let s = UdpSocket::bind(bind).ok()?;
    s.connect(target).ok()?;
    let a = s.local_addr().ok()?.ip();
    (!a.is_unspecified()).then_some(a)
}

/// Where the launcher is, when it is on the network: ibrun's PMI address
/// for remote ranks, or the host srun ran on.
fn launcher_addr() -> Option<SocketAddr> {
    if let Ok(p) = std::env::var("PMI_PORT") {
        if let Ok(mut a) = p.to_socket_addrs() {
            if let Some(a) = a.next().filter(|a| !a.ip().is_loopback()) {
                return Some(a);
            }
        }
    }
    let ip: IpAddr = std::env::var("SLURM_LAUNCH_NODE_IPADDR")
        .ok()?
        .trim()
        .parse()
        .ok()?;
    (!ip.is_loopback()).then_some(SocketAddr::new(ip, 9))
}

/// How the published addresses were chosen, for `ibcoll-info` and errors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Choice {
    pub addrs: Vec<IpAddr>,
    pub why: String,
}

/// The addresses to publish (see the module documentation).
pub fn choose(tcp_host: Option<&str>, tcp_if: Option<&str>) -> Result<Choice, String> {
    if let Some(h) = tcp_host {
        let addrs: Vec<IpAddr> = match h.parse::<IpAddr>() {
            Ok(a) => vec![a],
            Err(_) => (h, 0)
                .to_socket_addrs()
                .map_err(|e| format!("IBCOLL_TCP_HOST={h:?} does not resolve: {e}"))?
                .map(|a| a.ip())
                .collect(),
        };
        return Ok(Choice {
            addrs,
            why: format!("IBCOLL_TCP_HOST={h}"),
        });
    }
    let ifs = interfaces();
    if let Some(spec) = tcp_if {
        return Ok(Choice {
            addrs: select(spec, &ifs)?,
            why: format!("IBCOLL_TCP_IF={spec}"),
        });
    }
    if let Some(l) = launcher_addr() {
        if let Some(a) = route_to(l) {
            let name = ifs
                .iter()
                .find(|i| i.addr == a)
                .map_or("?", |i| i.name.as_str());
            return Ok(Choice {
                addrs: vec![a],
                why: format!(
                    "the interface ({name}) that reaches the launcher at {}",
                    l.ip()
                ),
            });
        }
    }
    let first = ifs
        .iter()
        .filter(|i| i.up && !i.loopback && !is_local_bridge(&i.name))
        .find(|i| i.addr.is_ipv4())
        .or_else(|| {
            ifs.iter()
                .find(|i| i.up && !i.loopback && !is_local_bridge(&i.name))
        });
    Ok(match first {
        Some(i) => Choice {
            addrs: vec![i.addr],
            why: format!("the first interface that is up ({})", i.name),
        },
        None => Choice {
            addrs: vec![IpAddr::V4(Ipv4Addr::LOCALHOST)],
            why: "loopback (no other interface is up)".into(),
        },
    })
}

/// Identifies this kernel and network namespace: two ranks with the same
/// key reach each other over loopback (and see each other's pids).
pub fn host_key() -> u64 {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    let netns = std::fs::read_link("/proc/self/ns/net")
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default();
    // FNV-1a: stable across processes and builds, unlike the std hasher.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in boot.trim().bytes().chain([0]).chain(netns.bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ifa(name: &str, a: &str, up: bool) -> IfAddr {
        IfAddr {
            name: name.into(),
            addr: a.parse().unwrap(),
            up,
            loopback: name == "lo",
        }
    }

    fn hosts() -> Vec<IfAddr> {
        vec![
            ifa("lo", "127.0.0.1", true),
            ifa("eth0", "10.251.0.11", true),
            ifa("eth0", "fe80::1", true),
            ifa("ib0", "192.168.7.3", true),
            ifa("eth1", "172.16.0.5", false),
        ]
    }

    fn ips(v: &[&str]) -> Vec<IpAddr> {
        v.iter().map(|a| a.parse().unwrap()).collect()
    }

    #[test]
    fn names_and_cidrs_in_list_order() {
        let h = hosts();
        assert_eq!(
            select("ib0,eth0", &h).unwrap(),
            ips(&["192.168.7.3", "10.251.0.11", "fe80::1"])
        );
        assert_eq!(select("10.251.0.0/24", &h).unwrap(), ips(&["10.251.0.11"]));
        assert_eq!(select("fe80::/10", &h).unwrap(), ips(&["fe80::1"]));
        assert_eq!(
            select("0.0.0.0/0", &h).unwrap(),
            ips(&["127.0.0.1", "10.251.0.11", "192.168.7.3"])
        );
    }

    #[test]
    fn excludes_and_down_interfaces() {
        let h = hosts();
        assert_eq!(select("^eth0", &h).unwrap(), ips(&["192.168.7.3"]));
        assert_eq!(
            select("eth0,^fe80::/10", &h).unwrap(),
            ips(&["10.251.0.11"])
        );
        let e = select("eth1", &h).unwrap_err();
        assert!(
            e.contains("matches no address") && e.contains("eth0 10.251.0.11"),
            "{e}"
        );
    }

    #[test]
    fn bad_lists_are_errors() {
        assert!(select("10.0.0.0/33", &hosts())
            .unwrap_err()
            .contains("0-32"));
        assert!(select("10.0.0/8", &hosts()).unwrap_err().contains("CIDR"));
        assert!(select("x/8", &hosts()).is_err());
    }

    #[test]
    fn cidr_edges() {
        let a: IpAddr = "10.1.2.3".parse().unwrap();
        assert!(in_cidr(a, "10.0.0.0".parse().unwrap(), 8));
        assert!(!in_cidr(a, "10.0.0.0".parse().unwrap(), 16));
        assert!(in_cidr(a, "10.1.2.3".parse().unwrap(), 32));
        assert!(in_cidr(a, "0.0.0.0".parse().unwrap(), 0));
        assert!(!in_cidr(a, "::".parse().unwrap(), 0));
    }

    #[test]
    fn explicit_host_wins_and_this_host_has_a_key() {
        let c = choose(Some("10.9.8.7"), Some("eth0")).unwrap();
        assert_eq!(c.addrs, ips(&["10.9.8.7"]));
        assert!(choose(None, None).unwrap().addrs.len() == 1);
        assert_eq!(host_key(), host_key());
    }
}
