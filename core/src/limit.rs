//! Parsing of memory sizes and caps (`FGPU_LIMIT`, the `limit` line of the config file).
//!
//! Grammar, whitespace around tokens ignored, units case-insensitive:
//!
//! ```text
//! limit   := amount | entry ("," entry)*
//! entry   := key "=" amount
//! key     := "*" | ("GPU-" | "MIG-") hex-and-dashes   (a UUID or a prefix of one)
//! amount  := size | number "%"
//! size    := number [unit]
//! unit    := ("K" | "M" | "G" | "T") ["i"] ["B"]  |  "B"
//! ```
//!
//! Every unit is a binary multiple, as in Docker's `--memory`: `8G` = `8GiB` = `8GB` =
//! 8589934592 bytes. A number may have a fractional part (`1.5G`); the result is rounded
//! down to a whole byte.
//!
//! **A cap too small for any CUDA context is refused** ([`MIN_CAP_BYTES`], 1 MiB): every
//! context holds far more device memory than that (hundreds of MiB on current GPUs), so
//! such a cap can only be a number whose unit was left out (`FGPU_LIMIT=8` is 8 bytes, not
//! 8 GiB) and the error says which was probably meant. The one exception is exactly one
//! byte, written `1` (or `1B`): "no memory on this GPU", which `fgpu cdi generate` writes for the GPUs a
//! device does not name (`*=1`). Percentages are not checked.
//!
//! A device key is a UUID or a prefix of one; for each device the longest matching key
//! decides. A key that would decide for more than one of the devices present is ambiguous
//! ([`LimitSpec::ambiguous_key`]): the caller treats it as an error, checked against every
//! device the machine lists (not only those a process sees), so that every process reads a
//! key the same way.

use thiserror::Error;

/// Why a size or limit string was rejected. The message names the problem; the caller adds
/// which variable or file line it came from.
/// The one rule for a cap's smallest size, in the words of every error that applies it
/// (`0`, `8`, `512K`).
pub const CAP_RULE: &str = "a cap must be at least 1 MiB, or exactly 1 byte to give a GPU no memory";

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum LimitError {
    #[error("it is empty")]
    Empty,
    #[error("{0:?} is not a number followed by an optional unit (K, M, G, T with optional i/iB/B) or %")]
    Malformed(String),
    #[error("{0:?} is negative")]
    Negative(String),
    #[error("{0:?} is zero ({rule})", rule = CAP_RULE)]
    Zero(String),
    #[error("{0:?} is too large (more than 2^64 bytes)")]
    Overflow(String),
    #[error("{0:?} is not a percentage between 0 and 100")]
    BadPercent(String),
    #[error("{0:?} is not a device key: use '*' or a GPU or MIG UUID such as GPU-1a2b3c4d (a prefix is enough)")]
    BadKey(String),
    #[error("device {0:?} is given twice")]
    DuplicateKey(String),
    #[error("{0:?} is not a share of the GPU's time: write a percentage such as 30%")]
    NotPercent(String),
    #[error("{text:?} is {bytes} bytes, too small for any CUDA context ({rule}): did you mean {hint}?", rule = CAP_RULE)]
    TooSmall { text: String, bytes: u64, hint: String },
}

/// The smallest cap accepted, besides exactly one byte: 1 MiB. No CUDA context fits in
/// it, so a smaller cap can only be a size whose unit was left out (see the module).
pub const MIN_CAP_BYTES: u64 = 1 << 20;

/// An amount of device memory, absolute or relative to the device's physical memory.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Amount {
    Bytes(u64),
    /// Percentage in (0, 100].
    Percent(f64),
}

impl Amount {
    /// The amount in bytes on a device with `total` bytes of memory.
    pub fn resolve(self, total: u64) -> u64 {
        match self {
            Amount::Bytes(b) => b,
            Amount::Percent(p) => ((total as f64) * p / 100.0).floor() as u64,
        }
    }
}

/// A parsed cap: one amount for every device, or amounts per device UUID.
#[derive(Debug, Clone, PartialEq)]
pub struct LimitSpec {
    /// Applies to devices that no entry names.
    pub default: Option<Amount>,
    /// `(lower-case UUID prefix without its "GPU-"/"MIG-", amount)`.
    pub per_device: Vec<(String, Amount)>,
    /// Each per-device key as written (same order as `per_device`), for messages.
    pub keys: Vec<String>,
}

