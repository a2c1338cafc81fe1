//! Starting one rank: locally with an inherited PMI socket, or on another
//! host through the remote shell and ibrun's proxy.

use std::ffi::OsString;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};

use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};

use crate::plan::RankSlot;

/// Job-wide facts every rank's environment carries.
pub struct JobEnv {
    pub job_id: String,
    pub size: usize,
    pub num_nodes: usize,
    pub exports: Vec<(String, String)>,
    /// `host:port` of the TCP PMI server, when there is one.
    pub pmi_port: Option<String>,
    /// Local ranks also use TCP (a test of the PMI_PORT path).
    pub local_over_tcp: bool,
    /// `--bind-to core`: one CPU per rank of a host.
    pub bind: bool,
    /// Forward ibrun's standard input to a local rank 0.
    pub forward_stdin: bool,
    /// ibrun's standard error is a terminal. The ranks' is a pipe to ibrun,
    /// so without being told they could never show a progress line.
    pub stderr_tty: bool,
}

/// A started rank: the child process and ibrun's end of its PMI socket.
pub struct Started {
    pub child: Child,
    pub pmi: Option<OwnedFd>,
}

fn rank_vars(slot: &RankSlot, job: &JobEnv) -> Vec<(String, String)> {
    let mut v = vec![
        ("PMI_RANK".to_string(), slot.rank.to_string()),
        ("PMI_SIZE".into(), job.size.to_string()),
        ("IBCOLL_JOB_ID".into(), job.job_id.clone()),
        ("IBCOLL_NODE_ID".into(), slot.node.to_string()),
        ("IBCOLL_LOCAL_RANK".into(), slot.local_rank.to_string()),
        ("IBCOLL_LOCAL_SIZE".into(), slot.local_size.to_string()),
        ("IBCOLL_NUM_NODES".into(), job.num_nodes.to_string()),
        // ibcoll's client subscribes to news of lost ranks only from a
        // server that names its own kvsname here (ibrun's is the job id).
        ("IBCOLL_PMI_NOTIFY".into(), job.job_id.clone()),
    ];
    if job.stderr_tty {
        v.push(("IBCOLL_STDERR_TTY".into(), "1".into()));
    }
    v.extend(job.exports.iter().cloned());
    v
}

/// Each rank costs ibrun three or four descriptors (PMI socket, output
/// pipes, input): raise the soft limit as far as a job of `ranks` needs, so
/// that thousands of ranks do not run out at the common default of 1024.
/// Only as far as needed, since the ranks inherit it.
pub fn raise_fd_limit(ranks: usize) {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let need = 4 * ranks as u64 + 256;
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        if soft < need {
            let _ = setrlimit(Resource::RLIMIT_NOFILE, need.min(hard), hard);
        }
    }
}

/// Runs in a forked child before exec: its own process group (so ibrun can
/// signal all it starts), and none of the signals ibrun blocks for its
/// signalfd stay blocked in the rank. Only for ranks bound to a CPU: the
/// others start through posix_spawn, which does both itself.
fn child_setup() -> std::io::Result<()> {
    // SAFETY: setpgid, sigemptyset and sigprocmask are async-signal-safe and
    // operate on this (child) process and a local sigset only.
    unsafe {
        if libc::setpgid(0, 0) == -1 {
            return Err(std::io::Error::last_os_error());
        }
        unblock_all_signals()
    }
}

