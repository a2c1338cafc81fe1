//! `ibrun`: starts the ranks of an ibcoll (or MPICH) job and serves PMI-1.

mod cli;
mod job;
mod output;
mod plan;
mod proxy;
mod spawn;

use std::io::IsTerminal;
use std::net::{IpAddr, SocketAddr, TcpListener, ToSocketAddrs, UdpSocket};
use std::os::fd::AsRawFd;

use ibcoll_launcher::mapping::format_process_mapping;
use ibcoll_launcher::server::{PmiServer, ServerConfig};

use cli::Parsed;
use job::Job;
use output::OutputSink;
use spawn::JobEnv;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let code = match cli::parse(&args) {
        Ok(Parsed::Help) => {
            print!("{}", cli::USAGE);
            0
        }
        Ok(Parsed::Version) => {
            println!("ibrun (ibcoll) {}", env!("CARGO_PKG_VERSION"));
            0
        }
        Ok(Parsed::Proxy(rest)) => proxy::run(rest),
        Ok(Parsed::Run(opts)) => match run(opts) {
            Ok(code) => code,
            Err(e) => {
                eprintln!("ibrun: {e}");
                2
            }
        },
        Err(e) => {
            eprintln!("ibrun: {e}");
            2
        }
    };
    std::process::exit(code);
}

fn new_job_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("j{}x{:x}", std::process::id(), nanos & 0xffffff)
}

/// The address remote hosts can reach us at: the source address the kernel
/// would use towards the first remote host that is an address or resolves
/// (a UDP connect sends nothing). Hosts are often given as addresses where
/// names do not resolve; what ranks are told is always an address.
fn pick_pmi_addr(explicit: Option<&str>, remotes: &[&str]) -> Result<IpAddr, String> {
    if let Some(a) = explicit {
        return a
            .parse()
            .map_err(|_| format!("--pmi-addr {a:?} is not an IP address"));
    }
    if remotes.is_empty() {
        return Ok(IpAddr::from([127, 0, 0, 1]));
    }
    let mut unresolved = Vec::new();
    for &host in remotes {
        let target = match host.parse::<IpAddr>() {
            Ok(ip) => SocketAddr::new(ip, 9),
            Err(_) => match (host, 9).to_socket_addrs().map(|mut a| a.next()) {
                Ok(Some(a)) => a,
                // In an allocation, Slurm knows its nodes' addresses where
                // their names are not in DNS.
                _ if std::env::var_os("SLURM_JOB_ID").is_some() => {
                    match ibcoll_launcher::slurm::node_address(host)
                        .ok()
                        .and_then(|a| a.parse::<IpAddr>().ok())
                    {
                        Some(ip) => SocketAddr::new(ip, 9),
                        None => {
                            unresolved.push(format!("{host}: neither DNS nor scontrol knows it"));
                            continue;
                        }
                    }
                }
                Ok(None) => {
                    unresolved.push(format!("{host}: no address"));
                    continue;
                }
                Err(e) => {
                    unresolved.push(format!("{host}: {e}"));
                    continue;
                }
            },
        };
        let bind: SocketAddr = if target.is_ipv4() {
            "0.0.0.0:0".parse().expect("literal")
        } else {
            "[::]:0".parse().expect("literal")
        };
        let s = UdpSocket::bind(bind).map_err(|e| e.to_string())?;
        s.connect(target)
            .map_err(|e| format!("no route to host {host:?} ({target}): {e}; use --pmi-addr"))?;
        return Ok(s.local_addr().map_err(|e| e.to_string())?.ip());
    }
    Err(format!(
        "cannot choose the address remote ranks reach ibrun at: no host resolves ({}); \
         give the hosts as IP addresses or --pmi-addr ADDR",
        unresolved.join("; ")
    ))
}

