//! Why a MIG operation failed: the cases a caller acts on apart (an instance in use, a
//! placement taken, no right to configure MIG) and the rest, each a one-line message.

/// A failed `fgpu mig` operation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MigError {
    /// Neither root nor the MIG config capability.
    #[error("{0}")]
    NoPermission(String),
    /// Processes still use the instance (or the driver answered `NVML_ERROR_IN_USE`).
    #[error("{uuid} is in use{}", if pids.is_empty() { String::new() } else { format!(" by PID(s) {pids:?}") })]
    InUse { uuid: String, pids: Vec<u32> },
    /// The placement asked is another instance's (already, or taken meanwhile).
    #[error("placement {start} of {profile} on GPU {gpu} is taken{by}; `fgpu mig list` shows the free placements")]
    Taken { gpu: u32, profile: String, start: u32, by: String },
    /// The record cannot be read or written.
    #[error("{0}")]
    Record(String),
    /// NVML cannot be loaded or asked.
    #[error("{0}")]
    Driver(String),
    /// What was asked does not exist or does not fit here (a GPU, a profile, a placement).
    #[error("{0}")]
    Refused(String),
}

impl MigError {
    /// `fgpu mig`'s exit status for it: 3 for an instance in use, 4 for a placement taken,
    /// 1 otherwise.
    pub fn exit_code(&self) -> i32 {
        match self {
            MigError::InUse { .. } => EXIT_IN_USE,
            MigError::Taken { .. } => EXIT_TAKEN,
            _ => 1,
        }
    }

    /// The kind, as `--json` names it.
    pub fn kind(&self) -> &'static str {
        match self {
            MigError::NoPermission(_) => "no_permission",
            MigError::InUse { .. } => "in_use",
            MigError::Taken { .. } => "taken",
            MigError::Record(_) => "record",
            MigError::Driver(_) => "driver",
            MigError::Refused(_) => "refused",
        }
    }
}

/// Exit status of `fgpu mig destroy` when an instance is in use (and nothing else failed).
pub const EXIT_IN_USE: i32 = 3;
/// Exit status of `fgpu mig create --placement` when the placement is taken.
pub const EXIT_TAKEN: i32 = 4;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_and_exit_codes() {
        let busy = MigError::InUse { uuid: "MIG-1".into(), pids: vec![42] };
        assert_eq!(busy.to_string(), "MIG-1 is in use by PID(s) [42]");
        assert_eq!((busy.exit_code(), busy.kind()), (3, "in_use"));
        assert_eq!(MigError::InUse { uuid: "MIG-1".into(), pids: vec![] }.to_string(), "MIG-1 is in use");
        let taken = MigError::Taken { gpu: 0, profile: "3g.40gb".into(), start: 4, by: " by instance 2 (3g.40gb at 4:4)".into() };
        assert_eq!(taken.to_string(), "placement 4 of 3g.40gb on GPU 0 is taken by instance 2 (3g.40gb at 4:4); `fgpu mig list` shows the free placements");
        assert_eq!(taken.exit_code(), 4);
        assert_eq!(MigError::Refused("x".into()).exit_code(), 1);
    }
}
