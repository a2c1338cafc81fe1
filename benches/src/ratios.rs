//! `ibcoll-bench plot-ratios TABLE --out FILE`: a tab-separated table of
//! ratios drawn as bars, so that every comparison script (compare-coll.sh,
//! a future compare-hosts.sh) draws the same way without Python.
//!
//! One bar a line: `panel<TAB>label<TAB>series<TAB>ratio`, `#` starts a
//! comment line, `-` is a ratio that was not measured. Panels, labels and
//! series appear in the order of their first line.

use std::path::Path;

use crate::plot::{self, BarChart, Panel};

/// Reads the table; errors name the line.
pub fn read(text: &str) -> Result<(Vec<String>, Vec<Panel>), String> {
    let mut series: Vec<String> = Vec::new();
    let mut panels: Vec<Panel> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let at = |what: String| format!("line {}: {what}", i + 1);
        if line.trim().is_empty() || line.starts_with('#') {
            continue;
        }
        let f: Vec<&str> = line.split('\t').map(str::trim).collect();
        let [panel, label, name, ratio] = f[..] else {
            return Err(at(format!(
                "{} tab-separated fields, expected 4 (panel, label, series, ratio)",
                f.len()
            )));
        };
        let ratio = match ratio {
            "-" => None,
            r => match r.parse::<f64>() {
                Ok(v) if v.is_finite() && v > 0.0 => Some(v),
                _ => return Err(at(format!("ratio {r:?} is not a positive number or -"))),
            },
        };
        let s = match series.iter().position(|x| x == name) {
            Some(s) => s,
            None => {
                series.push(name.to_string());
                series.len() - 1
            }
        };
        let p = match panels.iter().position(|p| p.title == panel) {
            Some(p) => p,
            None => {
                panels.push(Panel {
                    title: panel.to_string(),
                    labels: Vec::new(),
                    values: Vec::new(),
                });
                panels.len() - 1
            }
        };
        let p = &mut panels[p];
        let l = match p.labels.iter().position(|x| x == label) {
            Some(l) => l,
            None => {
                p.labels.push(label.to_string());
                p.values.push(Vec::new());
                p.labels.len() - 1
            }
        };
        let row = &mut p.values[l];
        if row.len() <= s {
            row.resize(s + 1, None);
        }
        if row[s].is_some() {
            return Err(at(format!("a second ratio for {panel} / {label} / {name}")));
        }
        row[s] = ratio;
    }
    if panels.is_empty() {
        return Err("no ratios (lines: panel<TAB>label<TAB>series<TAB>ratio)".into());
    }
    Ok((series, panels))
}

pub fn draw(table: &Path, out: &Path, title: Option<&str>) -> Result<(), String> {
    let text = std::fs::read_to_string(table).map_err(|e| format!("{}: {e}", table.display()))?;
    let (series, panels) = read(&text).map_err(|e| format!("{}: {e}", table.display()))?;
    plot::bars(
        out,
        &BarChart {
            title: title
                .unwrap_or("ibcoll / MPI latency (below 1: ibcoll faster)")
                .to_string(),
            x_desc: "ratio (log)".into(),
            series,
            panels,
            anchor: Some(1.0),
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn reads_in_order_of_appearance() {
        let (s, p) = read(
            "# np coll size\n2 ranks\tbcast 8\tOpen MPI\t0.5\n\
             2 ranks\tbcast 8\tMPICH\t-\n4 ranks\tscan 8\tMPICH\t2\n\n",
        )
        .unwrap();
        assert_eq!(s, ["Open MPI", "MPICH"]);
        assert_eq!(p.len(), 2);
        assert_eq!(p[0].values, vec![vec![Some(0.5), None]]);
        assert_eq!(
            (p[1].title.as_str(), &p[1].values),
            ("4 ranks", &vec![vec![None, Some(2.0)]])
        );
    }

    #[test]
    fn errors_name_the_line() {
        for (t, want) in [
            ("", "no ratios"),
            ("# only\n", "no ratios"),
            ("a\tb\tc\n", "line 1: 3 tab-separated fields"),
            ("a\tb\tc\t1\na b c 1\n", "line 2: 1 tab-separated"),
            ("a\tb\tc\t0\n", "line 1: ratio \"0\""),
            ("a\tb\tc\tNaN\n", "not a positive number"),
            ("a\tb\tc\t1\na\tb\tc\t2\n", "line 2: a second ratio"),
        ] {
            let e = read(t).unwrap_err();
            assert!(e.contains(want), "{t:?}: {e}");
        }
    }

    proptest! {
        #[test]
        fn any_bytes_read_or_error(b in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = read(&String::from_utf8_lossy(&b));
        }
    }
}
