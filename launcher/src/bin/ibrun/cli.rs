//! Command-line options of `ibrun`.

use std::time::Duration;

pub const USAGE: &str = "\
usage: ibrun -n N [options] prog [args...]

Starts N ranks of prog with a PMI-1 key-value server (MPICH's simple PMI wire
protocol), forwards their output, and ends the whole job when one rank fails;
ranks that asked (ibcoll's do) are told which rank was lost first.

options:
  -n, -np N            number of ranks
  --nodes K            place ranks in blocks over K (virtual) nodes; ranks on
                       different virtual nodes never share memory
  --ppn P              ranks per node (with or without --nodes)
  --hosts h1,h2,...    start ranks on these hosts (one node each) through ssh;
                       names or IP addresses (ranks are always told an address)
  --hostfile F         hosts from a file: one per line, `host`, `host:slots`
                       or `host slots=N`; # starts a comment
  --rsh CMD            remote shell instead of `ssh` (run as CMD host command)
  --launcher ssh|srun  how remote ranks start; inside a Slurm allocation
                       (salloc/sbatch) the default is srun, and -n defaults
                       to the allocation's task count
  --pmi-addr ADDR      IP address remote ranks use to reach ibrun's PMI server
                       (default: the local address that routes to the first
                       host given as an address or whose name resolves)
  --tag-output         prefix every output line with [rank]
  -x VAR[=VAL]         export VAR (with its current or the given value); remote
                       ranks get only exported variables
  --timeout SECS       end the job when it runs longer than SECS
  --bind-to core|none  pin each rank to one CPU of its host, in local-rank
                       order over the CPUs ibrun may use (default none)
  --kill-grace SECS    time between TERM and KILL when ending a job (default 2)
  -v, --verbose        print PMI and job-control diagnostics, and the start time
  -h, --help           this text
  --version            print the version
";

/// A host and how many ranks it takes (`None`: spread evenly).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Host {
    pub name: String,
    pub slots: Option<usize>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    pub np: Option<usize>,
    pub nodes: Option<usize>,
    pub ppn: Option<usize>,
    pub hosts: Vec<Host>,
    pub rsh: String,
    /// Start remote ranks with `srun` (inside a Slurm allocation).
    pub srun: bool,
    /// The hosts came from the Slurm allocation ibrun runs in.
    pub in_allocation: bool,
    pub pmi_addr: Option<String>,
    pub tag_output: bool,
    pub exports: Vec<(String, Option<String>)>,
    pub timeout: Option<Duration>,
    pub kill_grace: Duration,
    pub verbose: bool,
    /// `--bind-to core`: pin each rank to one CPU of its host.
    pub bind: bool,
    pub program: Vec<String>,
}

/// What the command line asks for.
#[derive(Debug)]
pub enum Parsed {
    Run(Options),
    Help,
    Version,
    /// Internal: run one remote rank under the proxy (see proxy.rs).
    Proxy(Vec<String>),
}

fn positive(flag: &str, v: &str) -> Result<usize, String> {
    match v.parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!("{flag} needs a positive integer, got {v:?}")),
    }
}

fn seconds(flag: &str, v: &str) -> Result<Duration, String> {
    match v.parse::<f64>() {
        Ok(s) if (0.0..1e9).contains(&s) => Ok(Duration::from_secs_f64(s)),
        _ => Err(format!("{flag} needs a number of seconds, got {v:?}")),
    }
}

/// Parses a hostfile's text.
pub fn parse_hostfile(text: &str) -> Result<Vec<Host>, String> {
    let mut hosts = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let mut words = line.split_whitespace();
        let first = words.next().unwrap_or("");
        let (name, mut slots) = match first.split_once(':') {
            Some((h, s)) => (
                h,
                Some(positive("hostfile slots", s).map_err(|e| format!("line {}: {e}", i + 1))?),
            ),
            None => (first, None),
        };
        for w in words {
            match w.strip_prefix("slots=") {
                Some(s) => {
                    slots = Some(
                        positive("hostfile slots", s)
                            .map_err(|e| format!("line {}: {e}", i + 1))?,
                    )
                }
                None => return Err(format!("line {}: unexpected {w:?}", i + 1)),
            }
        }
        hosts.push(Host {
            name: name.to_string(),
            slots,
        });
    }
    if hosts.is_empty() {
        return Err("hostfile lists no hosts".into());
    }
    Ok(hosts)
}

