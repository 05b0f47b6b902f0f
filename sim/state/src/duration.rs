//! Durations as the simulator's configuration and module images write them: a number with
//! a unit, `2ms`, `50us`, `1500ns`, `1s`, `0.5ms` (`µs` is accepted for `us`).

/// Parses a duration into nanoseconds. `None` for anything else (no unit, negative, NaN,
/// or more than about 584 years).
pub fn parse_duration(s: &str) -> Option<u64> {
    let s = s.trim();
    let split = s.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
    let (num, unit) = s.split_at(split);
    let scale: f64 = match unit.trim() {
        "ns" => 1.0,
        "us" | "µs" => 1e3,
        "ms" => 1e6,
        "s" => 1e9,
        _ => return None,
    };
    if num.is_empty() || num.chars().filter(|&c| c == '.').count() > 1 {
        return None;
    }
    // Integers stay exact; fractions go through f64.
    if let Ok(n) = num.parse::<u64>() {
        return n.checked_mul(scale as u64);
    }
    let v = num.parse::<f64>().ok()? * scale;
    if v.is_finite() && v >= 0.0 && v < u64::MAX as f64 {
        Some(v.round() as u64)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::parse_duration;

    #[test]
    fn units_and_fractions() {
        assert_eq!(parse_duration("2ms"), Some(2_000_000));
        assert_eq!(parse_duration("50us"), Some(50_000));
        assert_eq!(parse_duration("50µs"), Some(50_000));
        assert_eq!(parse_duration("1500ns"), Some(1500));
        assert_eq!(parse_duration("1s"), Some(1_000_000_000));
        assert_eq!(parse_duration(" 0.5ms "), Some(500_000));
        assert_eq!(parse_duration("0ns"), Some(0));
    }

    #[test]
    fn rejects_what_is_not_a_duration() {
        for bad in ["", "2", "ms", "-1ms", "2 parsecs", "1.2.3ms", "99999999999999999999s", "2m"] {
            assert_eq!(parse_duration(bad), None, "{bad:?}");
        }
    }
}
