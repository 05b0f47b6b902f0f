//! Which XID errors make a GPU unhealthy.
//!
//! An XID is the driver's report of an error on a GPU, delivered to NVML's event sets as
//! `nvmlEventTypeXidCriticalError` with the XID as the event's data. Every XID counts, except
//! those NVIDIA's own Kubernetes components treat as an application's error rather than the
//! GPU's: the hard-coded list of NVIDIA's DRA driver (`xidsToSkip`,
//! cmd/gpu-kubelet-plugin/device_health.go in NVIDIA/k8s-dra-driver-gpu), the same as its
//! device plugin's (`getDisabledHealthCheckXids`, internal/rm/health.go in
//! NVIDIA/k8s-device-plugin), which cites NVIDIA's XID catalogue
//! (docs.nvidia.com/deploy/xid-errors). `--additional-xids-to-ignore` adds to it, as NVIDIA's
//! flag of the same name does.

use std::collections::BTreeSet;

/// The XIDs an application causes, on a GPU that stays healthy: 13 (graphics engine
/// exception), 31 (GPU memory page fault), 43 (GPU stopped processing), 45 (preemptive
/// cleanup after earlier errors), 68 (video processor exception), 109 (context switch
/// timeout).
pub const APPLICATION_XIDS: [u64; 6] = [13, 31, 43, 45, 68, 109];

/// What an XID means, in a few words, for the ones a GPU commonly reports (NVIDIA's XID
/// catalogue); `None` for the others.
pub fn meaning(xid: u64) -> Option<&'static str> {
    Some(match xid {
        13 => "graphics engine exception",
        31 => "GPU memory page fault",
        43 => "GPU stopped processing",
        45 => "preemptive cleanup after earlier errors",
        48 => "double-bit ECC error",
        63 => "ECC page retirement or row remapping recorded",
        64 => "ECC page retirement or row remapping failed",
        68 => "video processor exception",
        74 => "NVLink error",
        79 => "the GPU has fallen off the bus",
        92 => "high single-bit ECC error rate",
        94 => "contained ECC error",
        95 => "uncontained ECC error",
        109 => "context switch timeout",
        119 => "GSP RPC timeout",
        120 => "GSP error",
        _ => return None,
    })
}

/// The XIDs that make a GPU unhealthy: all but the ignored ones.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XidPolicy {
    ignored: BTreeSet<u64>,
}

impl XidPolicy {
    /// [`APPLICATION_XIDS`] and `additional` are ignored.
    pub fn new(additional: &[u64]) -> XidPolicy {
        XidPolicy { ignored: APPLICATION_XIDS.iter().chain(additional).copied().collect() }
    }

    /// Whether XID `xid` makes the GPU unhealthy.
    pub fn counts(&self, xid: u64) -> bool {
        !self.ignored.contains(&xid)
    }

    /// The ignored XIDs, in order.
    pub fn ignored(&self) -> Vec<u64> {
        self.ignored.iter().copied().collect()
    }
}

/// `XID 79 (the GPU has fallen off the bus)`.
pub fn describe(xid: u64) -> String {
    match meaning(xid) {
        Some(m) => format!("XID {xid} ({m})"),
        None => format!("XID {xid}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn application_errors_do_not_count_and_others_do() {
        let p = XidPolicy::new(&[]);
        for xid in APPLICATION_XIDS {
            assert!(!p.counts(xid), "{xid}");
        }
        for xid in [48, 63, 64, 74, 79, 92, 94, 95, 119, 120, 999] {
            assert!(p.counts(xid), "{xid}");
        }
        let p = XidPolicy::new(&[63, 74]);
        assert!(!p.counts(63) && !p.counts(74) && p.counts(79));
        assert_eq!(p.ignored(), vec![13, 31, 43, 45, 63, 68, 74, 109]);
        assert_eq!(describe(79), "XID 79 (the GPU has fallen off the bus)");
        assert_eq!(describe(7), "XID 7");
    }
}
