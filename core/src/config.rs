//! Where a process's cap, ledger path and log level come from.
//!
//! Two sources, in this order of authority:
//!
//! 1. The root-owned file [`CONFIG_PATH`] (`key = value` lines; `#` starts a comment). It is
//!    honoured only if owned by root and not writable by group or others. Images use it to
//!    bake a cap in that the workload cannot raise.
//! 2. The environment: `FGPU_LIMIT`, `FGPU_LEDGER`, `FGPU_LOG`. `FGPU_LIMIT` can lower the
//!    file's cap, never raise it: per device the smaller of the two applies. When the file
//!    sets a limit, `FGPU_LEDGER` is ignored: the file (or the default) names the ledger, so
//!    no process can leave the container's shared cap for a ledger of its own.
//!
//! Reading is split from the OS ([`Sources`]) so the rules are unit-tested.

use crate::limit::{parse_limit, LimitError, LimitSpec};
use crate::log::Level;
use std::path::PathBuf;
use thiserror::Error;

/// The configuration file images write.
pub const CONFIG_PATH: &str = "/etc/fgpu/fgpu.conf";
/// Directory of the per-user default ledgers: `/tmp/fgpu-UID/ledger` is used when neither
/// the file nor `FGPU_LEDGER` names a ledger. Per user, so that two users' jobs on one host
/// never share a cap or reach each other's ledger; in `/tmp`, which belongs to a container's
/// own filesystem, so two containers never share one either, even with `--ipc=host`.
pub const DEFAULT_LEDGER_DIR_PREFIX: &str = "/tmp/fgpu-";

/// The default ledger of a user.
pub fn default_ledger(uid: u32) -> PathBuf {
    PathBuf::from(format!("{DEFAULT_LEDGER_DIR_PREFIX}{uid}/ledger"))
}

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
    /// Who may share the ledger: a default is the user's own; a ledger named on purpose is
    /// shared by every user who can open it.
    pub fn sharing(self) -> crate::ledger::Sharing {
        match self {
            LedgerOrigin::Default => crate::ledger::Sharing::User,
            LedgerOrigin::Env | LedgerOrigin::File => crate::ledger::Sharing::Shared,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            LedgerOrigin::Default => "default",
            LedgerOrigin::Env => "environment",
            LedgerOrigin::File => "config-file",
        }
    }
}

