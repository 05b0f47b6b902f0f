//! Where a process's cap, ledger path and log level come from.
//!
//! Two sources, in this order of authority:
//!
//! 1. The root-owned file [`CONFIG_PATH`] (`key = value` lines; `#` starts a comment). It is
//!    honoured only if owned by root and not writable by group or others. Images use it to
//!    bake a cap in that the workload cannot raise.
//! 2. The environment: `FGPU_LIMIT`, `FGPU_COMPUTE`, `FGPU_LEDGER`, `FGPU_LOG`. `FGPU_LIMIT`
//!    can lower the file's cap, never raise it: per device the smaller of the two applies;
//!    `FGPU_COMPUTE` likewise for the file's compute share. When the file sets a limit or a
//!    compute share, `FGPU_LEDGER` is ignored: the file (or the default) names the ledger,
//!    so no process can leave the container's shared cap for a ledger of its own.
//!    `FGPU_LOG` replaces the file's `log`.
//!
//! What decides what is granted (a limit, the ledger, the file itself) fails closed when it
//! cannot be read. A log level does not decide anything: one that is not a level is ignored
//! with a warning ([`Config::warnings`]), an empty one silently, and the level that applies
//! without it is used. A key repeated in the file takes its last value.
//!
//! Reading is split from the OS ([`Sources`]) so the rules are unit-tested.

use crate::compute::{parse_share, ShareSpec};
use crate::limit::{parse_limit, AmbiguousKey, LimitError, LimitSpec};
use crate::log::Level;
use std::path::PathBuf;
use thiserror::Error;

/// The configuration file images write.
pub const CONFIG_PATH: &str = "/etc/fgpu/fgpu.conf";
pub use crate::ledger::default_path::{DefaultLedger, NoPlaceLeft};
use crate::ledger::Sharing;

/// What named the ledger a process uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LedgerOrigin {
    /// Nothing did: the user's own default (private to the user).
    Default,
    /// `FGPU_LEDGER` (ignored when the configuration file sets a limit).
    Env,
    /// `ledger =` in the configuration file.
    File,
}

impl LedgerOrigin {
    pub fn as_str(self) -> &'static str {
        match self {
            LedgerOrigin::Default => "default",
            LedgerOrigin::Env => "environment",
            LedgerOrigin::File => "config-file",
        }
    }
}

pub const ENV_LIMIT: &str = "FGPU_LIMIT";
pub const ENV_COMPUTE: &str = "FGPU_COMPUTE";
pub const ENV_LEDGER: &str = "FGPU_LEDGER";
/// `1` (or `true`, `yes`): the ledger `FGPU_LEDGER` names is shared with every user who can
/// open its file. Without it that ledger is private to its user. Ignored with `FGPU_LEDGER`.
pub const ENV_LEDGER_SHARED: &str = "FGPU_LEDGER_SHARED";
pub const ENV_LOG: &str = "FGPU_LOG";

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ConfigError {
    #[error("{var}={value:?} is not a valid limit: {reason}")]
    BadLimitEnv { var: &'static str, value: String, reason: LimitError },
    #[error("{path}:{line}: limit {value:?} is not valid: {reason}")]
    BadLimitFile { path: String, line: usize, value: String, reason: LimitError },
    #[error("{var}={value:?} is not a valid compute share: {reason}")]
    BadComputeEnv { var: &'static str, value: String, reason: LimitError },
    #[error("{path}:{line}: compute {value:?} is not valid: {reason}")]
    BadComputeFile { path: String, line: usize, value: String, reason: LimitError },
    #[error("{path}:{line}: {text:?} is not a `key = value` line with key limit, compute, ledger or log")]
    BadLine { path: String, line: usize, text: String },
    #[error("{var}={value:?} is not a yes or a no (1, true, yes; 0, false, no)")]
    BadFlagEnv { var: &'static str, value: String },
    #[error("{path} is not owned by root or is writable by group/others; refusing to trust its cap (fix: chown root:root and chmod 644)")]
    Untrusted { path: String },
    #[error("{path} cannot be read: {reason}")]
    Unreadable { path: String, reason: String },
    #[error("{source_name}: device key {key:?} is ambiguous: it matches {} GPUs ({}); give enough of the UUID to name one", matches.len(), matches.join(", "))]
    AmbiguousKey { source_name: String, key: String, matches: Vec<String> },
    #[error(
        "{source_name}: device key {key:?} is a UUID prefix, and the GPUs cannot be listed to check that it names only one ({reason}); give the whole UUID"
    )]
    UncheckedKey { source_name: String, key: String, reason: String },
}

/// Which source set the cap that applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitSource {
    File,
    Env,
    /// Both gave a cap; per device the smaller applies.
    FileAndEnv,
}

