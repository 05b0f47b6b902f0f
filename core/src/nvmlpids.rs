//! Which PIDs NVML gives a caller outside the host's PID namespace, found out from what it
//! lists rather than assumed.
//!
//! Drivers differ ([`NvmlPids`]). In NVIDIA's open GPU kernel modules
//! (`src/nvidia/src/kernel/gpu/gpu.c`), `gpuGetProcWithObject`, behind every process list,
//! passes each client's PID through `_gpuConvertPid` → `osFindNsPid` (`pid_vnr`: the PID in
//! the caller's namespace, 0 when the caller cannot see it) and leaves out the processes
//! the caller cannot see; the per-process memory query matches through the same conversion
//! (`_gpuMatchClientPid`). Older drivers give host PIDs whatever the caller's namespace.
//! Some releases converted the list but matched the memory query against the raw host PID
//! (open-gpu-kernel-modules pull request 614), so a container saw its PIDs with no memory;
//! and some show a container none of its processes at all. In the host's own namespace all
//! of them answer alike.
//!
//! The evidence, in a nested namespace: an entry for this process's own `getpid()` whose
//! memory is what the ledger counts for it, and the same for the ledger's other processes
//! this namespace can see; or, under host PIDs, the entry under the host PID the host's
//! service told, else one that no other process claims and that moved with this process's
//! count between two looks (an entry merely alone is not taken: a list that does not show
//! this process yet would hand it another's). Wherever two
//! entries could both be this process (a host PID can equal a PID of this namespace), only
//! a look in which exactly one of them moved with this process's count decides
//! ([`Identifier::look`]). Pure logic, unit-tested: the shim and `fgpu doctor` feed it.

/// How NVML names processes to the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum NvmlPids {
    /// Not found out yet.
    Unknown = 0,
    /// The caller is in the host's PID namespace: every driver gives host PIDs here, with
    /// their memory, so nothing needs telling apart.
    HostNamespace = 1,
    /// Host PIDs whatever the caller's namespace (older drivers).
    Host = 2,
    /// PIDs as the caller's namespace sees them, processes it cannot see left out, and
    /// each one's memory (current drivers).
    Caller = 3,
    /// PIDs as the caller sees them, but no memory figure for them.
    CallerNoMemory = 4,
    /// No entry for the caller's processes at all.
    Absent = 5,
}

impl NvmlPids {
    pub fn from_u8(v: u8) -> NvmlPids {
        match v {
            1 => NvmlPids::HostNamespace,
            2 => NvmlPids::Host,
            3 => NvmlPids::Caller,
            4 => NvmlPids::CallerNoMemory,
            5 => NvmlPids::Absent,
            _ => NvmlPids::Unknown,
        }
    }

    /// The name `fgpu doctor --json` and the docs use.
    pub fn label(self) -> &'static str {
        match self {
            NvmlPids::Unknown => "unknown",
            NvmlPids::HostNamespace => "host-namespace",
            NvmlPids::Host => "host",
            NvmlPids::Caller => "caller",
            NvmlPids::CallerNoMemory => "caller-no-memory",
            NvmlPids::Absent => "none",
        }
    }

    /// Whether process lists (compute, graphics, MPS) name processes by the PID the
    /// caller's namespace sees, so a list entry's PID is a PID of this namespace.
    pub fn lists_in_caller_namespace(self) -> bool {
        matches!(self, NvmlPids::Caller | NvmlPids::CallerNoMemory)
    }
}

/// `NVML_VALUE_NOT_AVAILABLE` (nvml.h): `usedGpuMemory` when the driver has no figure.
pub const VALUE_NOT_AVAILABLE: u64 = u64::MAX;

/// NVML's figure for a process can trail or lead the ledger's by this much (page
/// rounding; memory the driver takes unannounced only adds).
pub const SLACK: u64 = 2 << 20;

/// A moving figure must move by at least this much for a look to tell who moved.
const MOVE_AT_LEAST: u64 = 4 * SLACK;

