//! The front (`libfgpu.so`) and the shim it loads (`libfgpu_shim.so`): found, built for
//! this machine, needing no newer glibc than it has (the larger of the two libraries'
//! needs), and loading here.

use crate::doctor::facts::Facts;
use crate::doctor::finding::{finding, Finding, Level};
use crate::elf;
use crate::shimpath;

/// Whether the front and the shim it loads can be loaded here; says why not.
pub fn check(f: &Facts, out: &mut Vec<Finding>) -> bool {
    let found = match &f.shim {
        Err(e) => {
            out.push(finding(
                "shim",
                Level::Fail,
                format!("The front, libfgpu.so, cannot be found: {e}"),
                Some("Install libfgpu.so and libfgpu_shim.so beside the fgpu binary (or in ../lib/fgpu), or set FGPU_SHIM to the path of libfgpu.so.".into()),
            ));
            return false;
        }
        Ok(found) => found,
    };
    let path = found.path.display();
    let here = f.own_machine.map(elf::machine_name).unwrap_or_else(|| "this machine".into());
    let glibc = f.glibc.clone().unwrap_or_else(|| "unknown".into());
    let front_info = match &f.shim_elf {
        Some(Err(e)) => {
            out.push(finding(
                "shim",
                Level::Fail,
                format!("{path} is not a loadable shared library: {e}."),
                Some("Reinstall fgpu; the file is damaged or is not fgpu's libfgpu.so.".into()),
            ));
            return false;
        }
        Some(Ok(info)) => Some(info),
        None => None,
    };
    if let Some(info) = front_info.filter(|info| !info.class64 || Some(info.machine) != f.own_machine) {
        let built = if info.class64 { elf::machine_name(info.machine) } else { format!("{} (32-bit)", elf::machine_name(info.machine)) };
        out.push(finding(
            "shim",
            Level::Fail,
            format!("{path} is built for {built}, but this machine runs {here}: it cannot be loaded here."),
            Some(format!("Install the {here} build of fgpu.")),
        ));
        return false;
    }
    let companion = shimpath::companion(&found.path);
    let companion_info = f.companion_elf.as_ref().and_then(|r| r.as_ref().ok());
    // The front and the shim it loads are one installation: the larger need counts.
    let need = elf::newest_glibc_among(&[(&found.path, front_info), (&companion, companion_info)]);
    let newer = need.as_ref().filter(|(need, _)| {
        let have = f.glibc.as_deref().and_then(elf::glibc_version);
        have.is_some_and(|have| elf::glibc_version(need).is_some_and(|need| need > have))
    });
    if let Some((need, library)) = newer {
        out.push(finding(
            "shim",
            Level::Fail,
            format!("{} needs glibc {need}, but this system has glibc {glibc}: it cannot be loaded here.", library.display()),
            Some("Install the fgpu build made for older glibc (the release is built against glibc 2.17), or build it on this system.".into()),
        ));
        return false;
    }
    if let Some(Err(why)) = &f.shim_trial {
        out.push(finding("shim", Level::Fail, format!("{path} does not load here: {why}"), Some("Reinstall fgpu, or build it on this system.".into())));
        return false;
    }
    let need = need.map(|(n, _)| format!(", needs glibc {n}; this system has {glibc}")).unwrap_or_default();
    let how = if found.from_env { " (from FGPU_SHIM)" } else { "" };
    out.push(finding("shim", Level::Ok, format!("The front {path}{how} and the shim beside it load here ({here}{need})."), None));
    true
}
