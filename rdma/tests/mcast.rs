//! Multicast groups and the reliable multicast protocol over real devices
//! (Soft-RoCE in the VM: `scripts/rxe-run --rdma-tests`, `-n veth`: rxe0 and
//! rxe1 over a veth pair). Without a device every test prints a note and
//! passes; `IBCOLL_RDMA_REQUIRE=1` makes that a failure.

use ibcoll_rdma::rmcast::{self, Config, Data, Dest, DropFilter, Member};
use ibcoll_rdma::*;
use std::time::{Duration, Instant};

fn ports(test: &str) -> Option<Vec<SelectedPort>> {
    let d: Vec<String> = devices().into_iter().map(|d| d.name).collect();
    if d.is_empty() {
        if std::env::var("IBCOLL_RDMA_REQUIRE").is_ok_and(|v| v == "1") {
            panic!("{test}: IBCOLL_RDMA_REQUIRE=1 but no RDMA device found");
        }
        eprintln!("note: {test} skipped: no RDMA device (run it with scripts/rxe-run)");
        return None;
    }
    Some(
        d.iter()
            .map(|n| {
                DeviceSelection {
                    device: Some(n.clone()),
                    ..Default::default()
                }
                .select()
                .expect("select")
            })
            .collect(),
    )
}

fn cfg(tag: u8) -> UdConfig {
    UdConfig {
        qkey: 0x1bc0_11ec,
        recv_bufs: 256,
        send_bufs: 64,
        wr_tag: tag,
        ..UdConfig::default()
    }
}

struct M {
    name: &'static str,
    g: McastGroup,
}

fn join(port: &SelectedPort, mgid: Gid, name: &'static str) -> M {
    let pd = ProtectionDomain::new(&port.context).unwrap();
    M {
        name,
        g: McastGroup::join(port, &pd, mgid, cfg(0xe0))
            .unwrap_or_else(|e| panic!("{name}: join: {e}")),
    }
}

fn mgid(test: &str) -> Gid {
    group_gid(format!("{test}-{}", std::process::id()).as_bytes(), 1)
}

/// Poll every member for `for_`; returns datagrams received per member.
fn drain(ms: &mut [M], for_: Duration) -> Vec<Vec<Vec<u8>>> {
    let mut got = vec![Vec::new(); ms.len()];
    let end = Instant::now() + for_;
    while Instant::now() < end {
        for (i, m) in ms.iter_mut().enumerate() {
            m.g.poll(|d| got[i].push(d.data.to_vec())).unwrap();
        }
    }
    got
}

fn send_all(m: &mut M, msgs: &[Vec<u8>]) {
    for msg in msgs {
        let t = Instant::now();
        while !m.g.send(msg).unwrap() {
            m.g.poll(|_| {}).unwrap();
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "{}: no send slot",
                m.name
            );
        }
    }
}

fn igmp_has(g: Gid) -> bool {
    let ip = g.ipv4().unwrap();
    let hex = format!("{:08X}", u32::from_ne_bytes(ip.octets()));
    std::fs::read_to_string("/proc/net/igmp").is_ok_and(|s| s.contains(&hex))
}

