//! The report: the table (or JSON) of the metrics, their spreads and paired ratios, and
//! what the run was (date, machine, load).

use crate::plan::{ALLOC_SIZE, LIMIT, PROCESSES, SIM_MEMORY};
use crate::statistics::{quantile, spread, Kind, Metric, Verdict};
use serde_json::{json, Value};

/// A figure and its unit; ratios ("x") with three decimals.
fn fmt_value(v: f64, unit: &str) -> String {
    if unit == "x" {
        format!("{v:.3}x")
    } else {
        format!("{} {unit}", fmt_num(v))
    }
}

pub fn fmt_num(v: f64) -> String {
    match v.abs() {
        a if a >= 1000.0 => format!("{v:.0}"),
        a if a >= 100.0 => format!("{v:.1}"),
        a if a >= 1.0 => format!("{v:.2}"),
        _ => format!("{v:.3}"),
    }
}

pub struct Report {
    pub plan: &'static str,
    pub date: String,
    pub machine: String,
    pub cpus: usize,
    pub metrics: Vec<Metric>,
    pub startup_quiet: bool,
    /// Median minor page faults of `/bin/true` under each preload: (name, label, faults).
    pub startup_faults: Vec<(String, String, f64)>,
    pub seconds: f64,
    /// One-minute load average before and after the run.
    pub load: (f64, f64),
}

impl Report {
    pub fn print(&self) {
        println!("fgpu-bench ({} run, {}, {} CPUs: {})", self.plan, self.date, self.cpus, self.machine);
        println!(
            "simulated driver, cap {LIMIT} of {SIM_MEMORY}, {} MiB per allocation; medians of interleaved runs, difference/ratio = median over paired runs",
            ALLOC_SIZE >> 20
        );
        if self.load.0.max(self.load.1) >= 0.5 {
            println!("note: load average {:.2} before, {:.2} after: other work was running and adds noise to both sides", self.load.0, self.load.1);
        }
        if self.cpus < PROCESSES && self.metrics.iter().any(|m| m.key == "alloc_free_4proc_mpairs_per_s") {
            println!("note: {PROCESSES} processes share {} CPUs in the 4-process figure", self.cpus);
        }
        println!();
        let header = ["metric", "without shim", "with shim", "difference", "target", "verdict"];
        let rows: Vec<[String; 6]> = self
            .metrics
            .iter()
            .map(|m| {
                [
                    m.label.clone(),
                    fmt_value(m.without(), m.unit),
                    fmt_value(m.with(), m.unit),
                    difference_text(m),
                    m.target.to_string(),
                    format!("{}{}", m.verdict().word(), if m.remeasured { " (full)" } else { "" }),
                ]
            })
            .collect();
        let mut width = header.map(str::len);
        for row in &rows {
            for (w, cell) in width.iter_mut().zip(row) {
                *w = (*w).max(cell.chars().count());
            }
        }
        let line = |cells: &[String]| {
            let mut out = String::new();
            for (i, (cell, w)) in cells.iter().zip(width).enumerate() {
                if i == 0 {
                    out += &format!("{cell:<w$}");
                } else {
                    out += &format!("  {cell:>w$}");
                }
            }
            println!("{}", out.trim_end());
        };
        line(&header.map(String::from));
        line(&width.map(|w| "-".repeat(w)));
        for row in &rows {
            line(row);
        }
        println!();
        let noise: Vec<String> = self
            .metrics
            .iter()
            .filter(|m| !matches!(m.kind, Kind::Info))
            .map(|m| format!("{} {:.1}%/{:.1}% (n={})", m.key, spread(&m.samples.without), spread(&m.samples.with), m.samples.with.len()))
            .collect();
        println!("spread (IQR/median, without/with): {}", noise.join("; "));
        if self.metrics.iter().any(|m| matches!(m.kind, Kind::AbWithin(_))) {
            println!("A/B rows: \"without shim\" is A (the baseline build), \"with shim\" is B (this build), each the cost with the shim; B meets when its median is at most A's plus max(3%, A's spread), the spread above (without = A)");
        }
        // How far the paired ratios themselves scatter: their quartiles.
        let ratios: Vec<String> = self
            .metrics
            .iter()
            .filter(|m| matches!(m.kind, Kind::RatioAtMost(_) | Kind::RatioAtLeast(_)))
            .map(|m| {
                let r = m.ratios();
                format!("{} {:.3}x..{:.3}x", m.key, quantile(&r, 0.25), quantile(&r, 0.75))
            })
            .collect();
        if !ratios.is_empty() {
            println!("paired ratios, quartiles: {}", ratios.join("; "));
        }
        let margins: Vec<String> = self
            .metrics
            .iter()
            .filter(|m| matches!(m.verdict(), Verdict::Meets | Verdict::Misses | Verdict::Fails))
            .map(|m| format!("{} {}", m.key, margin_text(m)))
            .collect();
        println!("fails beyond (target + margin; docs/benchmarks.md, \"Verdicts\"): {}", margins.join("; "));
        for m in &self.metrics {
            if let Verdict::NotJudged(why) = m.verdict() {
                println!("not judged: {}: {why}", m.key);
            }
        }
        if self.metrics.iter().any(|m| m.remeasured) {
            println!("(full): read past its margin in the quick run, so measured again with the full plan; the verdict is that measurement's");
        }
        if self.startup_faults.is_empty() {
            // No start-up rows: nothing was spawned bare.
            println!("run took {:.1} s", self.seconds);
            return;
        }
        let faults: Vec<String> = self.startup_faults.iter().map(|(_, label, f)| format!("{label} {f:.0}")).collect();
        println!("/bin/true minor page faults (median): {}", faults.join(", "));
        println!(
            "/bin/true under the shim created {}; run took {:.1} s",
            if self.startup_quiet { "no file" } else { "a FILE (ledger or state): it should not" },
            self.seconds
        );
    }

