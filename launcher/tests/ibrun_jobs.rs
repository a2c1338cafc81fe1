//! ibrun end to end: real processes, real PMI traffic.

mod common;

use common::*;
use std::process::Command;

fn ok_lines(out: &str) -> Vec<&str> {
    let mut v: Vec<&str> = out.lines().filter(|l| l.contains("pmi_check ok")).collect();
    v.sort();
    v
}

#[test]
fn three_ranks_exchange_values() {
    let r = run(ibrun_cmd(&["-n", "3"]).arg(example("pmi_check")));
    assert_eq!(r.code, 0);
    let lines = ok_lines(&r.stdout);
    assert_eq!(lines.len(), 3);
    for (i, l) in lines.iter().enumerate() {
        assert!(
            l.contains(&format!(
                "rank={i} size=3 node=0 local={i}/3 nodes=1 map=0,0,0 mode=Fd"
            )),
            "{l}"
        );
    }
}

#[test]
fn virtual_nodes_place_ranks_in_blocks() {
    let r = run(ibrun_cmd(&["-n", "5", "--nodes", "2", "--tag-output"]).arg(example("pmi_check")));
    assert_eq!(r.code, 0);
    for (rank, node, local) in [(0, 0, "0/3"), (2, 0, "2/3"), (3, 1, "0/2"), (4, 1, "1/2")] {
        let want = format!(
            "[{rank}] pmi_check ok rank={rank} size=5 node={node} local={local} nodes=2 map=0,0,0,1,1"
        );
        assert!(r.stdout.lines().any(|l| l.starts_with(&want)), "{want}");
    }
}

#[test]
fn ppn_and_tcp_pmi_path() {
    let r = run(ibrun_cmd(&["-n", "3", "--ppn", "2"])
        .env("IBRUN_PMI_TCP", "1")
        .arg(example("pmi_check")));
    assert_eq!(r.code, 0);
    let lines = ok_lines(&r.stdout);
    assert_eq!(lines.len(), 3);
    assert!(lines
        .iter()
        .all(|l| l.contains("mode=Port") && l.contains("map=0,0,1")));
}

#[test]
fn singleton_without_launcher() {
    let r = run(Command::new(example("pmi_check"))
        .env_remove("PMI_FD")
        .env_remove("PMI_PORT"));
    assert_eq!(r.code, 0);
    assert!(r
        .stdout
        .contains("rank=0 size=1 node=0 local=0/1 nodes=1 map=0 mode=Singleton"));
}

#[test]
fn environment_and_exports() {
    std::env::set_var("IBCOLL_TEST_FORWARDED", "fwd");
    let r = run(ibrun_cmd(&["-n", "2", "--nodes", "2", "-x", "A=1", "-x", "IBCOLL_TEST_FORWARDED"])
        .args(["sh", "-c", "echo \"$PMI_RANK/$PMI_SIZE $IBCOLL_NODE_ID $IBCOLL_LOCAL_RANK/$IBCOLL_LOCAL_SIZE $IBCOLL_NUM_NODES $A $IBCOLL_TEST_FORWARDED ${IBCOLL_JOB_ID:+job} ${PMI_FD:+fd}\""]));
    assert_eq!(r.code, 0);
    let mut lines: Vec<&str> = r.stdout.lines().collect();
    lines.sort();
    assert_eq!(
        lines,
        vec!["0/2 0 0/1 2 1 fwd job fd", "1/2 1 0/1 2 1 fwd job fd"]
    );
}