/// The resolved configuration of one process.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub file_limit: Option<LimitSpec>,
    pub env_limit: Option<LimitSpec>,
    /// The compute share (`compute =` in the file, `FGPU_COMPUTE`); see `compute.rs`.
    pub file_compute: Option<ShareSpec>,
    pub env_compute: Option<ShareSpec>,
    /// The ledger this process uses, and what named it. Everything that shows a ledger
    /// (`fgpu status`, `doctor`, the exporter) takes it from here, as the shim does.
    pub ledger: PathBuf,
    pub ledger_origin: LedgerOrigin,
    /// Who may share the ledger: the default is the user's own, one named in `FGPU_LEDGER`
    /// is private to the user unless `FGPU_LEDGER_SHARED` is set, one named in the file is
    /// shared by every user of the container.
    pub ledger_sharing: Sharing,
    /// Said once per process: the default ledger is not in its first place (someone else
    /// holds that), or no place is left for it (then it is an error when a cap is asked for).
    pub ledger_note: Option<String>,
    /// Why the ledger cannot be used: every place for the default ledger is someone else's.
    pub ledger_error: Option<String>,
    pub log: Level,
    /// What was ignored and why, one line each (a log level that is not one). Never
    /// anything that changes what is granted.
    pub warnings: Vec<String>,
}

impl Config {
    /// Whether a memory cap is configured.
    pub fn is_capped(&self) -> bool {
        self.file_limit.is_some() || self.env_limit.is_some()
    }

    /// Whether a compute share is configured.
    pub fn has_compute(&self) -> bool {
        self.file_compute.is_some() || self.env_compute.is_some()
    }

    /// Whether the shim has anything to do: a memory cap or a compute share. Without either
    /// it stays out of the way.
    pub fn is_active(&self) -> bool {
        self.is_capped() || self.has_compute()
    }

    /// The compute share for one device, in parts per million of its time: the smaller of
    /// the file's and the environment's; `None` when neither names the device.
    pub fn share_for(&self, uuid: &str) -> Option<u64> {
        let file = self.file_compute.as_ref().and_then(|s| s.share_for(uuid));
        let env = self.env_compute.as_ref().and_then(|s| s.share_for(uuid));
        match (file, env) {
            (Some(f), Some(e)) => Some(f.min(e)),
            (f, e) => f.or(e),
        }
    }

    pub fn limit_source(&self) -> Option<LimitSource> {
        match (&self.file_limit, &self.env_limit) {
            (Some(_), Some(_)) => Some(LimitSource::FileAndEnv),
            (Some(_), None) => Some(LimitSource::File),
            (None, Some(_)) => Some(LimitSource::Env),
            (None, None) => None,
        }
    }

    /// The cap for one device: the smaller of the file's and the environment's.
    pub fn cap_for(&self, uuid: &str, total: u64) -> Option<u64> {
        let file = self.file_limit.as_ref().and_then(|s| s.cap_for(uuid, total));
        let env = self.env_limit.as_ref().and_then(|s| s.cap_for(uuid, total));
        match (file, env) {
            (Some(f), Some(e)) => Some(f.min(e)),
            (f, e) => f.or(e),
        }
    }