fn run(opts: cli::Options) -> Result<i32, String> {
    let signals =
        job::block_signals().map_err(|e| format!("cannot set up signal handling: {e}"))?;
    let slots = plan::place(&opts)?;
    spawn::raise_fd_limit(slots.len());
    let size = slots.len();
    let map = plan::node_map(&slots);
    let job_id = new_job_id();

    let local_over_tcp = std::env::var("IBRUN_PMI_TCP").is_ok_and(|v| v == "1");
    let mut remotes: Vec<&str> = Vec::new();
    for h in slots.iter().filter_map(|s| s.host.as_deref()) {
        if remotes.last() != Some(&h) {
            remotes.push(h);
        }
    }
    let listener = if !remotes.is_empty() || local_over_tcp {
        let ip = pick_pmi_addr(opts.pmi_addr.as_deref(), &remotes)?;
        let l = TcpListener::bind((ip, 0))
            .map_err(|e| format!("cannot listen for PMI on {ip}: {e}"))?;
        // std listens with a backlog of 128; every rank connects at once,
        // and a dropped SYN costs a second. Listening again resizes it.
        // SAFETY: listen on the socket `l` owns, open for the call.
        unsafe { libc::listen(l.as_raw_fd(), 4096) };
        Some(l)
    } else {
        None
    };
    let pmi_port = match &listener {
        Some(l) => Some(l.local_addr().map_err(|e| e.to_string())?.to_string()),
        None => None,
    };

    let mut cfg = ServerConfig::new(&job_id, size);
    cfg.preset.push((
        "PMI_process_mapping".into(),
        format_process_mapping(&map.to_blocks()),
    ));
    let server = PmiServer::new(cfg);

    let exports = opts
        .exports
        .iter()
        .filter_map(|(k, v)| match v {
            Some(v) => Some((k.clone(), v.clone())),
            None => std::env::var(k).ok().map(|v| (k.clone(), v)),
        })
        .collect();
    let env = JobEnv {
        job_id: job_id.clone(),
        size,
        num_nodes: map.num_nodes(),
        exports,
        pmi_port,
        local_over_tcp,
        bind: opts.bind,
        forward_stdin: true,
        stderr_tty: std::io::stderr().is_terminal(),
    };
    let cpus = spawn::allowed_cpus();
    let mut local_index = 0usize;
    let sink = OutputSink {
        tag: opts.tag_output,
    };
    let mut job = Job::new(
        server,
        listener,
        signals,
        sink,
        opts.verbose,
        opts.kill_grace,
        opts.timeout,
    )
    .map_err(|e| format!("cannot set up the event loop: {e}"))?;
    let local_host = nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "localhost".into());
    let mut start_error = None;
    let started_at = std::time::Instant::now();
    for slot in slots {
        let started = match &slot.host {
            None => {
                // Virtual nodes share this machine's CPUs: count every local
                // rank, not the local rank within its virtual node.
                let cpu = opts.bind.then(|| cpus[local_index % cpus.len()]);
                local_index += 1;
                if let (true, Some(c)) = (opts.verbose, cpu) {
                    eprintln!("ibrun: rank {} bound to cpu {c}", slot.rank);
                }
                spawn::start_local(&slot, &env, &opts.program, cpu)
            }
            Some(h) => spawn::start_remote(
                &slot,
                h,
                &opts.rsh,
                opts.srun || opts.in_allocation,
                &env,
                &opts.program,
            ),
        };
        match started {
            Ok(s) => {
                let host = slot.host.clone().unwrap_or_else(|| {
                    if env.num_nodes > 1 {
                        format!("{local_host}/node{}", slot.node)
                    } else {
                        local_host.clone()
                    }
                });
                let rank = slot.rank;
                if let Err(e) = job.add_rank(slot, host, s.child, s.pmi) {
                    start_error = Some(format!("cannot watch rank {rank}: {e}"));
                    break;
                }
            }
            Err(e) => {
                let what = match &slot.host {
                    None => opts.program[0].clone(),
                    Some(h) if opts.srun || opts.in_allocation => {
                        format!("{} on {h} via srun", opts.program[0])
                    }
                    Some(h) => format!("{} on {h} via {:?}", opts.program[0], opts.rsh),
                };
                start_error = Some(format!("cannot start rank {} ({what}): {e}", slot.rank));
                break;
            }
        }
    }
    if let Some(e) = start_error {
        job.abort_start(&e);
    } else if opts.verbose {
        eprintln!(
            "ibrun: started {size} rank(s) in {:.3} s",
            started_at.elapsed().as_secs_f64()
        );
    }
    let code = job.run();
    proxy::cleanup_shm(&job_id);
    Ok(code)
}