#[test]
fn group_reaches_every_member_and_leave_stops_it() {
    let Some(ps) = ports("group_reaches_every_member") else {
        return;
    };
    let (p0, p1) = (&ps[0], ps.get(1).unwrap_or(&ps[0]));
    let g = mgid("reach");
    let mut ms = vec![
        join(p0, g, "a0 (rxe0, sender)"),
        join(p0, g, "a1 (rxe0, second QP)"),
        join(p1, g, "b0 (rxe1)"),
        join(p1, g, "b1 (rxe1, second QP)"),
    ];
    assert!(
        igmp_has(g),
        "the IP group {g} is not joined (/proc/net/igmp)"
    );
    let msgs: Vec<Vec<u8>> = (0..8u8).map(|i| vec![i; 100 + i as usize]).collect();
    send_all(&mut ms[0], &msgs);
    let got = drain(&mut ms, Duration::from_secs(2));
    for (m, g) in ms.iter().zip(&got) {
        println!(
            "multicast from a0 on {}: {} received {} of 8",
            p0.context.name(),
            m.name,
            g.len()
        );
    }
    // Every QP attached gets every datagram with the right bytes: the other
    // device's two, and on Soft-RoCE the sender's device's second QP too
    // (measured: rxe delivers a group's packet to every QP attached on the
    // sending device, the sender's own included).
    for i in [1, 2, 3] {
        assert_eq!(got[i], msgs, "{}", ms[i].name);
    }
    // From rxe1 back: both QPs of rxe0 receive.
    send_all(&mut ms[2], &msgs);
    let back = drain(&mut ms, Duration::from_secs(2));
    for (m, g) in ms.iter().zip(&back) {
        println!(
            "multicast from b0 on {}: {} received {} of 8",
            p1.context.name(),
            m.name,
            g.len()
        );
    }
    assert_eq!(back[0], msgs);
    assert_eq!(back[1], msgs);

    // b1 leaves: its QP (handed back) gets nothing more, b0 still all.
    let b1 = ms.pop().unwrap();
    let ep = b1.g.leave().expect("leave");
    let mut ep = ep;
    send_all(&mut ms[0], &msgs);
    let after = drain(&mut ms, Duration::from_secs(2));
    let mut stray = 0;
    ep.poll(|_| stray += 1).unwrap();
    assert_eq!(after[2], msgs, "b0 still joined");
    assert_eq!(stray, 0, "a QP that left still receives");
    drop(ep);
    drop(ms);
    assert!(
        !igmp_has(g),
        "the IP group {g} is still joined after every member left"
    );
}

#[test]
fn join_refuses_what_cannot_work() {
    let Some(ps) = ports("join_refuses") else {
        return;
    };
    let pd = ProtectionDomain::new(&ps[0].context).unwrap();
    // Not a multicast address.
    let uni = Gid(std::net::Ipv4Addr::new(10, 77, 0, 9)
        .to_ipv6_mapped()
        .octets());
    let e = McastGroup::join(&ps[0], &pd, uni, cfg(0xe1)).unwrap_err();
    assert!(
        e.to_string().contains("not an IPv4-mapped multicast"),
        "{e}"
    );
    // A source address on no interface: the IP join fails, nothing leaks.
    let mut p = ps[0].clone();
    if let Some(gid) = p.gid.as_mut() {
        gid.gid = Gid(std::net::Ipv4Addr::new(10, 99, 99, 99)
            .to_ipv6_mapped()
            .octets());
    }
    let g = mgid("refuse");
    let e = McastGroup::join(&p, &pd, g, cfg(0xe1)).unwrap_err();
    assert!(e.to_string().contains("IP_ADD_MEMBERSHIP"), "{e}");
    assert!(!igmp_has(g));
    println!("join errors: {e}");
}

