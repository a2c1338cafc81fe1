//! Helpers shared by ibcoll's process-level tests.
#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};

use ibcoll_launcher::server::{Action, ConnId, PmiServer, ServerConfig};

/// `target/<profile>`, where ibrun and the examples are built.
pub fn target_dir() -> PathBuf {
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

pub fn ibrun() -> PathBuf {
    built(target_dir().join("ibrun"))
}

pub fn example(name: &str) -> PathBuf {
    built(target_dir().join("examples").join(name))
}

/// Runs `ibrun --timeout T <launcher args> <example prog> <args>`. The
/// caller's own transport settings are cleared so that only what the test
/// passes with `-x` applies; the timeout only turns a hang into a failure.
pub fn run_job(timeout_s: u32, launcher: &[&str], prog: &str, args: &[&str]) -> Output {
    let t = std::time::Instant::now();
    let o = Command::new(ibrun())
        .arg("--timeout")
        .arg(timeout_s.to_string())
        .args(launcher)
        .arg(example(prog))
        .args(args)
        .env_remove("IBCOLL_TRANSPORT")
        .env_remove("IBCOLL_CMA")
        .env_remove("IBCOLL_IB_DEVICE")
        .output()
        .expect("spawn ibrun");
    // Shown with --nocapture or on failure: how long each job took.
    eprintln!(
        "{launcher:?} {prog} {args:?}: {:.1} s",
        t.elapsed().as_secs_f64()
    );
    o
}

/// A job's status and output, for assertion messages.
pub fn text(o: &Output) -> String {
    format!(
        "status: {:?}\n--- stdout\n{}--- stderr\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// [`run_job`] that must succeed; returns its stdout.
pub fn run_job_ok(timeout_s: u32, launcher: &[&str], prog: &str, args: &[&str]) -> String {
    let o = run_job(timeout_s, launcher, prog, args);
    assert!(
        o.status.success(),
        "{launcher:?} {prog} {args:?} failed:\n{}",
        text(&o)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

struct Shared {
    server: PmiServer,
    writers: HashMap<ConnId, UnixStream>,
}

fn deliver(shared: &mut Shared, actions: Vec<Action>) {
    for a in actions {
        if let Action::Reply(to, text) = a {
            if let Some(w) = shared.writers.get_mut(&to) {
                let _ = w.write_all(text.as_bytes());
            }
        }
    }
}

fn serve(shared: Arc<Mutex<Shared>>, id: ConnId, conn: UnixStream) {
    let mut lines = BufReader::new(conn);
    let mut line = Vec::new();
    loop {
        line.clear();
        if lines.read_until(b'\n', &mut line).unwrap_or(0) == 0 {
            let mut s = shared.lock().unwrap();
            let actions = s.server.remove_conn(id);
            deliver(&mut s, actions);
            return;
        }
        let mut s = shared.lock().unwrap();
        let actions = s.server.handle_line(id, &line);
        deliver(&mut s, actions);
    }
}

/// Starts `prog args` as one rank per entry of `nodes` (the node of each
/// rank) with no launcher: the project's PMI server runs on threads of the
/// test, over socketpairs. Unlike ibrun, nothing kills the other ranks when
/// one dies, so a test can see what the survivors themselves report.
/// Every child is SIGKILLed after `watchdog_s`, so a hang fails the test
/// instead of blocking it.
pub fn start_without_launcher(
    prog: &str,
    args: &[&str],
    nodes: &[usize],
    job: &str,
    env: &[(&str, &str)],
    watchdog_s: u64,
) -> Vec<Child> {
    let size = nodes.len();
    let shared = Arc::new(Mutex::new(Shared {
        server: PmiServer::new(ServerConfig::new(job, size)),
        writers: HashMap::new(),
    }));
    let num_nodes = {
        let mut n = nodes.to_vec();
        n.sort_unstable();
        n.dedup();
        n.len()
    };
    let mut children = Vec::new();
    for (rank, &node) in nodes.iter().enumerate() {
        let (ours, theirs) = UnixStream::pair().expect("socketpair");
        {
            let mut s = shared.lock().unwrap();
            s.server.add_conn(rank, Some(rank));
            s.writers.insert(rank, ours.try_clone().expect("clone"));
        }
        let sh = shared.clone();
        std::thread::spawn(move || serve(sh, rank, ours));
        let local: Vec<usize> = (0..size).filter(|&r| nodes[r] == node).collect();
        let local_rank = local.iter().position(|&r| r == rank).unwrap_or(0);
        let fd = theirs.as_raw_fd();
        let mut cmd = Command::new(example(prog));
        cmd.args(args)
            .env("PMI_FD", "3")
            .env("PMI_RANK", rank.to_string())
            .env("PMI_SIZE", size.to_string())
            .env("IBCOLL_NODE_ID", node.to_string())
            .env("IBCOLL_LOCAL_RANK", local_rank.to_string())
            .env("IBCOLL_LOCAL_SIZE", local.len().to_string())
            .env("IBCOLL_NUM_NODES", num_nodes.to_string())
            .env("IBCOLL_JOB_ID", job)
            .env_remove("PMI_PORT")
            .env_remove("IBCOLL_TRANSPORT")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
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
        children.push(cmd.spawn().expect("spawn rank"));
        drop(theirs);
    }
    // Process descriptors, taken while the children cannot have been
    // reaped yet: a signal through one reaches that process or nobody,
    // never another that got its pid after it was reaped (pids wrap at
    // 32768 here, and a test run starts many thousands of processes).
    let pidfds: Vec<i32> = children
        .iter()
        // SAFETY: pidfd_open takes a pid and flags and returns a new
        // descriptor (or -1); no memory is passed.
        .map(|c| unsafe { libc::syscall(libc::SYS_pidfd_open, c.id() as libc::pid_t, 0) } as i32)
        .collect();
    std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_secs(watchdog_s));
        for fd in pidfds.into_iter().filter(|&fd| fd >= 0) {
            // SAFETY: `fd` is a pidfd this thread owns; the call passes no
            // siginfo (null) and no flags, and the descriptor is closed once.
            unsafe {
                libc::syscall(
                    libc::SYS_pidfd_send_signal,
                    fd,
                    libc::SIGKILL,
                    std::ptr::null::<libc::siginfo_t>(),
                    0,
                );
                libc::close(fd);
            }
        }
    });
    children
}

/// Removes the node segments a killed job may leave behind.
pub fn remove_segments(job: &str, nodes: usize) {
    for n in 0..nodes {
        let _ = std::fs::remove_file(format!("/dev/shm/ibcoll-{job}-n{n}"));
    }
}

/// Checks that the output of `p2p_check all` reports every check passed.
pub fn assert_p2p_checks_ok(out: &str) {
    for c in [
        "anysource",
        "order",
        "wildcard",
        "probe",
        "truncate",
        "ssend",
        "split",
        "ring",
    ] {
        assert!(out.contains(&format!("{c}: ok")), "{c} missing:\n{out}");
    }
}