    /// Checks that no device key of either limit is ambiguous among `devices`: the UUIDs of
    /// every GPU and MIG instance the machine lists (NVML's list, not the devices this process
    /// sees: two processes with different `CUDA_VISIBLE_DEVICES` must read a key alike).
    /// `devices` is only called when some key is a prefix; its error says why the list
    /// cannot be had, and makes such a key an error too.
    pub fn check_device_keys<E: std::fmt::Display>(&self, devices: impl FnOnce() -> Result<Vec<String>, E>) -> Result<(), ConfigError> {
        let limits = [
            (self.file_limit.as_ref(), CONFIG_PATH),
            (self.env_limit.as_ref(), ENV_LIMIT),
            (self.file_compute.as_ref().map(|s| &s.spec), CONFIG_PATH),
            (self.env_compute.as_ref().map(|s| &s.spec), ENV_COMPUTE),
        ];
        let with_prefixes: Vec<(&LimitSpec, &str)> =
            limits.iter().filter_map(|(spec, name)| spec.map(|s| (s, *name))).filter(|(s, _)| s.has_prefix_keys()).collect();
        if with_prefixes.is_empty() {
            return Ok(());
        }
        let uuids = match devices() {
            Ok(uuids) => uuids,
            Err(reason) => {
                let (spec, name) = with_prefixes[0];
                let key = spec.first_prefix_key().unwrap_or_default().to_string();
                return Err(ConfigError::UncheckedKey { source_name: name.to_string(), key, reason: reason.to_string() });
            }
        };
        for (spec, name) in with_prefixes {
            if let Some(AmbiguousKey { key, matches }) = spec.ambiguous_key(&uuids) {
                return Err(ConfigError::AmbiguousKey { source_name: name.to_string(), key, matches });
            }
        }
        Ok(())
    }

    /// Reads the real file and environment of this process, and prints each of
    /// [`Config::warnings`] once on stderr unless the level in effect is below `warn`.
    pub fn load() -> Result<Config, ConfigError> {
        let config = Config::from_sources(&OsSources)?;
        for warning in &config.warnings {
            crate::log::emit_under(config.log, Level::Warn, format_args!("{warning}"));
        }
        Ok(config)
    }

    pub fn from_sources(sources: &dyn Sources) -> Result<Config, ConfigError> {
        let mut config = Config {
            file_limit: None,
            env_limit: None,
            file_compute: None,
            env_compute: None,
            ledger: PathBuf::new(),
            ledger_origin: LedgerOrigin::Default,
            ledger_sharing: Sharing::User,
            ledger_note: None,
            ledger_error: None,
            log: Level::Warn,
            warnings: Vec::new(),
        };
        // Log levels that are not one, worded once every source is read (a later line or
        // FGPU_LOG may still set the level that applies).
        let mut bad_logs = Vec::new();
        if let Some(file) = sources.config_file()? {
            if !file.trusted {
                return Err(ConfigError::Untrusted { path: file.path });
            }
            apply_file(&mut config, &file.path, &file.text, &mut bad_logs)?;
        }
        if let Some(value) = sources.env(ENV_LIMIT) {
            let spec = parse_limit(&value).map_err(|reason| ConfigError::BadLimitEnv { var: ENV_LIMIT, value: value.clone(), reason })?;
            config.env_limit = Some(spec);
        }
        if let Some(value) = sources.env(ENV_COMPUTE) {
            let spec = parse_share(&value).map_err(|reason| ConfigError::BadComputeEnv { var: ENV_COMPUTE, value: value.clone(), reason })?;
            config.env_compute = Some(spec);
        }
        // A cap or share baked into the file also fixes the ledger: a workload that could name
        // its own ledger would get a fresh, empty share of the cap and escape the container's.
        if let Some(value) = sources.env(ENV_LEDGER) {
            if !value.is_empty() && config.file_limit.is_none() && config.file_compute.is_none() {
                config.ledger = PathBuf::from(value);
                config.ledger_origin = LedgerOrigin::Env;
                let shared = match sources.env(ENV_LEDGER_SHARED) {
                    None => false,
                    Some(v) => parse_flag(&v).ok_or(ConfigError::BadFlagEnv { var: ENV_LEDGER_SHARED, value: v.clone() })?,
                };
                config.ledger_sharing = if shared { Sharing::Shared } else { Sharing::Private };
            }
        }
        if config.ledger_origin == LedgerOrigin::Default {
            let uid = sources.euid();
            match sources.default_ledger(uid) {
                Ok(chosen) => {
                    config.ledger = chosen.path;
                    config.ledger_note = chosen.note;
                }
                Err(why) => {
                    config.ledger = crate::ledger::default_path::tmp_places(uid).next().unwrap_or_default().join("ledger");
                    config.ledger_error = Some(why.to_string());
                }
            }
        }
        if let Some(value) = sources.env(ENV_LOG) {
            match parse_log_level(&value) {
                LogValue::Level(level) => config.log = level,
                LogValue::Empty => {}
                LogValue::Bad => bad_logs.push(format!("{ENV_LOG}={value:?}")),
            }
        }
        let level = config.log;
        config.warnings.extend(bad_logs.iter().map(|what| bad_log_warning(what, level)));
        Ok(config)
    }
}

