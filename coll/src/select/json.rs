//! The tuning file (format in the module doc of [`super`]), read with
//! serde_json. serde checks the shape (unknown fields, missing names,
//! negative or fractional numbers, truncation, with line and column); the
//! names are then checked against the algorithm registry, which knows
//! which algorithms each collective has.

use serde::Deserialize;

use super::{names, Net, Rule, Table, ANY, SEG, WINDOW};
use crate::algorithms::{find, Collective};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileText {
    rules: Vec<RuleText>,
}

/// One rule as written; a missing or `null` bound is unbounded.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleText {
    collective: String,
    algorithm: String,
    max_comm_size: Option<u64>,
    max_ranks_per_node: Option<u64>,
    max_bytes: Option<u64>,
    min_nodes: Option<u64>,
    network: Option<String>,
    segment_bytes: Option<u64>,
    window: Option<u64>,
}

/// A bound of the file as a size (a u64 beyond usize is unbounded anyway).
fn size(v: Option<u64>, dflt: usize) -> usize {
    v.map_or(dflt, |x| usize::try_from(x).unwrap_or(usize::MAX))
}

pub(super) fn table(text: &str) -> Result<Table, String> {
    let file: FileText = serde_json::from_str(text).map_err(|e| format!("JSON: {e}"))?;
    let mut out = Vec::with_capacity(file.rules.len());
    for (i, r) in file.rules.into_iter().enumerate() {
        let c = Collective::from_name(&r.collective).ok_or_else(|| {
            format!(
                "rule {i}: unknown collective {:?} (valid: {})",
                r.collective,
                Collective::ALL.map(|c| c.name()).join(", ")
            )
        })?;
        let a = find(c, &r.algorithm).ok_or_else(|| {
            format!(
                "rule {i}: unknown {} algorithm {:?} (valid: {})",
                c.name(),
                r.algorithm,
                names(c)
            )
        })?;
        let network = match r.network.as_deref() {
            None => None,
            Some(n) => Some(Net::from_name(n).ok_or_else(|| {
                format!("rule {i}: unknown network {n:?} (valid: shm, tcp, rdma)")
            })?),
        };
        out.push(Rule {
            collective: c,
            max_comm_size: size(r.max_comm_size, ANY),
            max_ranks_per_node: size(r.max_ranks_per_node, ANY),
            max_bytes: size(r.max_bytes, ANY),
            min_nodes: size(r.min_nodes, 1),
            network,
            algorithm: a.name,
            segment_bytes: size(r.segment_bytes, SEG).max(1),
            window: size(r.window, WINDOW).max(1),
        });
    }
    Ok(Table { rules: out })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const GOOD: &str = r#"{"rules": [
        {"collective": "allreduce", "algorithm": "ring", "max_comm_size": 64,
         "max_ranks_per_node": 8, "max_bytes": 1048576, "min_nodes": 1,
         "segment_bytes": 65536, "window": 8},
        {"collective": "bcast", "algorithm": "chain", "max_bytes": null}
    ]}"#;

    #[test]
    fn reads_every_field() {
        let t = table(GOOD).unwrap();
        assert_eq!(t.rules.len(), 2);
        let r = &t.rules[0];
        assert_eq!(
            (
                r.collective,
                r.algorithm,
                r.max_comm_size,
                r.max_ranks_per_node
            ),
            (Collective::Allreduce, "ring", 64, 8)
        );
        assert_eq!(
            (r.max_bytes, r.min_nodes, r.segment_bytes, r.window),
            (1 << 20, 1, SEG, 8)
        );
        let r = &t.rules[1];
        assert_eq!((r.max_bytes, r.max_comm_size, r.min_nodes), (ANY, ANY, 1));
        assert!(table(r#"{"rules": []}"#).unwrap().rules.is_empty());
    }

    #[test]
    fn unknown_field_is_named() {
        let e = table(r#"{"rules": [{"collective": "bcast", "algorithm": "chain", "bogus": 1}]}"#)
            .unwrap_err();
        assert!(
            e.contains("unknown field `bogus`") && e.contains("line 1"),
            "{e}"
        );
        let e = table(r#"{"rules": [], "comment": "x"}"#).unwrap_err();
        assert!(e.contains("unknown field `comment`"), "{e}");
    }

    #[test]
    fn unknown_names_list_the_valid_ones() {
        let e = table(
            r#"{"rules": [{"collective": "bcast", "algorithm": "chain"},
                                    {"collective": "allreduce", "algorithm": "nope"}]}"#,
        )
        .unwrap_err();
        assert!(
            e.starts_with("rule 1: unknown allreduce algorithm \"nope\"")
                && e.contains("recursive_doubling, ring"),
            "{e}"
        );
        let e =
            table(r#"{"rules": [{"collective": "allreduse", "algorithm": "ring"}]}"#).unwrap_err();
        assert!(
            e.contains("unknown collective \"allreduse\"") && e.contains("alltoallv"),
            "{e}"
        );
    }

    #[test]
    fn wrong_types_and_missing_names() {
        for (doc, want) in [
            (
                r#"{"rules": [{"collective": "bcast"}]}"#,
                "missing field `algorithm`",
            ),
            (
                r#"{"rules": [{"collective": "bcast", "algorithm": "chain", "max_bytes": -1}]}"#,
                "-1",
            ),
            (
                r#"{"rules": [{"collective": "bcast", "algorithm": "chain", "window": 2.5}]}"#,
                "2.5",
            ),
            (
                r#"{"rules": [{"collective": 3, "algorithm": "chain"}]}"#,
                "expected a string",
            ),
            (r#"{"rules": {}}"#, "expected a sequence"),
            (r#"[]"#, "expected struct"),
            (r#"{}"#, "missing field `rules`"),
        ] {
            let e = table(doc).unwrap_err();
            assert!(e.contains(want), "{doc}: {e}");
        }
    }

    #[test]
    fn every_truncation_is_an_error() {
        for end in 0..GOOD.len() {
            let e = table(&GOOD[..end]).unwrap_err();
            assert!(e.starts_with("JSON: "), "{end}: {e}");
        }
        let e = table(&GOOD[..GOOD.len() / 2]).unwrap_err();
        assert!(e.contains("EOF while parsing"), "{e}");
        assert!(table(&format!("{GOOD} {{"))
            .unwrap_err()
            .contains("trailing"));
    }

    proptest! {
        #[test]
        fn any_bytes_give_table_or_error(b in proptest::collection::vec(any::<u8>(), 0..400)) {
            let _ = table(&String::from_utf8_lossy(&b));
        }

        /// A valid document with one byte replaced: a table or an error,
        /// never a panic; most such edits hit the structure or a name.
        #[test]
        fn one_byte_changed(at in 0..GOOD.len(), byte in any::<u8>()) {
            let mut b = GOOD.as_bytes().to_vec();
            b[at] = byte;
            let _ = table(&String::from_utf8_lossy(&b));
        }
    }
}
