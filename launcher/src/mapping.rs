//! Where ranks live: the `PMI_process_mapping` format and Slurm's task counts.
//!
//! MPICH's hydra and Slurm publish the placement of ranks on nodes as
//! `(vector,(start_node,node_count,ranks_per_node),...)`; ibrun publishes the
//! same key so that MPICH programs see its virtual nodes. When the blocks cover
//! fewer ranks than the job has, they repeat (hydra's round-robin placement).

use std::fmt;

/// The node of every rank, plus derived per-node facts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeMap {
    node_of: Vec<usize>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot parse process mapping {text:?}: {why}")]
pub struct MappingError {
    pub text: String,
    pub why: String,
}

fn err(text: &str, why: impl fmt::Display) -> MappingError {
    MappingError {
        text: text.chars().take(200).collect(),
        why: why.to_string(),
    }
}

/// One `(start, count, ppn)` block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Block {
    pub start_node: usize,
    pub node_count: usize,
    pub ranks_per_node: usize,
}

/// Parses `(vector,(0,2,3),(2,1,1))` into its blocks.
pub fn parse_process_mapping(text: &str) -> Result<Vec<Block>, MappingError> {
    let compact: String = text.chars().filter(|c| !c.is_whitespace()).collect();
    let inner = compact
        .strip_prefix("(vector")
        .and_then(|s| s.strip_suffix(')'))
        .ok_or_else(|| err(text, "expected (vector,...)"))?;
    let mut blocks = Vec::new();
    let mut rest = inner;
    while !rest.is_empty() {
        rest = rest
            .strip_prefix(",(")
            .ok_or_else(|| err(text, "expected ,( before a block"))?;
        let end = rest
            .find(')')
            .ok_or_else(|| err(text, "unterminated block"))?;
        let nums: Vec<&str> = rest[..end].split(',').collect();
        if nums.len() != 3 {
            return Err(err(text, "a block needs three numbers"));
        }
        let mut v = [0usize; 3];
        for (slot, n) in v.iter_mut().zip(&nums) {
            *slot = n
                .parse()
                .map_err(|_| err(text, format!("{n:?} is not a number")))?;
        }
        if v[1] == 0 || v[2] == 0 {
            return Err(err(text, "a block with zero nodes or ranks"));
        }
        if v[0] > 1 << 20 || v[1] > 1 << 20 || v[2] > 1 << 20 {
            return Err(err(text, "implausibly large block"));
        }
        blocks.push(Block {
            start_node: v[0],
            node_count: v[1],
            ranks_per_node: v[2],
        });
        rest = &rest[end + 1..];
    }
    if blocks.is_empty() {
        return Err(err(text, "no blocks"));
    }
    Ok(blocks)
}

/// Writes blocks in the `PMI_process_mapping` format.
pub fn format_process_mapping(blocks: &[Block]) -> String {
    let mut s = String::from("(vector");
    for b in blocks {
        s.push_str(&format!(
            ",({},{},{})",
            b.start_node, b.node_count, b.ranks_per_node
        ));
    }
    s.push(')');
    s
}

/// Parses Slurm's `SLURM_TASKS_PER_NODE` (`2(x3),1`) into per-node counts.
pub fn parse_tasks_per_node(text: &str) -> Result<Vec<usize>, MappingError> {
    let mut counts = Vec::new();
    for part in text.split(',') {
        let part = part.trim();
        let (n, rep) = match part.split_once("(x") {
            Some((n, r)) => {
                let r = r
                    .strip_suffix(')')
                    .ok_or_else(|| err(text, "expected (xN)"))?;
                (n, r.parse::<usize>().map_err(|_| err(text, "bad repeat"))?)
            }
            None => (part, 1),
        };
        let n: usize = n
            .parse()
            .map_err(|_| err(text, format!("{n:?} is not a number")))?;
        if rep > 1 << 20 || counts.len() + rep > 1 << 20 {
            return Err(err(text, "implausibly many nodes"));
        }
        counts.extend(std::iter::repeat(n).take(rep));
    }
    Ok(counts)
}

impl NodeMap {
    /// Builds the map from an explicit node per rank.
    pub fn from_nodes(node_of: Vec<usize>) -> Self {
        NodeMap { node_of }
    }

    /// All ranks on one node.
    pub fn single_node(size: usize) -> Self {
        NodeMap {
            node_of: vec![0; size],
        }
    }

    /// Block placement: `per_node[i]` consecutive ranks on node `i`.
    pub fn from_counts(per_node: &[usize]) -> Self {
        let node_of = per_node
            .iter()
            .enumerate()
            .flat_map(|(n, &c)| std::iter::repeat(n).take(c))
            .collect();
        NodeMap { node_of }
    }