/// A device key that decides the cap of more than one device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AmbiguousKey {
    /// The key as written.
    pub key: String,
    /// The devices it would decide for, as given.
    pub matches: Vec<String>,
}

/// Hex digits in a full GPU or MIG UUID.
const UUID_HEX_DIGITS: usize = 32;

impl LimitSpec {
    /// The cap in bytes for the device with this UUID string (`GPU-...`, or `MIG-...` for a
    /// MIG instance) and physical memory, or `None` when this spec does not cap that device.
    /// The longest matching prefix wins.
    pub fn cap_for(&self, uuid: &str, total: u64) -> Option<u64> {
        self.deciding_entry(uuid).map(|i| self.per_device[i].1).or(self.default).map(|amount| amount.resolve(total))
    }

    /// The amount as written for the device with this UUID string (the longest matching
    /// key, else `*`), or `None` when this spec does not name that device.
    pub fn amount_for(&self, uuid: &str) -> Option<Amount> {
        self.deciding_entry(uuid).map(|i| self.per_device[i].1).or(self.default)
    }

    /// The index of the per-device entry that decides for `uuid`: the longest matching key.
    fn deciding_entry(&self, uuid: &str) -> Option<usize> {
        let lower = uuid.to_ascii_lowercase();
        let uuid = uuid_body(&lower);
        self.per_device.iter().enumerate().filter(|(_, (key, _))| uuid.starts_with(key.as_str())).max_by_key(|(_, (key, _))| key.len()).map(|(i, _)| i)
    }

    /// The first device key (as written) that is shorter than a whole UUID, and so could
    /// name more than one device.
    pub fn first_prefix_key(&self) -> Option<&str> {
        self.per_device
            .iter()
            .zip(&self.keys)
            .find(|((body, _), _)| body.chars().filter(char::is_ascii_hexdigit).count() < UUID_HEX_DIGITS)
            .map(|(_, key)| key.as_str())
    }

    pub fn has_prefix_keys(&self) -> bool {
        self.first_prefix_key().is_some()
    }

    /// The first key (in the order written) that would decide the cap of more than one of
    /// `uuids` (every GPU and MIG instance present, `GPU-…`/`MIG-…`).
    pub fn ambiguous_key(&self, uuids: &[String]) -> Option<AmbiguousKey> {
        (0..self.per_device.len()).find_map(|entry| {
            let matches: Vec<String> = uuids.iter().filter(|u| self.deciding_entry(u) == Some(entry)).cloned().collect();
            (matches.len() > 1).then(|| AmbiguousKey { key: self.keys[entry].clone(), matches })
        })
    }
}

impl std::str::FromStr for LimitSpec {
    type Err = LimitError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse_limit(s)
    }
}

/// Parses a whole memory limit: a single amount, or a comma-separated list of
/// `key=amount`. A size under [`MIN_CAP_BYTES`] other than one byte is refused.
pub fn parse_limit(text: &str) -> Result<LimitSpec, LimitError> {
    let spec = parse_spec(text)?;
    let amounts = spec.default.iter().chain(spec.per_device.iter().map(|(_, a)| a));
    for amount in amounts {
        if let Amount::Bytes(bytes) = *amount {
            let written = written_amount(text, bytes);
            let one_byte = ["1", "1b"].contains(&written.to_ascii_lowercase().as_str());
            if bytes < MIN_CAP_BYTES && !one_byte {
                return Err(LimitError::TooSmall { hint: meant(&written), text: written, bytes });
            }
        }
    }
    Ok(spec)
}

/// The amount as written in `text` that parses to `bytes` (for the message).
fn written_amount(text: &str, bytes: u64) -> String {
    text.split(',')
        .map(|entry| entry.split_once('=').map_or(entry, |(_, amount)| amount).trim())
        .find(|amount| parse_size(amount) == Ok(bytes))
        .unwrap_or(text.trim())
        .to_string()
}

/// What a size too small for any context probably meant: the same number in GiB when it
/// is a plausible number of GiB (up to 1024, or written in KiB), else in MiB (`8192`).
fn meant(written: &str) -> String {
    let split = written.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(written.len());
    let (number, unit) = written.split_at(split);
    let kib = unit.trim().to_ascii_lowercase().starts_with('k');
    let whole: f64 = number.parse().unwrap_or(0.0);
    if kib {
        format!("{number}M")
    } else if whole <= 1024.0 {
        format!("{number}G")
    } else {
        format!("{number}M")
    }
}

