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

pub struct Metric {
    pub key: String,
    pub label: String,
    pub unit: &'static str,
    pub samples: Samples,
    pub kind: Kind,
    /// The target as the design states it.
    pub target: &'static str,
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
        match self.kind {
            Kind::AddedAtMost(t) => Some(self.added() <= t),
            Kind::RatioAtLeast(t) => Some(self.ratio() >= t),
            Kind::RatioAtMost(t) => Some(self.ratio() <= t),
            Kind::AbWithin(floor) => Some(self.ab_change_pct() <= self.ab_bar_pct(floor)),
            Kind::Info => None,
        }
    }
}