/// One entry of NVML's compute-process list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub pid: u32,
    /// `usedGpuMemory`; `None` when the driver gives no figure (0 or
    /// `NVML_VALUE_NOT_AVAILABLE`: every listed process holds at least its context).
    pub used: Option<u64>,
}

impl Entry {
    pub fn new(pid: u32, used_gpu_memory: u64) -> Entry {
        let used = (used_gpu_memory != 0 && used_gpu_memory != VALUE_NOT_AVAILABLE).then_some(used_gpu_memory);
        Entry { pid, used }
    }
}

/// A process of the ledger, as this process sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Member {
    /// Its PID in this process's namespace, if this namespace can see it.
    pub here: Option<u32>,
    /// Its host PID, where known (the kernel, the host's service or a match told it).
    pub host: Option<u32>,
    /// What the ledger counts for it on the device.
    pub counted: u64,
}

/// This process, when it is a member holding a context on the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Own {
    /// `getpid()`.
    pub here: u32,
    /// Its host PID if known.
    pub host: Option<u32>,
    /// A lower bound on what the driver holds for it on the device (what the ledger counts,
    /// less reservations still in flight).
    pub counted: u64,
}

/// One look at NVML's list for a device, in a namespace other than the host's.
#[derive(Debug, Clone, Copy)]
pub struct Look<'a> {
    /// When it was taken (any monotonic clock, ns).
    pub at_ns: u64,
    /// This process, if it holds a context on the device (so the driver lists it).
    pub own: Option<Own>,
    /// The ledger's other live processes.
    pub others: &'a [Member],
    pub entries: &'a [Entry],
}

/// What a look told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    /// The behaviour, once told ([`NvmlPids::Unknown`] while it is not).
    pub behaviour: NvmlPids,
    /// Under host PIDs: this process's host PID, once only one entry can be it.
    pub host_pid: Option<u32>,
    /// Several entries could be this process (say so; a later look may tell).
    pub ambiguous: bool,
}

impl Verdict {
    fn unknown(ambiguous: bool) -> Verdict {
        Verdict { behaviour: NvmlPids::Unknown, host_pid: None, ambiguous }
    }
    fn is(behaviour: NvmlPids) -> Verdict {
        Verdict { behaviour, host_pid: None, ambiguous: false }
    }
}

/// What the previous look saw, to tell who moved with this process's count.
#[derive(Debug, Clone, Default)]
struct Previous {
    counted: u64,
    entries: Vec<Entry>,
}

/// Finds out the behaviour from successive looks. One per process and device kind; keeps
/// the previous look only.
#[derive(Debug, Default)]
pub struct Identifier {
    previous: Option<Previous>,
    /// Since when (look time) this process, holding a context, had no entry at all in any
    /// look.
    absent_since: Option<u64>,
}

/// How long this process must have had no entry at all, in every look, before
/// [`NvmlPids::Absent`] is concluded (a driver lists a process as soon as it has a context;
/// this is slack for a list taken at that very moment).
const ABSENT_AFTER_NS: u64 = 1_000_000_000;

fn figure_at(entries: &[Entry], pid: u32) -> Option<Option<u64>> {
    entries.iter().find(|e| e.pid == pid).map(|e| e.used)
}

/// Whether `used` can be the memory of a process the ledger counts `counted` for.
fn can_hold(used: Option<u64>, counted: u64) -> bool {
    used.is_some_and(|u| u.saturating_add(SLACK) >= counted)
}

impl Identifier {
    /// Takes one look; see the module's documentation for the rules.
    pub fn look(&mut self, look: &Look) -> Verdict {
        let verdict = match look.own {
            Some(own) => self.with_own(own, look),
            None => from_others(look),
        };
        if let Some(own) = look.own {
            self.previous = Some(Previous { counted: own.counted, entries: look.entries.to_vec() });
        }
        verdict
    }

