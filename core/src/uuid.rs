//! GPU UUIDs: the 16 bytes `cuDeviceGetUuid` returns and the `GPU-…` string NVML prints.

/// Formats 16 UUID bytes the way NVML does: `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
pub fn format_gpu_uuid(bytes: &[u8; 16]) -> String {
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!("GPU-{}-{}-{}-{}-{}", &hex[0..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..32])
}

/// Parses `GPU-…` (or `MIG-…`, or bare hex with dashes) back into 16 bytes.
pub fn parse_gpu_uuid(text: &str) -> Option<[u8; 16]> {
    let body = text.trim().trim_end_matches('\0');
    let body = body.strip_prefix("GPU-").or_else(|| body.strip_prefix("MIG-")).unwrap_or(body);
    let hex: Vec<u8> = body.bytes().filter(|b| *b != b'-').collect();
    if hex.len() != 32 {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, pair) in hex.chunks(2).enumerate() {
        let text = std::str::from_utf8(pair).ok()?;
        out[i] = u8::from_str_radix(text, 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let bytes: [u8; 16] = core::array::from_fn(|i| (i * 17) as u8);
        let text = format_gpu_uuid(&bytes);
        assert_eq!(text, "GPU-00112233-4455-6677-8899-aabbccddeeff");
        assert_eq!(parse_gpu_uuid(&text), Some(bytes));
        assert_eq!(parse_gpu_uuid("GPU-1234"), None);
    }
}
