//! Size parsing for the `FGPU_SIM_*` variables: `80G`, `80GiB`, `80GB`, `81920M`, `300M`,
//! plain bytes. Suffixes are binary (K = 1024), with or without `B` / `iB`, any case.

/// Parses a size. Returns `None` for anything malformed or overflowing.
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    if s.is_empty() {
        return None;
    }
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    if num.is_empty() {
        return None;
    }
    let n: u64 = num.parse().ok()?;
    let unit = unit.trim().to_ascii_lowercase();
    let mult: u64 = match unit.as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => return None,
    };
    n.checked_mul(mult)
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("80G"), Some(80 << 30));
        assert_eq!(parse_size("80GiB"), Some(80 << 30));
        assert_eq!(parse_size("80GB"), Some(80 << 30));
        assert_eq!(parse_size("81920M"), Some(80 << 30));
        assert_eq!(parse_size("300M"), Some(300 << 20));
        assert_eq!(parse_size("8589934592"), Some(8 << 30));
        assert_eq!(parse_size("0"), Some(0));
        assert_eq!(parse_size("12x"), None);
        assert_eq!(parse_size("G"), None);
        assert_eq!(parse_size(""), None);
        assert_eq!(parse_size("99999999999999999999T"), None);
    }
}
