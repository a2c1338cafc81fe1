//! Many ranks on a machine of few cores: ibrun's loop and PMI server must
//! cost what is active, so these finish in seconds. Only results are
//! checked here; `benches/launch.sh` measures the time.

mod common;

use common::*;

/// Every rank's `pmi_check ring` line, checked: each subscribed to news of
/// lost ranks, and made one put, three gets (its placement and its two
/// neighbours' values) and two fences.
fn check_ring(stdout: &str, n: usize, mode: &str) {
    let mut seen = vec![false; n];
    for l in stdout
        .lines()
        .filter(|l| l.starts_with("pmi_check ring ok"))
    {
        let rank: usize = l
            .split_whitespace()
            .find_map(|w| w.strip_prefix("rank="))
            .and_then(|r| r.parse().ok())
            .expect("a rank");
        assert!(
            l.contains(&format!(
                "size={n} notify=true puts=1 gets=3 fences=2 bytes_fetched="
            )),
            "{l}"
        );
        assert!(!seen[rank], "rank {rank} twice");
        seen[rank] = true;
    }
    let missing: Vec<usize> = (0..n).filter(|&r| !seen[r]).collect();
    assert!(
        missing.is_empty(),
        "no line from ranks {missing:?} ({mode})"
    );
}

#[test]
fn five_hundred_twelve_ranks_of_true() {
    let r = run(&mut ibrun_cmd(&["-n", "512", "/bin/true"]));
    assert_eq!(r.code, 0);
    assert!(r.stderr.is_empty(), "{}", r.stderr);
}

#[test]
fn pmi_job_of_512_ranks_on_256_virtual_nodes() {
    let r = run(ibrun_cmd(&["-n", "512", "--nodes", "256"])
        .arg(example("pmi_check"))
        .arg("ring"));
    assert_eq!(r.code, 0);
    check_ring(&r.stdout, 512, "socketpairs");
}

#[test]
fn pmi_job_of_256_ranks_over_tcp() {
    // Every rank connects to ibrun's listener at once.
    let r = run(ibrun_cmd(&["-n", "256"])
        .env("IBRUN_PMI_TCP", "1")
        .arg(example("pmi_check"))
        .arg("ring"));
    assert_eq!(r.code, 0);
    check_ring(&r.stdout, 256, "tcp");
}

#[test]
fn first_failure_of_256_ranks_is_named_and_the_rest_ended() {
    let r = run(ibrun_cmd(&["-n", "256"])
        .arg(example("pmi_check"))
        .arg("ring-kill-rank1"));
    assert_eq!(r.code, 137);
    let failures: Vec<&str> = r
        .stderr
        .lines()
        .filter(|l| l.starts_with("ibrun: rank"))
        .collect();
    assert_eq!(failures.len(), 1, "{failures:?}");
    assert!(
        failures[0].contains("rank 1 (host ") && failures[0].contains("killed by signal 9"),
        "{}",
        failures[0]
    );
}
