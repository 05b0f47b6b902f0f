//! Kubernetes quantities (`8Gi`, `30`, `1.5`, `500m`, `1e3`): what the scheduler writes in a
//! claim's `consumedCapacity`, and what this driver publishes as capacity.
//!
//! A quantity is a decimal number (an optional sign, digits, at most one `.`) with an
//! optional suffix: binary (`Ki` `Mi` `Gi` `Ti` `Pi` `Ei`), decimal (`n` `u` `m` `k` `M` `G`
//! `T` `P` `E`) or an exponent (`e3`, `E-2`). Values are kept exactly, in billionths
//! (the smallest unit, `1n`), as an `i128`.

/// Billionths in one unit.
const NANO: i128 = 1_000_000_000;

/// Text that is not a Kubernetes quantity, and what is wrong with it.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{text:?} is not a Kubernetes quantity: {fault}")]
pub struct QuantityError {
    pub text: String,
    pub fault: QuantityFault,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum QuantityFault {
    #[error("no number")]
    NoNumber,
    #[error("unknown suffix")]
    UnknownSuffix,
    #[error("exponent out of range")]
    ExponentOutOfRange,
    #[error("too many digits")]
    TooManyDigits,
    #[error("not a number")]
    NotANumber,
    #[error("too large")]
    TooLarge,
}

/// A quantity in billionths of its unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Quantity(pub i128);

impl Quantity {
    pub fn parse(text: &str) -> Result<Quantity, QuantityError> {
        let bad = |fault| QuantityError { text: text.into(), fault };
        let s = text.trim();
        let (negative, s) = match s.as_bytes().first() {
            Some(b'-') => (true, &s[1..]),
            Some(b'+') => (false, &s[1..]),
            _ => (false, s),
        };
        let end = s.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(s.len());
        let (number, suffix) = s.split_at(end);
        if number.is_empty() || number == "." || number.matches('.').count() > 1 {
            return Err(bad(QuantityFault::NoNumber));
        }
        let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
        // (multiplier numerator, power of ten) of the suffix.
        let (factor, exponent): (i128, i32) = match suffix {
            "" => (1, 0),
            "Ki" => (1 << 10, 0),
            "Mi" => (1 << 20, 0),
            "Gi" => (1 << 30, 0),
            "Ti" => (1 << 40, 0),
            "Pi" => (1 << 50, 0),
            "Ei" => (1 << 60, 0),
            "n" => (1, -9),
            "u" => (1, -6),
            "m" => (1, -3),
            "k" => (1, 3),
            "M" => (1, 6),
            "G" => (1, 9),
            "T" => (1, 12),
            "P" => (1, 15),
            "E" => (1, 18),
            other => {
                let digits = other.strip_prefix(['e', 'E']).ok_or_else(|| bad(QuantityFault::UnknownSuffix))?;
                let e: i32 = digits.parse().map_err(|_| bad(QuantityFault::UnknownSuffix))?;
                if !(-30..=30).contains(&e) {
                    return Err(bad(QuantityFault::ExponentOutOfRange));
                }
                (1, e)
            }
        };
        // The digits as one integer, and where the decimal point was.
        let digits: String = format!("{whole}{fraction}");
        let digits = digits.trim_start_matches('0');
        if digits.len() > 30 {
            return Err(bad(QuantityFault::TooManyDigits));
        }
        let mantissa: i128 = if digits.is_empty() { 0 } else { digits.parse().map_err(|_| bad(QuantityFault::NotANumber))? };
        // value = mantissa * 10^(exponent - fraction.len()) * factor, in billionths.
        let power = exponent - fraction.len() as i32 + 9;
        let overflow = || bad(QuantityFault::TooLarge);
        let scaled = mantissa.checked_mul(factor).ok_or_else(overflow)?;
        let value = if power >= 0 {
            scaled.checked_mul(10i128.checked_pow(power as u32).ok_or_else(overflow)?).ok_or_else(overflow)?
        } else {
            // Finer than a billionth: rounded up, as Kubernetes does.
            let divisor = 10i128.checked_pow((-power) as u32).ok_or_else(overflow)?;
            (scaled + divisor - 1) / divisor
        };
        if value > NANO * (1i128 << 64) {
            return Err(overflow());
        }
        Ok(Quantity(if negative { -value } else { value }))
    }

    /// The whole units, rounded down; `None` when negative.
    pub fn floor_units(self) -> Option<u64> {
        (self.0 >= 0).then(|| u64::try_from(self.0 / NANO).unwrap_or(u64::MAX))
    }

    /// Thousandths of a unit, rounded down; `None` when negative.
    pub fn floor_milli(self) -> Option<u64> {
        (self.0 >= 0).then(|| u64::try_from(self.0 / 1_000_000).unwrap_or(u64::MAX))
    }
}

/// A whole number of bytes with the largest binary suffix that divides it (`80Gi`,
/// `81408Mi`), or the plain number. For the whole MiB this driver publishes that is
/// Kubernetes' canonical form, so the API server hands back exactly the text it was given.
pub fn format_bytes(bytes: u64) -> String {
    for (suffix, shift) in [("Ei", 60), ("Pi", 50), ("Ti", 40), ("Gi", 30), ("Mi", 20), ("Ki", 10)] {
        if bytes >= 1 << shift && bytes.is_multiple_of(1 << shift) {
            return format!("{}{suffix}", bytes >> shift);
        }
    }
    bytes.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn units(text: &str) -> u64 {
        Quantity::parse(text).unwrap().floor_units().unwrap()
    }

    #[test]
    fn binary_decimal_and_exponent_suffixes() {
        assert_eq!(units("8Gi"), 8 << 30);
        assert_eq!(units("1536Mi"), 1536 << 20);
        assert_eq!(units("1.5Gi"), 3 << 29);
        assert_eq!(units("8G"), 8_000_000_000);
        assert_eq!(units("30"), 30);
        assert_eq!(units("+30"), 30);
        assert_eq!(units("1e3"), 1000);
        assert_eq!(units("12E-1"), 1);
        assert_eq!(units("0"), 0);
        assert_eq!(units("81408Mi"), 81408 << 20);
        assert_eq!(Quantity::parse("500m").unwrap().floor_milli(), Some(500));
        assert_eq!(Quantity::parse("12.5").unwrap().floor_milli(), Some(12_500));
        assert_eq!(Quantity::parse("30").unwrap().floor_milli(), Some(30_000));
        assert_eq!(Quantity::parse("1n").unwrap().0, 1);
        assert_eq!(Quantity::parse("1.5n").unwrap().0, 2, "finer than 1n rounds up");
    }

    #[test]
    fn negative_and_malformed() {
        assert_eq!(Quantity::parse("-1Gi").unwrap().floor_units(), None);
        for bad in ["", "Gi", "1.2.3", "8GiB", "8 Gi x", "1e99", ".", "9999999999999999999999999999999999Ei"] {
            assert!(Quantity::parse(bad).is_err(), "{bad:?}");
        }
        assert_eq!(Quantity::parse("1Qi").unwrap_err().to_string(), r#""1Qi" is not a Kubernetes quantity: unknown suffix"#);
    }

    #[test]
    fn canonical_byte_counts_round_trip() {
        for (bytes, text) in [(80u64 << 30, "80Gi"), (81408 << 20, "81408Mi"), (256 << 20, "256Mi"), (1000, "1000"), (0, "0")] {
            assert_eq!(format_bytes(bytes), text);
            assert_eq!(units(text), bytes);
        }
    }
}
