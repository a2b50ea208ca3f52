//! `docs/benchmarks.png`: every `RESULT` line of `docs/benchmarks.md` as a
//! bar of how many times better Isthmus did than the peer or target it was
//! measured against, drawn by gnuplot.

use std::{fs, path::PathBuf};

use anyhow::{Context, Result, bail};
use isthmus_lab::cmd::run;

fn docs() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs")
}

/// One `RESULT` line: its name and Isthmus' advantage (above 1: better),
/// the median over rounds and the range of the rounds.
#[derive(Debug, PartialEq)]
struct Advantage {
    name: String,
    times: f64,
    least: f64,
    most: f64,
}

/// The chart's axis: a range is drawn up to its edges.
const AXIS: (f64, f64) = (0.1, 100_000.0);

/// The advantage a `RESULT name=… ratio=…` line records, if it can be
/// drawn as a bar. The ratio is
/// Isthmus over the peer; where smaller is better (times, latencies,
/// memory, CPU, cost), the advantage is its inverse.
fn advantage(line: &str) -> Option<Advantage> {
    let field = |key: &str| {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
    };
    let name = field("name")?.to_owned();
    let ratio: f64 = field("ratio")?.parse().ok()?;
    let metric = name.split("-vs-").next().unwrap_or(&name);
    let smaller_is_better = ["-ms", "-us", "-ns-", "-mib", "rss", "cpu", "cost"]
        .iter()
        .any(|unit| metric.contains(unit));
    // A cost at or below zero (faster than the reference) is an unbounded
    // advantage.
    let times = |ratio: f64| match (smaller_is_better, ratio > 0.0) {
        (true, true) => 1.0 / ratio,
        (true, false) => f64::INFINITY,
        (false, _) => ratio,
    };
    let bound = |key| {
        field(key)
            .and_then(|r| r.parse().ok())
            .map_or(times(ratio), times)
    };
    let (a, b) = (bound("min"), bound("max"));
    let clamp = |t: f64| t.clamp(AXIS.0, AXIS.1);
    let median = times(ratio);
    // A cost that was negative in the median round has no bar to draw: the
    // RESULT line says it.
    (median.is_finite() && median > 0.0).then_some(Advantage {
        name,
        times: median,
        least: clamp(a.min(b)),
        most: clamp(a.max(b)),
    })
}

/// Renders the chart from the results in `docs/benchmarks.md`.
pub fn render() -> Result<()> {
    let results = fs::read_to_string(docs().join("benchmarks.md"))?;
    let advantages: Vec<Advantage> = results.lines().filter_map(advantage).collect();
    if advantages.is_empty() {
        bail!("docs/benchmarks.md holds no RESULT line");
    }
    let data = docs().join("../target/benchmarks.dat");
    let mut rows = String::new();
    // gnuplot draws the first row at the bottom: reverse, so the chart
    // reads in the document's order.
    for (i, a) in advantages.iter().rev().enumerate() {
        rows.push_str(&format!(
            "{i} {} {} {} \"{}\"\n",
            a.times, a.least, a.most, a.name
        ));
    }
    fs::write(&data, rows)?;
    let png = docs().join("benchmarks.png");
    let script = format!(
        r#"set terminal pngcairo size 1100,{height} font "sans,9"
set output "{png}"
set title "Isthmus against the peer or target of each benchmark (docs/benchmarks.md): how many times better, median over rounds, with the range of the rounds"
set logscale x 10
set xrange [{low}:{high}]
set yrange [-1:{rows}]
set xtics format "%g×"
set grid xtics
set key off
set style fill solid 0.8
set arrow from 1, graph 0 to 1, graph 1 nohead lc rgb "black" lw 2
plot "{data}" using (($2 < 1) ? $2 : 1):1:(($2 < 1) ? $2 : 1):(($2 < 1) ? 1 : $2):($1 - 0.35):($1 + 0.35):(($2 >= 1) ? 0x2e8b57 : 0xcd5c5c):ytic(5) with boxxyerror lc rgb variable, \
     "{data}" using 2:1:3:4 with xerrorbars lc rgb "black" pt 0, \
     "{data}" using 4:1:(sprintf(" %.3g×", $2)) with labels left font "sans,8"
"#,
        height = 140 + 22 * advantages.len(),
        png = png.display(),
        data = data.display(),
        rows = advantages.len(),
        low = AXIS.0,
        high = AXIS.1,
    );
    let script_path = docs().join("../target/benchmarks.gnuplot");
    fs::write(&script_path, script)?;
    run("gnuplot", &[&script_path.to_string_lossy()]).context("gnuplot")?;
    println!("bench: drew {}", png.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smaller_is_better_for_times_memory_and_cpu() {
        let line =
            |name: &str, ratio: &str| format!("RESULT name={name} isthmus=1 peer=2 ratio={ratio}");
        let times = |name, ratio| advantage(&line(name, ratio)).unwrap().times;
        assert_eq!(times("overlay-pps-worker-vs-liqo", "1.5"), 1.5);
        assert_eq!(times("tunnel-rtt-p50-us-vs-wireguard-go", "0.5"), 2.0);
        assert_eq!(times("agent-rss-mib-200peers-vs-budget", "0.25"), 4.0);
        assert_eq!(times("idle-memory-mib-1000-peers-vs-budget", "0.5"), 2.0);
        assert_eq!(
            times("agent-cpu-percent-under-flood-guard-vs-no-guard", "0.01"),
            100.0
        );
        assert_eq!(
            times("nat-cost-ns-per-packet-200peers-vs-iptables", "0.5"),
            2.0
        );
        assert_eq!(
            times("natmapping-10k-converge-ms-vs-iptables", "1e-3"),
            1000.0
        );
        assert!(advantage("| plain | - | 211769 |").is_none());
    }

    #[test]
    fn a_negative_or_zero_ratio_draws_no_bar() {
        let line = |ratio: &str| {
            format!(
                "RESULT name=nat-cost-ns-per-packet-200peers-vs-liqo isthmus=-3 peer=900 ratio={ratio} min=-0.1 max=0.2 rounds=5"
            )
        };
        assert!(advantage(&line("-0.003")).is_none());
        assert!(advantage(&line("0")).is_none());
        let drawn = advantage(&line("0.25")).unwrap();
        assert_eq!(drawn.times, 4.0);
        // The round at -0.1 beat the reference outright: its bar ends at the
        // axis; the round at 0.2 was 5x better.
        assert_eq!((drawn.least, drawn.most), (5.0, AXIS.1));
    }

    #[test]
    fn the_range_is_the_rounds_least_and_greatest_advantage() {
        let line = "RESULT name=tunnel-tcp-1stream-gbps-vs-wireguard-go-current isthmus=2 peer=1 ratio=1.9 min=1.5 max=2.2 rounds=5";
        let a = advantage(line).unwrap();
        assert_eq!((a.times, a.least, a.most), (1.9, 1.5, 2.2));
        let line = "RESULT name=tunnel-rtt-p99-us-vs-wireguard-go-current isthmus=1 peer=2 ratio=0.5 min=0.25 max=1 rounds=5";
        let a = advantage(line).unwrap();
        assert_eq!((a.times, a.least, a.most), (2.0, 1.0, 4.0));
        let line = "RESULT name=overlay-pps-vs-liqo isthmus=2 peer=1 ratio=2";
        let a = advantage(line).unwrap();
        assert_eq!((a.least, a.most), (2.0, 2.0));
    }
}
