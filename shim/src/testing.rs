//! What the shim's unit tests share: a private directory with a ledger, a configuration
//! read from made-up environment variables, and an [`Active`] process over both, whose
//! driver is the fake (`driver/fake.rs`).

use crate::accounting::active::Active;
use crate::driver::fake::{self, State, FAKE};
use crate::process::account::Account;
use fgpu_core::config::{Config, ConfigError, ConfigFile, Sources};
use fgpu_core::ledger::Ledger;
use fgpu_core::uuid::{DeviceUuid, UuidKind};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::MutexGuard;

pub const GIB: u64 = 1 << 30;
pub const MIB: u64 = 1 << 20;
/// The UUID of the fake's device 0.
pub const UUID: DeviceUuid = DeviceUuid { kind: UuidKind::Gpu, bytes: [0x5a; 16] };

/// A directory of one test's own, removed when it ends (pass or fail). Each has a path of
/// its own, never used again by the test binary: the ledgers of earlier ones stay open
/// ([`account`]), and a ledger whose path names a new lock file while its members live on
/// is joined by design (`fgpu_core::ledger::store`).
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(name: &str) -> TempDir {
        static MADE: AtomicUsize = AtomicUsize::new(0);
        let n = MADE.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("fgpu-shim-test-{}-{name}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    pub fn ledger(&self) -> PathBuf {
        self.0.join("ledger")
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The environment a test gives the configuration; no configuration file.
struct Env(HashMap<String, String>);

impl Sources for Env {
    fn env(&self, name: &str) -> Option<String> {
        self.0.get(name).cloned()
    }

    fn config_file(&self) -> Result<Option<ConfigFile>, ConfigError> {
        Ok(None)
    }
}

/// A test's process: the fake driver (held for the test), its directory, and an
/// [`Active`] whose ledger is in that directory.
pub struct Process {
    pub active: Active,
    pub dir: TempDir,
    _serial: MutexGuard<'static, ()>,
}

impl Process {
    /// A process under `vars` (`FGPU_LIMIT`, `FGPU_COMPUTE`...; the ledger is the test's
    /// own), with one device of `device_bytes` on the fake driver.
    pub fn new(name: &str, vars: &[(&str, &str)], device_bytes: u64) -> Process {
        let serial = fake::serial();
        FAKE.reset(State { devices: vec![(UUID, device_bytes)], ..State::default() });
        let dir = TempDir::new(name);
        let active = Active::new(account(&dir, vars));
        Process { active, dir, _serial: serial }
    }

    /// Another process of the same ledger (another open of it), under `vars`.
    pub fn another(&self, vars: &[(&str, &str)]) -> Active {
        Active::new(account(&self.dir, vars))
    }
}

/// An account under `vars` in the ledger of `dir`, leaked as the shim's own is (an
/// [`Active`] holds its account for good): its ledger stays open until the test binary
/// exits, which changes nothing for a test, each having a directory and ledger of its own.
fn account(dir: &TempDir, vars: &[(&str, &str)]) -> &'static Account {
    let mut env: HashMap<String, String> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    env.insert("FGPU_LEDGER".into(), dir.ledger().display().to_string());
    let config = Config::from_sources(&Env(env)).expect("the test's configuration");
    let ledger = Ledger::open(&config.ledger, config.ledger_sharing).expect("the test's ledger");
    Box::leak(Box::new(Account::new(config, ledger)))
}
