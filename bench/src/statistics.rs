//! Statistics over the samples of a metric: medians, quantiles, spreads, and the paired
//! differences and ratios a verdict is taken on.

/// Samples of one metric, without and with the shim.
#[derive(Default)]
pub struct Samples {
    pub without: Vec<f64>,
    pub with: Vec<f64>,
}

impl Samples {
    pub fn push(&mut self, shim: bool, v: f64) {
        if shim {
            self.with.push(v)
        } else {
            self.without.push(v)
        }
    }
}

pub fn median(v: &[f64]) -> f64 {
    quantile(v, 0.5)
}

pub fn quantile(v: &[f64], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let pos = q * (v.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    v[lo] + (v[hi] - v[lo]) * (pos - lo as f64)
}

/// Interquartile range relative to the median, in percent: how noisy a side was.
pub fn spread(v: &[f64]) -> f64 {
    100.0 * (quantile(v, 0.75) - quantile(v, 0.25)) / median(v)
}

pub enum Kind {
    /// Shim minus baseline must stay at or under the target.
    AddedAtMost(f64),
    /// Shim / baseline must be at least the target.
    RatioAtLeast(f64),
    /// Shim / baseline must be at most the target.
    RatioAtMost(f64),
    /// An A/B of two builds ("without" is A, the baseline build; "with" is B, this one):
    /// B's median must be at most A's plus the larger of this many percent and A's spread.
    /// A faster B always meets it.
    AbWithin(f64),
    /// Shown for information.
    Info,
}

/// What a run makes of a row (docs/benchmarks.md, "Verdicts").
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    /// The target is met.
    Meets,
    /// The target is missed, by no more than the row's margin: shown, not a failure.
    Misses,
    /// The target is missed beyond the row's margin: `--check` fails.
    Fails,
    /// The row cannot be judged on this machine, for the reason given.
    NotJudged(String),
    /// Shown for information.
    Info,
}

impl Verdict {
    pub fn word(&self) -> &'static str {
        match self {
            Verdict::Meets => "meets",
            Verdict::Misses => "misses",
            Verdict::Fails => "FAILS",
            Verdict::NotJudged(_) => "not judged",
            Verdict::Info => "",
        }
    }
}

pub struct Metric {
    pub key: String,
    pub label: String,
    pub unit: &'static str,
    pub samples: Samples,
    pub kind: Kind,
    /// The target as the design states it.
    pub target: &'static str,
    /// How far past the target the row may read before it fails, in the target's own
    /// terms: nanoseconds or microseconds added, a ratio, or percentage points (A/B).
    pub margin: f64,
    /// Why this machine cannot judge the row, if it cannot.
    pub not_judged: Option<String>,
    /// Measured again with the full plan after a quick run read it past its margin.
    pub remeasured: bool,
}

impl Metric {
    pub fn without(&self) -> f64 {
        median(&self.samples.without)
    }
    pub fn with(&self) -> f64 {
        median(&self.samples.with)
    }
    /// Median of the per-round ratios: each shim run against the baseline run next to it.
    pub fn ratio(&self) -> f64 {
        median(&self.ratios())
    }
    /// The per-round ratios (each shim run against the baseline run next to it).
    pub fn ratios(&self) -> Vec<f64> {
        self.samples.without.iter().zip(&self.samples.with).map(|(a, b)| b / a).collect()
    }
    /// Median of the per-round differences, paired as for [`Metric::ratio`].
    pub fn added(&self) -> f64 {
        let d: Vec<f64> = self.samples.without.iter().zip(&self.samples.with).map(|(a, b)| b - a).collect();
        median(&d)
    }
    /// B's median against A's, in percent (A/B rows).
    pub fn ab_change_pct(&self) -> f64 {
        100.0 * (self.with() - self.without()) / self.without()
    }
    /// How much slower B may be, in percent: the larger of `floor` and A's spread.
    pub fn ab_bar_pct(&self, floor: f64) -> f64 {
        floor.max(spread(&self.samples.without))
    }
    pub fn meets(&self) -> Option<bool> {
        self.within(0.0)
    }

    /// Whether the row's figure is within `slack` past its target (`None` for information).
    fn within(&self, slack: f64) -> Option<bool> {
        match self.kind {
            Kind::AddedAtMost(t) => Some(self.added() <= t + slack),
            Kind::RatioAtLeast(t) => Some(self.ratio() >= t - slack),
            Kind::RatioAtMost(t) => Some(self.ratio() <= t + slack),
            Kind::AbWithin(floor) => Some(self.ab_change_pct() <= self.ab_bar_pct(floor) + slack),
            Kind::Info => None,
        }
    }

    /// The row's verdict: met, missed within its margin, missed beyond it, or not judged.
    /// A figure that is not a number (no samples) fails: a row that measured nothing must
    /// never pass.
    pub fn verdict(&self) -> Verdict {
        if let Some(why) = &self.not_judged {
            return Verdict::NotJudged(why.clone());
        }
        match (self.within(0.0), self.within(self.margin)) {
            (None, _) => Verdict::Info,
            (Some(true), _) => Verdict::Meets,
            (Some(false), Some(true)) => Verdict::Misses,
            (Some(false), _) => Verdict::Fails,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metric(kind: Kind, margin: f64, without: &[f64], with: &[f64]) -> Metric {
        Metric {
            key: "k".into(),
            label: "k".into(),
            unit: "ns",
            samples: Samples { without: without.to_vec(), with: with.to_vec() },
            kind,
            target: "-",
            margin,
            not_judged: None,
            remeasured: false,
        }
    }

    #[test]
    fn a_target_missed_beyond_its_margin_fails_and_within_it_only_misses() {
        let added = |with: f64| metric(Kind::AddedAtMost(50.0), 25.0, &[100.0, 100.0, 100.0], &[with, with, with]).verdict();
        assert_eq!(added(140.0), Verdict::Meets);
        assert_eq!(added(160.0), Verdict::Misses);
        assert_eq!(added(175.0), Verdict::Misses);
        assert_eq!(added(176.0), Verdict::Fails);
        let ratio = |with: f64| metric(Kind::RatioAtLeast(0.9), 0.1, &[10.0, 10.0], &[with, with]).verdict();
        assert_eq!(ratio(9.5), Verdict::Meets);
        assert_eq!(ratio(8.5), Verdict::Misses);
        assert_eq!(ratio(7.9), Verdict::Fails);
        let at_most = |with: f64| metric(Kind::RatioAtMost(1.05), 0.05, &[10.0], &[with]).verdict();
        assert_eq!(at_most(10.4), Verdict::Meets);
        assert_eq!(at_most(10.9), Verdict::Misses);
        assert_eq!(at_most(11.2), Verdict::Fails);
    }

    #[test]
    fn a_row_that_measured_nothing_fails_and_one_not_judged_says_why() {
        assert_eq!(metric(Kind::AddedAtMost(50.0), 25.0, &[], &[]).verdict(), Verdict::Fails);
        assert_eq!(metric(Kind::RatioAtLeast(0.9), 0.1, &[], &[]).verdict(), Verdict::Fails);
        assert_eq!(metric(Kind::Info, 0.0, &[1.0], &[2.0]).verdict(), Verdict::Info);
        let mut m = metric(Kind::RatioAtLeast(0.9), 0.1, &[10.0], &[1.0]);
        m.not_judged = Some("2 CPUs".into());
        assert_eq!(m.verdict(), Verdict::NotJudged("2 CPUs".into()));
    }
}