    fn with_own(&mut self, own: Own, look: &Look) -> Verdict {
        let entries = look.entries;
        // Host PIDs the ledger's other processes are known by: their entries are theirs.
        let claimed: Vec<u32> = look.others.iter().filter_map(|m| m.host).chain(look.others.iter().filter_map(|m| m.here)).collect();
        let at_here = figure_at(entries, own.here);
        // Under host PIDs: the entries that could be this process.
        let candidates: Vec<Entry> = match own.host {
            Some(host) => entries.iter().copied().filter(|e| e.pid == host && e.pid != own.here && can_hold(e.used, own.counted)).collect(),
            None => entries.iter().copied().filter(|e| e.pid != own.here && !claimed.contains(&e.pid) && can_hold(e.used, own.counted)).collect(),
        };
        let others = from_others(look);
        if at_here.is_none() {
            if others.behaviour == NvmlPids::Caller {
                // The ledger's other processes show under their PIDs here, and this one not
                // yet: wait for a look that lists it.
                return Verdict::unknown(false);
            }
            if candidates.is_empty() {
                // Holding a context, yet nothing in the list can be this process.
                let since = *self.absent_since.get_or_insert(look.at_ns);
                let long = look.at_ns.saturating_sub(since) >= ABSENT_AFTER_NS;
                return if long && others.behaviour != NvmlPids::Caller { Verdict::is(NvmlPids::Absent) } else { Verdict::unknown(false) };
            }
            self.absent_since = None;
            // Not listed under its own PID, as caller-namespace PIDs would list it: host PIDs.
            let host_pid = self.which_host_entry(own, &candidates);
            return Verdict { behaviour: NvmlPids::Host, host_pid, ambiguous: host_pid.is_none() && candidates.len() > 1 };
        }
        self.absent_since = None;
        let here_used = at_here.flatten();
        let here_fits = if here_used.is_some() { can_hold(here_used, own.counted) } else { true };
        let kind = if here_used.is_some() { NvmlPids::Caller } else { NvmlPids::CallerNoMemory };
        if candidates.is_empty() && others.behaviour != NvmlPids::Host {
            // Only the entry under its own PID can be this process.
            return if here_fits { Verdict::is(kind) } else { Verdict::unknown(false) };
        }
        // Two entries could both be it: the one that moved with this process's count tells.
        let Some(previous) = &self.previous else { return Verdict::unknown(true) };
        let change = own.counted as i128 - previous.counted as i128;
        if change.unsigned_abs() < MOVE_AT_LEAST as u128 {
            return Verdict::unknown(true);
        }
        let followed = |pid: u32, now: Option<u64>| {
            let before = figure_at(&previous.entries, pid).flatten();
            match (now, before) {
                (Some(n), Some(b)) => (n as i128 - b as i128 - change).unsigned_abs() <= SLACK as u128,
                _ => false,
            }
        };
        let here_moved = here_used.is_some() && followed(own.here, here_used);
        let mut movers = candidates.iter().filter(|e| followed(e.pid, e.used));
        match (here_moved, movers.next(), movers.next()) {
            (true, None, _) => Verdict::is(NvmlPids::Caller),
            (false, Some(e), None) => Verdict { behaviour: NvmlPids::Host, host_pid: Some(e.pid), ambiguous: false },
            // Its own PID's entry has no figure and no other entry followed it.
            (false, None, _) if here_used.is_none() => Verdict::is(NvmlPids::CallerNoMemory),
            _ => Verdict::unknown(true),
        }
    }

