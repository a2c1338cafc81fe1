//! Helpers shared by the launcher's process-level tests.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Command, Output};

pub fn ibrun() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_ibrun"))
}

/// An example program of this package (cargo test builds examples).
pub fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test exe");
    let dir = exe.parent().and_then(|d| d.parent()).expect("target dir");
    let p = dir.join("examples").join(name);
    assert!(
        p.exists(),
        "{} is missing: run `cargo build --workspace --bins --examples` first",
        p.display()
    );
    p
}

pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

pub fn run(cmd: &mut Command) -> Run {
    let Output {
        status,
        stdout,
        stderr,
    } = cmd.output().expect("spawn");
    let r = Run {
        code: status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&stdout).into_owned(),
        stderr: String::from_utf8_lossy(&stderr).into_owned(),
    };
    eprintln!(
        "exit {}\n--- stdout\n{}--- stderr\n{}",
        r.code, r.stdout, r.stderr
    );
    r
}

/// ibrun with the given arguments, bounded so that a hang fails the test.
pub fn ibrun_cmd(args: &[&str]) -> Command {
    let mut c = Command::new(ibrun());
    c.arg("--timeout").arg("60").args(args);
    c
}

/// True when a command exists on PATH.
pub fn have(cmd: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {cmd}"))
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

/// A tool the tests need: CI installs it, so there it must be present; a
/// developer without it gets the test skipped with a note.
pub fn require(cmd: &str) -> bool {
    if have(cmd) {
        return true;
    }
    if std::env::var("CI").is_ok() {
        panic!("{cmd} is required in CI but missing");
    }
    eprintln!("skipping: {cmd} not installed (scripts/setup installs it)");
    false
}

/// Checks that each of `ranks` printed `pmi_check rank R told (...): rank L
/// REASON` (pmi_check's `told-*` modes) for the lost rank `lost`.
pub fn assert_told(stdout: &str, ranks: &[usize], lost: usize, reason: &str) {
    for rank in ranks {
        let want = format!("pmi_check rank {rank} told (");
        let line = stdout
            .lines()
            .find(|l| l.starts_with(&want))
            .unwrap_or_else(|| panic!("rank {rank} was not told:\n{stdout}"));
        assert!(
            line.ends_with(&format!("): rank {lost} {reason}")),
            "{line}"
        );
    }
}
