//! Device UUIDs: the 16 bytes `cuDeviceGetUuid_v2` returns and the text NVML prints, `GPU-…`
//! for a whole GPU and `MIG-…` for a MIG device (a compute instance of a GPU in MIG mode).
//!
//! The 16 bytes alone name a device: NVIDIA makes a MIG device's UUID new at each creation,
//! never equal to a GPU's, so the ledger finds a device by its bytes whatever it is called.
//! The kind says how the device is printed (`fgpu status`, the shim's lines) and how NVML
//! is asked for it (`nvmlDeviceGetHandleByUUID` takes the UUID as it prints it).

use std::fmt;

/// Whether a UUID names a whole GPU or a MIG device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum UuidKind {
    Gpu,
    Mig,
}

impl UuidKind {
    /// The prefix NVML prints: `GPU-` or `MIG-`.
    pub fn prefix(self) -> &'static str {
        match self {
            UuidKind::Gpu => "GPU-",
            UuidKind::Mig => "MIG-",
        }
    }
}

/// A device's UUID: its 16 bytes and what kind of device they name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DeviceUuid {
    pub kind: UuidKind,
    pub bytes: [u8; 16],
}

impl DeviceUuid {
    pub fn gpu(bytes: [u8; 16]) -> DeviceUuid {
        DeviceUuid { kind: UuidKind::Gpu, bytes }
    }

    pub fn mig(bytes: [u8; 16]) -> DeviceUuid {
        DeviceUuid { kind: UuidKind::Mig, bytes }
    }

    /// A UUID as NVML prints it: `GPU-…` or `MIG-…` (either case), 32 hex digits with or
    /// without dashes; a trailing NUL is ignored.
    pub fn parse(text: &str) -> Option<DeviceUuid> {
        let body = text.trim().trim_end_matches('\0');
        let prefix = body.get(..4)?;
        let kind = if prefix.eq_ignore_ascii_case("GPU-") {
            UuidKind::Gpu
        } else if prefix.eq_ignore_ascii_case("MIG-") {
            UuidKind::Mig
        } else {
            return None;
        };
        let rest = &body[4..];
        hex_bytes(rest).map(|bytes| DeviceUuid { kind, bytes })
    }
}

impl fmt::Display for DeviceUuid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = &self.bytes;
        let hex = |r: std::ops::Range<usize>| b[r].iter().map(|x| format!("{x:02x}")).collect::<String>();
        write!(f, "{}{}-{}-{}-{}-{}", self.kind.prefix(), hex(0..4), hex(4..6), hex(6..8), hex(8..10), hex(10..16))
    }
}

/// Formats 16 UUID bytes the way NVML prints a GPU's: `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
pub fn format_gpu_uuid(bytes: &[u8; 16]) -> String {
    DeviceUuid::gpu(*bytes).to_string()
}

/// Parses `GPU-…` (or `MIG-…`, or bare hex with dashes) back into 16 bytes.
pub fn parse_gpu_uuid(text: &str) -> Option<[u8; 16]> {
    let body = text.trim().trim_end_matches('\0');
    DeviceUuid::parse(body).map(|u| u.bytes).or_else(|| hex_bytes(body))
}

/// 32 hex digits, dashes anywhere, as 16 bytes.
fn hex_bytes(text: &str) -> Option<[u8; 16]> {
    let hex: Vec<u8> = text.bytes().filter(|b| *b != b'-').collect();
    if hex.len() != 32 || !hex.iter().all(u8::is_ascii_hexdigit) {
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

    #[test]
    fn a_mig_uuid_keeps_its_kind() {
        let bytes: [u8; 16] = core::array::from_fn(|i| (255 - i * 3) as u8);
        let mig = DeviceUuid::mig(bytes);
        let text = mig.to_string();
        assert_eq!(text, "MIG-fffcf9f6-f3f0-edea-e7e4-e1dedbd8d5d2");
        assert_eq!(DeviceUuid::parse(&text), Some(mig));
        assert_eq!(DeviceUuid::parse("mig-FFFCF9F6-F3F0-EDEA-E7E4-E1DEDBD8D5D2\0"), Some(mig), "either case, a trailing NUL");
        assert_eq!(DeviceUuid::parse(&format!("GPU-{}", &text[4..])), Some(DeviceUuid::gpu(bytes)), "the same bytes as a GPU's");
        assert_eq!(parse_gpu_uuid(&text), Some(bytes), "the bytes alone, whatever the kind");
        for bad in [
            "",
            "MIG-",
            "MIG-1234",
            "XYZ-fffcf9f6-f3f0-edea-e7e4-e1dedbd8d5d2",
            "fffcf9f6-f3f0-edea-e7e4-e1dedbd8d5d2",
            "MIG-zzfcf9f6-f3f0-edea-e7e4-e1dedbd8d5d2",
            "é-fffcf9f6",
        ] {
            assert_eq!(DeviceUuid::parse(bad), None, "{bad:?}");
        }
    }
}