/// A yes or a no, as written in an environment variable; empty is a no.
fn parse_flag(value: &str) -> Option<bool> {
    match value.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Some(true),
        "" | "0" | "false" | "no" | "off" => Some(false),
        _ => None,
    }
}

/// A log level as written: a level, nothing (ignored silently), or not a level.
enum LogValue {
    Level(Level),
    Empty,
    Bad,
}

fn parse_log_level(value: &str) -> LogValue {
    if value.trim().is_empty() {
        return LogValue::Empty;
    }
    value.parse().map(LogValue::Level).unwrap_or(LogValue::Bad)
}

fn bad_log_warning(what: &str, level: Level) -> String {
    format!("{what} is not a log level (quiet, error, warn, info, debug); ignored, logging at {}", level.name())
}

fn apply_file(config: &mut Config, path: &str, text: &str, bad_logs: &mut Vec<String>) -> Result<(), ConfigError> {
    for (index, raw) in text.lines().enumerate() {
        let line = raw.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let bad_line = || ConfigError::BadLine { path: path.to_string(), line: index + 1, text: raw.to_string() };
        let (key, value) = line.split_once('=').ok_or_else(bad_line)?;
        let value = value.trim();
        match key.trim() {
            "limit" => {
                let spec = parse_limit(value).map_err(|reason| ConfigError::BadLimitFile {
                    path: path.to_string(),
                    line: index + 1,
                    value: value.to_string(),
                    reason,
                })?;
                config.file_limit = Some(spec);
            }
            "compute" => {
                let spec = parse_share(value).map_err(|reason| ConfigError::BadComputeFile {
                    path: path.to_string(),
                    line: index + 1,
                    value: value.to_string(),
                    reason,
                })?;
                config.file_compute = Some(spec);
            }
            "ledger" if !value.is_empty() => {
                config.ledger = PathBuf::from(value);
                config.ledger_origin = LedgerOrigin::File;
                config.ledger_sharing = Sharing::Shared;
            }
            "log" => match parse_log_level(value) {
                LogValue::Level(level) => config.log = level,
                LogValue::Empty => {}
                LogValue::Bad => bad_logs.push(format!("{path}:{}: log = {value:?}", index + 1)),
            },
            _ => return Err(bad_line()),
        }
    }
    Ok(())
}

/// The configuration file as read from disk.
pub struct ConfigFile {
    pub path: String,
    pub text: String,
    /// Owned by root and not writable by group or others.
    pub trusted: bool,
}

/// Where configuration comes from: the OS in production, fixed values in tests.
pub trait Sources {
    fn env(&self, name: &str) -> Option<String>;
    fn config_file(&self) -> Result<Option<ConfigFile>, ConfigError>;
    /// The effective user id (it names the default ledger).
    fn euid(&self) -> u32 {
        crate::ledger::store::euid()
    }
    /// The user's default ledger (`ledger/default_path.rs`).
    fn default_ledger(&self, uid: u32) -> Result<DefaultLedger, NoPlaceLeft> {
        crate::ledger::default_path::choose(uid, &crate::ledger::default_path::OsPlaces)
    }
}

/// The real environment and [`CONFIG_PATH`].
pub struct OsSources;

impl Sources for OsSources {
    fn env(&self, name: &str) -> Option<String> {
        std::env::var_os(name).map(|v| v.to_string_lossy().into_owned())
    }

    fn config_file(&self) -> Result<Option<ConfigFile>, ConfigError> {
        use std::os::unix::fs::MetadataExt;
        let unreadable = |e: std::io::Error| ConfigError::Unreadable { path: CONFIG_PATH.to_string(), reason: e.to_string() };
        let meta = match std::fs::metadata(CONFIG_PATH) {
            Ok(meta) => meta,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(unreadable(e)),
        };
        let text = std::fs::read_to_string(CONFIG_PATH).map_err(unreadable)?;
        Ok(Some(ConfigFile { path: CONFIG_PATH.to_string(), text, trusted: meta.uid() == 0 && meta.mode() & 0o022 == 0 }))
    }
}

#[cfg(test)]
mod tests;
