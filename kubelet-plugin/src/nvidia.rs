//! NVIDIA's CDI device for a GPU: the device nodes and driver libraries come from NVIDIA's
//! own spec (`nvidia-ctk cdi generate`, kind `nvidia.com/gpu`), which fgpu's device only
//! caps. The name is read from the specs in the CDI directories: the GPU's UUID when the
//! spec has it (`nvidia.com/gpu=GPU-...`, whatever the index), else its index
//! (`nvidia.com/gpu=0`), else `gpu<index>` (nvidia-ctk's `type-index` names). A template
//! given with `--nvidia-cdi-device` replaces the search.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

pub const NVIDIA_KIND: &str = "nvidia.com/gpu";

/// How NVIDIA's device is named.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NvidiaNames {
    /// Read NVIDIA's specs in these directories.
    Search(Vec<PathBuf>),
    /// A fully qualified CDI name with `{index}` and `{uuid}` in it.
    Template(String),
}

/// The device names of kind `nvidia.com/gpu` in the spec files of `dirs` (`.json`, `.yaml`,
/// `.yml`); unreadable or malformed files are passed over, with the reason.
pub fn device_names(dirs: &[PathBuf]) -> (BTreeSet<String>, Vec<String>) {
    let mut names = BTreeSet::new();
    let mut problems = Vec::new();
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(dir) else { continue };
        let mut files: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
        files.sort();
        for file in files {
            let ext = file.extension().and_then(|e| e.to_str()).unwrap_or("");
            if !["json", "yaml", "yml"].contains(&ext) || !file.is_file() {
                continue;
            }
            match read_spec(&file, ext == "json") {
                Ok(Some(found)) => names.extend(found),
                Ok(None) => {}
                Err(e) => problems.push(format!("{}: {e}", file.display())),
            }
        }
    }
    (names, problems)
}

/// Why a spec file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    #[error("{0}")]
    Read(#[from] std::io::Error),
    #[error("{0}")]
    Json(#[from] serde_json::Error),
    #[error("{0}")]
    Yaml(#[from] serde_saphyr::Error),
}

/// The device names of one spec file, if its kind is NVIDIA's.
fn read_spec(path: &Path, json: bool) -> Result<Option<Vec<String>>, SpecError> {
    let text = std::fs::read_to_string(path)?;
    let value: serde_json::Value = if json { serde_json::from_str(&text)? } else { serde_saphyr::from_str(&text)? };
    if value.get("kind").and_then(|k| k.as_str()) != Some(NVIDIA_KIND) {
        return Ok(None);
    }
    let devices = value.get("devices").and_then(|d| d.as_array()).map(Vec::as_slice).unwrap_or(&[]);
    Ok(Some(devices.iter().filter_map(|d| d.get("name")?.as_str().map(str::to_string)).collect()))
}

/// No device of NVIDIA's for a GPU in the CDI specs searched.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "no {NVIDIA_KIND} device for GPU {index} ({uuid}) in the CDI specs of {}: run `nvidia-ctk cdi generate` on the node, or name NVIDIA's device with --nvidia-cdi-device{}",
    dirs.join(" and "),
    if problems.is_empty() { String::new() } else { format!(" (unreadable: {})", problems.join("; ")) }
)]
pub struct NoNvidiaDevice {
    pub index: u32,
    pub uuid: String,
    /// The directories searched.
    pub dirs: Vec<String>,
    /// The spec files passed over, each with why.
    pub problems: Vec<String>,
}

/// NVIDIA's CDI ID for the GPU with this index and UUID.
pub fn device_id(names: &NvidiaNames, index: u32, uuid: &str) -> Result<String, NoNvidiaDevice> {
    match names {
        NvidiaNames::Template(t) => Ok(t.replace("{index}", &index.to_string()).replace("{uuid}", uuid)),
        NvidiaNames::Search(dirs) => {
            let (found, problems) = device_names(dirs);
            let candidates = [uuid.to_string(), index.to_string(), format!("gpu{index}")];
            if let Some(name) = candidates.iter().find(|c| found.contains(*c)) {
                return Ok(format!("{NVIDIA_KIND}={name}"));
            }
            let dirs = dirs.iter().map(|d| d.display().to_string()).collect();
            Err(NoNvidiaDevice { index, uuid: uuid.to_string(), dirs, problems })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const UUID: &str = "GPU-7f2f4a87-663d-b312-36f4-6ad9417f4505";

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("fgpu-nvidia-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn the_uuid_name_is_preferred_then_the_index() {
        let d = dir("uuid");
        std::fs::write(
            d.join("nvidia.yaml"),
            format!("cdiVersion: \"0.5.0\"\nkind: nvidia.com/gpu\ndevices:\n  - name: \"0\"\n    containerEdits: {{}}\n  - name: {UUID}\n    containerEdits: {{}}\n  - name: all\n"),
        )
        .unwrap();
        std::fs::write(d.join("other.json"), r#"{"cdiVersion":"0.5.0","kind":"fgpu.io/gpu","devices":[{"name":"1"}]}"#).unwrap();
        let search = NvidiaNames::Search(vec![d.clone(), d.join("missing")]);
        assert_eq!(device_id(&search, 0, UUID).unwrap(), format!("nvidia.com/gpu={UUID}"));
        // GPU 1 has no UUID name and no index name in NVIDIA's spec (fgpu's "1" does not count).
        let err = device_id(&search, 1, "GPU-other").unwrap_err().to_string();
        assert!(err.contains("no nvidia.com/gpu device for GPU 1") && err.contains("--nvidia-cdi-device"), "{err}");
        std::fs::write(d.join("nvidia.json"), r#"{"cdiVersion":"0.5.0","kind":"nvidia.com/gpu","devices":[{"name":"1"}]}"#).unwrap();
        assert_eq!(device_id(&search, 1, "GPU-other").unwrap(), "nvidia.com/gpu=1");
        std::fs::write(d.join("broken.yaml"), "kind: [").unwrap();
        let err = device_id(&search, 7, "GPU-none").unwrap_err().to_string();
        assert!(err.contains("broken.yaml"), "{err}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_template_replaces_the_search() {
        let t = NvidiaNames::Template("nvidia.com/gpu={uuid}".into());
        assert_eq!(device_id(&t, 3, UUID).unwrap(), format!("nvidia.com/gpu={UUID}"));
        let t = NvidiaNames::Template("example.com/gpu=gpu{index}".into());
        assert_eq!(device_id(&t, 3, UUID).unwrap(), "example.com/gpu=gpu3");
    }
}
