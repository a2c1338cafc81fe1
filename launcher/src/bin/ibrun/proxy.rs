//! `ibrun --proxy -- prog args`: runs one remote rank on its host.
//!
//! The remote shell starts the proxy, which starts the rank and stays with it:
//! it reports the rank's pid and how it ended to ibrun (as marked lines on
//! stderr), forwards TERM/INT/HUP, and kills the rank when its standard input
//! closes — that happens when ibrun or the ssh connection goes away — so that
//! no rank outlives its job.

use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::os::unix::process::ExitStatusExt;
use std::process::Command;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::job::{block_signals, End};

const MARK: &str = "\u{1e}ibrun-proxy ";

#[derive(Debug, PartialEq, Eq)]
pub enum Marker {
    Pid(i32),
    Ended(End),
}

/// Finds a proxy report in a line; returns the text before it and the report.
pub fn parse_marker(line: &[u8]) -> Option<(&[u8], Marker)> {
    let mark = MARK.as_bytes();
    let pos = line.windows(mark.len()).position(|w| w == mark)?;
    let rest = std::str::from_utf8(&line[pos + mark.len()..]).ok()?;
    let (k, v) = rest.trim().split_once('=')?;
    let v: i32 = v.parse().ok()?;
    let m = match k {
        "pid" => Marker::Pid(v),
        "exit" => Marker::Ended(End::Code(v)),
        "signal" => Marker::Ended(End::Signal(v)),
        _ => return None,
    };
    Some((&line[..pos], m))
}

fn report(what: &str) {
    eprintln!("{MARK}{what}");
}

/// Removes this job's leftover shared-memory segments on this host.
pub fn cleanup_shm(job_id: &str) {
    let prefix = format!("ibcoll-{job_id}-");
    if let Ok(dir) = std::fs::read_dir("/dev/shm") {
        for e in dir.flatten() {
            if e.file_name().to_string_lossy().starts_with(&prefix) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
}

pub fn run(mut args: Vec<String>) -> i32 {
    let mut bind = None;
    if let Some(v) = args
        .first()
        .and_then(|a| a.strip_prefix("--bind-local-rank="))
    {
        bind = v.parse::<usize>().ok();
        args.remove(0);
    }
    let program: Vec<String> = match args.first().map(String::as_str) {
        Some("--") => args[1..].to_vec(),
        _ => args,
    };
    let cpu = bind.map(|r| {
        let cpus = crate::spawn::allowed_cpus();
        cpus[r % cpus.len()]
    });
    if program.is_empty() {
        eprintln!("ibrun --proxy: no program");
        return 2;
    }
    let signals = match block_signals() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("ibrun --proxy: cannot set up signals: {e}");
            return 2;
        }
    };
    let mut cmd = Command::new(&program[0]);
    cmd.args(&program[1..]);
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            crate::spawn::unblock_all_signals()?;
            if let Some(c) = cpu {
                crate::spawn::bind_to_cpu(c)?;
            }
            Ok(())
        });
    }
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("ibrun --proxy: cannot start {}: {e}", program[0]);
            report("exit=127");
            return 127;
        }
    };
    let pid = child.id() as i32;
    report(&format!("pid={pid}"));
    let stdin_fd = std::io::stdin().as_raw_fd();
    let mut stdin_open = true;
    let mut kill_at: Option<Instant> = None;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            if let Ok(job) = std::env::var("IBCOLL_JOB_ID") {
                cleanup_shm(&job);
            }
            return match (status.code(), status.signal()) {
                (Some(c), _) => {
                    report(&format!("exit={c}"));
                    c
                }
                (None, Some(s)) => {
                    report(&format!("signal={s}"));
                    128 + s
                }
                _ => 1,
            };
        }
        let mut fds = vec![libc::pollfd {
            fd: signals.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }];
        if stdin_open {
            fds.push(libc::pollfd {
                fd: stdin_fd,
                events: libc::POLLIN,
                revents: 0,
            });
        }
        // SAFETY: valid pollfd array with its true length; descriptors open.
        unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 200) };
        while let Ok(Some(info)) = signals.read_signal() {
            let sig = info.ssi_signo as i32;
            if let Ok(s @ (Signal::SIGTERM | Signal::SIGINT | Signal::SIGHUP)) =
                Signal::try_from(sig)
            {
                let _ = kill(Pid::from_raw(pid), s);
                kill_at.get_or_insert(Instant::now() + Duration::from_secs(2));
            }
        }
        if stdin_open && fds.len() > 1 && fds[1].revents != 0 {
            let mut b = [0u8; 256];
            // SAFETY: reading into a stack buffer of the given length.
            let n = unsafe { libc::read(stdin_fd, b.as_mut_ptr().cast(), b.len()) };
            if n <= 0 {
                stdin_open = false;
                let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
                kill_at.get_or_insert(Instant::now() + Duration::from_secs(2));
            }
        }
        if kill_at.is_some_and(|t| Instant::now() >= t) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers() {
        let l = format!("partial{MARK}pid=42");
        assert_eq!(
            parse_marker(l.as_bytes()),
            Some((&b"partial"[..], Marker::Pid(42)))
        );
        let l = format!("{MARK}signal=9");
        assert_eq!(
            parse_marker(l.as_bytes()).map(|x| x.1),
            Some(Marker::Ended(End::Signal(9)))
        );
        assert_eq!(parse_marker(b"plain line"), None);
        let l = format!("{MARK}bogus=1");
        assert_eq!(parse_marker(l.as_bytes()), None);
    }
}