#[test]
fn unmodified_mpich_program() {
    if !require("mpicc.mpich") {
        return;
    }
    let dir = std::env::temp_dir().join(format!("ibrun-mpich-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("ring.c");
    std::fs::write(
        &src,
        r#"#include <mpi.h>
#include <stdio.h>
int main(int argc, char **argv) {
    int rank, size, left, sum, node_local;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int right = (rank + 1) % size, from = (rank + size - 1) % size;
    MPI_Sendrecv(&rank, 1, MPI_INT, right, 7, &left, 1, MPI_INT, from, 7,
                 MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    MPI_Allreduce(&rank, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Comm shared;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &shared);
    MPI_Comm_size(shared, &node_local);
    printf("rank %d of %d received %d sum %d node-local %d\n", rank, size, left, sum, node_local);
    MPI_Finalize();
    return 0;
}
"#,
    )
    .unwrap();
    let exe = dir.join("ring");
    let st = Command::new("mpicc.mpich")
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .status()
        .unwrap();
    assert!(st.success());
    for (args, size, per_node) in [
        (vec!["-n", "3"], 3, [3, 3, 3, 0]),
        (vec!["-n", "4", "--nodes", "2"], 4, [2, 2, 2, 2]),
    ] {
        let r = run(ibrun_cmd(&args).arg(&exe));
        assert_eq!(r.code, 0);
        let sum: i32 = (0..size).sum();
        for rank in 0..size {
            let want = format!(
                "rank {rank} of {size} received {} sum {sum} node-local {}",
                (rank + size - 1) % size,
                per_node[rank as usize]
            );
            assert!(r.stdout.lines().any(|l| l == want), "missing {want:?}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn client_under_mpich_hydra() {
    if !require("mpiexec.mpich") {
        return;
    }
    let r = run(Command::new("mpiexec.mpich")
        .args(["-n", "3"])
        .arg(example("pmi_check")));
    assert_eq!(r.code, 0);
    let lines = ok_lines(&r.stdout);
    assert_eq!(lines.len(), 3);
    for (i, l) in lines.iter().enumerate() {
        assert!(
            l.contains(&format!("rank={i} size=3 node=0 local={i}/3 nodes=1")),
            "{l}"
        );
    }
}

#[test]
fn malformed_pmi_lines_get_error_replies() {
    // A rank that speaks garbage gets an error reply, then a normal answer;
    // ibrun neither crashes nor hangs.
    let script = r#"printf 'garbage\ncmd=frob x=1\ncmd=put kvsname=x\ncmd=get_maxes\n' >&$PMI_FD; head -n 4 <&$PMI_FD"#;
    let r = run(&mut ibrun_cmd(&["-n", "1", "bash", "-c", script]));
    assert_eq!(r.code, 0);
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert_eq!(lines.len(), 4, "{lines:?}");
    assert!(lines[0].starts_with("cmd=error rc=-1"));
    assert!(lines[1].starts_with("cmd=frob_result rc=-1"));
    assert!(lines[2].starts_with("cmd=put_result rc=-1"));
    assert!(lines[3].starts_with("cmd=maxes "));
    assert!(r.stderr.contains("malformed line from rank 0"));
    assert!(r.stderr.contains("unknown command"));
}

#[test]
fn bind_to_core_pins_each_rank_to_one_cpu() {
    let r = run(ibrun_cmd(&[
        "-n",
        "3",
        "--nodes",
        "2",
        "--bind-to",
        "core",
        "--tag-output",
        "sh",
        "-c",
    ])
    .arg("grep Cpus_allowed_list /proc/self/status"));
    assert_eq!(r.code, 0);
    let mut cpus = Vec::new();
    for rank in 0..3 {
        let line = r
            .stdout
            .lines()
            .find(|l| l.starts_with(&format!("[{rank}] ")))
            .expect("a line per rank");
        let list = line.rsplit('\t').next().unwrap_or("").trim();
        let cpu: usize = list
            .parse()
            .unwrap_or_else(|_| panic!("not one cpu: {line}"));
        cpus.push(cpu);
    }
    // Ranks of both virtual nodes share this machine's CPUs round-robin.
    let n = std::thread::available_parallelism().map_or(1, |n| n.get());
    if n >= 2 {
        assert_ne!(cpus[0], cpus[1]);
    }
}

#[test]
fn stdin_goes_to_rank_0_only() {
    use std::io::Write;
    let mut child = ibrun_cmd(&["-n", "3", "--tag-output", "sh", "-c", "wc -l"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    let lines: String = (0..50_000).map(|i| format!("line {i}\n")).collect();
    input.write_all(lines.as_bytes()).unwrap();
    drop(input);
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    let mut got: Vec<&str> = text.lines().collect();
    got.sort();
    assert_eq!(got, vec!["[0] 50000", "[1] 0", "[2] 0"]);
}

#[test]
fn leftover_shared_memory_of_the_job_is_removed() {
    // A rank that dies before the node segment is unlinked leaves its file
    // behind; ibrun removes every /dev/shm/ibcoll-<job>-* when the job ends.
    let r = run(ibrun_cmd(&["-n", "2", "sh", "-c"])
        .arg("f=/dev/shm/ibcoll-$IBCOLL_JOB_ID-n$PMI_RANK; touch $f; echo $f; kill -9 $$"));
    assert_eq!(r.code, 137);
    let files: Vec<&str> = r.stdout.lines().collect();
    assert!(!files.is_empty());
    for f in files {
        assert!(f.starts_with("/dev/shm/ibcoll-j"), "{f}");
        assert!(!std::path::Path::new(f).exists(), "{f} was left behind");
    }
}
