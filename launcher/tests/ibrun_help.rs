//! `ibrun --help` exits 0 and lists every option, and every option it
//! lists is one the parser knows.

mod common;

use common::*;
use std::process::Command;

fn help() -> String {
    let r = run(Command::new(ibrun()).arg("--help"));
    assert_eq!(r.code, 0);
    r.stdout
}

#[test]
fn help_lists_the_options() {
    let h = help();
    for opt in [
        "usage: ibrun -n N",
        "-n, -np N",
        "--nodes K",
        "--ppn P",
        "--hosts h1,h2",
        "--hostfile F",
        "--rsh CMD",
        "--launcher ssh|srun",
        "--pmi-addr ADDR",
        "--tag-output",
        "-x VAR[=VAL]",
        "--timeout SECS",
        "--bind-to core|none",
        "--kill-grace SECS",
        "-v, --verbose",
        "-h, --help",
        "--version",
    ] {
        assert!(h.contains(opt), "{opt} missing:\n{h}");
    }
    let r = run(Command::new(ibrun()).arg("--version"));
    assert_eq!(r.code, 0);
    assert!(r.stdout.starts_with("ibrun (ibcoll) "), "{}", r.stdout);
}

#[test]
fn every_listed_option_is_known() {
    let h = help();
    let listed = h
        .lines()
        .filter_map(|l| l.strip_prefix("  "))
        .filter(|l| l.starts_with('-'))
        .map(|l| l.split("  ").next().unwrap_or(""));
    let mut seen = 0;
    for left in listed {
        // `-n, -np N` -> flags -n and -np, each taking a value.
        let words: Vec<&str> = left.split([',', ' ']).filter(|w| !w.is_empty()).collect();
        let takes_value = words.last().is_some_and(|w| !w.starts_with('-'));
        for flag in words.iter().filter(|w| w.starts_with('-')) {
            if ["-h", "--help", "--version"].contains(flag) {
                continue;
            }
            let mut cmd = Command::new(ibrun());
            cmd.arg(flag);
            if takes_value {
                cmd.arg("1");
            }
            // No program: the parser answers without starting a job.
            let r = run(&mut cmd);
            assert_eq!(r.code, 2, "{flag}");
            assert!(!r.stderr.contains("unknown option"), "{flag}: {}", r.stderr);
            seen += 1;
        }
    }
    assert!(seen >= 15, "only {seen} options found in:\n{h}");
}

#[test]
fn a_bad_option_is_named() {
    let r = run(Command::new(ibrun()).args(["--bogus", "-n", "1", "true"]));
    assert_eq!(r.code, 2);
    assert!(
        r.stderr.contains("unknown option \"--bogus\""),
        "{}",
        r.stderr
    );
}
