//! Bootstrapping under `srun --mpi=none`, where Slurm offers no PMI at all.
//!
//! Every task can derive the same rendezvous from its environment: rank 0
//! serves a PMI-1 key-value space (the same server as ibrun's) on the first
//! host of the step's node list, at a port computed from the job and step ids,
//! with a few fallback ports in case one is taken. The other tasks connect
//! with retries and identify themselves with `initack`; they check the
//! server's kvsname so that a stranger's server on a fallback port is skipped.

use std::env;

/// How many consecutive ports are tried after the derived one.
pub const PORT_FALLBACKS: u16 = 8;

/// What a task of a Slurm step knows about the step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlurmStep {
    pub job_id: u64,
    pub step_id: u64,
    pub rank: usize,
    pub size: usize,
    pub first_host: String,
}

fn var(name: &str) -> Option<String> {
    env::var(name).ok().filter(|v| !v.is_empty())
}

impl SlurmStep {
    /// The step this process is a task of, when it was started by `srun`
    /// (a batch script has no step id and is not one).
    pub fn from_env() -> Option<Result<SlurmStep, String>> {
        let step = var("SLURM_STEP_ID").or_else(|| var("SLURM_STEPID"))?;
        let get = |n: &str| var(n).ok_or_else(|| format!("{n} is not set"));
        Some((|| {
            let num = |n: &str| -> Result<u64, String> {
                let v = get(n)?;
                v.parse().map_err(|_| format!("{n}={v:?} is not a number"))
            };
            let size = var("SLURM_STEP_NUM_TASKS")
                .or_else(|| var("SLURM_NTASKS"))
                .ok_or("SLURM_STEP_NUM_TASKS is not set")?;
            let nodelist = get("SLURM_STEP_NODELIST").or_else(|_| get("SLURM_NODELIST"))?;
            Ok(SlurmStep {
                job_id: num("SLURM_JOB_ID")?,
                step_id: step
                    .parse()
                    .map_err(|_| format!("SLURM_STEP_ID={step:?} is not a number"))?,
                rank: num("SLURM_PROCID")? as usize,
                size: size
                    .parse()
                    .map_err(|_| format!("SLURM_STEP_NUM_TASKS={size:?} is not a number"))?,
                first_host: first_host(&nodelist)?,
            })
        })())
    }

    /// The ports rank 0 tries, in order; clients try the same ones.
    pub fn ports(&self) -> Vec<u16> {
        let base: u16 = var("IBCOLL_SLURM_PORT_BASE")
            .and_then(|v| v.parse().ok())
            .unwrap_or(41000);
        let span = 16000u64;
        let off = (self
            .job_id
            .wrapping_mul(131)
            .wrapping_add(self.step_id * 17))
            % span;
        (0..PORT_FALLBACKS)
            .map(|i| base.wrapping_add(((off + u64::from(i)) % span) as u16))
            .collect()
    }

    pub fn kvsname(&self) -> String {
        format!("slurm-{}.{}", self.job_id, self.step_id)
    }
}

/// First host of a Slurm host list such as `node[07-09,12],login1`.
pub fn first_host(list: &str) -> Result<String, String> {
    let list = list.trim();
    let end = list.find(',').unwrap_or(list.len());
    let bracket = list.find('[');
    match bracket {
        Some(b) if b < end => {
            let close = list[b..]
                .find(']')
                .map(|c| b + c)
                .ok_or_else(|| format!("unterminated '[' in host list {list:?}"))?;
            let prefix = &list[..b];
            let first = list[b + 1..close]
                .split([',', '-'])
                .next()
                .filter(|s| !s.is_empty() && s.bytes().all(|c| c.is_ascii_digit()))
                .ok_or_else(|| format!("bad range in host list {list:?}"))?;
            let suffix_end = list[close + 1..]
                .find(',')
                .map_or(list.len(), |i| close + 1 + i);
            Ok(format!("{prefix}{first}{}", &list[close + 1..suffix_end]))
        }
        _ if end > 0 => Ok(list[..end].to_string()),
        _ => Err(format!("empty host list {list:?}")),
    }
}

/// Where to reach node `name`: the name itself when it is an address or
/// resolves, otherwise the `NodeAddr` Slurm keeps for it (`scontrol show
/// node`), as on clusters whose node names are not in DNS (Slurm itself
/// reaches its nodes by NodeAddr there).
pub fn node_address(name: &str) -> Result<String, String> {
    use std::net::ToSocketAddrs;
    if name.parse::<std::net::IpAddr>().is_ok() {
        return Ok(name.to_string());
    }
    let resolve_err = match (name, 0).to_socket_addrs().map(|mut a| a.next()) {
        Ok(Some(_)) => return Ok(name.to_string()),
        Ok(None) => "no address".to_string(),
        Err(e) => e.to_string(),
    };
    let out = std::process::Command::new("scontrol")
        .args(["show", "node", "-o", name])
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output()
        .map_err(|e| format!("cannot resolve {name} ({resolve_err}) nor run scontrol: {e}"))?;
    parse_node_addr(&String::from_utf8_lossy(&out.stdout)).ok_or_else(|| {
        format!("cannot resolve {name} ({resolve_err}) and scontrol shows no NodeAddr for it")
    })
}

