//! Which of NVIDIA's headers a check reads, and the pinned releases of them that
//! `$FGPU_TEST_NVIDIA_HEADERS` holds.

use crate::paths::{target_dir, workspace};
use std::path::PathBuf;

/// Which of NVIDIA's headers a check reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Header {
    Cuda,
    Nvml,
}

impl Header {
    pub fn file(self) -> &'static str {
        match self {
            Header::Cuda => "cuda.h",
            Header::Nvml => "nvml.h",
        }
    }
}

/// One pinned header: the wheel it came from and its text.
pub struct HeaderSet {
    /// `name==version` as written in the requirements file.
    pub pin: String,
    pub header: Header,
    pub include: PathBuf,
    text: String,
}

impl HeaderSet {
    /// Whether the header names `ident` (a whole identifier, anywhere in the text).
    pub fn declares(&self, ident: &str) -> bool {
        let bytes = self.text.as_bytes();
        let is_ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
        self.text.match_indices(ident).any(|(at, _)| {
            let before = at.checked_sub(1).map(|i| bytes[i]);
            let after = bytes.get(at + ident.len()).copied();
            !before.is_some_and(is_ident) && !after.is_some_and(is_ident)
        })
    }
}

/// The pinned header sets, in the order of the requirements file (oldest first within a
/// kind). `None` (test skipped, with a printed reason) when they are not fetched; a
/// failure under CI, where tests/run.sh fetches them.
pub fn header_sets() -> Option<Vec<HeaderSet>> {
    let root = std::env::var_os("FGPU_TEST_NVIDIA_HEADERS").map(PathBuf::from).unwrap_or_else(|| target_dir().join("nvidia-headers"));
    let requirements = workspace().join("tests/abi/requirements.txt");
    let text = std::fs::read_to_string(&requirements).unwrap_or_else(|e| panic!("cannot read {}: {e}", requirements.display()));
    let mut sets = Vec::new();
    for pin in text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')) {
        let (name, version) = pin.split_once("==").unwrap_or_else(|| panic!("{}: {pin:?} is not name==version", requirements.display()));
        let include = root.join(format!("{name}-{version}")).join("include");
        let found = [Header::Cuda, Header::Nvml].into_iter().find(|h| include.join(h.file()).is_file());
        let Some(header) = found else {
            crate::prerequisite(
                false,
                &format!("NVIDIA's headers are not fetched ({} has no cuda.h or nvml.h); tests/run.sh fetches them (`scripts/get-nvidia-headers.sh target/nvidia-headers .venv/bin/python`)", include.display()),
            );
            return None;
        };
        let path = include.join(header.file());
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
        sets.push(HeaderSet { pin: pin.to_string(), header, include, text });
    }
    assert!(!sets.is_empty(), "{} pins no header", requirements.display());
    Some(sets)
}