/// The protocol driven over real multicast: every member in this thread,
/// data through the group, acks and nacks handed over directly (the
/// reliable channel), loss injected on receive.
fn reliable_bcast(ms: &mut [M], sizes: &[usize], drop_rate: f64) {
    let n = ms.len() as u32;
    let mtu = ms.iter().map(|m| m.g.max_payload()).min().unwrap();
    let mut members: Vec<Member> = (0..n)
        .map(|i| {
            let mut c = Config::new(0x77, i, n, mtu);
            c.window = 32;
            c.ack_step = 8;
            // The VM is slow: a long quiet time before nacking the tail.
            c.nack_delay = Duration::from_millis(5);
            c.retx_holdoff = Duration::from_millis(2);
            c.peer_timeout = Duration::from_secs(20);
            Member::new(c).unwrap()
        })
        .collect();
    let mut drops: Vec<DropFilter> = (0..n)
        .map(|i| DropFilter::new(drop_rate, 7 + i as u64))
        .collect();
    let mut ctrl: Vec<(u32, u32, Vec<u8>)> = Vec::new();
    for (k, &len) in sizes.iter().enumerate() {
        let root = k as u32 % n;
        let src: Vec<u8> = (0..len).map(|i| (i * 31 + k * 7 + 1) as u8).collect();
        let mut bufs: Vec<Vec<u8>> = (0..n)
            .map(|i| if i == root { src.clone() } else { vec![0; len] })
            .collect();
        let t0 = Instant::now();
        for i in 0..n as usize {
            let mut d = if i as u32 == root {
                Data::Source(&src)
            } else {
                Data::Sink(&mut bufs[i])
            };
            members[i].begin(Instant::now(), root, len, &mut d).unwrap();
        }
        let mut done = vec![false; n as usize];
        loop {
            let now = Instant::now();
            for i in 0..n as usize {
                let cur = members[i].current().is_some();
                let mut d = match (cur, i as u32 == root) {
                    (false, _) => Data::None,
                    (true, true) => Data::Source(&src),
                    (true, false) => Data::Sink(&mut bufs[i]),
                };
                // Receive.
                let mut pkts = Vec::new();
                ms[i].g.poll(|dg| pkts.push(dg.data.to_vec())).unwrap();
                for p in pkts {
                    if drops[i].drop_next() {
                        continue;
                    }
                    members[i].handle_datagram(now, &p, &mut d).unwrap();
                }
                if members[i].poll_timeout().is_some_and(|t| t <= now) {
                    members[i].handle_timeout(now).unwrap();
                }
                // Send all the member has (a datagram that arrives while
                // waiting for a send slot is discarded: one more loss).
                while let Some(t) = members[i].poll_transmit(now, &d).unwrap() {
                    match t.dest {
                        Dest::Member(to) => ctrl.push((i as u32, to, t.bytes.to_vec())),
                        Dest::Group => {
                            let bytes = t.bytes.to_vec();
                            while !ms[i].g.send(&bytes).unwrap() {
                                ms[i].g.poll(|_| {}).unwrap();
                            }
                        }
                    }
                }
                if members[i].current().is_none() && !done[i] {
                    done[i] = true;
                    assert!(
                        bufs[i] == src,
                        "broadcast {k} ({len} B, root {root}): member {i} has wrong bytes"
                    );
                }
            }
            for (from, to, pkt) in ctrl.drain(..) {
                members[to as usize]
                    .handle_control(Instant::now(), from, &pkt)
                    .unwrap();
            }
            if done.iter().all(|&d| d) && members.iter().all(|m| m.is_idle()) {
                break;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "broadcast {k} ({len} B) did not finish"
            );
        }
        let st: Vec<_> = members
            .iter()
            .map(|m| {
                (
                    m.stats().sent,
                    m.stats().retransmitted,
                    m.stats().nacks_sent,
                )
            })
            .collect();
        println!(
            "reliable bcast {len} B root {root} drop {drop_rate}: {:.1} ms, (sent, resent, nacks) per member {st:?}",
            t0.elapsed().as_secs_f64() * 1e3
        );
    }
}

fn members_for_bcast(ps: &[SelectedPort], g: Gid) -> Vec<M> {
    let (p0, p1) = (&ps[0], ps.get(1).unwrap_or(&ps[0]));
    vec![
        join(p0, g, "m0 (rxe0)"),
        join(p1, g, "m1 (rxe1)"),
        join(p1, g, "m2 (rxe1)"),
        join(p0, g, "m3 (rxe0)"),
    ]
}

#[test]
fn reliable_bcast_over_rxe() {
    let Some(ps) = ports("reliable_bcast_over_rxe") else {
        return;
    };
    let mut ms = members_for_bcast(&ps, mgid("rel"));
    let mtu = ms[0].g.max_payload() - rmcast::wire::DATA_HDR;
    let sizes = [0, 1, mtu - 1, mtu, mtu + 1, 1 << 20];
    for rate in [0.0, 0.01, 0.1] {
        reliable_bcast(&mut ms, &sizes, rate);
    }
}
