//! Point-to-point over the rdma channel: the rank programs of
//! `coll/examples/` under `ibrun --nodes K` with `IBCOLL_TRANSPORT=rdma`.
//!
//! These need verbs devices: they run inside the Soft-RoCE VM
//! (`scripts/rxe-run --coll-rdma-tests`, part of `scripts/test`), with
//! `-n veth` giving rxe0 and rxe1 and `IBCOLL_IB_DEVICE=rxe0,rxe1` putting
//! node i on `rxe<i mod 2>` so traffic between virtual nodes crosses the
//! veth pair. Without a device each test prints a note and passes, unless
//! `IBCOLL_RDMA_REQUIRE=1`. Build first: `cargo build --workspace --bins
//! --examples`.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::sync::{Arc, Mutex};

const DEVICES: &str = "IBCOLL_IB_DEVICE=rxe0,rxe1";

fn have_rdma() -> bool {
    if !ibcoll_rdma::devices().is_empty() {
        return true;
    }
    if std::env::var("IBCOLL_RDMA_REQUIRE").is_ok_and(|v| v == "1") {
        panic!("IBCOLL_RDMA_REQUIRE=1 but there is no RDMA device");
    }
    eprintln!("note: no RDMA device here; run scripts/rxe-run --coll-rdma-tests");
    false
}

fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    exe.parent()
        .and_then(|d| d.parent())
        .expect("test executable lives in target/<profile>/deps")
        .to_path_buf()
}

fn built(p: PathBuf) -> PathBuf {
    assert!(
        p.exists(),
        "{} is missing: run `cargo build --workspace --bins --examples` first",
        p.display()
    );
    p
}

fn example(name: &str) -> PathBuf {
    built(target_dir().join("examples").join(name))
}

fn run(launcher: &[&str], prog: &str, args: &[&str]) -> Output {
    let t = std::time::Instant::now();
    let o = Command::new(built(target_dir().join("ibrun")))
        .args(["--timeout", "200"])
        .args(launcher)
        .arg(example(prog))
        .args(args)
        .env_remove("IBCOLL_TRANSPORT")
        .env_remove("IBCOLL_IB_DEVICE")
        .output()
        .expect("spawn ibrun");
    eprintln!(
        "{launcher:?} {prog} {args:?}: {:.1} s",
        t.elapsed().as_secs_f64()
    );
    o
}

