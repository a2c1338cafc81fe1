//! Jobs of hundreds of ranks on virtual nodes (tcp between them, every
//! node's pair over shm), oversubscribed on this machine, and what a rank
//! costs in them (`IBCOLL_STATS`); first contacts in both directions at
//! once; first contacts that fail.

mod common;

use common::*;

fn scale(n: usize, nodes: usize, what: &str) -> String {
    let (n_s, nodes_s) = (n.to_string(), nodes.to_string());
    let out = run_job_ok(
        600,
        &["-n", &n_s, "--nodes", &nodes_s],
        "scale_check",
        &[what],
    );
    assert!(
        out.contains(&format!("scale_check {what}: ok ({n} ranks)")),
        "{out}"
    );
    out
}

#[test]
fn ranks_256_on_128_nodes() {
    scale(256, 128, "all");
}

#[test]
fn ranks_512_on_256_nodes() {
    scale(512, 256, "all");
}

#[test]
fn ranks_64_on_64_nodes() {
    scale(64, 64, "all");
}

/// The fields of one `IBCOLL_STATS` line.
struct Stat {
    shm: u64,
    tcp: u64,
    rdma: u64,
    dialed: u64,
    gets: u64,
    cards: u64,
}

fn field(line: &str, key: &str) -> u64 {
    let at = line
        .find(key)
        .unwrap_or_else(|| panic!("no {key} in {line}"));
    line[at + key.len()..]
        .chars()
        .take_while(|c| c.is_ascii_digit())
        .collect::<String>()
        .parse()
        .unwrap_or_else(|_| panic!("bad {key} in {line}"))
}

fn stats(text: &str) -> Vec<Stat> {
    text.lines()
        .filter(|l| l.starts_with("ibcoll stats: "))
        .map(|l| Stat {
            shm: field(l, "shm="),
            tcp: field(l, "tcp="),
            rdma: field(l, "rdma="),
            dialed: field(l, "dialed "),
            gets: field(l, "gets="),
            cards: field(l, "(cards "),
        })
        .collect()
}

#[test]
fn a_rank_talking_to_two_neighbours_pays_for_two_whatever_the_job_size() {
    for (n, nodes) in [(16, 8), (128, 64)] {
        let (n_s, nodes_s) = (n.to_string(), nodes.to_string());
        let o = run_job(
            600,
            &["-n", &n_s, "--nodes", &nodes_s, "-x", "IBCOLL_STATS=1"],
            "scale_check",
            &["ring"],
        );
        let all = text(&o);
        assert!(o.status.success(), "{all}");
        let st = stats(&String::from_utf8_lossy(&o.stderr));
        assert_eq!(st.len(), n, "one line per rank:\n{all}");
        for s in &st {
            assert_eq!(s.shm + s.tcp + s.rdma, 2, "two connections:\n{all}");
            assert!(s.cards <= s.dialed, "a card per peer dialed:\n{all}");
            assert!(s.gets <= 2 + s.dialed, "gets bounded:\n{all}");
        }
    }
}

#[test]
fn first_contacts_in_both_directions_at_once_make_one_connection_per_pair() {
    let o = run_job(
        300,
        &["-n", "12", "--nodes", "12", "-x", "IBCOLL_STATS=1"],
        "scale_check",
        &["first-contact"],
    );
    let all = text(&o);
    assert!(o.status.success(), "{all}");
    assert!(String::from_utf8_lossy(&o.stdout).contains("first-contact: ok (12 ranks)"));
    for s in stats(&String::from_utf8_lossy(&o.stderr)) {
        assert_eq!(s.tcp, 11, "one connection to every other rank:\n{all}");
    }
}

fn failed_contact(what: &str, env_rank1: &[(&str, &str)]) -> String {
    let job = format!("cc{}{}", what.len(), std::process::id());
    let mut env = vec![("IBCOLL_PEER_TIMEOUT_MS", "2000")];
    env.extend_from_slice(env_rank1);
    let children = start_without_launcher("connect_check", &[what], &[0, 1], &job, &env, 120);
    let mut it = children.into_iter();
    let r0 = it
        .next()
        .expect("rank 0")
        .wait_with_output()
        .expect("rank 0");
    for mut c in it {
        let _ = c.kill();
        let _ = c.wait();
    }
    remove_segments(&job, 2);
    let out = text(&r0);
    assert!(r0.status.success(), "{out}");
    out
}

#[test]
fn a_peer_dead_before_first_contact_is_an_error_naming_it() {
    let out = failed_contact("dead-before-contact", &[]);
    assert!(out.contains("survivor: got expected error"), "{out}");
    assert!(out.contains("rank 1"), "{out}");
}

#[test]
fn a_peer_nobody_can_reach_is_an_error_naming_it_and_the_address() {
    // Only rank 1's card matters, but both ranks get the variable: the
    // IPv6 loopback reaches no listener (they bind IPv4).
    let out = failed_contact("unreachable", &[("IBCOLL_TCP_HOST", "::1")]);
    assert!(out.contains("survivor: got expected error"), "{out}");
    assert!(out.contains("[::1]:"), "names the address tried: {out}");
}

/// Many ranks on one node (oversubscribed): the ring exchange, alltoall of
/// small and of 32 KiB blocks and every collective, with the fast paths
/// and without; the node segment is at most 8 MiB per local rank and at
/// most 4 MiB per rank of it is resident at the end.
fn one_node(n: usize, fast: bool) {
    let n_s = n.to_string();
    let coll = if fast { "65536" } else { "0" };
    let coll_var = format!("IBCOLL_SHM_COLL_BYTES={coll}");
    // With the fast paths, the barrier's tree too (auto leaves it off on
    // an oversubscribed node).
    let o = run_job(
        600,
        &[
            "-n",
            &n_s,
            "-x",
            "IBCOLL_STATS=1",
            "-x",
            &coll_var,
            "-x",
            "IBCOLL_SHM_TREE_MIN=16",
        ],
        "scale_check",
        &["node"],
    );
    let all = text(&o);
    assert!(o.status.success(), "{all}");
    assert!(
        String::from_utf8_lossy(&o.stdout).contains(&format!("scale_check node: ok ({n} ranks)")),
        "{all}"
    );
    let err = String::from_utf8_lossy(&o.stderr);
    let lines: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("ibcoll stats: "))
        .collect();
    assert_eq!(lines.len(), n, "one line per rank:\n{all}");
    for l in lines {
        let seg = field(l, "shm segment=");
        let res = field(l, "shm resident=");
        assert!(
            seg <= n as u64 * (8 << 20),
            "segment {seg} B at {n} ranks: {l}"
        );
        assert!(
            res <= n as u64 * (4 << 20),
            "resident {res} B at {n} ranks: {l}"
        );
        assert!(res > 0, "{l}");
        // A pass polls the granted boxes (the pool's size at most) and the
        // channels with work, never every local peer.
        let granted = field(l, "shm boxes granted=");
        let polled = field(l, " polled=");
        assert!(granted <= 32, "{l}");
        assert!(polled <= granted + 2, "{l}");
    }
}

#[test]
fn shm_at_64_and_128_ranks() {
    for n in [64, 128] {
        one_node(n, true);
        one_node(n, false);
    }
}
