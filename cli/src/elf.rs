//! Just enough ELF reading for `fgpu doctor`: the architecture of a shared object, the
//! glibc symbol versions it needs (`.gnu.version_r`), and the dynamic symbols it defines
//! (to recognise another CUDA interposer). 64-bit little-endian objects are read fully;
//! others only as far as the header, which is enough to say they do not fit here.

use std::path::Path;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ElfInfo {
    pub class64: bool,
    pub little_endian: bool,
    pub machine: u16,
    /// (library, version) pairs the object needs, such as ("libc.so.6", "GLIBC_2.34").
    pub needed_versions: Vec<(String, String)>,
    /// Names of the dynamic symbols it defines.
    pub defined: Vec<String>,
}

const SHT_DYNSYM: u32 = 11;
const SHT_GNU_VERNEED: u32 = 0x6fff_fffe;

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}
fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}
fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}
fn cstr_at(b: &[u8], at: usize) -> Option<String> {
    let rest = b.get(at..)?;
    let end = rest.iter().position(|c| *c == 0)?;
    Some(String::from_utf8_lossy(&rest[..end]).into_owned())
}

struct Section {
    kind: u32,
    offset: usize,
    size: usize,
    link: u32,
    info: u32,
}

/// Why a file's ELF facts cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum ElfError {
    #[error("cannot read {}: {source}", path.display())]
    Read { path: std::path::PathBuf, source: std::io::Error },
    #[error("not an ELF file")]
    NotElf,
    #[error("truncated ELF file")]
    Truncated,
    #[error("bad ELF section header size")]
    BadSectionHeaderSize,
}

pub fn read(path: &Path) -> Result<ElfInfo, ElfError> {
    let bytes = std::fs::read(path).map_err(|source| ElfError::Read { path: path.to_path_buf(), source })?;
    parse(&bytes)
}

pub fn parse(b: &[u8]) -> Result<ElfInfo, ElfError> {
    if b.len() < 20 || &b[..4] != b"\x7fELF" {
        return Err(ElfError::NotElf);
    }
    let class64 = b[4] == 2;
    let little_endian = b[5] == 1;
    let machine = if little_endian { u16_at(b, 18).unwrap_or(0) } else { u16::from_be_bytes([b[18], b[19]]) };
    let mut info = ElfInfo { class64, little_endian, machine, needed_versions: Vec::new(), defined: Vec::new() };
    if !(class64 && little_endian) {
        return Ok(info);
    }
    let truncated = || ElfError::Truncated;
    let shoff = u64_at(b, 0x28).ok_or_else(truncated)? as usize;
    let shentsize = u16_at(b, 0x3a).ok_or_else(truncated)? as usize;
    let shnum = u16_at(b, 0x3c).ok_or_else(truncated)? as usize;
    if shoff == 0 || shnum == 0 {
        return Ok(info); // no section headers: nothing more to learn cheaply
    }
    if shentsize < 64 {
        return Err(ElfError::BadSectionHeaderSize);
    }
    let sections: Vec<Section> = (0..shnum)
        .map(|i| {
            let at = shoff.checked_add(i.checked_mul(shentsize)?)?;
            Some(Section {
                kind: u32_at(b, at + 4)?,
                offset: u64_at(b, at + 24)? as usize,
                size: u64_at(b, at + 32)? as usize,
                link: u32_at(b, at + 40)?,
                info: u32_at(b, at + 44)?,
            })
        })
        .collect::<Option<_>>()
        .ok_or_else(truncated)?;
    let strtab = |link: u32| sections.get(link as usize).map(|s| s.offset).ok_or_else(truncated);
    for s in &sections {
        match s.kind {
            SHT_DYNSYM => {
                let names = strtab(s.link)?;
                for i in 0..s.size / 24 {
                    let at = s.offset + i * 24;
                    let (Some(name), Some(shndx)) = (u32_at(b, at), u16_at(b, at + 6)) else { return Err(truncated()) };
                    if shndx != 0 && name != 0 {
                        if let Some(name) = cstr_at(b, names + name as usize) {
                            info.defined.push(name);
                        }
                    }
                }
            }
            SHT_GNU_VERNEED => {
                let names = strtab(s.link)?;
                let mut at = s.offset;
                for _ in 0..s.info {
                    let count = u16_at(b, at + 2).ok_or_else(truncated)?;
                    let file = cstr_at(b, names + u32_at(b, at + 4).ok_or_else(truncated)? as usize).unwrap_or_default();
                    let mut aux = at + u32_at(b, at + 8).ok_or_else(truncated)? as usize;
                    for _ in 0..count {
                        let name = u32_at(b, aux + 8).ok_or_else(truncated)?;
                        info.needed_versions.push((file.clone(), cstr_at(b, names + name as usize).unwrap_or_default()));
                        let next = u32_at(b, aux + 12).ok_or_else(truncated)?;
                        if next == 0 {
                            break;
                        }
                        aux += next as usize;
                    }
                    let next = u32_at(b, at + 12).ok_or_else(truncated)?;
                    if next == 0 {
                        break;
                    }
                    at += next as usize;
                }
            }
            _ => {}
        }
    }
    Ok(info)
}

