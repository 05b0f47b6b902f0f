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
    fn default_ledger(&self, uid: u32) -> Result<DefaultLedger, NoPlaceLeft> {
        Ok(DefaultLedger { path: default_ledger(uid), note: None })
    }
}

fn default_ledger(uid: u32) -> PathBuf {
    PathBuf::from(format!("/run/user/{uid}/fgpu/ledger-ipc1"))
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
fn who_shares_a_ledger() {
    // The default: the user's own.
    assert_eq!(load(&[(ENV_LIMIT, "8G")], None).unwrap().ledger_sharing, Sharing::User);
    // Named in FGPU_LEDGER: private to the user unless FGPU_LEDGER_SHARED says otherwise.
    assert_eq!(load(&[(ENV_LEDGER, "/srv/l")], None).unwrap().ledger_sharing, Sharing::Private);
    for yes in ["1", "true", "YES"] {
        assert_eq!(load(&[(ENV_LEDGER, "/srv/l"), (ENV_LEDGER_SHARED, yes)], None).unwrap().ledger_sharing, Sharing::Shared, "{yes}");
    }
    for no in ["0", "no", ""] {
        assert_eq!(load(&[(ENV_LEDGER, "/srv/l"), (ENV_LEDGER_SHARED, no)], None).unwrap().ledger_sharing, Sharing::Private, "{no:?}");
    }
    let err = load(&[(ENV_LEDGER, "/srv/l"), (ENV_LEDGER_SHARED, "sure")], None).unwrap_err();
    assert_eq!(err.to_string(), r#"FGPU_LEDGER_SHARED="sure" is not a yes or a no (1, true, yes; 0, false, no)"#);
    // Named in the file: shared by the container's users, whatever the environment says.
    let file = Some(("limit = 8G\nledger = /var/lib/fgpu/ledger\n", true));
    assert_eq!(load(&[(ENV_LEDGER_SHARED, "0")], file).unwrap().ledger_sharing, Sharing::Shared);
    // FGPU_LEDGER ignored (the file sets a cap): so is FGPU_LEDGER_SHARED.
    let pinned = load(&[(ENV_LEDGER, "/tmp/mine"), (ENV_LEDGER_SHARED, "1")], Some(("limit = 8G", true))).unwrap();
    assert_eq!((pinned.ledger_origin, pinned.ledger_sharing), (LedgerOrigin::Default, Sharing::User));
}

#[test]
fn no_place_for_the_default_ledger_is_an_error_only_for_the_ledger() {
    struct Squatted;
    impl Sources for Squatted {
        fn env(&self, name: &str) -> Option<String> {
            (name == ENV_LIMIT).then(|| "8G".to_string())
        }
        fn config_file(&self) -> Result<Option<ConfigFile>, ConfigError> {
            Ok(None)
        }
        fn euid(&self) -> u32 {
            1001
        }
        fn default_ledger(&self, uid: u32) -> Result<DefaultLedger, NoPlaceLeft> {
            Err(NoPlaceLeft { uid, passed: vec!["/tmp/fgpu-1001 belongs to uid 0".into()] })
        }
    }
    let config = Config::from_sources(&Squatted).unwrap();
    assert_eq!(config.cap_for("GPU-1", 80 * GIB), Some(8 * GIB));
    assert_eq!(
        config.ledger_error.as_deref(),
        Some("no place is left for the default ledger of uid 1001: /tmp/fgpu-1001 belongs to uid 0; set FGPU_LEDGER to a file in a directory of your own")
    );
}

#[test]
fn untrusted_or_bad_file_fails_closed() {
    assert!(matches!(load(&[], Some(("limit = 8G", false))), Err(ConfigError::Untrusted { .. })));
    assert!(matches!(load(&[], Some(("limit = lots", true))), Err(ConfigError::BadLimitFile { line: 1, .. })));
    assert!(matches!(load(&[], Some(("# cap\nlimt = 8G", true))), Err(ConfigError::BadLine { line: 2, .. })));
}

#[test]
fn a_cap_too_small_for_any_context_fails_closed_in_the_file_and_the_environment() {
    let err = load(&[(ENV_LIMIT, "8")], None).unwrap_err();
    assert!(matches!(&err, ConfigError::BadLimitEnv { reason: LimitError::TooSmall { bytes: 8, .. }, .. }), "{err:?}");
    assert!(err.to_string().starts_with(r#"FGPU_LIMIT="8" is not a valid limit: "8" is 8 bytes, too small for any CUDA context"#), "{err}");
    assert!(err.to_string().ends_with("did you mean 8G?"), "{err}");
    let err = load(&[], Some(("limit = 16", true))).unwrap_err();
    assert!(matches!(&err, ConfigError::BadLimitFile { line: 1, reason: LimitError::TooSmall { .. }, .. }), "{err:?}");
    assert!(err.to_string().ends_with("did you mean 16G?"), "{err}");
}

#[test]
fn bad_environment_names_the_variable_and_value() {
    for bad in ["banana", "-1", "8XB", "", "99999999999999999999999"] {
        let err = load(&[(ENV_LIMIT, bad)], None).unwrap_err();
        let message = err.to_string();
        assert!(message.starts_with("FGPU_LIMIT="), "{message}");
        assert!(message.contains(&format!("{bad:?}")), "{message}");
    }
}

#[test]
fn a_bad_log_level_is_ignored_with_one_warning_and_never_changes_the_cap() {
    // No cap: still no cap, and nothing else changes.
    let uncapped = load(&[(ENV_LOG, "bogus")], None).unwrap();
    assert!(!uncapped.is_capped());
    assert_eq!(uncapped.log, Level::Warn);
    assert_eq!(uncapped.warnings, vec![r#"FGPU_LOG="bogus" is not a log level (quiet, error, warn, info, debug); ignored, logging at warn"#]);
    // A cap: the same cap.
    let capped = load(&[(ENV_LOG, "bogus"), (ENV_LIMIT, "8G")], None).unwrap();
    assert_eq!(capped.cap_for("GPU-1", 80 * GIB), Some(8 * GIB));
    assert_eq!(capped.warnings.len(), 1);
    // Empty: silently the default.
    for empty in ["", "  "] {
        let config = load(&[(ENV_LOG, empty)], None).unwrap();
        assert_eq!((config.log, config.warnings.len()), (Level::Warn, 0), "{empty:?}");
    }
    // Ignored means as if unset: the file's level applies, and the warning says so.
    let file = Some(("limit = 8G\nlog = debug\n", true));
    let config = load(&[(ENV_LOG, "loud")], file).unwrap();
    assert_eq!(config.log, Level::Debug);
    assert!(config.warnings[0].ends_with("logging at debug"), "{:?}", config.warnings);
    // A bad level in the file: the same rule, with file and line; the cap stands.
    let config = load(&[], Some(("limit = 2G\nlog = lots\n", true))).unwrap();
    assert_eq!(config.cap_for("GPU-1", 80 * GIB), Some(2 * GIB));
    assert_eq!(config.warnings, vec![r#"/etc/fgpu/fgpu.conf:2: log = "lots" is not a log level (quiet, error, warn, info, debug); ignored, logging at warn"#]);
    let config = load(&[(ENV_LOG, "error")], Some(("log = lots\n", true))).unwrap();
    assert!(config.warnings[0].ends_with("logging at error"), "{:?}", config.warnings);
    assert!(load(&[], Some(("log =\n", true))).unwrap().warnings.is_empty());
}

#[test]
fn the_environment_log_level_beats_the_file_and_a_repeated_key_takes_its_last_value() {
    let file = Some(("log = debug\nlimit = 8G\nlimit = 4G\nledger = /a\nledger = /b\n", true));
    let config = load(&[(ENV_LOG, "error")], file).unwrap();
    assert_eq!(config.log, Level::Error);
    assert_eq!(config.cap_for("GPU-1", 80 * GIB), Some(4 * GIB));
    assert_eq!(config.ledger, PathBuf::from("/b"));
    assert_eq!(load(&[], file).unwrap().log, Level::Debug);
}

#[test]
fn an_ambiguous_device_key_is_an_error_naming_it_and_its_gpus() {
    let gpus = || Ok::<_, String>(vec!["GPU-f350df69-dd23-9511-0000-000000000001".to_string(), "GPU-fb306127-4b39-44e9-0000-000000000004".to_string()]);
    let config = load(&[(ENV_LIMIT, "GPU-f=2G")], None).unwrap();
    let err = config.check_device_keys(gpus).unwrap_err();
    assert_eq!(
        err.to_string(),
        r#"FGPU_LIMIT: device key "GPU-f" is ambiguous: it matches 2 GPUs (GPU-f350df69-dd23-9511-0000-000000000001, GPU-fb306127-4b39-44e9-0000-000000000004); give enough of the UUID to name one"#
    );
    assert_eq!(load(&[(ENV_LIMIT, "GPU-f3=2G")], None).unwrap().check_device_keys(gpus), Ok(()));
    // In the file: named by the file.
    let config = load(&[], Some(("limit = GPU-f=2G", true))).unwrap();
    assert!(config.check_device_keys(gpus).unwrap_err().to_string().starts_with("/etc/fgpu/fgpu.conf: device key \"GPU-f\""));
    // The list is asked for only when a key is a prefix, and a prefix that cannot be
    // checked is an error too.
    let never = || -> Result<Vec<String>, String> { panic!("no list needed") };
    load(&[(ENV_LIMIT, "8G")], None).unwrap().check_device_keys(never).unwrap();
    load(&[(ENV_LIMIT, "GPU-f350df69-dd23-9511-0000-000000000001=2G")], None).unwrap().check_device_keys(never).unwrap();
    let err = load(&[(ENV_LIMIT, "GPU-f3=2G,*=1G")], None).unwrap().check_device_keys(|| Err::<Vec<String>, _>("NVML cannot be loaded")).unwrap_err();
    assert!(matches!(&err, ConfigError::UncheckedKey { key, .. } if key == "GPU-f3"), "{err}");
}

#[test]
fn a_compute_share_from_the_file_and_the_environment() {
    let file = Some(("compute = 50%\nledger = /var/lib/fgpu/ledger\n", true));
    let config = load(&[], file).unwrap();
    assert!(config.has_compute() && config.is_active() && !config.is_capped());
    assert_eq!(config.share_for("GPU-1"), Some(500_000));
    // The environment lowers, never raises; per device the smaller applies.
    assert_eq!(load(&[(ENV_COMPUTE, "30%")], file).unwrap().share_for("GPU-1"), Some(300_000));
    assert_eq!(load(&[(ENV_COMPUTE, "90%")], file).unwrap().share_for("GPU-1"), Some(500_000));
    let mixed = load(&[(ENV_COMPUTE, "GPU-1=10%")], file).unwrap();
    assert_eq!((mixed.share_for("GPU-1"), mixed.share_for("GPU-2")), (Some(100_000), Some(500_000)));
    // FGPU_COMPUTE alone turns the shim on; a share in the file pins the ledger.
    let alone = load(&[(ENV_COMPUTE, "25%")], None).unwrap();
    assert!(alone.is_active() && !alone.is_capped());
    assert_eq!(alone.share_for("MIG-abc"), Some(250_000));
    let pinned = load(&[(ENV_LEDGER, "/tmp/mine")], Some(("compute = 50%", true))).unwrap();
    assert_eq!(pinned.ledger_origin, LedgerOrigin::Default);
    assert!(!load(&[], None).unwrap().is_active());
}

#[test]
fn a_bad_compute_share_fails_closed_naming_it() {
    let err = load(&[(ENV_COMPUTE, "30")], None).unwrap_err();
    assert_eq!(err.to_string(), r#"FGPU_COMPUTE="30" is not a valid compute share: "30" is not a share of the GPU's time: write a percentage such as 30%"#);
    let err = load(&[(ENV_COMPUTE, "150%")], None).unwrap_err();
    assert!(err.to_string().starts_with(r#"FGPU_COMPUTE="150%" is not a valid compute share"#), "{err}");
    let err = load(&[], Some(("limit = 8G\ncompute = half\n", true))).unwrap_err();
    assert!(matches!(err, ConfigError::BadComputeFile { line: 2, .. }), "{err}");
    assert!(err.to_string().starts_with(r#"/etc/fgpu/fgpu.conf:2: compute "half" is not valid"#), "{err}");
    // Ambiguous device keys are checked for the share as for the cap.
    let gpus = || Ok::<_, String>(vec!["GPU-f350df69-dd23-9511-0000-000000000001".to_string(), "GPU-fb306127-4b39-44e9-0000-000000000004".to_string()]);
    let err = load(&[(ENV_COMPUTE, "GPU-f=20%")], None).unwrap().check_device_keys(gpus).unwrap_err();
    assert!(err.to_string().starts_with(r#"FGPU_COMPUTE: device key "GPU-f" is ambiguous"#), "{err}");
}

#[test]
fn comments_and_log_level_in_file() {
    let config = load(&[], Some(("# baked by the image\nlimit = 25%  # a quarter\nlog = debug\n", true))).unwrap();
    assert_eq!(config.cap_for("GPU-1", 80 * GIB), Some(20 * GIB));
    assert_eq!(config.log, Level::Debug);
}
