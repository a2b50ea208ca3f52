//! `docs/benchmarks.png`: every `RESULT` line of `docs/benchmarks.md` as a
//! bar of how many times better Isthmus did than the peer or target it was
//! measured against, drawn by gnuplot.

use std::{fs, path::PathBuf};

use anyhow::{Context, Result, bail};
use xtask::cmd::run;

fn docs() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs")
}

/// One `RESULT` line: its name and Isthmus' advantage (above 1: better).
#[derive(Debug, PartialEq)]
struct Advantage {
    name: String,
    times: f64,
}

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
    let smaller_is_better = ["-ms", "-us", "-ns-", "rss", "cpu", "cost"]
        .iter()
        .any(|unit| metric.contains(unit));
    let times = if smaller_is_better {
        1.0 / ratio
    } else {
        ratio
    };
    // A cost that was negative in the median round has no advantage to
    // draw: the RESULT line says it.
    (times.is_finite() && times > 0.0).then_some(Advantage { name, times })
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
        rows.push_str(&format!("{i} {} \"{}\"\n", a.times, a.name));
    }
    fs::write(&data, rows)?;
    let png = docs().join("benchmarks.png");
    let script = format!(
        r#"set terminal pngcairo size 1100,{height} font "sans,9"
set output "{png}"
set title "Isthmus against the peer or target of each benchmark (docs/benchmarks.md): how many times better"
set logscale x 10
set xrange [0.1:100000]
set yrange [-1:{rows}]
set xtics format "%g×"
set grid xtics
set key off
set style fill solid 0.8
set arrow from 1, graph 0 to 1, graph 1 nohead lc rgb "black" lw 2
plot "{data}" using (($2 < 1) ? $2 : 1):1:(($2 < 1) ? $2 : 1):(($2 < 1) ? 1 : $2):($1 - 0.35):($1 + 0.35):(($2 >= 1) ? 0x2e8b57 : 0xcd5c5c):ytic(3) with boxxyerror lc rgb variable, \
     "{data}" using 2:1:(sprintf(" %.3g×", $2)) with labels left font "sans,8"
"#,
        height = 140 + 22 * advantages.len(),
        png = png.display(),
        data = data.display(),
        rows = advantages.len(),
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
        assert_eq!(advantage(&line("0.25")).unwrap().times, 4.0);
    }
}