fn text(o: &Output) -> String {
    format!(
        "status: {:?}\n--- stdout\n{}--- stderr\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn run_ok(launcher: &[&str], prog: &str, args: &[&str]) -> String {
    let o = run(launcher, prog, args);
    assert!(
        o.status.success(),
        "{launcher:?} {prog} {args:?} failed:\n{}",
        text(&o)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn pingpong_rdma_2_nodes_read_and_write_rendezvous() {
    if !have_rdma() {
        return;
    }
    for mode in ["auto", "read", "write"] {
        let m = format!("IBCOLL_RDMA_RNDV={mode}");
        let out = run_ok(
            &[
                "-n",
                "2",
                "--nodes",
                "2",
                "-x",
                "IBCOLL_TRANSPORT=rdma",
                "-x",
                DEVICES,
                "-x",
                &m,
            ],
            "pingpong",
            &["1100000"],
        );
        assert!(
            out.contains("ok (rdma)") && out.contains("eager limit 8192") && out.contains("all ok"),
            "{mode}: {out}"
        );
    }
}

#[test]
fn auto_uses_rdma_between_nodes_and_shm_within() {
    if !have_rdma() {
        return;
    }
    let o = run(
        &["-n", "4", "--nodes", "2", "-x", DEVICES],
        "pingpong",
        &["100000"],
    );
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(t.contains("ok (rdma)") && t.contains("ok (shm)"), "{t}");
    assert!(!t.contains("using tcp"), "{t}");
}

#[test]
fn semantics_rdma_3_nodes() {
    if !have_rdma() {
        return;
    }
    let out = run_ok(
        &[
            "-n",
            "3",
            "--nodes",
            "3",
            "-x",
            "IBCOLL_TRANSPORT=rdma",
            "-x",
            DEVICES,
        ],
        "p2p_check",
        &["all"],
    );
    for c in [
        "anysource",
        "order",
        "wildcard",
        "probe",
        "truncate",
        "split",
        "ring",
    ] {
        assert!(out.contains(&format!("{c}: ok")), "{c} missing:\n{out}");
    }
    assert!(out.contains("truncate: got expected error"), "{out}");
}

#[test]
fn many_to_one_with_few_credits() {
    if !have_rdma() {
        return;
    }
    // 3 senders into one receiver with 4 receive buffers per peer and
    // write rendezvous: credits, not RNR retries, pace the senders.
    let out = run_ok(
        &[
            "-n",
            "4",
            "--nodes",
            "2",
            "-x",
            "IBCOLL_TRANSPORT=rdma",
            "-x",
            DEVICES,
            "-x",
            "IBCOLL_RDMA_RECV_BUFS=4",
            "-x",
            "IBCOLL_RDMA_SEND_BUFS=2",
            "-x",
            "IBCOLL_RDMA_RNR_RETRY=0",
            "-x",
            "IBCOLL_RDMA_RNDV=write",
        ],
        "p2p_check",
        &["anysource", "ring"],
    );
    assert!(
        out.contains("anysource: ok (4 ranks)") && out.contains("ring: ok"),
        "{out}"
    );
}

#[test]
fn collectives_over_rdma_if_present() {
    if !have_rdma() {
        return;
    }
    if !target_dir().join("examples").join("coll_check").exists() {
        eprintln!("note: no coll_check example yet");
        return;
    }
    // Every rank over rdma on 3 nodes, then shm within and rdma between 2.
    for launcher in [
        &[
            "-n",
            "3",
            "--nodes",
            "3",
            "-x",
            "IBCOLL_TRANSPORT=rdma",
            "-x",
            DEVICES,
        ][..],
        &["-n", "4", "--nodes", "2", "-x", DEVICES][..],
    ] {
        let o = run(launcher, "coll_check", &["quick"]);
        let t = text(&o);
        assert!(
            o.status.success() && t.contains("coll_check: all ok"),
            "{t}"
        );
    }
}

// ---------------------------------------------------------------- peer death

/// A minimal PMI-1 server (as in `multiprocess.rs`), so the survivor is not
/// killed by a launcher when the victim dies.
struct MiniPmi {
    kvs: HashMap<String, String>,
    barrier: Vec<UnixStream>,
    size: usize,
}

fn serve(state: Arc<Mutex<MiniPmi>>, conn: UnixStream) {
    let mut w = conn.try_clone().expect("clone");
    let mut lines = BufReader::new(conn);
    let mut line = String::new();
    loop {
        line.clear();
        if lines.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let kv: HashMap<&str, &str> = line
            .split_whitespace()
            .filter_map(|t| t.split_once('='))
            .collect();
        let reply = match kv.get("cmd").copied().unwrap_or("") {
            "init" => "cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=0\n".to_string(),
            "get_maxes" => "cmd=maxes kvsname_max=256 keylen_max=64 vallen_max=1024\n".into(),
            "get_my_kvsname" => "cmd=my_kvsname kvsname=kvs_test\n".into(),
            "get_universe_size" => {
                format!("cmd=universe_size size={}\n", state.lock().unwrap().size)
            }
            "get_appnum" => "cmd=appnum appnum=0\n".into(),
            "put" => {
                let (k, v) = (
                    kv["key"].to_string(),
                    kv.get("value").unwrap_or(&"").to_string(),
                );
                state.lock().unwrap().kvs.insert(k, v);
                "cmd=put_result rc=0\n".into()
            }
            "get" => match state.lock().unwrap().kvs.get(kv["key"]) {
                Some(v) => format!("cmd=get_result rc=0 value={v}\n"),
                None => "cmd=get_result rc=-1 msg=not_found\n".into(),
            },
            "barrier_in" => {
                let mut s = state.lock().unwrap();
                s.barrier.push(w.try_clone().expect("clone"));
                if s.barrier.len() == s.size {
                    for mut b in s.barrier.drain(..) {
                        let _ = b.write_all(b"cmd=barrier_out\n");
                    }
                }
                continue;
            }
            "finalize" => "cmd=finalize_ack\n".into(),
            _ => continue,
        };
        if w.write_all(reply.as_bytes()).is_err() {
            return;
        }
    }
}

/// `peer_death` as 2 ranks on two virtual nodes over rdma; the victim
/// SIGKILLs itself with a rendezvous send pending. Returns the survivor's
/// output and how long it took.
fn peer_death(extra_env: &[(&str, &str)]) -> (Output, f64) {
    let size = 2;
    let state = Arc::new(Mutex::new(MiniPmi {
        kvs: HashMap::new(),
        barrier: Vec::new(),
        size,
    }));
    let job = format!("rdmapd{}{}", std::process::id(), extra_env.len());
    let t = std::time::Instant::now();
    let mut children = Vec::new();
    for rank in 0..size {
        let (ours, theirs) = UnixStream::pair().expect("socketpair");
        let st = state.clone();
        std::thread::spawn(move || serve(st, ours));
        let fd = theirs.as_raw_fd();
        let mut cmd = Command::new(example("peer_death"));
        cmd.env("PMI_FD", "3")
            .env("PMI_RANK", rank.to_string())
            .env("PMI_SIZE", size.to_string())
            .env("IBCOLL_NODE_ID", rank.to_string())
            .env("IBCOLL_LOCAL_RANK", "0")
            .env("IBCOLL_LOCAL_SIZE", "1")
            .env("IBCOLL_NUM_NODES", "2")
            .env("IBCOLL_JOB_ID", &job)
            .env("IBCOLL_TRANSPORT", "rdma")
            .env("IBCOLL_IB_DEVICE", "rxe0,rxe1")
            .env_remove("PMI_PORT")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in extra_env {
            cmd.env(k, v);
        }
        // SAFETY: between fork and exec only dup2 (async-signal-safe) runs;
        // it gives the child our end of the socketpair as fd 3.
        unsafe {
            cmd.pre_exec(move || {
                if libc::dup2(fd, 3) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        children.push(cmd.spawn().expect("spawn peer_death"));
        drop(theirs);
    }
    let victim = children.pop().expect("victim");
    let survivor = children.pop().expect("survivor");
    let _ = victim.wait_with_output();
    let out = survivor.wait_with_output().expect("wait survivor");
    (out, t.elapsed().as_secs_f64())
}

fn check_survivor(extra_env: &[(&str, &str)], bound_s: f64) {
    let (out, secs) = peer_death(extra_env);
    let o = text(&out);
    eprintln!("peer death {extra_env:?}: {secs:.1} s\n{o}");
    assert!(out.status.success(), "survivor failed:\n{o}");
    assert!(
        o.contains("survivor: got expected error") && o.contains("peer lost"),
        "{o}"
    );
    assert!(o.contains("send to dead rank"), "{o}");
    assert!(secs < bound_s, "took {secs:.1} s (bound {bound_s} s):\n{o}");
}

#[test]
fn peer_death_over_rdma_is_an_error_not_a_hang() {
    if !have_rdma() {
        return;
    }
    check_survivor(&[], 60.0);
}

#[test]
fn peer_death_over_rdma_found_by_the_verbs_heartbeat() {
    if !have_rdma() {
        return;
    }
    // No pid check: the idle survivor's probe (a zero-length RDMA write)
    // must fail with "retry counter exceeded" within the peer timeout.
    check_survivor(
        &[
            ("IBCOLL_RDMA_PID_CHECK", "off"),
            ("IBCOLL_PEER_TIMEOUT_MS", "3000"),
            ("IBCOLL_RDMA_TIMEOUT", "14"),
            ("IBCOLL_RDMA_RETRY_CNT", "3"),
        ],
        60.0,
    );
}