pub fn machine_name(machine: u16) -> String {
    match machine {
        3 => "x86 (32-bit)".into(),
        40 => "ARM (32-bit)".into(),
        62 => "x86-64".into(),
        183 => "AArch64".into(),
        243 => "RISC-V".into(),
        21 => "PowerPC64".into(),
        other => format!("machine {other}"),
    }
}

/// Parses "2.34" or "GLIBC_2.34" into comparable numbers.
pub fn glibc_version(text: &str) -> Option<Vec<u32>> {
    let v = text.strip_prefix("GLIBC_").unwrap_or(text);
    let parts: Option<Vec<u32>> = v.split('.').map(|p| p.parse().ok()).collect();
    parts.filter(|p| !p.is_empty())
}

/// The newest `GLIBC_x.y` the object needs.
pub fn newest_glibc_needed(info: &ElfInfo) -> Option<String> {
    info.needed_versions
        .iter()
        .filter_map(|(_, v)| glibc_version(v).map(|n| (n, v)))
        .max_by(|a, b| a.0.cmp(&b.0))
        .map(|(_, v)| v.trim_start_matches("GLIBC_").to_string())
}

/// The newest glibc any of `libraries` needs, and the library that needs it. The front and
/// the shim it loads are one installation, and the shim may need a newer glibc than the
/// front (a native build links it against the glibc it was built on).
pub fn newest_glibc_among<'a>(libraries: &[(&'a Path, Option<&ElfInfo>)]) -> Option<(String, &'a Path)> {
    libraries.iter().filter_map(|(path, info)| Some((newest_glibc_needed((*info)?)?, *path))).max_by(|a, b| glibc_version(&a.0).cmp(&glibc_version(&b.0)))
}

/// The glibc this process runs with.
pub fn running_glibc() -> Option<String> {
    fgpu_core::sys::host::glibc_version()
}

/// The machine this process runs as.
pub fn own_machine() -> Option<u16> {
    read(Path::new("/proc/self/exe")).ok().map(|i| i.machine)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_our_own_executable() {
        let info = read(Path::new("/proc/self/exe")).unwrap();
        assert!(info.class64);
        #[cfg(target_arch = "x86_64")]
        assert_eq!(machine_name(info.machine), "x86-64");
        #[cfg(target_arch = "aarch64")]
        assert_eq!(machine_name(info.machine), "AArch64");
        assert!(info.needed_versions.iter().any(|(f, v)| f.starts_with("libc.so") && v.starts_with("GLIBC_2.")), "{:?}", info.needed_versions);
        let newest = newest_glibc_needed(&info).unwrap();
        assert!(glibc_version(&newest).unwrap() <= glibc_version(&running_glibc().unwrap()).unwrap());
    }

    #[test]
    fn lists_what_libc_defines() {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let libc_path = maps.lines().filter_map(|l| l.split_whitespace().nth(5)).find(|p| p.contains("/libc.so")).expect("libc is mapped");
        let info = read(Path::new(libc_path)).unwrap();
        assert!(info.defined.iter().any(|s| s == "malloc"));
        assert!(!info.defined.iter().any(|s| s == "cuMemAlloc_v2"));
    }

    #[test]
    fn rejects_garbage_and_reads_foreign_headers() {
        assert!(parse(b"#!/bin/sh\necho hi\n").is_err());
        let mut header = vec![0u8; 64];
        header[..4].copy_from_slice(b"\x7fELF");
        header[4] = 2;
        header[5] = 1;
        header[18..20].copy_from_slice(&183u16.to_le_bytes());
        let info = parse(&header).unwrap();
        assert_eq!(machine_name(info.machine), "AArch64");
        assert!(info.needed_versions.is_empty());
    }

    #[test]
    fn glibc_versions_compare_numerically() {
        assert!(glibc_version("GLIBC_2.34").unwrap() > glibc_version("2.4").unwrap());
        assert!(glibc_version("GLIBC_PRIVATE").is_none());
        let info = ElfInfo {
            class64: true,
            little_endian: true,
            machine: 62,
            needed_versions: vec![
                ("libc.so.6".into(), "GLIBC_2.2.5".into()),
                ("libc.so.6".into(), "GLIBC_2.34".into()),
                ("libc.so.6".into(), "GLIBC_2.4".into()),
            ],
            defined: vec![],
        };
        assert_eq!(newest_glibc_needed(&info).as_deref(), Some("2.34"));
    }
}
