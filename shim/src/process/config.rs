//! The configuration as the shim takes it: `fgpu_core::config` (file and environment), and
//! a check that each device key of the cap names one GPU among all that NVML lists.
//!
//! The check is made against NVML's list, not the devices CUDA shows this process: with a
//! prefix that matched two GPUs, a process that sees only one of them would cap it, and a
//! process that sees both would have to pick. An ambiguous key is a configuration error
//! (fail closed, one line naming the key and the GPUs it matched). It is only looked at
//! when some key is shorter than a whole UUID, so `FGPU_LIMIT=8G` never touches NVML here.

use crate::driver::instance::driver;
use crate::driver::seam::NvmlDriver;
use fgpu_core::config::{Config, ConfigError};

/// [`Config::load`], then [`Config::check_device_keys`] against NVML's list.
pub fn load() -> Result<Config, ConfigError> {
    let config = Config::load()?;
    config.check_device_keys(|| driver().nvml_all_uuids())?;
    Ok(config)
}