/// [`parse_limit`] without the smallest-cap rule: the grammar alone, for the compute share
/// (whose amounts must all be percentages) and for what checks them itself.
pub fn parse_spec(text: &str) -> Result<LimitSpec, LimitError> {
    let text = text.trim();
    if text.is_empty() {
        return Err(LimitError::Empty);
    }
    if !text.contains('=') {
        return Ok(LimitSpec { default: Some(parse_amount(text)?), per_device: Vec::new(), keys: Vec::new() });
    }
    let mut spec = LimitSpec { default: None, per_device: Vec::new(), keys: Vec::new() };
    for entry in text.split(',') {
        let entry = entry.trim();
        let (key, value) = entry.split_once('=').ok_or_else(|| LimitError::Malformed(entry.to_string()))?;
        let (key, amount) = (key.trim(), parse_amount(value)?);
        if key == "*" {
            if spec.default.is_some() {
                return Err(LimitError::DuplicateKey(key.to_string()));
            }
            spec.default = Some(amount);
            continue;
        }
        let lower = key.to_ascii_lowercase();
        if !(lower.starts_with("gpu-") || lower.starts_with("mig-")) {
            return Err(LimitError::BadKey(key.to_string()));
        }
        let body = uuid_body(&lower);
        if body.is_empty() || !body.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
            return Err(LimitError::BadKey(key.to_string()));
        }
        if spec.per_device.iter().any(|(k, _)| k == body) {
            return Err(LimitError::DuplicateKey(key.to_string()));
        }
        spec.per_device.push((body.to_string(), amount));
        spec.keys.push(key.to_string());
    }
    Ok(spec)
}

/// A lower-case UUID without its `gpu-` or `mig-` prefix: both name the same 16 bytes.
fn uuid_body(lower: &str) -> &str {
    lower.strip_prefix("gpu-").or_else(|| lower.strip_prefix("mig-")).unwrap_or(lower)
}

/// Parses one amount: a size or a percentage.
pub fn parse_amount(text: &str) -> Result<Amount, LimitError> {
    let text = text.trim();
    if let Some(number) = text.strip_suffix('%') {
        let value: f64 = number.trim().parse().map_err(|_| LimitError::BadPercent(text.to_string()))?;
        if !(value > 0.0 && value <= 100.0 && value.is_finite()) {
            return Err(LimitError::BadPercent(text.to_string()));
        }
        return Ok(Amount::Percent(value));
    }
    let bytes = parse_size(text)?;
    if bytes == 0 {
        return Err(LimitError::Zero(text.to_string()));
    }
    Ok(Amount::Bytes(bytes))
}

/// Parses a size in bytes (`8G`, `8GiB`, `512m`, `1.5T`, `4096`). Zero is allowed here;
/// callers that need a positive size check for it.
pub fn parse_size(text: &str) -> Result<u64, LimitError> {
    let text = text.trim();
    if text.is_empty() {
        return Err(LimitError::Empty);
    }
    if text.starts_with('-') {
        return Err(LimitError::Negative(text.to_string()));
    }
    let split = text.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let multiplier = unit_multiplier(unit.trim()).ok_or_else(|| LimitError::Malformed(text.to_string()))?;
    if number.is_empty() || number.starts_with('.') || number.ends_with('.') || number.matches('.').count() > 1 {
        return Err(LimitError::Malformed(text.to_string()));
    }
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    let whole: u64 = whole.parse().map_err(|_| LimitError::Overflow(text.to_string()))?;
    let mut bytes = whole.checked_mul(multiplier).ok_or_else(|| LimitError::Overflow(text.to_string()))?;
    if !fraction.is_empty() {
        // Exact decimal fraction of the multiplier, computed in u128 to avoid rounding error.
        let digits = fraction.len().min(18) as u32;
        let numerator: u128 = fraction[..digits as usize].parse().map_err(|_| LimitError::Malformed(text.to_string()))?;
        let part = numerator * multiplier as u128 / 10u128.pow(digits);
        bytes = bytes.checked_add(part as u64).ok_or_else(|| LimitError::Overflow(text.to_string()))?;
    }
    Ok(bytes)
}

fn unit_multiplier(unit: &str) -> Option<u64> {
    let lower = unit.to_ascii_lowercase();
    if lower.is_empty() || lower == "b" {
        return Some(1);
    }
    let mut chars = lower.chars();
    let shift = match chars.next()? {
        'k' => 10,
        'm' => 20,
        'g' => 30,
        't' => 40,
        _ => return None,
    };
    match chars.as_str() {
        "" | "i" | "ib" | "b" => Some(1u64 << shift),
        _ => None,
    }
}