pub const ENV_LIMIT: &str = "FGPU_LIMIT";
pub const ENV_LEDGER: &str = "FGPU_LEDGER";
pub const ENV_LOG: &str = "FGPU_LOG";

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ConfigError {
    #[error("{var}={value:?} is not a valid limit: {reason}")]
    BadLimitEnv { var: &'static str, value: String, reason: LimitError },
    #[error("{path}:{line}: limit {value:?} is not valid: {reason}")]
    BadLimitFile { path: String, line: usize, value: String, reason: LimitError },
    #[error("{path}:{line}: {text:?} is not a `key = value` line with key limit, ledger or log")]
    BadLine { path: String, line: usize, text: String },
    #[error("{path} is not owned by root or is writable by group/others; refusing to trust its cap (fix: chown root:root and chmod 644)")]
    Untrusted { path: String },
    #[error("{path} cannot be read: {reason}")]
    Unreadable { path: String, reason: String },
    #[error("{var}={value:?} is not a log level (quiet, error, warn, info, debug)")]
    BadLogLevel { var: String, value: String },
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
    /// The ledger this process uses, and what named it. Everything that shows a ledger
    /// (`fgpu status`, `doctor`, the exporter) takes it from here, as the shim does.
    pub ledger: PathBuf,
    pub ledger_origin: LedgerOrigin,
    pub log: Level,
}

impl Config {
    /// Whether any cap is configured at all. Without one the shim stays out of the way.
    pub fn is_capped(&self) -> bool {
        self.file_limit.is_some() || self.env_limit.is_some()
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

    /// Reads the real file and environment of this process.
    pub fn load() -> Result<Config, ConfigError> {
        Config::from_sources(&OsSources)
    }

    pub fn from_sources(sources: &dyn Sources) -> Result<Config, ConfigError> {
        let mut config = Config {
            file_limit: None,
            env_limit: None,
            ledger: default_ledger(sources.euid()),
            ledger_origin: LedgerOrigin::Default,
            log: Level::Warn,
        };
        if let Some(file) = sources.config_file()? {
            if !file.trusted {
                return Err(ConfigError::Untrusted { path: file.path });
            }
            apply_file(&mut config, &file.path, &file.text)?;
        }
        if let Some(value) = sources.env(ENV_LIMIT) {
            let spec = parse_limit(&value).map_err(|reason| ConfigError::BadLimitEnv {
                var: ENV_LIMIT,
                value: value.clone(),
                reason,
            })?;
            config.env_limit = Some(spec);
        }
        // A cap baked into the file also fixes the ledger: a workload that could name its own
        // ledger would get a fresh, empty share of the cap and escape the container's.
        if let Some(value) = sources.env(ENV_LEDGER) {
            if !value.is_empty() && config.file_limit.is_none() {
                config.ledger = PathBuf::from(value);
                config.ledger_origin = LedgerOrigin::Env;
            }
        }
        if let Some(value) = sources.env(ENV_LOG) {
            config.log = value
                .parse()
                .map_err(|_| ConfigError::BadLogLevel { var: ENV_LOG.to_string(), value })?;
        }
        Ok(config)
    }
}

fn apply_file(config: &mut Config, path: &str, text: &str) -> Result<(), ConfigError> {
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
            "ledger" if !value.is_empty() => {
                config.ledger = PathBuf::from(value);
                config.ledger_origin = LedgerOrigin::File;
            }
            "log" => {
                config.log = value.parse().map_err(|_| ConfigError::BadLogLevel {
                    var: format!("{path}:{} log", index + 1),
                    value: value.to_string(),
                })?
            }
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
        Ok(Some(ConfigFile {
            path: CONFIG_PATH.to_string(),
            text,
            trusted: meta.uid() == 0 && meta.mode() & 0o022 == 0,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    const GIB: u64 = 1 << 30;

    struct Fixed {
        env: HashMap<&'static str, &'static str>,
        file: Option<(&'static str, bool)>,
    }

    impl Sources for Fixed {
        fn env(&self, name: &str) -> Option<String> {
            self.env.get(name).map(|v| v.to_string())
        }
        fn config_file(&self) -> Result<Option<ConfigFile>, ConfigError> {
            Ok(self.file.map(|(text, trusted)| ConfigFile { path: CONFIG_PATH.into(), text: text.into(), trusted }))
        }
        fn euid(&self) -> u32 {
            1000
        }
    }

    fn load(env: &[(&'static str, &'static str)], file: Option<(&'static str, bool)>) -> Result<Config, ConfigError> {
        Config::from_sources(&Fixed { env: env.iter().copied().collect(), file })
    }

    #[test]
    fn nothing_configured_means_uncapped_with_default_ledger() {
        let config = load(&[], None).unwrap();
        assert!(!config.is_capped());
        assert_eq!(config.ledger, default_ledger(1000));
        assert_eq!(config.ledger_origin, LedgerOrigin::Default);
        assert_eq!(config.log, Level::Warn);
    }

    #[test]
    fn environment_can_lower_but_not_raise_the_file_cap() {
        let file = Some(("limit = 8G\nledger = /var/lib/fgpu/ledger\n", true));
        let raised = load(&[(ENV_LIMIT, "64G")], file).unwrap();
        assert_eq!(raised.cap_for("GPU-1", 80 * GIB), Some(8 * GIB));
        let lowered = load(&[(ENV_LIMIT, "2G")], file).unwrap();
        assert_eq!(lowered.cap_for("GPU-1", 80 * GIB), Some(2 * GIB));
        assert_eq!(lowered.limit_source(), Some(LimitSource::FileAndEnv));
        let file_only = load(&[], file).unwrap();
        assert_eq!(file_only.cap_for("GPU-1", 80 * GIB), Some(8 * GIB));
        assert_eq!(file_only.ledger, PathBuf::from("/var/lib/fgpu/ledger"));
    }

    #[test]
    fn a_file_cap_pins_the_ledger() {
        let file = Some(("limit = 8G\nledger = /var/lib/fgpu/ledger\n", true));
        let config = load(&[(ENV_LEDGER, "/tmp/mine")], file).unwrap();
        assert_eq!(config.ledger, PathBuf::from("/var/lib/fgpu/ledger"));
        let pinned = load(&[(ENV_LEDGER, "/tmp/mine")], Some(("limit = 8G", true))).unwrap();
        assert_eq!(pinned.ledger, default_ledger(1000));
        assert_eq!(pinned.ledger_origin, LedgerOrigin::Default);
        let no_file_cap = load(&[(ENV_LEDGER, "/tmp/mine")], Some(("log = info", true))).unwrap();
        assert_eq!(no_file_cap.ledger, PathBuf::from("/tmp/mine"));
        assert_eq!(no_file_cap.ledger_origin, LedgerOrigin::Env);
        assert_eq!(config.ledger_origin, LedgerOrigin::File);
    }

    #[test]
    fn untrusted_or_bad_file_fails_closed() {
        assert!(matches!(load(&[], Some(("limit = 8G", false))), Err(ConfigError::Untrusted { .. })));
        assert!(matches!(load(&[], Some(("limit = lots", true))), Err(ConfigError::BadLimitFile { line: 1, .. })));
        assert!(matches!(load(&[], Some(("# cap\nlimt = 8G", true))), Err(ConfigError::BadLine { line: 2, .. })));
    }

    #[test]
    fn bad_environment_names_the_variable_and_value() {
        for bad in ["banana", "-1", "8XB", "", "99999999999999999999999"] {
            let err = load(&[(ENV_LIMIT, bad)], None).unwrap_err();
            let message = err.to_string();
            assert!(message.starts_with("FGPU_LIMIT="), "{message}");
            assert!(message.contains(&format!("{bad:?}")), "{message}");
        }
        assert!(matches!(load(&[(ENV_LOG, "loud")], None), Err(ConfigError::BadLogLevel { .. })));
    }

    #[test]
    fn comments_and_log_level_in_file() {
        let config = load(&[], Some(("# baked by the image\nlimit = 25%  # a quarter\nlog = debug\n", true))).unwrap();
        assert_eq!(config.cap_for("GPU-1", 80 * GIB), Some(20 * GIB));
        assert_eq!(config.log, Level::Debug);
    }
}