/// Clears the signal mask of the calling process.
///
/// # Safety
/// Only async-signal-safe calls; callable between fork and exec.
pub unsafe fn unblock_all_signals() -> std::io::Result<()> {
    let mut set: libc::sigset_t = std::mem::zeroed();
    libc::sigemptyset(&mut set);
    if libc::sigprocmask(libc::SIG_SETMASK, &set, std::ptr::null_mut()) == -1 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Pins the calling process to one CPU.
///
/// # Safety
/// Only async-signal-safe calls; callable between fork and exec.
pub unsafe fn bind_to_cpu(cpu: usize) -> std::io::Result<()> {
    let mut set: libc::cpu_set_t = std::mem::zeroed();
    libc::CPU_SET(cpu, &mut set);
    if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == -1 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The CPUs this process may run on, in order (what `--bind-to core`
/// hands out to the ranks of this host).
pub fn allowed_cpus() -> Vec<usize> {
    // SAFETY: sched_getaffinity writes into a zeroed cpu_set_t of the size
    // passed; CPU_ISSET only reads it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return vec![0];
        }
        let v: Vec<usize> = (0..libc::CPU_SETSIZE as usize)
            .filter(|&c| libc::CPU_ISSET(c, &set))
            .collect();
        if v.is_empty() {
            vec![0]
        } else {
            v
        }
    }
}

/// Starts a rank on this machine, pinned to `cpu` when given.
pub fn start_local(
    slot: &RankSlot,
    job: &JobEnv,
    program: &[String],
    cpu: Option<usize>,
) -> std::io::Result<Started> {
    let mut cmd = Command::new(&program[0]);
    // Like mpirun, ibrun's standard input goes to rank 0 only.
    let stdin = if slot.rank == 0 && job.forward_stdin {
        Stdio::piped()
    } else {
        Stdio::null()
    };
    cmd.args(&program[1..])
        .stdin(stdin)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in rank_vars(slot, job) {
        cmd.env(k, v);
    }
    let tcp = job
        .local_over_tcp
        .then_some(job.pmi_port.as_ref())
        .flatten();
    let mut pair = None;
    if let Some(port) = tcp {
        cmd.env("PMI_PORT", port)
            .env("PMI_ID", slot.rank.to_string());
        cmd.env_remove("PMI_FD");
    } else {
        let (parent, child_end) = socketpair(
            AddressFamily::Unix,
            SockType::Stream,
            None,
            SockFlag::SOCK_CLOEXEC,
        )?;
        cmd.env("PMI_FD", child_end.as_raw_fd().to_string());
        cmd.env_remove("PMI_PORT");
        pair = Some((parent, child_end));
    }
    let inherit_fd = pair.as_ref().map(|(_, c)| c.as_raw_fd());
    if let Some(c) = cpu {
        // SAFETY: the closure runs in the forked child before exec and only
        // calls async-signal-safe functions (fcntl, setpgid, sigprocmask,
        // sched_setaffinity); the PMI descriptor stays open in the parent
        // until spawn returns.
        unsafe {
            cmd.pre_exec(move || {
                if let Some(fd) = inherit_fd {
                    if libc::fcntl(fd, libc::F_SETFD, 0) == -1 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                child_setup()?;
                bind_to_cpu(c)
            });
        }
    } else {
        // Without a closure std starts the rank with posix_spawn (a vfork,
        // much cheaper than fork for many ranks), which sets the process
        // group and clears the signal mask itself. The PMI end must then be
        // inheritable: ibrun is single-threaded and starts one rank at a
        // time, so no other child can inherit it before it is closed here.
        cmd.process_group(0);
        if let Some(fd) = inherit_fd {
            set_cloexec(fd, false)?;
        }
    }
    let child = cmd.spawn();
    if let Some(fd) = inherit_fd {
        set_cloexec(fd, true)?;
    }
    Ok(Started {
        child: child?,
        pmi: pair.map(|(parent, _child_end)| parent),
    })
}

fn set_cloexec(fd: std::os::fd::RawFd, on: bool) -> std::io::Result<()> {
    let flag = if on { libc::FD_CLOEXEC } else { 0 };
    // SAFETY: fcntl on a descriptor this process owns and keeps open.
    if unsafe { libc::fcntl(fd, libc::F_SETFD, flag) } == -1 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Quotes a word for a POSIX shell.
pub fn shell_quote(s: &str) -> String {
    if !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./:=,+@%".contains(&b))
    {
        return s.to_string();
    }
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The command line the remote shell runs: ibrun's proxy with the rank's
/// environment, in the same directory (HPC hosts share file systems).
pub fn remote_command(
    slot: &RankSlot,
    job: &JobEnv,
    program: &[String],
) -> std::io::Result<String> {
    let me = std::env::current_exe()?;
    let cwd = std::env::current_dir()?;
    let mut words = vec!["exec".to_string(), "env".to_string()];
    let port = job.pmi_port.clone().unwrap_or_default();
    let mut vars = rank_vars(slot, job);
    vars.push(("PMI_PORT".into(), port));
    vars.push(("PMI_ID".into(), slot.rank.to_string()));
    for (k, v) in vars {
        words.push(shell_quote(&format!("{k}={v}")));
    }
    words.push(shell_quote(&me.to_string_lossy()));
    words.push("--proxy".into());
    if job.bind {
        // The proxy knows the remote host's CPUs; it binds by local rank.
        words.push(format!("--bind-local-rank={}", slot.local_rank));
    }
    words.push("--".into());
    let prog = if program[0].contains('/') && !program[0].starts_with('/') {
        cwd.join(&program[0]).to_string_lossy().into_owned()
    } else {
        program[0].clone()
    };
    words.push(shell_quote(&prog));
    words.extend(program[1..].iter().map(|a| shell_quote(a)));
    Ok(format!(
        "cd {} 2>/dev/null; {}",
        shell_quote(&cwd.to_string_lossy()),
        words.join(" ")
    ))
}

/// Starts a rank on `host` through the remote shell.
pub fn start_remote(
    slot: &RankSlot,
    host: &str,
    rsh: &str,
    srun: bool,
    job: &JobEnv,
    program: &[String],
) -> std::io::Result<Started> {
    let line = remote_command(slot, job, program)?;
    let mut cmd = if srun {
        // One single-task step per rank on the chosen node; --overlap lets
        // the steps share the allocation's CPUs with each other.
        let mut c = Command::new("srun");
        c.args(["--mpi=none", "--overlap", "--quiet", "-N1", "-n1", "-w"])
            .arg(host)
            .args(["sh", "-c"])
            .arg(line);
        c
    } else {
        let mut rsh_words = rsh.split_whitespace().map(OsString::from);
        let exe = rsh_words
            .next()
            .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "empty --rsh"))?;
        let mut c = Command::new(exe);
        c.args(rsh_words).arg(host).arg(line);
        c
    };
    cmd
        // The proxy ends its rank when this pipe closes, so a lost ibrun or
        // a dropped ssh connection never leaves ranks behind.
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd.process_group(0);
    Ok(Started {
        child: cmd.spawn()?,
        pmi: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting() {
        assert_eq!(shell_quote("abc"), "abc");
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_quote(""), "''");
        assert_eq!(shell_quote("A=1"), "A=1");
    }
}
