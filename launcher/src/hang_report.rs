//! The job-wide watchdog report `ibrun` prints once: the states the ranks'
//! hang watchdogs put (`ibcoll-hang-<rank>`, see
//! [`HANG_KEY_PREFIX`](crate::server::HANG_KEY_PREFIX)) grouped by what
//! the ranks do, each group named by rank ranges, e.g.
//! `ranks 1-3: waiting in barrier (...) for rank 0` and
//! `ranks 0, 4-7: not waiting in ibcoll (...)`.

use std::collections::BTreeMap;

/// What a rank's state value says, without the time it waited (which
/// differs between ranks doing the same thing): `(text, seconds)`.
fn parse(value: &str) -> (String, Option<f64>) {
    let mut parts = value.split('|');
    let text = parts.next().unwrap_or("").replace('_', " ");
    let secs = parts.nth(1).and_then(|s| s.parse().ok());
    (text, secs)
}

/// Whether a state value is a wait that fired (not a rank that reached
/// finalize, which every rank says when the watchdog is on).
pub fn is_wait(value: &str) -> bool {
    !value.starts_with("finalizing")
}

/// `rank 3`, `ranks 0-2, 5`.
pub fn ranges(ranks: &[usize]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < ranks.len() {
        let mut j = i;
        while j + 1 < ranks.len() && ranks[j + 1] == ranks[j] + 1 {
            j += 1;
        }
        out.push(if j == i {
            ranks[i].to_string()
        } else {
            format!("{}-{}", ranks[i], ranks[j])
        });
        i = j + 1;
    }
    let s = if ranks.len() == 1 { "" } else { "s" };
    format!("rank{s} {}", out.join(", "))
}

/// The report's lines for a job of `n` ranks: `states` by rank (as put),
/// `other(r)` for a rank that put none (it never waited in ibcoll that
/// long: in user code, finalized, exited). Identical states form one line,
/// lines in the order of their first rank.
pub fn lines(
    n: usize,
    states: &BTreeMap<usize, String>,
    mut other: impl FnMut(usize) -> String,
) -> Vec<String> {
    let mut groups: Vec<(String, Vec<usize>, Option<f64>)> = Vec::new();
    let mut index: BTreeMap<String, usize> = BTreeMap::new();
    for r in 0..n {
        let (text, secs) = match states.get(&r) {
            Some(v) => parse(v),
            None => (other(r), None),
        };
        let g = *index.entry(text.clone()).or_insert_with(|| {
            groups.push((text, Vec::new(), None));
            groups.len() - 1
        });
        groups[g].1.push(r);
        if let Some(s) = secs {
            groups[g].2 = Some(groups[g].2.map_or(s, |m: f64| m.max(s)));
        }
    }
    groups
        .into_iter()
        .map(|(text, ranks, secs)| match secs {
            Some(s) => format!("{}: {text} (waited {s:.1} s)", ranges(&ranks)),
            None => format!("{}: {text}", ranges(&ranks)),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank_ranges() {
        assert_eq!(ranges(&[3]), "rank 3");
        assert_eq!(ranges(&[0, 1, 2, 5, 7, 8]), "ranks 0-2, 5, 7-8");
    }

    #[test]
    fn identical_states_are_one_line() {
        let mut st = BTreeMap::new();
        for r in 1..4 {
            st.insert(
                r,
                "waiting_in_barrier_(call_1)_for_rank_0|0|2.5".to_string(),
            );
        }
        st.insert(
            5,
            "waiting_in_barrier_(call_1)_for_rank_0|0|2.0".to_string(),
        );
        st.insert(
            6,
            "finalizing_(it_called_no_further_collective)".to_string(),
        );
        let l = lines(8, &st, |_| "in user code".into());
        assert_eq!(
            l,
            [
                "ranks 0, 4, 7: in user code",
                "ranks 1-3, 5: waiting in barrier (call 1) for rank 0 (waited 2.5 s)",
                "rank 6: finalizing (it called no further collective)",
            ]
        );
        assert!(is_wait(&st[&1]) && !is_wait(&st[&6]));
    }
}