/// Formats bytes for people: `8.00 GiB`, `300 MiB`, `512 B`.
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [(&str, u64); 4] = [("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)];
    for (name, size) in UNITS {
        if bytes >= size {
            if bytes.is_multiple_of(size) {
                return format!("{} {name}", bytes / size);
            }
            return format!("{:.2} {name}", bytes as f64 / size as f64);
        }
    }
    format!("{bytes} B")
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn binary_units_in_every_spelling() {
        for text in ["8G", "8g", "8GiB", "8gib", "8GB", "8gb", "8Gi", "8 G", " 8G "] {
            assert_eq!(parse_size(text), Ok(8 * GIB), "{text}");
        }
        assert_eq!(parse_size("8589934592"), Ok(8 * GIB));
        assert_eq!(parse_size("512M"), Ok(512 << 20));
        assert_eq!(parse_size("4k"), Ok(4096));
        assert_eq!(parse_size("2T"), Ok(2 << 40));
        assert_eq!(parse_size("1.5G"), Ok(GIB + GIB / 2));
        assert_eq!(parse_size("100B"), Ok(100));
    }

    #[test]
    fn bad_sizes_are_named() {
        assert_eq!(parse_size(""), Err(LimitError::Empty));
        assert!(matches!(parse_size("banana"), Err(LimitError::Malformed(_))));
        assert!(matches!(parse_size("-1"), Err(LimitError::Negative(_))));
        assert!(matches!(parse_size("8XB"), Err(LimitError::Malformed(_))));
        assert!(matches!(parse_size("8GG"), Err(LimitError::Malformed(_))));
        assert!(matches!(parse_size("1.2.3G"), Err(LimitError::Malformed(_))));
        assert!(matches!(parse_size("99999999999999999999"), Err(LimitError::Overflow(_))));
        assert!(matches!(parse_size("20000000000T"), Err(LimitError::Overflow(_))));
        assert!(matches!(parse_amount("0"), Err(LimitError::Zero(_))));
        // Zero and too small give the same rule in the same words.
        let zero = parse_amount("0").unwrap_err().to_string();
        assert_eq!(zero, r#""0" is zero (a cap must be at least 1 MiB, or exactly 1 byte to give a GPU no memory)"#);
        assert!(parse_limit("8").unwrap_err().to_string().contains(CAP_RULE));
    }

    #[test]
    fn a_cap_too_small_for_any_context_is_refused_with_what_was_meant() {
        let too_small = |text: &str| match parse_limit(text) {
            Err(LimitError::TooSmall { hint, .. }) => hint,
            other => panic!("{text}: {other:?}"),
        };
        assert_eq!(too_small("8"), "8G");
        assert_eq!(too_small(" 16 "), "16G");
        assert_eq!(too_small("8192"), "8192M", "a number of MiB");
        assert_eq!(too_small("512K"), "512M");
        assert_eq!(too_small("100B"), "100G");
        assert_eq!(too_small("GPU-1a2b=8,*=4G"), "8G");
        assert_eq!(too_small("GPU-1a2b=4G,*=1.5"), "1.5G");
        let message = parse_limit("8").unwrap_err().to_string();
        assert_eq!(
            message,
            r#""8" is 8 bytes, too small for any CUDA context (a cap must be at least 1 MiB, or exactly 1 byte to give a GPU no memory): did you mean 8G?"#
        );
        // One byte (no memory on that GPU, as fgpu cdi generate writes), 1 MiB and up, and
        // percentages pass.
        assert_eq!(parse_limit("GPU-1a2b=8G,*=1").unwrap().default, Some(Amount::Bytes(1)));
        assert_eq!(parse_limit("1").unwrap().default, Some(Amount::Bytes(1)));
        assert_eq!(parse_limit("1M").unwrap().default, Some(Amount::Bytes(MIN_CAP_BYTES)));
        assert_eq!(parse_limit("1048576").unwrap().default, Some(Amount::Bytes(MIN_CAP_BYTES)));
        assert!(parse_limit("1048575").is_err());
        assert_eq!(parse_limit("0.001%").unwrap().default, Some(Amount::Percent(0.001)));
        // The grammar alone still reads them (the compute share checks its own way).
        assert_eq!(parse_spec("8").unwrap().default, Some(Amount::Bytes(8)));
    }

    #[test]
    fn percentages() {
        assert_eq!(parse_amount("25%"), Ok(Amount::Percent(25.0)));
        assert_eq!(Amount::Percent(25.0).resolve(80 * GIB), 20 * GIB);
        for bad in ["0%", "101%", "-5%", "x%", "%"] {
            assert!(matches!(parse_amount(bad), Err(LimitError::BadPercent(_))), "{bad}");
        }
    }

    #[test]
    fn per_device_limits_pick_the_longest_prefix() {
        let spec = parse_limit("GPU-1a2b=8G, gpu-1a2b3c=4G, *=2G").unwrap();
        assert_eq!(spec.cap_for("GPU-1a2b3c4d-0000", 80 * GIB), Some(4 * GIB));
        assert_eq!(spec.cap_for("GPU-1a2bffff-0000", 80 * GIB), Some(8 * GIB));
        assert_eq!(spec.cap_for("GPU-99999999-0000", 80 * GIB), Some(2 * GIB));
        let mig = parse_limit("MIG-77aa=3G").unwrap();
        assert_eq!(mig.cap_for("MIG-77aa0000-1111", 80 * GIB), Some(3 * GIB));
        assert_eq!(mig.cap_for("GPU-77aa0000-1111", 80 * GIB), Some(3 * GIB), "the same bytes, however printed");
        let only = parse_limit("GPU-1a2b=50%").unwrap();
        assert_eq!(only.cap_for("GPU-1a2b", 80 * GIB), Some(40 * GIB));
        assert_eq!(only.cap_for("GPU-ffff", 80 * GIB), None);
    }

    #[test]
    fn a_key_deciding_for_two_devices_is_ambiguous() {
        let gpus: Vec<String> =
            ["GPU-5a1e3c27-0000-4000-8000-000000000001", "GPU-5a1e3c27-0000-4000-8000-000000000002", "GPU-77000000-0000-4000-8000-000000000003"]
                .iter()
                .map(|s| s.to_string())
                .collect();
        let spec = parse_limit("GPU-5a1e3c27=2G").unwrap();
        assert!(spec.has_prefix_keys());
        assert_eq!(spec.ambiguous_key(&gpus), Some(AmbiguousKey { key: "GPU-5a1e3c27".into(), matches: gpus[..2].to_vec() }));
        // The same key written as MIG-: the same 16 bytes, the same verdict, named as written.
        assert_eq!(parse_limit("MIG-5A1E=2G").unwrap().ambiguous_key(&gpus).unwrap().key, "MIG-5A1E");
        // Named apart: a longer key decides for one, so the shorter decides for only the other.
        let spec = parse_limit("GPU-5a1e3c27=2G,GPU-5a1e3c27-0000-4000-8000-000000000002=4G,*=1G").unwrap();
        assert_eq!(spec.ambiguous_key(&gpus), None);
        assert_eq!(spec.cap_for(&gpus[0], 80 << 30), Some(2 << 30));
        assert_eq!(spec.cap_for(&gpus[1], 80 << 30), Some(4 << 30));
        // One match, no match, '*': never ambiguous.
        assert_eq!(parse_limit("GPU-77=2G,GPU-ff=1G,*=3G").unwrap().ambiguous_key(&gpus), None);
        // Full UUIDs cannot be ambiguous: nothing to check.
        assert!(!parse_limit("GPU-5a1e3c27-0000-4000-8000-000000000001=2G").unwrap().has_prefix_keys());
        assert!(!parse_limit("8G").unwrap().has_prefix_keys());
    }

    #[test]
    fn bad_per_device_limits() {
        assert!(matches!(parse_limit("GPU-xyz=8G"), Err(LimitError::BadKey(_))));
        assert!(matches!(parse_limit("0=8G"), Err(LimitError::BadKey(_))));
        assert!(matches!(parse_limit("*=8G,*=4G"), Err(LimitError::DuplicateKey(_))));
        assert!(matches!(parse_limit("GPU-1=8G,gpu-1=4G"), Err(LimitError::DuplicateKey(_))));
        assert!(matches!(parse_limit("GPU-1=8G,,"), Err(LimitError::Malformed(_))));
    }

    #[test]
    fn formatting() {
        assert_eq!(format_bytes(8 * GIB), "8 GiB");
        assert_eq!(format_bytes(300 << 20), "300 MiB");
        assert_eq!(format_bytes(GIB + GIB / 2), "1.50 GiB");
        assert_eq!(format_bytes(12), "12 B");
    }
}
