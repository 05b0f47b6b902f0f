//! Why a claim cannot be prepared or unprepared: kubelet is answered with the message (and
//! retries), so each variant keeps the words users and tests read.

use crate::api::ApiError;
use crate::capacity::CapacityError;
use crate::claimfiles::ClaimFilesError;
use crate::mig::MigOpError;
use crate::nvidia::NoNvidiaDevice;
use crate::plan::PlanError;
use fgpu_cdi::files::FileError;

/// NodePrepareResources' or NodeUnprepareResources' error for one claim.
#[derive(Debug, thiserror::Error)]
pub enum ClaimError {
    #[error(transparent)]
    Uid(ClaimFilesError),
    /// `what`: `ResourceClaim <namespace>/<name>`.
    #[error("cannot read {what}: {source}")]
    Read { what: String, source: ApiError },
    #[error("{what} does not exist")]
    Missing { what: String },
    #[error("{what} has UID {found:?}, not {uid:?}: it was deleted and created again")]
    Recreated { what: String, found: String, uid: String },
    #[error("{what}: {why}")]
    Step { what: String, why: StepError },
    #[error("preparing a claim failed: {0}")]
    PrepareTask(tokio::task::JoinError),
    #[error("unpreparing a claim failed: {0}")]
    UnprepareTask(tokio::task::JoinError),
}

/// The step of a prepare or an unprepare that failed.
#[derive(Debug, thiserror::Error)]
pub enum StepError {
    /// The claim failed closed at start (its instance could not be made again).
    #[error("{0}")]
    Lost(String),
    #[error(transparent)]
    Files(#[from] ClaimFilesError),
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error(transparent)]
    Nvidia(#[from] NoNvidiaDevice),
    #[error(transparent)]
    Capacity(#[from] CapacityError),
    #[error(transparent)]
    Checkpoint(#[from] FileError),
    #[error("device {device}: {why}")]
    Instance { device: String, why: InstanceError },
    #[error("{0}: a process still uses the MIG instance; the claim stays prepared until it can be destroyed")]
    InUse(String),
    #[error("cannot destroy {mig_uuid}: {source}")]
    Destroy { mig_uuid: String, source: MigOpError },
}

/// Why a claim's MIG instance could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum InstanceError {
    #[error(transparent)]
    Mig(#[from] MigOpError),
    #[error(transparent)]
    Checkpoint(#[from] FileError),
    #[error("the claim consumes {consumed} bytes of the {profile} instance's {memory}")]
    OverInstance { consumed: u64, profile: String, memory: u64 },
}

impl ClaimError {
    pub(super) fn step(what: &str, why: impl Into<StepError>) -> ClaimError {
        ClaimError::Step { what: what.to_string(), why: why.into() }
    }
}
