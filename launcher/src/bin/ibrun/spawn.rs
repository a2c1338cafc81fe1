//! Starting one rank: locally with an inherited PMI socket, or on another
//! host through the remote shell and ibrun's proxy.

use std::ffi::OsString;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};

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

/// The descriptor limit ibrun found, which its children get back (0: ibrun
/// left it alone).
static CHILD_NOFILE: AtomicU64 = AtomicU64::new(0);

/// Each rank costs ibrun three or four descriptors (PMI socket, output pipes,
/// input): raise the soft limit to the hard one so that a job of thousands
/// of ranks does not run out at the common default of 1024. The ranks start
/// with the limit ibrun was given.
pub fn raise_fd_limit() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        if soft < hard && setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_ok() {
            CHILD_NOFILE.store(soft, Ordering::Relaxed);
        }
    }
}

/// Runs in a forked child before exec: its own process group (so ibrun can
/// signal all it starts), the descriptor limit ibrun was given, and none of
/// the signals ibrun blocks for its signalfd stay blocked in the rank.
pub fn child_setup() -> std::io::Result<()> {
    let nofile = CHILD_NOFILE.load(Ordering::Relaxed);
    // SAFETY: setpgid, getrlimit, setrlimit, sigemptyset and sigprocmask are
    // plain system calls, safe between fork and exec; they act on this
    // (child) process and local structures only.
    unsafe {
        if libc::setpgid(0, 0) == -1 {
            return Err(std::io::Error::last_os_error());
        }
        if nofile > 0 {
            let mut lim: libc::rlimit = std::mem::zeroed();
            if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 {
                lim.rlim_cur = nofile as libc::rlim_t;
                libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
            }
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
    // SAFETY: the closure runs in the forked child before exec and only calls
    // async-signal-safe functions (fcntl, setpgid, sigprocmask,
    // sched_setaffinity); the PMI descriptor stays open in the parent until
    // spawn returns.
    unsafe {
        cmd.pre_exec(move || {
            if let Some(fd) = inherit_fd {
                if libc::fcntl(fd, libc::F_SETFD, 0) == -1 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            child_setup()?;
            if let Some(c) = cpu {
                bind_to_cpu(c)?;
            }
            Ok(())
        });
    }
    let child = cmd.spawn()?;
    Ok(Started {
        child,
        pmi: pair.map(|(parent, _child_end)| parent),
    })
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
    // SAFETY: setpgid is async-signal-safe; it runs in the child before exec.
    unsafe {
        cmd.pre_exec(child_setup);
    }
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
