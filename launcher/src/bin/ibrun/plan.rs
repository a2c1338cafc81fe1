//! Where each rank runs: virtual nodes on this machine, or hosts.

use crate::cli::{Host, Options};
use ibcoll_launcher::NodeMap;

/// One rank's placement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankSlot {
    pub rank: usize,
    pub node: usize,
    pub local_rank: usize,
    pub local_size: usize,
    /// `None`: start on this machine; otherwise through the remote shell.
    pub host: Option<String>,
}

/// Ranks per node for a block placement of `n` ranks.
fn counts(n: usize, nodes: Option<usize>, ppn: Option<usize>) -> Result<Vec<usize>, String> {
    match (nodes, ppn) {
        (None, None) => Ok(vec![n]),
        (Some(k), None) => {
            if k > n {
                return Err(format!(
                    "--nodes {k} leaves nodes empty with only {n} ranks"
                ));
            }
            Ok((0..k).map(|i| n / k + usize::from(i < n % k)).collect())
        }
        (None, Some(p)) => {
            let k = n.div_ceil(p);
            Ok((0..k).map(|i| p.min(n - i * p)).collect())
        }
        (Some(k), Some(p)) => {
            if k * p < n {
                return Err(format!("{n} ranks do not fit on {k} nodes of {p}"));
            }
            let full = n.div_ceil(p);
            if full < k {
                return Err(format!(
                    "--nodes {k} --ppn {p} leaves nodes empty with only {n} ranks"
                ));
            }
            Ok((0..k).map(|i| p.min(n - i * p)).collect())
        }
    }
}

fn is_local_host(name: &str) -> bool {
    if matches!(name, "localhost" | "127.0.0.1" | "::1") {
        return true;
    }
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .is_some_and(|h| h == name || h.split('.').next() == Some(name))
}

fn host_counts(n: usize, hosts: &[Host], ppn: Option<usize>) -> Result<Vec<usize>, String> {
    if let Some(p) = ppn {
        let c = counts(n, Some(hosts.len()), Some(p))?;
        return Ok(c);
    }
    if hosts.iter().all(|h| h.slots.is_some()) {
        let mut left = n;
        let mut c = Vec::new();
        for h in hosts {
            let take = h.slots.unwrap_or(0).min(left);
            c.push(take);
            left -= take;
        }
        if left > 0 {
            return Err(format!("{n} ranks exceed the hosts' slots"));
        }
        return Ok(c);
    }
    counts(n, Some(hosts.len()), None)
}

/// Computes every rank's placement.
pub fn place(o: &Options) -> Result<Vec<RankSlot>, String> {
    let n = o.np.unwrap_or(1);
    let (per_node, hosts): (Vec<usize>, Vec<Option<String>>) = if o.hosts.is_empty() {
        let c = counts(n, o.nodes, o.ppn)?;
        let h = vec![None; c.len()];
        (c, h)
    } else {
        let c = host_counts(n, &o.hosts, o.ppn)?;
        let h = o
            .hosts
            .iter()
            .map(|h| (o.srun || !is_local_host(&h.name)).then(|| h.name.clone()))
            .collect();
        (c, h)
    };
    let mut slots = Vec::with_capacity(n);
    for (node, (&count, host)) in per_node.iter().zip(&hosts).enumerate() {
        for local_rank in 0..count {
            slots.push(RankSlot {
                rank: slots.len(),
                node,
                local_rank,
                local_size: count,
                host: host.clone(),
            });
        }
    }
    Ok(slots)
}

/// The node map of a placement (for `PMI_process_mapping`).
pub fn node_map(slots: &[RankSlot]) -> NodeMap {
    NodeMap::from_nodes(slots.iter().map(|s| s.node).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::parse;
    use crate::cli::Parsed;

    fn place_str(s: &str) -> Result<Vec<(usize, usize, usize)>, String> {
        let args: Vec<String> = s.split_whitespace().map(String::from).collect();
        let Parsed::Run(o) = parse(&args)? else {
            panic!()
        };
        Ok(place(&o)?
            .iter()
            .map(|s| (s.node, s.local_rank, s.local_size))
            .collect())
    }

    #[test]
    fn block_over_nodes() {
        assert_eq!(
            place_str("-n 5 --nodes 2 p").unwrap(),
            vec![(0, 0, 3), (0, 1, 3), (0, 2, 3), (1, 0, 2), (1, 1, 2)]
        );
        assert_eq!(
            place_str("-n 3 --ppn 2 p").unwrap(),
            vec![(0, 0, 2), (0, 1, 2), (1, 0, 1)]
        );
        assert_eq!(place_str("-n 2 p").unwrap(), vec![(0, 0, 2), (0, 1, 2)]);
        assert!(place_str("-n 2 --nodes 3 p").is_err());
        assert!(place_str("-n 5 --nodes 2 --ppn 2 p").is_err());
        assert!(place_str("-n 2 --nodes 2 --ppn 4 p").is_err());
    }

    #[test]
    fn hosts_with_slots() {
        let v = place_str("-n 3 --hosts localhost:1,localhost:2 p").unwrap();
        assert_eq!(v, vec![(0, 0, 1), (1, 0, 2), (1, 1, 2)]);
        assert!(place_str("-n 4 --hosts localhost:1,localhost:2 p").is_err());
    }
}