    /// The keys of the rows that missed their target beyond its margin.
    pub fn failed(&self) -> Vec<String> {
        self.metrics.iter().filter(|m| m.verdict() == Verdict::Fails).map(|m| m.key.clone()).collect()
    }

    pub fn to_json(&self) -> Value {
        let metrics: Vec<Value> = self
            .metrics
            .iter()
            .map(|m| {
                json!({
                    "key": m.key,
                    "label": m.label.trim(),
                    "unit": m.unit,
                    "without": m.without(),
                    "with": m.with(),
                    "difference": m.added(),
                    "ratio": m.ratio(),
                    "target": m.target,
                    "meets": m.meets(),
                    "verdict": m.verdict().word().to_lowercase(),
                    "margin": m.margin,
                    "not_judged": match m.verdict() { Verdict::NotJudged(why) => Value::from(why), _ => Value::Null },
                    "remeasured": m.remeasured,
                    "spread_pct": { "without": spread(&m.samples.without), "with": spread(&m.samples.with) },
                    "ratio_quartiles": [quantile(&m.ratios(), 0.25), quantile(&m.ratios(), 0.75)],
                    "samples": { "without": m.samples.without, "with": m.samples.with },
                })
            })
            .collect();
        json!({
            "plan": self.plan,
            "date": self.date,
            "machine": self.machine,
            "cpus": self.cpus,
            "limit": LIMIT,
            "sim_memory": SIM_MEMORY,
            "alloc_size": ALLOC_SIZE,
            "processes": PROCESSES,
            "metrics": metrics,
            "failed": self.failed(),
            "startup_created_no_file": self.startup_quiet,
            "startup_minor_faults": self.startup_faults.iter().map(|(name, _, f)| (name.clone(), json!(f))).collect::<serde_json::Map<String, Value>>(),
            "seconds": self.seconds,
            "load_average": { "before": self.load.0, "after": self.load.1 },
        })
    }
}

pub fn loadavg() -> f64 {
    std::fs::read_to_string("/proc/loadavg").ok().and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok())).unwrap_or(f64::NAN)
}

pub fn machine() -> String {
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("model name")).and_then(|l| l.split_once(':')).map(|(_, m)| m.trim().to_string()))
        .unwrap_or_else(|| "unknown CPU".into());
    let virt = std::fs::read_to_string("/proc/cpuinfo").map(|s| s.contains(" hypervisor")).unwrap_or(false);
    if virt {
        format!("{model}, virtual machine")
    } else {
        model
    }
}

/// Today's date (UTC) as YYYY-MM-DD, from the civil-from-days algorithm.
pub fn utc_date() -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let z = (secs / 86_400) as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + if month <= 2 { 1 } else { 0 };
    format!("{year:04}-{month:02}-{day:02}")
}

/// The bar past which a row fails, in its own terms.
fn margin_text(m: &Metric) -> String {
    match m.kind {
        Kind::AddedAtMost(t) => format!("+{} {}", fmt_num(t + m.margin), m.unit),
        Kind::RatioAtLeast(t) => format!("< {:.2}x", t - m.margin),
        Kind::RatioAtMost(t) => format!("> {:.2}x", t + m.margin),
        Kind::AbWithin(floor) => format!("B > A + {:.1}%", m.ab_bar_pct(floor) + m.margin),
        Kind::Info => String::new(),
    }
}

/// The difference column: a ratio where the target is one, else the added amount (and the
/// ratio beside it when it is readable).
fn difference_text(m: &Metric) -> String {
    let ratio = m.ratio();
    match m.kind {
        Kind::RatioAtLeast(_) | Kind::RatioAtMost(_) => format!("{ratio:.3}x"),
        Kind::AbWithin(floor) => format!("{:+.2}% (bar {:.1}%)", m.ab_change_pct(), m.ab_bar_pct(floor)),
        Kind::AddedAtMost(_) | Kind::Info => {
            let added = m.added();
            let sign = if added < 0.0 { "-" } else { "+" };
            let mut text = format!("{sign}{} {}", fmt_num(added.abs()), m.unit);
            if ratio < 100.0 {
                text += &format!(" ({ratio:.2}x)");
            }
            text
        }
    }
}
