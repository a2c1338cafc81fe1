//! The `srun --mpi=none` key-value store (rank 0's thread) without Slurm:
//! the tasks are started here with the environment srun gives them. The
//! real Slurm checks are in scripts/slurm-test.

mod common;

use common::*;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct Task {
    child: Child,
}

/// Starts `n` tasks of `pmi_check args` as one step of a fake Slurm job.
fn start(n: usize, nodelist: &str, path_prefix: Option<&Path>, args: &[&str]) -> Vec<Task> {
    let job = std::process::id() as u64 * 16 + n as u64;
    // Ports of our own, away from other test runs (rank 0 listens on one).
    let base = 20_000 + (std::process::id() % 2_000) as u16 * 4;
    (0..n)
        .map(|rank| {
            let mut c = Command::new(example("pmi_check"));
            c.args(args)
                .env_remove("PMI_FD")
                .env_remove("PMI_PORT")
                .env_remove("IBCOLL_PMI_NOTIFY")
                .env("SLURM_JOB_ID", job.to_string())
                .env("SLURM_STEP_ID", "0")
                .env("SLURM_PROCID", rank.to_string())
                .env("SLURM_STEP_NUM_TASKS", n.to_string())
                .env("SLURM_STEP_NODELIST", nodelist)
                .env("SLURM_STEP_TASKS_PER_NODE", n.to_string())
                .env("IBCOLL_SLURM_PORT_BASE", base.to_string())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            if let Some(dir) = path_prefix {
                let path = std::env::var("PATH").unwrap_or_default();
                c.env("PATH", format!("{}:{path}", dir.display()));
            }
            Task {
                child: c.spawn().expect("spawn pmi_check"),
            }
        })
        .collect()
}

/// Waits for every task (bounded, so that a hang fails the test); returns
/// each one's exit code (or signal as 128+N) and output.
fn finish(tasks: Vec<Task>) -> Vec<(i32, String, String)> {
    use std::os::unix::process::ExitStatusExt;
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut out = Vec::new();
    for mut t in tasks {
        let status = loop {
            if let Some(s) = t.child.try_wait().expect("wait") {
                break s;
            }
            if Instant::now() > deadline {
                let _ = t.child.kill();
                panic!("a task hung");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let o = t.child.wait_with_output().expect("output");
        let code = status
            .code()
            .unwrap_or_else(|| 128 + status.signal().unwrap_or(0));
        out.push((
            code,
            String::from_utf8_lossy(&o.stdout).into_owned(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        ));
    }
    for (i, (c, o, e)) in out.iter().enumerate() {
        eprintln!("task {i}: exit {c}\n{o}{e}");
    }
    out
}

#[test]
fn store_serves_a_ring_of_64_tasks() {
    let out = finish(start(64, "localhost", None, &["ring"]));
    for (rank, (code, stdout, _)) in out.iter().enumerate() {
        assert_eq!(*code, 0, "task {rank}");
        let want =
            format!("pmi_check ring ok rank={rank} size=64 notify=true puts=1 gets=3 fences=2");
        assert!(stdout.contains(&want), "{stdout}");
    }
}

#[test]
fn store_tells_survivors_and_finds_a_node_by_its_slurm_address() {
    // The first node's name does not resolve: the tasks ask `scontrol`
    // (here a stand-in) for its NodeAddr, as on clusters without DNS.
    let dir = std::env::temp_dir().join(format!("ibcoll-fake-slurm-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let scontrol = dir.join("scontrol");
    std::fs::write(
        &scontrol,
        "#!/bin/sh\n[ \"$1 $2 $3\" = \"show node -o\" ] && echo \"NodeName=$4 NodeAddr=127.0.0.1 State=IDLE\"\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&scontrol, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = finish(start(3, "node1.invalid", Some(&dir), &["told-kill-rank1"]));
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(out[1].0, 128 + 9);
    for rank in [0, 2] {
        let (code, stdout, _) = &out[rank];
        assert_eq!(*code, 0, "task {rank}");
        assert!(stdout.contains("mode=Slurm"), "{stdout}");
        assert_told(stdout, &[rank], 1, "disconnected before finalize");
    }
}
