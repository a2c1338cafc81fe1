//! Collectives through ibrun: `coll/examples/coll_check` runs every
//! algorithm of every collective (sizes 0, 1, 3, count < ranks, 1 KiB,
//! eager limits -1/0/+1, 1 MiB), typed operations, bit-identical floating
//! point, argument errors and concurrent nonblocking collectives, for a
//! handful of (ranks, virtual nodes) combinations; and a rank dying in the
//! middle of a collective. Build first: `cargo build --workspace --bins
//! --examples`. Nothing depends on timing (timeouts only turn hangs into
//! failures).

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::sync::{Arc, Mutex};

fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    exe.parent()
        .and_then(|d| d.parent())
        .expect("test executable lives in target/<profile>/deps")
        .to_path_buf()
}

fn bin(path: PathBuf) -> PathBuf {
    assert!(
        path.exists(),
        "{} is missing: run `cargo build --workspace --bins --examples` first",
        path.display()
    );
    path
}

fn example(name: &str) -> PathBuf {
    bin(target_dir().join("examples").join(name))
}

fn text(o: &Output) -> String {
    format!(
        "status: {:?}\n--- stdout\n{}--- stderr\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn coll_check(launcher: &[&str]) {
    let o = Command::new(bin(target_dir().join("ibrun")))
        .args(["--timeout", "200"])
        .args(launcher)
        .arg(example("coll_check"))
        .env_remove("IBCOLL_TRANSPORT")
        .env_remove("IBCOLL_CMA")
        .output()
        .expect("spawn ibrun");
    let t = text(&o);
    assert!(o.status.success(), "{launcher:?} failed:\n{t}");
    for c in ibcoll::Collective::ALL {
        assert!(
            t.contains(&format!("{}: ok", c.name())),
            "{} missing:\n{t}",
            c.name()
        );
    }
    for c in ["typed: ok", "concurrent: ok", "coll_check: all ok"] {
        assert!(t.contains(c), "{c} missing:\n{t}");
    }
}

#[test]
fn collectives_1_rank() {
    coll_check(&["-n", "1"]);
}

#[test]
fn collectives_2_ranks() {
    coll_check(&["-n", "2"]);
}

#[test]
fn collectives_3_ranks() {
    coll_check(&["-n", "3"]);
}

#[test]
fn collectives_4_ranks_on_2_virtual_nodes() {
    coll_check(&["-n", "4", "--nodes", "2"]);
}

#[test]
fn collectives_5_ranks_on_3_virtual_nodes() {
    coll_check(&["-n", "5", "--nodes", "3"]);
}

#[test]
fn collectives_7_ranks_oversubscribed() {
    coll_check(&["-n", "7"]);
}

#[test]
fn collectives_8_ranks_on_2_virtual_nodes_oversubscribed() {
    coll_check(&["-n", "8", "--nodes", "2"]);
}

#[test]
fn collectives_6_ranks_tcp_only() {
    coll_check(&["-n", "6", "-x", "IBCOLL_TRANSPORT=tcp"]);
}

#[test]
fn collectives_5_ranks_on_2_virtual_nodes_small_eager_limits() {
    // Nearly every message goes by rendezvous.
    coll_check(&[
        "-n",
        "5",
        "--nodes",
        "2",
        "-x",
        "IBCOLL_EAGER_LIMIT=100",
        "-x",
        "IBCOLL_TCP_EAGER_LIMIT=1000",
    ]);
}

#[test]
fn collectives_4_ranks_without_cma() {
    coll_check(&["-n", "4", "-x", "IBCOLL_CMA=off"]);
}

// ---------------------------------------------------------------- selection

fn select_run(env: &[(&str, &str)]) -> String {
    let mut cmd = Command::new(bin(target_dir().join("ibrun")));
    cmd.args(["--timeout", "60", "-n", "3"]);
    for (k, v) in env {
        cmd.args(["-x", &format!("{k}={v}")]);
    }
    let o = cmd
        .arg(example("coll_check"))
        .arg("select")
        .output()
        .expect("spawn ibrun");
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    t
}

#[test]
fn algorithm_forced_by_environment_and_tuning_file() {
    let t = select_run(&[("IBCOLL_ALLREDUCE_ALGORITHM", "ring")]);
    assert!(
        t.contains("allreduce 8 -> ring") && t.contains("select: allreduce ok"),
        "{t}"
    );
    let t = select_run(&[("IBCOLL_ALLREDUCE_ALGORITHM", "bogus")]);
    assert!(
        t.contains("IBCOLL_ALLREDUCE_ALGORITHM")
            && t.contains("recursive_doubling, ring, rabenseifner, node_aware")
            && t.contains("select: allreduce error"),
        "{t}"
    );
    let dir = std::env::temp_dir().join(format!("ibcoll-tune-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("mkdir");
    let file = dir.join("table.json");
    std::fs::write(
        &file,
        r#"{"rules": [{"collective": "allreduce", "algorithm": "node_aware", "max_bytes": 64, "window": 3},
                     {"collective": "allreduce", "algorithm": "ring", "segment_bytes": 4096}]}"#,
    )
    .expect("write table");
    let f = file.to_string_lossy().into_owned();
    let t = select_run(&[("IBCOLL_TUNING_FILE", &f)]);
    assert!(
        t.contains("allreduce 8 -> node_aware seg 65536 window 3")
            && t.contains("allreduce 1048576 -> ring seg 4096")
            && t.contains("select: allreduce ok"),
        "{t}"
    );
    std::fs::write(&file, "{\"rules\": [{\"collective\": \"allreduce\"}]}").expect("write");
    let t = select_run(&[("IBCOLL_TUNING_FILE", &f)]);
    assert!(
        t.contains("IBCOLL_TUNING_FILE") && t.contains("select: allreduce error"),
        "{t}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

// ---------------------------------------------------------------- peer death

/// A minimal PMI-1 server over socketpairs, so that the ranks run without a
/// launcher that kills the survivor as soon as the victim dies: the test
/// can then see what the survivor itself reports.
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

/// Starts `coll_check death` as `size` ranks on one node (shm) or one node
/// per rank (tcp) under the mini PMI server; the last rank dies in the
/// middle of an allreduce. Returns (survivors' outputs, victim status). A
/// watchdog kills everything after 120 s, so a hang becomes a failure.
fn death_direct(size: usize, two_nodes: bool) -> (Vec<Output>, std::process::ExitStatus) {
    let state = Arc::new(Mutex::new(MiniPmi {
        kvs: HashMap::new(),
        barrier: Vec::new(),
        size,
    }));
    let job = format!(
        "cdtest{}{}{size}",
        std::process::id(),
        if two_nodes { "t" } else { "s" }
    );
    let mut children = Vec::new();
    for rank in 0..size {
        let (ours, theirs) = UnixStream::pair().expect("socketpair");
        let st = state.clone();
        std::thread::spawn(move || serve(st, ours));
        let fd = theirs.as_raw_fd();
        let (node, local_rank, local_size, nodes) = if two_nodes {
            (rank, 0, 1, size)
        } else {
            (0, rank, size, 1)
        };
        let mut cmd = Command::new(example("coll_check"));
        cmd.arg("death")
            .env("PMI_FD", "3")
            .env("PMI_RANK", rank.to_string())
            .env("PMI_SIZE", size.to_string())
            .env("IBCOLL_NODE_ID", node.to_string())
            .env("IBCOLL_LOCAL_RANK", local_rank.to_string())
            .env("IBCOLL_LOCAL_SIZE", local_size.to_string())
            .env("IBCOLL_NUM_NODES", nodes.to_string())
            .env("IBCOLL_JOB_ID", &job)
            .env_remove("PMI_PORT")
            .env_remove("IBCOLL_TRANSPORT")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // SAFETY: between fork and exec only dup2 (async-signal-safe) runs;
        // it gives the child our end of the socketpair as fd 3 without
        // close-on-exec.
        unsafe {
            cmd.pre_exec(move || {
                if libc::dup2(fd, 3) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        children.push(cmd.spawn().expect("spawn coll_check"));
        drop(theirs);
    }
    let pids: Vec<i32> = children.iter().map(|c| c.id() as i32).collect();
    std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_secs(120));
        for p in pids {
            // SAFETY: kill has no memory preconditions; these are our
            // children (a reaped pid is not reused within the test run).
            unsafe {
                libc::kill(p, libc::SIGKILL);
            }
        }
    });
    let victim = children.pop().expect("victim");
    // Reap the victim at once: a zombie still counts as alive.
    let victim_status = victim.wait_with_output().expect("wait victim").status;
    let outs = children
        .into_iter()
        .map(|c| c.wait_with_output().expect("wait survivor"))
        .collect();
    let _ = std::fs::remove_file(format!("/dev/shm/ibcoll-{job}-n0"));
    (outs, victim_status)
}

fn check_survivors(size: usize, two_nodes: bool) {
    use std::os::unix::process::ExitStatusExt;
    let (outs, victim) = death_direct(size, two_nodes);
    assert_eq!(victim.signal(), Some(libc::SIGKILL), "victim: {victim:?}");
    for out in outs {
        let o = text(&out);
        eprintln!("{o}");
        assert!(out.status.success(), "survivor failed:\n{o}");
        assert!(
            o.contains("survivor: got expected error") && o.contains("peer lost"),
            "{o}"
        );
    }
}

#[test]
fn rank_death_mid_collective_over_shm_is_an_error() {
    check_survivors(2, false);
}

#[test]
fn rank_death_mid_collective_over_tcp_is_an_error() {
    check_survivors(2, true);
}

/// Rank 0 never talks to the victim (rank 2) in this allreduce; it must
/// still fail (the run's any-source sentinel), while rank 1, which did see
/// the death, stays alive until rank 0 has reported.
#[test]
fn rank_death_reaches_survivors_not_talking_to_it_shm() {
    check_survivors(3, false);
}

#[test]
fn rank_death_reaches_survivors_not_talking_to_it_tcp() {
    check_survivors(3, true);
}