/// The `NodeAddr=` of one line of `scontrol show node -o`.
pub fn parse_node_addr(text: &str) -> Option<String> {
    text.split_whitespace()
        .find_map(|w| w.strip_prefix("NodeAddr="))
        .filter(|a| !a.is_empty() && *a != "(null)")
        .map(str::to_string)
}

/// Every host of a Slurm host list (`node[07-09,12],login1`), in order.
pub fn expand_hostlist(list: &str) -> Result<Vec<String>, String> {
    let mut hosts = Vec::new();
    let bytes = list.trim().as_bytes();
    let mut start = 0;
    let mut depth = 0;
    let mut items = Vec::new();
    for (i, &b) in bytes.iter().enumerate() {
        match b {
            b'[' => depth += 1,
            b']' => depth -= 1,
            b',' if depth == 0 => {
                items.push(&list.trim()[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(&list.trim()[start..]);
    for item in items.into_iter().filter(|s| !s.is_empty()) {
        match (item.find('['), item.find(']')) {
            (None, None) => hosts.push(item.to_string()),
            (Some(o), Some(c)) if o < c => {
                let (prefix, suffix) = (&item[..o], &item[c + 1..]);
                for range in item[o + 1..c].split(',') {
                    let (lo, hi) = range.split_once('-').unwrap_or((range, range));
                    let width = lo.len();
                    let bad = || format!("bad range {range:?} in host list {list:?}");
                    let a: u64 = lo.parse().map_err(|_| bad())?;
                    let b: u64 = hi.parse().map_err(|_| bad())?;
                    if b < a || b - a > 100_000 || hosts.len() > 1_000_000 {
                        return Err(bad());
                    }
                    for n in a..=b {
                        hosts.push(format!("{prefix}{n:0width$}{suffix}"));
                    }
                }
            }
            _ => return Err(format!("unbalanced brackets in host list {list:?}")),
        }
    }
    if hosts.is_empty() {
        return Err(format!("empty host list {list:?}"));
    }
    Ok(hosts)
}

/// The hosts and task counts of the allocation ibrun runs in, if any.
pub fn allocation() -> Option<Result<Vec<(String, usize)>, String>> {
    let nodelist = var("SLURM_JOB_NODELIST").or_else(|| var("SLURM_NODELIST"))?;
    let tpn = var("SLURM_TASKS_PER_NODE")?;
    Some((|| {
        let hosts = expand_hostlist(&nodelist)?;
        let counts = crate::mapping::parse_tasks_per_node(&tpn).map_err(|e| e.to_string())?;
        if counts.len() != hosts.len() {
            return Err(format!(
                "SLURM_TASKS_PER_NODE={tpn:?} does not match the {} hosts of {nodelist:?}",
                hosts.len()
            ));
        }
        Ok(hosts.into_iter().zip(counts).collect())
    })())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn host_lists() {
        assert_eq!(first_host("vm").unwrap(), "vm");
        assert_eq!(first_host("a,b").unwrap(), "a");
        assert_eq!(first_host("node[07-09,12]").unwrap(), "node07");
        assert_eq!(first_host("node[3,5],x").unwrap(), "node3");
        assert_eq!(first_host("rack[1-2]-n,x").unwrap(), "rack1-n");
        assert!(first_host("").is_err());
        assert!(first_host("n[").is_err());
        assert!(first_host("n[a-b]").is_err());
    }

    #[test]
    fn node_addresses() {
        let line = "NodeName=h1 Arch=x86_64 CoresPerSocket=2 NodeAddr=10.251.0.11 NodeHostName=h1 Version=22.05.8\n";
        assert_eq!(parse_node_addr(line).as_deref(), Some("10.251.0.11"));
        assert_eq!(parse_node_addr("Node h9 not found\n"), None);
        assert_eq!(parse_node_addr("NodeName=x NodeAddr= y"), None);
        assert_eq!(node_address("10.1.2.3").unwrap(), "10.1.2.3");
        assert_eq!(node_address("localhost").unwrap(), "localhost");
    }

    #[test]
    fn expands_host_lists() {
        assert_eq!(expand_hostlist("vm").unwrap(), vec!["vm"]);
        assert_eq!(
            expand_hostlist("n[08-10,3],login").unwrap(),
            vec!["n08", "n09", "n10", "n3", "login"]
        );
        assert_eq!(expand_hostlist("r[1-2]x").unwrap(), vec!["r1x", "r2x"]);
        assert!(expand_hostlist("n[3-1]").is_err());
        assert!(expand_hostlist("n[1").is_err());
        assert!(expand_hostlist("").is_err());
    }

    #[test]
    fn ports_are_stable_and_distinct() {
        let s = SlurmStep {
            job_id: 1234,
            step_id: 0,
            rank: 0,
            size: 2,
            first_host: "vm".into(),
        };
        let p = s.ports();
        assert_eq!(p.len(), PORT_FALLBACKS as usize);
        assert_eq!(p, s.ports());
        let mut d = p.clone();
        d.dedup();
        assert_eq!(d.len(), p.len());
        let other = SlurmStep {
            step_id: 1,
            ..s.clone()
        };
        assert_ne!(other.ports()[0], p[0]);
    }

    proptest! {
        #[test]
        fn first_host_never_panics(s in "\\PC{0,40}") {
            let _ = first_host(&s);
            let _ = expand_hostlist(&s);
        }
    }
}
