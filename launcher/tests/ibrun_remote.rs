//! Remote ranks through a remote shell, across real network interfaces.
//!
//! Two network namespaces stand in for two hosts, each joined to this one by
//! a veth pair with addresses of our own; `tests/netns-rsh` plays ssh. The
//! ranks there reach ibrun's PMI server over TCP (PMI_PORT + PMI_ID).

mod common;

use common::*;
use std::path::PathBuf;
use std::process::Command;

struct Hosts {
    names: Vec<String>,
    links: Vec<String>,
    pub addrs: Vec<String>,
}

fn ip(args: &str) -> bool {
    Command::new("ip")
        .args(args.split_whitespace())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

impl Hosts {
    fn new(count: usize) -> Option<Hosts> {
        if
        // SAFETY: geteuid has no preconditions.
        unsafe { libc::geteuid() } != 0 || !require("ip") {
            eprintln!("skipping: needs root and iproute2 for network namespaces");
            if std::env::var("CI").is_ok() {
                panic!("CI must run the network-namespace tests");
            }
            return None;
        }
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let seq = NEXT.fetch_add(count, std::sync::atomic::Ordering::Relaxed);
        let tag = std::process::id() as usize % 5_000;
        let mut h = Hosts {
            names: Vec::new(),
            links: Vec::new(),
            addrs: Vec::new(),
        };
        for i in 0..count {
            let i = seq + i;
            let ns = format!("ibrun-t{tag}-{i}");
            let (a, b) = (format!("ibr{tag}h{i}"), format!("ibr{tag}n{i}"));
            // A /24 per host, in 10.251.0.0/16, derived from our pid so that
            // concurrent test runs do not collide.
            let net = format!("10.251.{}", (tag * 8 + i) % 250 + 1);
            let steps = [
                format!("netns add {ns}"),
                format!("link add {a} type veth peer name {b}"),
                format!("link set {b} netns {ns}"),
                format!("addr add {net}.1/24 dev {a}"),
                format!("link set {a} up"),
                format!("-n {ns} addr add {net}.2/24 dev {b}"),
                format!("-n {ns} link set {b} up"),
                format!("-n {ns} link set lo up"),
                format!("-n {ns} route add default via {net}.1"),
            ];
            h.names.push(ns);
            h.links.push(a);
            for s in &steps {
                assert!(ip(s), "ip {s} failed");
            }
            h.addrs.push(format!("{net}.2"));
        }
        Some(h)
    }

    fn map_env(&self) -> String {
        self.addrs
            .iter()
            .zip(&self.names)
            .map(|(a, n)| format!("{a}={n}"))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        for l in &self.links {
            ip(&format!("link del {l}"));
        }
        for n in &self.names {
            ip(&format!("netns del {n}"));
        }
    }
}

fn rsh() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/netns-rsh")
}

fn remote_cmd(h: &Hosts, n: usize) -> Command {
    let mut c = ibrun_cmd(&["-n", &n.to_string(), "--hosts", &h.addrs.join(",")]);
    c.arg("--rsh")
        .arg(rsh())
        .env("IBCOLL_TEST_NETNS", h.map_env());
    c
}

#[test]
fn ranks_on_two_remote_hosts() {
    let Some(h) = Hosts::new(2) else { return };
    let r = run(remote_cmd(&h, 4).arg(example("pmi_check")));
    assert_eq!(r.code, 0);
    let mut lines: Vec<&str> = r
        .stdout
        .lines()
        .filter(|l| l.contains("pmi_check ok"))
        .collect();
    lines.sort();
    assert_eq!(lines.len(), 4);
    for (rank, l) in lines.iter().enumerate() {
        let want = format!(
            "rank={rank} size=4 node={} local={}/2 nodes=2 map=0,0,1,1 mode=Port",
            rank / 2,
            rank % 2
        );
        assert!(l.contains(&want), "{l} lacks {want}");
    }
    // The ranks really ran behind the veth interfaces.
    let r = run(remote_cmd(&h, 2).arg("--tag-output").args([
        "sh",
        "-c",
        "ip -o -4 addr show | grep -o '10\\.251\\.[0-9]*\\.2' ",
    ]));
    assert_eq!(r.code, 0);
    assert!(
        r.stdout.contains(&format!("[0] {}", h.addrs[0])),
        "{}",
        r.stdout
    );
    assert!(
        r.stdout.contains(&format!("[1] {}", h.addrs[1])),
        "{}",
        r.stdout
    );
}

