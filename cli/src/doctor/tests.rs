//! Unit tests of `fgpu doctor`: the checks over made-up facts, and the facts gathered over a
//! fake system.

use super::checks::cap::{describe_spec, no_cap_yet};
use super::facts::{preload_entries, LedgerFact, PreloadEntry, LD_SO_PRELOAD};
use super::system::{HostPidError, TrialError};
use super::*;
use crate::driver::probe::{DriverProbe, LibraryProbe, ProbedDevice};
use crate::elf::ElfInfo;
use crate::observe::ledgers::Origin;
use crate::shimpath::{self, ShimError};
use fgpu_core::config::{Config, ConfigError};
use fgpu_core::ledger::shm_usage::ShmUsage;
use fgpu_core::limit::parse_limit;
use fgpu_core::nvmlpids::NvmlPids;

/// The driver of a machine with one H100, as the probe reports it.
fn one_h100() -> DriverProbe {
    DriverProbe {
        cuda: LibraryProbe { loaded: true, cuda_version: Some(12080), device_count: Some(1), ..Default::default() },
        nvml: LibraryProbe { loaded: true, driver_version: Some("570.1".into()), device_count: Some(1), ..Default::default() },
        devices: vec![ProbedDevice {
            index: 0,
            uuid: "GPU-12345678-0000-0000-0000-000000000000".into(),
            name: "H100".into(),
            total_bytes: 80 << 30,
            ..Default::default()
        }],
    }
}

fn good_facts() -> Facts {
    let info = ElfInfo { class64: true, little_endian: true, machine: 62, needed_versions: vec![("libc.so.6".into(), "GLIBC_2.17".into())], defined: vec![] };
    Facts {
        shim: Ok(shimpath::Found { path: "/usr/lib/fgpu/libfgpu.so".into(), from_env: false }),
        shim_elf: Some(Ok(info.clone())),
        companion_elf: Some(Ok(info)),
        own_machine: Some(62),
        glibc: Some("2.36".into()),
        shim_trial: Some(Ok(())),
        preloads: vec![PreloadEntry { path: "/usr/lib/fgpu/libfgpu.so".into(), source: "LD_PRELOAD", exists: true, is_fgpu: true, interposes: false }],
        config: Ok(Config {
            file_limit: None,
            env_limit: Some(parse_limit("8G").unwrap()),
            file_compute: None,
            env_compute: None,
            ledger: "/tmp/fgpu-0/ledger".into(),
            ledger_origin: fgpu_core::config::LedgerOrigin::Default,
            ledger_sharing: fgpu_core::ledger::Sharing::User,
            ledger_note: None,
            ledger_error: None,
            log: fgpu_core::log::Level::Warn,
            warnings: vec![],
        }),
        driver: Ok(one_h100()),
        ledger_path: "/tmp/.fgpu-ledger".into(),
        ledger_origin: Origin::Default,
        ledger: LedgerFact::Missing { dir: "/tmp".into(), dir_problem: None },
        host_pidns: true,
        host_pid: Err(HostPidError::NoAnswer),
        nvml_pids: NvmlPids::HostNamespace,
        shm: Some(ShmUsage { segments: 2, max_segments: 4096, pages: 150, max_pages: 1 << 40, by_owner: vec![(0, 2)] }),
    }
}

fn fails(f: &Facts) -> Vec<(&'static str, String)> {
    assess(f).into_iter().filter(|x| x.level == Level::Fail).map(|x| (x.check, x.message)).collect()
}

#[test]
fn a_good_setup_passes_and_says_where_the_cap_comes_from() {
    let f = good_facts();
    assert!(fails(&f).is_empty(), "{:?}", fails(&f));
    let all = assess(&f);
    let cap = all.iter().find(|x| x.check == "cap").unwrap();
    assert!(cap.message.contains("FGPU_LIMIT") && cap.message.contains("8 GiB on every GPU"), "{}", cap.message);
    assert!(all.iter().any(|x| x.message.contains("capped at 8 GiB.")));
    let mut f = good_facts();
    f.config = Ok(Config { env_limit: Some(parse_limit("200G").unwrap()), ..f.config.unwrap() });
    assert!(assess(&f).iter().any(|x| x.message.contains("capped at 200 GiB, more than the GPU has")));
    assert!(all.iter().any(|x| x.message.contains("CUDA driver API 12.8")));
    assert!(all.iter().any(|x| x.message.contains("driver 570.1")));
}

