//! PSTSWM's summary of a set of protocols on one machine and grid: the
//! best time, the spread of all of them relative to it, the three fastest
//! and how many are within 1%, 5% and 25% of the best. A protocol's time
//! is the median of its repetitions.

/// One protocol's repetitions (seconds).
pub struct Timing {
    pub name: String,
    pub reps: Vec<f64>,
}

/// One protocol's line: median, min and max of its repetitions.
pub struct Row {
    pub name: String,
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

/// The PSTSWM line of one grid.
pub struct Summary {
    pub grid: String,
    pub protocols: usize,
    /// The best protocol's time.
    pub best: f64,
    /// (mean - best) / best, (median - best) / best and (max - best) / best
    /// over the protocols' times.
    pub mean_rel: f64,
    pub median_rel: f64,
    pub max_rel: f64,
    /// Protocols within 1%, 5% and 25% of the best (the best included).
    pub within: [usize; 3],
    pub fastest: Vec<String>,
}

pub fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

/// The rows, fastest first, and the summary of `timings` (not empty).
pub fn summarize(grid: &str, timings: &[Timing]) -> (Vec<Row>, Summary) {
    let mut rows: Vec<Row> = timings
        .iter()
        .map(|t| Row {
            name: t.name.clone(),
            median: median(&t.reps),
            min: t.reps.iter().copied().fold(f64::INFINITY, f64::min),
            max: t.reps.iter().copied().fold(0.0, f64::max),
        })
        .collect();
    rows.sort_by(|a, b| a.median.total_cmp(&b.median));
    let times: Vec<f64> = rows.iter().map(|r| r.median).collect();
    let best = times[0];
    let mean = times.iter().sum::<f64>() / times.len() as f64;
    let rel = |t: f64| (t - best) / best;
    let within =
        [0.01, 0.05, 0.25].map(|f| times.iter().filter(|&&t| t <= best * (1.0 + f)).count());
    let s = Summary {
        grid: grid.into(),
        protocols: rows.len(),
        best,
        mean_rel: rel(mean),
        median_rel: rel(median(&times)),
        max_rel: rel(times[times.len() - 1]),
        within,
        fastest: rows.iter().take(3).map(|r| r.name.clone()).collect(),
    };
    (rows, s)
}

/// The per-protocol table of one grid (times in microseconds).
pub fn rows_text(rows: &[Row]) -> String {
    let best = rows.first().map_or(1.0, |r| r.median);
    let mut s = format!(
        "# {:<22}{:>14}{:>12}{:>12}{:>9}\n",
        "protocol", "median(us)", "min(us)", "max(us)", "/best"
    );
    for r in rows {
        s += &format!(
            "  {:<22}{:>14.1}{:>12.1}{:>12.1}{:>9.3}\n",
            r.name,
            r.median * 1e6,
            r.min * 1e6,
            r.max * 1e6,
            r.median / best
        );
    }
    s
}

/// The header of the summary table (benches/mpi/transpose.c prints the
/// same columns).
pub const SUMMARY_HEADER: &str =
    "# grid   protocols   best(us)  (mean-min)/min  (median-min)/min  (max-min)/min  within 1/5/25%  fastest three";

pub fn summary_line(s: &Summary) -> String {
    format!(
        "  {:<8}{:>9}{:>11.1}{:>16.3}{:>18.3}{:>15.3}{:>16}  {}",
        s.grid,
        s.protocols,
        s.best * 1e6,
        s.mean_rel,
        s.median_rel,
        s.max_rel,
        format!("{}/{}/{}", s.within[0], s.within[1], s.within[2]),
        s.fastest.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(name: &str, reps: &[f64]) -> Timing {
        Timing {
            name: name.into(),
            reps: reps.to_vec(),
        }
    }

    #[test]
    fn pstswm_summary() {
        // Medians 1.0, 1.004, 1.03, 1.2, 2.0.
        let ts = [
            t("c", &[1.2, 1.1, 1.3]),
            t("a", &[1.0, 0.9, 5.0]),
            t("e", &[2.0]),
            t("b", &[1.004, 1.004]),
            t("d", &[1.03, 1.02, 1.04]),
        ];
        let (rows, s) = summarize("2x4", &ts);
        let names: Vec<&str> = rows.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["a", "b", "d", "c", "e"]);
        assert_eq!((rows[0].min, rows[0].max), (0.9, 5.0));
        assert_eq!(s.best, 1.0);
        assert_eq!(s.within, [2, 3, 4]);
        assert_eq!(s.fastest, ["a", "b", "d"]);
        let mean = (1.0 + 1.004 + 1.03 + 1.2 + 2.0) / 5.0;
        assert!((s.mean_rel - (mean - 1.0)).abs() < 1e-12);
        assert!((s.median_rel - 0.03).abs() < 1e-12);
        assert!((s.max_rel - 1.0).abs() < 1e-12);
        let line = summary_line(&s);
        assert!(line.contains("2/3/4") && line.contains("a, b, d"), "{line}");
    }

    #[test]
    fn medians() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(&[]).is_nan());
    }
}