#[test]
fn remote_rank_killed_is_named() {
    let Some(h) = Hosts::new(2) else { return };
    let r = run(remote_cmd(&h, 2)
        .arg(example("pmi_check"))
        .arg("kill-rank1"));
    assert_eq!(r.code, 137);
    let l = r
        .stderr
        .lines()
        .find(|l| l.starts_with("ibrun: rank 1"))
        .unwrap_or("");
    assert!(
        l.contains(&format!("rank 1 (host {}, pid ", h.addrs[1]))
            && l.contains("killed by signal 9"),
        "{l}"
    );
}

#[test]
fn remote_exit_status_and_unknown_host() {
    let Some(h) = Hosts::new(1) else { return };
    let r = run(remote_cmd(&h, 2)
        .arg(example("pmi_check"))
        .arg("exit-rank1"));
    assert_eq!(r.code, 3);
    assert!(r.stderr.contains("exited with status 3"));
    // A host the remote shell cannot reach fails the job with its status.
    let r = run(ibrun_cmd(&[
        "-n",
        "1",
        "--hosts",
        "10.251.255.254",
        "--pmi-addr",
        "127.0.0.1",
    ])
    .arg("--rsh")
    .arg(rsh())
    .arg("true"));
    assert_eq!(r.code, 255);
    assert!(r.stderr.contains("remote shell"), "{}", r.stderr);
}

#[test]
fn remote_survivors_are_told_which_rank_was_lost() {
    // Over TCP PMI, across hosts: ranks 0-1 on one, 2-3 on the other.
    let Some(h) = Hosts::new(2) else { return };
    let r = run(remote_cmd(&h, 4)
        .arg(example("pmi_check"))
        .arg("told-kill-rank1"));
    assert_eq!(r.code, 137);
    assert_told(&r.stdout, &[0, 2, 3], 1, "was killed by signal 9 (SIGKILL)");
}

#[test]
fn hosts_whose_names_do_not_resolve() {
    // Names only the remote shell knows (no DNS, no /etc/hosts entry): ibrun
    // resolves nothing and tells the ranks an address, the one given.
    let Some(h) = Hosts::new(2) else { return };
    let names = ["ibrun-a.invalid", "ibrun-b.invalid"];
    let map = names
        .iter()
        .zip(&h.names)
        .map(|(a, n)| format!("{a}={n}"))
        .collect::<Vec<_>>()
        .join(" ");
    // The first host's link has this machine at .1 of its /24.
    let gateway = format!("{}.1", h.addrs[0].rsplit_once('.').map_or("", |x| x.0));
    let cmd = |pmi_addr: Option<&str>| {
        let mut c = ibrun_cmd(&["-n", "2", "--hosts", &names.join(",")]);
        if let Some(a) = pmi_addr {
            c.args(["--pmi-addr", a]);
        }
        c.arg("--rsh")
            .arg(rsh())
            .env("IBCOLL_TEST_NETNS", &map)
            .arg(example("pmi_check"));
        c
    };
    let r = run(&mut cmd(Some(&gateway)));
    assert_eq!(r.code, 0);
    assert_eq!(r.stdout.matches("size=2 ").count(), 2, "{}", r.stdout);
    assert!(r.stdout.contains("mode=Port"));
    // Without an address to give, ibrun says so instead of guessing.
    let r = run(&mut cmd(None));
    assert_eq!(r.code, 2);
    assert!(
        r.stderr.contains("no host resolves") && r.stderr.contains("--pmi-addr"),
        "{}",
        r.stderr
    );
}