#[test]
fn a_compute_share_alone_is_a_configuration_and_is_described() {
    let mut f = good_facts();
    f.config = Ok(Config { env_limit: None, env_compute: Some(fgpu_core::compute::parse_share("30%").unwrap()), ..f.config.unwrap() });
    assert!(fails(&f).is_empty(), "{:?}", fails(&f));
    let all = assess(&f);
    let compute = all.iter().find(|x| x.check == "compute").unwrap();
    assert_eq!(compute.level, Level::Ok);
    assert!(compute.message.contains("30% of the GPU's time on every GPU (from FGPU_COMPUTE in the environment)"), "{}", compute.message);
    assert!(all.iter().any(|x| x.check == "cap" && x.message.contains("No memory cap is configured, only a compute share")));
    f.preloads.clear();
    assert!(fails(&f).iter().any(|(c, _)| *c == "compute"), "{:?}", fails(&f));
}

#[test]
fn each_failure_is_named() {
    let mut f = good_facts();
    f.shim = Err(ShimError::NotFound(vec!["/a/libfgpu.so".into()]));
    assert!(fails(&f).iter().any(|(c, m)| *c == "shim" && m.contains("cannot be found")));

    let mut f = good_facts();
    if let Some(Ok(info)) = &mut f.shim_elf {
        info.machine = 183;
    }
    assert!(fails(&f).iter().any(|(_, m)| m.contains("built for AArch64")), "{:?}", fails(&f));

    let mut f = good_facts();
    if let Some(Ok(info)) = &mut f.shim_elf {
        info.needed_versions.push(("libc.so.6".into(), "GLIBC_2.38".into()));
    }
    assert!(fails(&f).iter().any(|(_, m)| m.contains("needs glibc 2.38") && m.contains("2.36")), "{:?}", fails(&f));

    let mut f = good_facts();
    f.shim_trial = Some(Err(TrialError::Loader("ERROR: ld.so: object cannot be preloaded".into())));
    let failed = fails(&f);
    assert!(failed.iter().any(|(c, _)| *c == "shim"));
    assert!(failed.iter().any(|(c, m)| *c == "cap" && m.contains("does not apply")), "{failed:?}");

    let mut f = good_facts();
    f.config = Ok(Config {
        file_limit: None,
        env_limit: None,
        file_compute: None,
        env_compute: None,
        ledger: "/x".into(),
        ledger_origin: fgpu_core::config::LedgerOrigin::Env,
        ledger_sharing: fgpu_core::ledger::Sharing::Private,
        ledger_note: None,
        ledger_error: None,
        log: fgpu_core::log::Level::Warn,
        warnings: vec![],
    });
    // No cap configured yet is no failure: information, with the next step.
    assert!(fails(&f).is_empty(), "{:?}", fails(&f));
    let all = assess(&f);
    assert!(no_cap_yet(&all), "{all:?}");
    assert!(
        all.iter().any(|x| x.check == "cap" && x.level == Level::Info && x.advice.as_deref().is_some_and(|a| a.contains("fgpu run --limit 8G"))),
        "{all:?}"
    );

    let mut f = good_facts();
    f.config = Config::from_sources(&BadEnv);
    assert!(fails(&f).iter().any(|(c, m)| *c == "cap" && m.contains("FGPU_LIMIT=\"lots\"")), "{:?}", fails(&f));

    let mut f = good_facts();
    f.preloads.clear();
    assert!(fails(&f).iter().any(|(c, m)| *c == "cap" && m.contains("not preloaded")));

    let mut f = good_facts();
    f.ledger = LedgerFact::Broken("ledger /x: not an fgpu ledger (unknown header)".into());
    assert!(fails(&f).iter().any(|(c, m)| *c == "ledger" && m.contains("not an fgpu ledger")));

    let mut f = good_facts();
    f.preloads.push(PreloadEntry { path: "/usr/lib/libvgpu.so".into(), source: LD_SO_PRELOAD, exists: true, is_fgpu: false, interposes: true });
    assert!(fails(&f).iter().any(|(c, m)| *c == "interposer" && m.contains("HAMi-core")));
}

struct BadEnv;
impl fgpu_core::config::Sources for BadEnv {
    fn env(&self, name: &str) -> Option<String> {
        (name == "FGPU_LIMIT").then(|| "lots".to_string())
    }
    fn config_file(&self) -> Result<Option<fgpu_core::config::ConfigFile>, ConfigError> {
        Ok(None)
    }
}

