//! Every way a job can fail ends it with one message naming the rank.

mod common;

use common::*;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn failure_line(stderr: &str) -> &str {
    stderr
        .lines()
        .find(|l| l.starts_with("ibrun: rank") || l.starts_with("ibrun: job"))
        .unwrap_or("")
}

#[test]
fn rank_exits_with_status_3() {
    let r = run(ibrun_cmd(&["-n", "3"])
        .arg(example("pmi_check"))
        .arg("exit-rank1"));
    assert_eq!(r.code, 3);
    let l = failure_line(&r.stderr);
    assert!(l.contains("rank 1 (host "), "{l}");
    assert!(l.contains(", pid "), "{l}");
    assert!(l.contains("exited with status 3"), "{l}");
}

#[test]
fn rank_killed_by_sigkill() {
    let r = run(ibrun_cmd(&["-n", "3"])
        .arg(example("pmi_check"))
        .arg("kill-rank1"));
    assert_eq!(r.code, 128 + 9);
    let l = failure_line(&r.stderr);
    assert!(
        l.contains("rank 1 (host ") && l.contains("killed by signal 9 (SIGKILL)"),
        "{l}"
    );
}

#[test]
fn survivors_are_told_which_rank_was_lost() {
    // Rank 0 hears of it on Pmi::event_fd (or during a call it was making),
    // rank 2 through the fence that fails; both before ibrun's TERM.
    let r = run(ibrun_cmd(&["-n", "3"])
        .arg(example("pmi_check"))
        .arg("told-kill-rank1"));
    assert_eq!(r.code, 137);
    assert_told(&r.stdout, &[0, 2], 1, "was killed by signal 9 (SIGKILL)");
    // Only the first loss is announced; ibrun ends the rest itself.
    assert_eq!(r.stderr.matches("ibrun: rank").count(), 1, "{}", r.stderr);
}

#[test]
fn only_ranks_that_asked_hear_of_a_lost_rank() {
    // Raw PMI from the shell: rank 1 dies after a barrier; rank 0 prints
    // every line it gets until ibrun ends it. An MPICH program never sends
    // ibcoll_notify and must never see an unsolicited line.
    let script = r#"printf "cmd=init pmi_version=1 pmi_subversion=1\n${SUB}cmd=barrier_in\n" >&$PMI_FD
while read -r l <&$PMI_FD; do echo "$PMI_RANK: $l"; case $l in cmd=barrier_out*) [ "$PMI_RANK" = 1 ] && kill -9 $$;; esac; done"#;
    let told = "0: cmd=ibcoll_failed rank=1 reason=was%20killed%20by%20signal%209%20(SIGKILL)";
    for (sub, want) in [("", false), ("cmd=ibcoll_notify\\n", true)] {
        let r = run(
            ibrun_cmd(&["-n", "2", "--kill-grace", "0.5", "bash", "-c", script]).env("SUB", sub),
        );
        assert_eq!(r.code, 137);
        assert!(r.stdout.contains("0: cmd=barrier_out rc=0"), "{}", r.stdout);
        assert_eq!(r.stdout.contains("ibcoll_failed"), want, "{}", r.stdout);
        if want {
            assert!(r.stdout.lines().any(|l| l == told), "{}", r.stdout);
            assert!(r.stdout.contains("0: cmd=ibcoll_notify_result rc=0"));
        }
    }
}

#[test]
fn rank_calls_abort() {
    let r = run(ibrun_cmd(&["-n", "3"])
        .arg(example("pmi_check"))
        .arg("abort"));
    assert_eq!(r.code, 5);
    let l = failure_line(&r.stderr);
    assert!(
        l.contains("rank 2 (host ") && l.contains("called abort with exit code 5"),
        "{l}"
    );
    assert!(l.contains("pmi_check was asked to abort"), "{l}");
}

#[test]
fn hung_rank_ends_with_timeout() {
    let start = Instant::now();
    let r = run(Command::new(ibrun())
        .args(["-n", "2", "--timeout", "2", "--kill-grace", "1"])
        .arg(example("pmi_check"))
        .arg("hang-rank0"));
    assert_eq!(r.code, 124);
    let l = failure_line(&r.stderr);
    assert!(l.contains("timed out after 2.0 s"), "{l}");
    assert!(l.contains("rank 0 (host "), "{l}");
    // Generous bound: only catches a job that would otherwise hang.
    assert!(start.elapsed() < Duration::from_secs(30));
}

#[test]
fn rank_that_ignores_term_is_killed() {
    let r = run(Command::new(ibrun())
        .args([
            "-n",
            "2",
            "--timeout",
            "1",
            "--kill-grace",
            "0.5",
            "sh",
            "-c",
        ])
        .arg("trap '' TERM; while :; do sleep 0.1; done"));
    assert_eq!(r.code, 124);
}

#[test]
fn missing_program() {
    let r = run(&mut ibrun_cmd(&["-n", "2", "/nonexistent/prog"]));
    assert_ne!(r.code, 0);
    assert!(r.stderr.contains("cannot start rank 0 (/nonexistent/prog)"));
}

#[test]
fn exit_without_finalize_after_init_fails_the_job() {
    let script = r#"printf 'cmd=init pmi_version=1 pmi_subversion=1\n' >&$PMI_FD; head -n 1 <&$PMI_FD >/dev/null; exit 0"#;
    let r = run(&mut ibrun_cmd(&["-n", "1", "bash", "-c", script]));
    assert_eq!(r.code, 1);
    assert!(r.stderr.contains("without calling PMI finalize"));
}

#[test]
fn bad_usage_is_reported() {
    for args in [
        vec!["-n", "0", "true"],
        vec!["true"],
        vec!["-n", "2", "--nodes", "3", "true"],
    ] {
        let r = run(Command::new(ibrun()).args(&args));
        assert_eq!(r.code, 2, "{args:?}");
        assert!(r.stderr.starts_with("ibrun: "));
    }
}

#[test]
fn sigterm_is_forwarded_to_ranks() {
    let mut child = Command::new(ibrun())
        .args(["-n", "3", "--timeout", "60", "sh", "-c"])
        .arg("trap 'echo got-term; exit 9' TERM; echo ready; while :; do sleep 0.05; done")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::{BufRead, BufReader};
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    for _ in 0..3 {
        line.clear();
        out.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "ready");
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = child.wait().unwrap();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
    assert_eq!(rest.matches("got-term").count(), 3, "{rest}");
    assert_eq!(status.code(), Some(128 + 15));
}