    /// Under host PIDs: the entry that is this process, once one look tells: the host PID
    /// it was told, or the one candidate that moved with this process's count since the
    /// previous look. A candidate that is merely alone is not enough: a list taken before the
    /// driver shows this process (or one that never does) would hand it someone else's.
    fn which_host_entry(&self, own: Own, candidates: &[Entry]) -> Option<u32> {
        if let Some(host) = own.host {
            return candidates.iter().any(|e| e.pid == host).then_some(host);
        }
        let previous = self.previous.as_ref()?;
        let change = own.counted as i128 - previous.counted as i128;
        if change.unsigned_abs() < MOVE_AT_LEAST as u128 {
            return None;
        }
        let mut movers = candidates.iter().filter(|e| {
            let before = figure_at(&previous.entries, e.pid).flatten();
            matches!((e.used, before), (Some(n), Some(b)) if (n as i128 - b as i128 - change).unsigned_abs() <= SLACK as u128)
        });
        match (movers.next(), movers.next()) {
            (Some(e), None) => Some(e.pid),
            _ => None,
        }
    }
}

/// What the ledger's other processes tell, for a process that holds no context itself (a
/// tool such as nvidia-smi, or `fgpu doctor`): each one the namespace can see and that
/// holds memory shows under the PID this namespace knows it by, or under its host PID.
fn from_others(look: &Look) -> Verdict {
    let (mut caller, mut no_memory, mut host, mut seen) = (0, 0, 0, 0);
    for m in look.others.iter().filter(|m| m.counted > SLACK) {
        let here = m.here.filter(|h| Some(*h) != m.host);
        if m.here.is_some() {
            seen += 1;
        }
        if let Some(h) = here {
            match figure_at(look.entries, h) {
                Some(Some(used)) if used.saturating_add(SLACK) >= m.counted => caller += 1,
                Some(None) => no_memory += 1,
                _ => {}
            }
        }
        if let Some(x) = m.host.filter(|x| Some(*x) != m.here) {
            if can_hold(figure_at(look.entries, x).flatten(), m.counted) {
                host += 1;
            }
        }
    }
    match (caller, no_memory, host) {
        (c, 0, 0) if c > 0 => Verdict::is(NvmlPids::Caller),
        (0, n, 0) if n > 0 => Verdict::is(NvmlPids::CallerNoMemory),
        (0, 0, h) if h > 0 => Verdict::is(NvmlPids::Host),
        // Processes this namespace sees hold memory, and the list is empty.
        (0, 0, 0) if seen > 0 && look.entries.is_empty() => Verdict::is(NvmlPids::Absent),
        _ => Verdict::unknown(caller + no_memory + host > 1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    const MIB: u64 = 1 << 20;

    fn e(pid: u32, mib: u64) -> Entry {
        Entry::new(pid, mib * MIB)
    }

    fn own(here: u32, counted_mib: u64) -> Option<Own> {
        Some(Own { here, host: None, counted: counted_mib * MIB })
    }

    #[test]
    fn its_own_pid_with_its_memory_is_the_caller_namespace() {
        let mut id = Identifier::default();
        let v = id.look(&Look { at_ns: 0, own: own(7, 300), others: &[], entries: &[e(7, 300)] });
        assert_eq!(v, Verdict::is(NvmlPids::Caller));
        // Just after its first context (nothing counted yet but the reservation in flight).
        let v = Identifier::default().look(&Look { at_ns: 0, own: own(7, 0), others: &[], entries: &[e(7, 300)] });
        assert_eq!(v.behaviour, NvmlPids::Caller);
    }

    #[test]
    fn its_own_pid_without_a_figure_is_caller_without_memory() {
        for used in [0, VALUE_NOT_AVAILABLE] {
            let v = Identifier::default().look(&Look { at_ns: 0, own: own(7, 300), others: &[], entries: &[Entry::new(7, used)] });
            assert_eq!(v.behaviour, NvmlPids::CallerNoMemory, "{used}");
        }
    }

    #[test]
    fn not_under_its_own_pid_is_host_pids_and_the_one_that_follows_it_is_it() {
        let mut id = Identifier::default();
        let v = id.look(&Look { at_ns: 0, own: own(7, 300), others: &[], entries: &[e(40123, 300)] });
        assert_eq!(v, Verdict { behaviour: NvmlPids::Host, host_pid: None, ambiguous: false }, "alone is not enough");
        let v = id.look(&Look { at_ns: 0, own: own(7, 556), others: &[], entries: &[e(40123, 556)] });
        assert_eq!(v, Verdict { behaviour: NvmlPids::Host, host_pid: Some(40123), ambiguous: false }, "it moved with this process");
        // Another tenant's process holding more could be it too: host PIDs, PID unknown.
        let v = Identifier::default().look(&Look { at_ns: 0, own: own(7, 300), others: &[], entries: &[e(40123, 300), e(50000, 900)] });
        assert_eq!((v.behaviour, v.host_pid, v.ambiguous), (NvmlPids::Host, None, true));
        // The host PID the service told.
        let mut id = Identifier::default();
        let mine = Some(Own { here: 7, host: Some(50000), counted: 300 * MIB });
        let v = id.look(&Look { at_ns: 0, own: mine, others: &[], entries: &[e(40123, 300), e(50000, 900)] });
        assert_eq!((v.behaviour, v.host_pid), (NvmlPids::Host, Some(50000)));
    }

    #[test]
    fn a_host_pid_equal_to_its_own_pid_needs_the_movement_check() {
        // Host PIDs: 7 is another tenant's process on the host; this process is 40123.
        let mut id = Identifier::default();
        let first = [e(7, 2000), e(40123, 1500)];
        assert_eq!(id.look(&Look { at_ns: 0, own: own(7, 1000), others: &[], entries: &first }), Verdict::unknown(true));
        // It allocated 300 MiB: only 40123 followed.
        let second = [e(7, 2000), e(40123, 1800)];
        let v = id.look(&Look { at_ns: 0, own: own(7, 1300), others: &[], entries: &second });
        assert_eq!((v.behaviour, v.host_pid), (NvmlPids::Host, Some(40123)));
        // Caller PIDs with an unknown process of this namespace that could be it: its own
        // entry followed.
        let mut id = Identifier::default();
        assert!(id.look(&Look { at_ns: 0, own: own(7, 1000), others: &[], entries: &[e(7, 1000), e(9, 5000)] }).ambiguous);
        let v = id.look(&Look { at_ns: 0, own: own(7, 1300), others: &[], entries: &[e(7, 1300), e(9, 5000)] });
        assert_eq!(v, Verdict::is(NvmlPids::Caller));
        // Nothing moved, or both did: still unknown.
        let mut id = Identifier::default();
        id.look(&Look { at_ns: 0, own: own(7, 1000), others: &[], entries: &[e(7, 1000), e(9, 5000)] });
        assert_eq!(id.look(&Look { at_ns: 0, own: own(7, 1000), others: &[], entries: &[e(7, 1000), e(9, 5000)] }), Verdict::unknown(true));
        assert_eq!(id.look(&Look { at_ns: 0, own: own(7, 1300), others: &[], entries: &[e(7, 1300), e(9, 5300)] }), Verdict::unknown(true));
    }

    #[test]
    fn no_entry_that_can_be_it_for_a_second_is_absent() {
        let mut id = Identifier::default();
        let look = |at_ns| Look { at_ns, own: own(7, 300), others: &[], entries: &[] };
        assert_eq!(id.look(&look(0)).behaviour, NvmlPids::Unknown);
        assert_eq!(id.look(&look(500_000_000)).behaviour, NvmlPids::Unknown, "not yet");
        assert_eq!(id.look(&look(1_000_000_000)).behaviour, NvmlPids::Absent);
        // An entry in between starts it over.
        let mut id = Identifier::default();
        id.look(&look(0));
        id.look(&Look { at_ns: 600_000_000, own: own(7, 300), others: &[], entries: &[e(7, 300)] });
        assert_eq!(id.look(&look(1_200_000_000)).behaviour, NvmlPids::Unknown);
        // Entries that cannot be it (they hold less) do not count as entries.
        let mut id = Identifier::default();
        let small = [e(40123, 10)];
        let look = |at_ns| Look { at_ns, own: own(7, 3000), others: &[], entries: &small };
        id.look(&look(0));
        assert_eq!(id.look(&look(2_000_000_000)).behaviour, NvmlPids::Absent);
    }

    #[test]
    fn another_process_that_does_not_follow_it_is_never_taken_for_it() {
        // Under host PIDs, with another tenant listed and this process not (yet): the other
        // tenant must not be taken for it, however long it stays alone.
        let mut id = Identifier::default();
        for (counted, at_ns) in [(0, 0), (300, 1), (300, 2), (1324, 3)] {
            let v = id.look(&Look { at_ns, own: own(7, counted), others: &[], entries: &[e(40000, 2300)] });
            assert_eq!((v.behaviour, v.host_pid), (NvmlPids::Host, None), "{counted}");
        }
    }

    #[test]
    fn other_processes_of_the_ledger_tell_a_process_without_a_context() {
        let others = [Member { here: Some(12), host: Some(40012), counted: 1324 * MIB }];
        let caller = Look { at_ns: 0, own: None, others: &others, entries: &[e(12, 1324)] };
        assert_eq!(Identifier::default().look(&caller).behaviour, NvmlPids::Caller);
        let nomem = Look { at_ns: 0, own: None, others: &others, entries: &[Entry::new(12, 0)] };
        assert_eq!(Identifier::default().look(&nomem).behaviour, NvmlPids::CallerNoMemory);
        let host = Look { at_ns: 0, own: None, others: &others, entries: &[e(40012, 1324), e(555, 80)] };
        assert_eq!(Identifier::default().look(&host).behaviour, NvmlPids::Host);
        let absent = Look { at_ns: 0, own: None, others: &others, entries: &[] };
        assert_eq!(Identifier::default().look(&absent).behaviour, NvmlPids::Absent);
        // Its host PID unknown and the list under host PIDs: nothing to tell by.
        let unknown = [Member { here: Some(12), host: None, counted: 1324 * MIB }];
        let look = Look { at_ns: 0, own: None, others: &unknown, entries: &[e(40012, 1324)] };
        assert_eq!(Identifier::default().look(&look).behaviour, NvmlPids::Unknown);
        // Nobody holds anything yet.
        let idle = [Member { here: Some(12), host: None, counted: 0 }];
        assert_eq!(Identifier::default().look(&Look { at_ns: 0, own: None, others: &idle, entries: &[] }).behaviour, NvmlPids::Unknown);
    }

    #[test]
    fn other_members_entries_are_not_candidates() {
        // Caller PIDs: member 12 of this namespace also holds more than this process.
        let others = [Member { here: Some(12), host: None, counted: 2000 * MIB }];
        let v = Identifier::default().look(&Look { at_ns: 0, own: own(7, 300), others: &others, entries: &[e(7, 300), e(12, 2000)] });
        assert_eq!(v.behaviour, NvmlPids::Caller);
        // Host PIDs: member 40012 (known) holds more; 40123 is the only one left, and it
        // follows this process.
        let others = [Member { here: Some(12), host: Some(40012), counted: 2000 * MIB }];
        let mut id = Identifier::default();
        let v = id.look(&Look { at_ns: 0, own: own(7, 300), others: &others, entries: &[e(40012, 2000), e(40123, 300)] });
        assert_eq!((v.behaviour, v.host_pid, v.ambiguous), (NvmlPids::Host, None, false));
        let v = id.look(&Look { at_ns: 0, own: own(7, 400), others: &others, entries: &[e(40012, 2000), e(40123, 400)] });
        assert_eq!((v.behaviour, v.host_pid), (NvmlPids::Host, Some(40123)));
    }

    #[test]
    fn labels_round_trip() {
        for b in [NvmlPids::Unknown, NvmlPids::HostNamespace, NvmlPids::Host, NvmlPids::Caller, NvmlPids::CallerNoMemory, NvmlPids::Absent] {
            assert_eq!(NvmlPids::from_u8(b as u8), b);
            assert!(!b.label().is_empty());
        }
    }
}