#[test]
fn warnings_do_not_fail() {
    let mut f = good_facts();
    f.driver = Ok(DriverProbe {
        cuda: LibraryProbe { error: Some("libcuda.so.1: cannot open shared object file".into()), ..Default::default() },
        ..Default::default()
    });
    f.host_pidns = false;
    assert!(fails(&f).is_empty());
    let all = assess(&f);
    assert!(all.iter().any(|x| x.level == Level::Warn && x.message.contains("libcuda.so.1 cannot be loaded")));
    assert!(all.iter().any(|x| x.message.contains("not the host PID namespace")));
}

/// Each PID behaviour gets its finding: what it means, and the remedy where one is
/// needed (docs/configuration.md).
#[test]
fn the_pid_behaviour_is_named_with_its_remedy() {
    let mut f = good_facts();
    f.host_pidns = false;
    let pid_finding = |f: &Facts| assess(f).into_iter().rfind(|x| x.check == "pidns").unwrap();
    let cases = [
        (NvmlPids::Caller, Err(HostPidError::Failed("no service".into())), Level::Ok, "NVML PIDs: caller", None),
        (NvmlPids::Host, Ok(4242), Level::Ok, "host PID 4242", None),
        (NvmlPids::Host, Err(HostPidError::Failed("no service".into())), Level::Warn, "NVML PIDs: host", Some("fgpu service")),
        (NvmlPids::CallerNoMemory, Ok(4242), Level::Warn, "NVML PIDs: caller-no-memory", Some("--pid=host")),
        (NvmlPids::Absent, Err(HostPidError::Failed("no service".into())), Level::Warn, "NVML PIDs: none", Some("--pid=host")),
        (NvmlPids::Unknown, Err(HostPidError::Failed("no service".into())), Level::Warn, "Host PIDs are unknown here", Some("fgpu service")),
        (NvmlPids::Unknown, Ok(4242), Level::Ok, "The host's fgpu service answers: this process is host PID 4242", None),
    ];
    for (behaviour, host_pid, level, says, advice) in cases {
        f.nvml_pids = behaviour;
        f.host_pid = host_pid;
        let x = pid_finding(&f);
        assert_eq!(x.level, level, "{behaviour:?}: {x:?}");
        assert!(x.message.contains(says), "{behaviour:?}: {x:?}");
        match advice {
            Some(a) => assert!(x.advice.as_deref().unwrap_or("").contains(a), "{behaviour:?}: {x:?}"),
            None => assert!(x.advice.is_none(), "{behaviour:?}: {x:?}"),
        }
    }
    // In the host's namespace it says it cannot tell.
    f.host_pidns = true;
    f.nvml_pids = NvmlPids::HostNamespace;
    assert!(pid_finding(&f).message.contains("cannot be told from here"));
    assert!(fails(&f).is_empty());
}