pub fn parse(args: &[String]) -> Result<Parsed, String> {
    let mut o = Options {
        np: None,
        nodes: None,
        ppn: None,
        hosts: Vec::new(),
        rsh: "ssh".into(),
        srun: false,
        in_allocation: false,
        pmi_addr: None,
        tag_output: false,
        exports: Vec::new(),
        timeout: None,
        kill_grace: Duration::from_secs(2),
        verbose: false,
        bind: false,
        program: Vec::new(),
    };
    let mut i = 0;
    let value = |i: &mut usize, flag: &str| -> Result<String, String> {
        *i += 1;
        args.get(*i)
            .cloned()
            .ok_or_else(|| format!("{flag} needs a value"))
    };
    while i < args.len() {
        let a = args[i].as_str();
        // Accept --flag=value as well as --flag value.
        let (flag, inline) = match a.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f, Some(v.to_string())),
            _ => (a, None),
        };
        let val = |i: &mut usize| match &inline {
            Some(v) => Ok(v.clone()),
            None => value(i, flag),
        };
        match flag {
            "-h" | "--help" => return Ok(Parsed::Help),
            "--version" => return Ok(Parsed::Version),
            "--proxy" => return Ok(Parsed::Proxy(args[i + 1..].to_vec())),
            "-n" | "-np" | "--np" => o.np = Some(positive(flag, &val(&mut i)?)?),
            "--nodes" => o.nodes = Some(positive(flag, &val(&mut i)?)?),
            "--ppn" => o.ppn = Some(positive(flag, &val(&mut i)?)?),
            "--hosts" | "-hosts" => {
                let v = val(&mut i)?;
                for h in v.split(',').filter(|h| !h.is_empty()) {
                    let (name, slots) = match h.split_once(':') {
                        Some((n, s)) => (n, Some(positive("--hosts slots", s)?)),
                        None => (h, None),
                    };
                    o.hosts.push(Host {
                        name: name.to_string(),
                        slots,
                    });
                }
                if o.hosts.is_empty() {
                    return Err("--hosts lists no hosts".into());
                }
            }
            "--hostfile" | "-f" => {
                let path = val(&mut i)?;
                let text = std::fs::read_to_string(&path)
                    .map_err(|e| format!("cannot read hostfile {path}: {e}"))?;
                o.hosts = parse_hostfile(&text).map_err(|e| format!("hostfile {path}: {e}"))?;
            }
            "--rsh" | "--launcher-exec" => o.rsh = val(&mut i)?,
            "--launcher" => match val(&mut i)?.as_str() {
                "ssh" => o.srun = false,
                "srun" | "slurm" => o.srun = true,
                other => return Err(format!("--launcher {other:?}: expected ssh or srun")),
            },
            "--pmi-addr" => o.pmi_addr = Some(val(&mut i)?),
            "--tag-output" | "-l" => o.tag_output = true,
            "-x" | "--export" => {
                let v = val(&mut i)?;
                let (k, v) = match v.split_once('=') {
                    Some((k, v)) => (k.to_string(), Some(v.to_string())),
                    None => (v, None),
                };
                if k.is_empty() || !k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                    return Err(format!("-x needs a variable name, got {k:?}"));
                }
                o.exports.push((k, v));
            }
            "--timeout" => o.timeout = Some(seconds(flag, &val(&mut i)?)?),
            "--kill-grace" => o.kill_grace = seconds(flag, &val(&mut i)?)?,
            "-v" | "--verbose" => o.verbose = true,
            "--bind-to" | "-bind-to" => match val(&mut i)?.as_str() {
                "core" | "cpu" => o.bind = true,
                "none" => o.bind = false,
                other => return Err(format!("--bind-to {other:?}: expected core or none")),
            },
            "--" => {
                o.program = args[i + 1..].to_vec();
                break;
            }
            _ if a.starts_with('-') && o.program.is_empty() => {
                return Err(format!("unknown option {a:?} (see ibrun --help)"))
            }
            _ => {
                o.program = args[i..].to_vec();
                break;
            }
        }
        i += 1;
    }
    if o.program.is_empty() {
        return Err("no program given (see ibrun --help)".into());
    }
    if o.hosts.is_empty() {
        if let Some(alloc) = ibcoll_launcher::slurm::allocation() {
            // Inside salloc/sbatch: the allocation says where ranks go, and
            // srun is how they get there (as hydra's slurm launcher does).
            let alloc = alloc.map_err(|e| format!("Slurm allocation: {e}"))?;
            let np = o.np;
            o.hosts = alloc
                .into_iter()
                .map(|(name, n)| Host {
                    name,
                    slots: if np.is_none() { Some(n) } else { None },
                })
                .collect();
            o.in_allocation = true;
        }
    }
    if o.np.is_none() {
        let slots: Option<usize> = o.hosts.iter().map(|h| h.slots).sum();
        match slots {
            Some(n) if !o.hosts.is_empty() => o.np = Some(n),
            _ => return Err("-n N is required (the number of ranks)".into()),
        }
    }
    if !o.hosts.is_empty() && o.nodes.is_some_and(|k| k != o.hosts.len()) {
        return Err(format!(
            "--nodes {} contradicts the {} hosts given",
            o.nodes.unwrap_or(0),
            o.hosts.len()
        ));
    }
    Ok(Parsed::Run(o))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Result<Options, String> {
        let args: Vec<String> = s.split_whitespace().map(String::from).collect();
        match parse(&args)? {
            Parsed::Run(o) => Ok(o),
            other => Err(format!("{other:?}")),
        }
    }

    #[test]
    fn basic() {
        let o = p("-n 4 --nodes 2 --tag-output -x A=1 -x HOME --timeout 2.5 prog -n 3").unwrap();
        assert_eq!(o.np, Some(4));
        assert_eq!(o.nodes, Some(2));
        assert!(o.tag_output);
        assert_eq!(
            o.exports,
            vec![("A".into(), Some("1".into())), ("HOME".into(), None)]
        );
        assert_eq!(o.timeout, Some(Duration::from_millis(2500)));
        assert_eq!(o.program, vec!["prog", "-n", "3"]);
    }

    #[test]
    fn equals_form_and_double_dash() {
        let o = p("--np=2 --ppn=1 -- -weird").unwrap();
        assert_eq!(o.np, Some(2));
        assert_eq!(o.ppn, Some(1));
        assert_eq!(o.program, vec!["-weird"]);
    }

    #[test]
    fn errors() {
        assert!(p("-n 0 prog").is_err());
        assert!(p("-n x prog").is_err());
        assert!(p("-n 2").is_err());
        assert!(p("prog").is_err());
        assert!(p("-n 2 --bogus prog").is_err());
        assert!(p("-n 2 --timeout -1 prog").is_err());
        assert!(p("-n 2 -x =1 prog").is_err());
        assert!(p("-n 2 --hosts a,b --nodes 3 prog").is_err());
        assert!(p("-n").is_err());
    }

    #[test]
    fn hosts_and_hostfile() {
        let o = p("--hosts a:2,b:1 prog").unwrap();
        assert_eq!(o.np, Some(3));
        let h = parse_hostfile("# c\nnode1 slots=2\nnode2:3\n\nnode3 # x\n").unwrap();
        assert_eq!(h.len(), 3);
        assert_eq!(h[0].slots, Some(2));
        assert_eq!(h[1].slots, Some(3));
        assert_eq!(h[2].slots, None);
        assert!(parse_hostfile("a junk").is_err());
        assert!(parse_hostfile("a:0").is_err());
        assert!(parse_hostfile("# nothing").is_err());
    }
}