    /// Expands mapping blocks over `size` ranks, repeating them as hydra does.
    pub fn from_blocks(blocks: &[Block], size: usize) -> Result<Self, MappingError> {
        let mut node_of = Vec::with_capacity(size);
        'outer: loop {
            for b in blocks {
                for node in b.start_node..b.start_node + b.node_count {
                    for _ in 0..b.ranks_per_node {
                        if node_of.len() == size {
                            break 'outer;
                        }
                        node_of.push(node);
                    }
                }
            }
            if size == 0 {
                break;
            }
        }
        Ok(NodeMap { node_of })
    }

    /// Compresses the map back to blocks, when it is a run of equal-size
    /// consecutive blocks (otherwise one block per run).
    pub fn to_blocks(&self) -> Vec<Block> {
        let mut runs: Vec<(usize, usize)> = Vec::new();
        for &n in &self.node_of {
            match runs.last_mut() {
                Some((node, count)) if *node == n => *count += 1,
                _ => runs.push((n, 1)),
            }
        }
        let mut blocks: Vec<Block> = Vec::new();
        for (node, count) in runs {
            match blocks.last_mut() {
                Some(b) if b.ranks_per_node == count && b.start_node + b.node_count == node => {
                    b.node_count += 1
                }
                _ => blocks.push(Block {
                    start_node: node,
                    node_count: 1,
                    ranks_per_node: count,
                }),
            }
        }
        blocks
    }

    pub fn size(&self) -> usize {
        self.node_of.len()
    }

    /// Node of `rank`, `None` when out of range.
    pub fn node_of(&self, rank: usize) -> Option<usize> {
        self.node_of.get(rank).copied()
    }

    pub fn num_nodes(&self) -> usize {
        let mut nodes: Vec<usize> = self.node_of.clone();
        nodes.sort_unstable();
        nodes.dedup();
        nodes.len()
    }

    /// Ranks on the same node as `rank`, in rank order.
    pub fn local_ranks(&self, rank: usize) -> Vec<usize> {
        match self.node_of(rank) {
            Some(n) => (0..self.size()).filter(|&r| self.node_of[r] == n).collect(),
            None => Vec::new(),
        }
    }

    /// (local rank, local size) of `rank`.
    pub fn local_position(&self, rank: usize) -> Option<(usize, usize)> {
        let peers = self.local_ranks(rank);
        let idx = peers.iter().position(|&r| r == rank)?;
        Some((idx, peers.len()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn hydra_single_node() {
        let b = parse_process_mapping("(vector,(0,1,3))").unwrap();
        let m = NodeMap::from_blocks(&b, 3).unwrap();
        assert_eq!(m.num_nodes(), 1);
        assert_eq!(m.local_position(2), Some((2, 3)));
    }

    #[test]
    fn blocks_over_nodes() {
        let b = parse_process_mapping("(vector,(0,2,2))").unwrap();
        let m = NodeMap::from_blocks(&b, 4).unwrap();
        assert_eq!(
            (0..4).map(|r| m.node_of(r).unwrap()).collect::<Vec<_>>(),
            vec![0, 0, 1, 1]
        );
        assert_eq!(m.local_position(3), Some((1, 2)));
    }

    #[test]
    fn round_robin_repeats() {
        // Hydra writes (vector,(0,2,1)) for 4 ranks placed cyclically.
        let b = parse_process_mapping("(vector,(0,2,1))").unwrap();
        let m = NodeMap::from_blocks(&b, 5).unwrap();
        assert_eq!(
            (0..5).map(|r| m.node_of(r).unwrap()).collect::<Vec<_>>(),
            vec![0, 1, 0, 1, 0]
        );
    }

    #[test]
    fn uneven_blocks_and_format() {
        let text = "(vector,(0,2,3),(2,1,1))";
        let b = parse_process_mapping(text).unwrap();
        assert_eq!(format_process_mapping(&b), text);
        let m = NodeMap::from_blocks(&b, 7).unwrap();
        assert_eq!(m.node_of(6), Some(2));
        assert_eq!(m.to_blocks(), b);
        assert_eq!(
            parse_process_mapping(" ( vector, (0,1,4) ) ")
                .unwrap()
                .len(),
            1
        );
    }

    #[test]
    fn bad_mappings() {
        for t in [
            "",
            "(vector)",
            "(vector,(0,1))",
            "(vector,(0,0,1))",
            "(vector,(a,1,1))",
            "(vector,(0,1,1)",
            "vector,(0,1,1)",
        ] {
            assert!(parse_process_mapping(t).is_err(), "{t}");
        }
    }

    #[test]
    fn slurm_tasks_per_node() {
        assert_eq!(parse_tasks_per_node("2(x3),1").unwrap(), vec![2, 2, 2, 1]);
        assert_eq!(parse_tasks_per_node("4").unwrap(), vec![4]);
        assert!(parse_tasks_per_node("2(x").is_err());
        assert!(parse_tasks_per_node("x").is_err());
        let m = NodeMap::from_counts(&[2, 1]);
        assert_eq!(m.local_position(2), Some((0, 1)));
    }

    proptest! {
        #[test]
        fn parsers_never_panic(s in "\\PC{0,80}") {
            let _ = parse_process_mapping(&s);
            let _ = parse_tasks_per_node(&s);
        }

        #[test]
        fn map_round_trips(counts in proptest::collection::vec(1usize..5, 1..6)) {
            let m = NodeMap::from_counts(&counts);
            let text = format_process_mapping(&m.to_blocks());
            let back = NodeMap::from_blocks(&parse_process_mapping(&text).unwrap(), m.size()).unwrap();
            prop_assert_eq!(back, m);
        }
    }
}