#[test]
fn a_bad_log_level_is_a_warning_and_the_cap_still_applies() {
    let mut f = good_facts();
    if let Ok(config) = &mut f.config {
        config.warnings.push(r#"FGPU_LOG="bogus" is not a log level (quiet, error, warn, info, debug); ignored, logging at warn"#.into());
    }
    assert!(fails(&f).is_empty(), "{:?}", fails(&f));
    assert!(assess(&f).iter().any(|x| x.level == Level::Warn && x.check == "cap" && x.message.contains("FGPU_LOG=\"bogus\"")));
}

#[test]
fn an_ambiguous_device_key_fails_as_in_the_shim() {
    let mut f = good_facts();
    if let Ok(d) = &mut f.driver {
        d.devices.push(ProbedDevice {
            index: 1,
            uuid: "GPU-12345678-1111-0000-0000-000000000000".into(),
            name: "H100".into(),
            total_bytes: 80 << 30,
            ..Default::default()
        });
    }
    f.config = Ok(Config { env_limit: Some(parse_limit("GPU-1234=2G").unwrap()), ..f.config.unwrap() });
    assert!(fails(&f).iter().any(|(c, m)| *c == "cap" && m.contains("\"GPU-1234\" is ambiguous") && m.contains("GPU-12345678-1111")), "{:?}", fails(&f));
    f.config = Ok(Config { env_limit: Some(parse_limit("GPU-12345678-1=2G").unwrap()), ..f.config.unwrap() });
    assert!(fails(&f).is_empty(), "{:?}", fails(&f));
    // Without NVML the prefix cannot be checked: the shim refuses it, so does the doctor.
    f.driver = Ok(DriverProbe {
        nvml: LibraryProbe { error: Some("libnvidia-ml.so.1: cannot open shared object file".into()), ..Default::default() },
        ..Default::default()
    });
    assert!(fails(&f).iter().any(|(c, m)| *c == "cap" && m.contains("cannot be listed")), "{:?}", fails(&f));
}

#[test]
fn describes_caps() {
    assert_eq!(describe_spec(&parse_limit("8G").unwrap()), "8 GiB on every GPU");
    assert_eq!(describe_spec(&parse_limit("GPU-1a=16G,*=25%").unwrap()), "16 GiB on GPU-1a, 25% of the GPU's memory on every other GPU");
}

#[test]
fn preload_entries_are_classified() {
    let entries = preload_entries(&Fake::default(), Some("/nonexistent/libfgpu.so /usr/lib/x.so"), Some("# comment\n/nonexistent/libvgpu.so\n"), None);
    assert_eq!(entries.len(), 3);
    assert!(entries[0].is_fgpu && !entries[0].exists);
    assert_eq!(entries[2].source, LD_SO_PRELOAD);
    let f = Facts { preloads: entries, ..good_facts() };
    let failed = fails(&f);
    assert!(failed.iter().any(|(c, m)| *c == "preload" && m.contains("/nonexistent/libfgpu.so, which does not exist")), "{failed:?}");
}

/// F5 of the second security review: a user who made segments up to kernel.shmmni keeps
/// every new ledger from being made; the doctor names the limit and who holds them.
#[test]
fn shared_memory_at_its_limit_is_a_failure_that_names_it() {
    let full = ShmUsage { segments: 8, max_segments: 8, pages: 8, max_pages: 1 << 40, by_owner: vec![(4242, 7), (0, 1)] };
    let f = Facts { shm: Some(full.clone()), ..good_facts() };
    let failed = fails(&f);
    let shm = failed.iter().find(|(check, _)| *check == "shm").unwrap_or_else(|| panic!("{failed:?}"));
    assert!(shm.1.contains("kernel.shmmni (8)") && shm.1.contains("uid 4242 holds 7, uid 0 holds 1"), "{}", shm.1);
    let joined = Facts { shm: Some(full), ledger: LedgerFact::Healthy { devices: 1, processes: 1 }, ..good_facts() };
    assert_eq!(assess(&joined).iter().find(|x| x.check == "shm").unwrap().level, Level::Warn, "its own ledger still takes processes");
    let fine = assess(&good_facts());
    assert_eq!(fine.iter().find(|x| x.check == "shm").unwrap().level, Level::Ok);
}

// ------------------------------------------------ the facts, gathered over a fake system

use super::system::System;
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

/// The environment and configuration file of a fake system.
#[derive(Default)]
struct FakeSources {
    env: HashMap<String, String>,
    file: Option<String>,
}

impl fgpu_core::config::Sources for FakeSources {
    fn env(&self, name: &str) -> Option<String> {
        self.env.get(name).cloned()
    }
    fn config_file(&self) -> Result<Option<fgpu_core::config::ConfigFile>, ConfigError> {
        Ok(self.file.as_ref().map(|text| fgpu_core::config::ConfigFile { path: fgpu_core::config::CONFIG_PATH.into(), text: text.clone(), trusted: true }))
    }
    fn euid(&self) -> u32 {
        1000
    }
    fn default_ledger(&self, _uid: u32) -> Result<fgpu_core::ledger::default_path::DefaultLedger, fgpu_core::config::NoPlaceLeft> {
        Ok(fgpu_core::ledger::default_path::DefaultLedger { path: "/run/user/1000/fgpu/ledger".into(), note: None })
    }
}

/// A machine made up for a test: its files and their ELF facts, which libraries fail to
/// load, the environment and the configuration file, and one GPU.
#[derive(Default)]
struct Fake {
    /// Where the front is found (`None`: nowhere).
    front: Option<PathBuf>,
    /// The files that exist, with their ELF facts.
    files: HashMap<PathBuf, ElfInfo>,
    /// Libraries that do not load, with the loader's message.
    broken: HashMap<PathBuf, String>,
    ld_so_preload: Option<String>,
    sources: FakeSources,
    loaded: std::cell::RefCell<HashSet<PathBuf>>,
}

fn elf_needing(glibc: &str, defined: &[&str]) -> ElfInfo {
    ElfInfo {
        class64: true,
        little_endian: true,
        machine: 62,
        needed_versions: vec![("libc.so.6".into(), "GLIBC_2.2.5".into()), ("libc.so.6".into(), format!("GLIBC_{glibc}"))],
        defined: defined.iter().map(|s| s.to_string()).collect(),
    }
}

impl Fake {
    /// fgpu installed in /opt/fgpu/lib, the front needing `front` and the shim `shim`.
    fn installed(front: &str, shim: &str) -> Fake {
        let mut fake = Fake { front: Some("/opt/fgpu/lib/libfgpu.so".into()), ..Default::default() };
        fake.files.insert("/opt/fgpu/lib/libfgpu.so".into(), elf_needing(front, &["cuMemAlloc_v2", "dlsym"]));
        fake.files.insert("/opt/fgpu/lib/libfgpu_shim.so".into(), elf_needing(shim, &[]));
        fake.sources.env.insert("FGPU_LIMIT".into(), "8G".into());
        fake.sources.env.insert("LD_PRELOAD".into(), "/opt/fgpu/lib/libfgpu.so".into());
        fake
    }
}

impl System for Fake {
    fn locate_front(&self) -> Result<shimpath::Found, ShimError> {
        self.front.clone().map(|path| shimpath::Found { path, from_env: false }).ok_or_else(|| ShimError::NotFound(vec!["/opt/fgpu/lib/libfgpu.so".into()]))
    }
    fn read_elf(&self, path: &Path) -> Result<ElfInfo, crate::elf::ElfError> {
        self.files.get(path).cloned().ok_or(crate::elf::ElfError::NotElf)
    }
    fn trial_load(&self, library: &Path) -> Result<(), TrialError> {
        self.loaded.borrow_mut().insert(library.to_path_buf());
        match self.broken.get(library) {
            Some(why) => Err(TrialError::Loader(why.clone())),
            None => Ok(()),
        }
    }
    fn is_file(&self, path: &Path) -> bool {
        self.files.contains_key(path)
    }
    fn canonicalize(&self, path: &Path) -> Option<PathBuf> {
        self.is_file(path).then(|| path.to_path_buf())
    }
    fn env(&self, name: &str) -> Option<String> {
        self.sources.env.get(name).cloned()
    }
    fn read_to_string(&self, path: &Path) -> Option<String> {
        (path == Path::new(LD_SO_PRELOAD)).then(|| self.ld_so_preload.clone()).flatten()
    }
    fn config_sources(&self) -> &dyn fgpu_core::config::Sources {
        &self.sources
    }
    fn driver(&self) -> Result<DriverProbe, crate::driver::probe::ProbeError> {
        Ok(one_h100())
    }
    fn host_pid(&self) -> Result<u32, HostPidError> {
        Ok(4242)
    }
    fn in_host_pidns(&self) -> bool {
        true
    }
    fn ledger(&self, path: &Path) -> LedgerFact {
        LedgerFact::Missing { dir: path.parent().unwrap().to_path_buf(), dir_problem: None }
    }
    fn nvml_pids(&self, _driver: Option<&DriverProbe>, _ledger: &Path) -> NvmlPids {
        NvmlPids::HostNamespace
    }
    fn own_machine(&self) -> Option<u16> {
        Some(62)
    }
    fn glibc(&self) -> Option<String> {
        Some("2.31".into())
    }
    fn shm(&self) -> Option<ShmUsage> {
        Some(ShmUsage { segments: 0, max_segments: 4096, pages: 0, max_pages: 1 << 40, by_owner: vec![] })
    }
}

#[test]
fn a_sound_installation_gathers_to_a_cap_that_applies() {
    let fake = Fake::installed("2.17", "2.17");
    let facts = gather(&fake);
    assert!(fake.loaded.borrow().contains(Path::new("/opt/fgpu/lib/libfgpu_shim.so")), "the shim beside the front is tried too");
    assert_eq!(facts.ledger_path, Path::new("/run/user/1000/fgpu/ledger"), "the user's default ledger, from the sources");
    let findings = assess(&facts);
    assert!(findings.iter().all(|x| x.level != Level::Fail), "{findings:?}");
    let shim = findings.iter().find(|x| x.check == "shim").unwrap();
    assert!(shim.message.contains("needs glibc 2.17; this system has 2.31"), "{}", shim.message);
    assert!(render_text(&findings).ends_with("A cap applies to GPU programs started here.\n"));
}

/// The newcomer's report: the front needs glibc 2.17, but a native build of the shim it
/// loads needs the build machine's (2.35 there). The doctor reports the larger, and
/// names the library that needs it.
#[test]
fn the_glibc_figure_is_the_larger_of_the_front_and_the_shim() {
    let fake = Fake::installed("2.17", "2.35");
    let findings = assess(&gather(&fake));
    let shim = findings.iter().find(|x| x.check == "shim").unwrap();
    assert_eq!(shim.level, Level::Fail, "{shim:?}");
    assert!(shim.message.starts_with("/opt/fgpu/lib/libfgpu_shim.so needs glibc 2.35, but this system has glibc 2.31"), "{}", shim.message);
    let mut newer_glibc = Fake::installed("2.17", "2.35");
    newer_glibc.sources.env.clear();
    let facts = Facts { glibc: Some("2.39".into()), ..gather(&newer_glibc) };
    let shim = assess(&facts).into_iter().find(|x| x.check == "shim").unwrap();
    assert!(shim.message.contains("needs glibc 2.35; this system has 2.39"), "{}", shim.message);
}

#[test]
fn a_missing_or_broken_shim_beside_the_front_is_named() {
    let mut fake = Fake::installed("2.17", "2.17");
    fake.files.remove(Path::new("/opt/fgpu/lib/libfgpu_shim.so"));
    let findings = assess(&gather(&fake));
    let shim = findings.iter().find(|x| x.check == "shim").unwrap();
    assert!(shim.message.contains("/opt/fgpu/lib/libfgpu_shim.so is missing beside it; libfgpu.so loads it"), "{}", shim.message);
    assert!(findings.iter().any(|x| x.check == "cap" && x.level == Level::Fail && x.message.contains("does not apply")), "{findings:?}");

    let mut fake = Fake::installed("2.17", "2.17");
    fake.broken.insert("/opt/fgpu/lib/libfgpu_shim.so".into(), "ERROR: ld.so: object cannot be preloaded".into());
    let shim = assess(&gather(&fake)).into_iter().find(|x| x.check == "shim").unwrap();
    assert!(shim.message.contains("/opt/fgpu/lib/libfgpu_shim.so, which it loads on a process's first CUDA or NVML call: ERROR: ld.so"), "{}", shim.message);
}

#[test]
fn what_is_preloaded_is_read_from_both_places() {
    let mut fake = Fake::installed("2.17", "2.17");
    fake.sources.env.remove("LD_PRELOAD");
    fake.ld_so_preload = Some("# fgpu\n/opt/fgpu/lib/libfgpu.so # the front\n/usr/lib/libvgpu.so\n".into());
    fake.files.insert("/usr/lib/libvgpu.so".into(), elf_needing("2.17", &["cuMemAlloc_v2"]));
    let facts = gather(&fake);
    let paths: Vec<&str> = facts.preloads.iter().map(|p| p.path.as_str()).collect();
    assert_eq!(paths, ["/opt/fgpu/lib/libfgpu.so", "/usr/lib/libvgpu.so"], "comments are not entries");
    assert!(facts.preloads[0].is_fgpu && !facts.preloads[0].interposes, "the front defines cuMemAlloc_v2 and is fgpu's");
    let findings = assess(&facts);
    assert!(findings.iter().any(|x| x.check == "preload" && x.level == Level::Ok && x.message.contains("for every program on this system")));
    assert!(
        findings.iter().any(|x| x.check == "interposer" && x.level == Level::Fail && x.message.contains("/usr/lib/libvgpu.so (HAMi-core)")),
        "{findings:?}"
    );
}

#[test]
fn no_front_found_is_the_first_failure() {
    let fake = Fake { front: None, ..Fake::installed("2.17", "2.17") };
    let facts = gather(&fake);
    assert!(facts.shim_elf.is_none() && facts.shim_trial.is_none() && fake.loaded.borrow().is_empty(), "nothing is tried without a front");
    let text = render_text(&assess(&facts));
    assert!(text.starts_with("FAIL  The front, libfgpu.so, cannot be found"), "{text}");
    assert!(text.ends_with("A cap would NOT apply to GPU programs started here (see FAIL above).\n"), "{text}");
}
