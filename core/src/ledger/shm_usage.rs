//! How much of the kernel's System V shared-memory limits this IPC namespace uses: why a
//! ledger's segment cannot be made (`shmget` fails with `ENOSPC` at `kernel.shmmni`
//! segments or `kernel.shmall` pages), and what `fgpu doctor` reports. Every ledger is one
//! segment, so a user who makes segments up to the limit keeps every other user's new
//! ledgers from being made (fgpu then refuses GPU memory, as it must): these name the limit
//! and who holds the segments.

use std::collections::BTreeMap;

/// The segments of an IPC namespace and its limits, as `/proc/sysvipc/shm` and
/// `/proc/sys/kernel/shm*` (per IPC namespace) give them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShmUsage {
    pub segments: u64,
    /// `kernel.shmmni`: the most segments.
    pub max_segments: u64,
    /// Pages the segments take (each rounded up to whole pages).
    pub pages: u64,
    /// `kernel.shmall`: the most pages.
    pub max_pages: u64,
    /// Segments per owner (uid), the most first.
    pub by_owner: Vec<(u32, u64)>,
}

/// The page size the kernel counts `kernel.shmall` in.
fn page_size() -> u64 {
    crate::sys::page_size().max(1)
}

impl ShmUsage {
    /// This process's IPC namespace, now; `None` if the kernel's files cannot be read.
    pub fn here() -> Option<ShmUsage> {
        let read = |p: &str| std::fs::read_to_string(p).ok();
        let number = |p: &str| read(p)?.trim().parse::<u64>().ok();
        Some(ShmUsage::parse(&read("/proc/sysvipc/shm")?, number("/proc/sys/kernel/shmmni")?, number("/proc/sys/kernel/shmall")?, page_size()))
    }

    /// From the text of `/proc/sysvipc/shm` (a header line, then `key shmid perms size cpid
    /// lpid nattch uid ...` per segment) and the two limits.
    pub fn parse(table: &str, max_segments: u64, max_pages: u64, page: u64) -> ShmUsage {
        let mut usage = ShmUsage { segments: 0, max_segments, pages: 0, max_pages, by_owner: Vec::new() };
        let mut owners: BTreeMap<u32, u64> = BTreeMap::new();
        for line in table.lines().skip(1) {
            let fields: Vec<&str> = line.split_ascii_whitespace().collect();
            let (Some(size), Some(uid)) = (fields.get(3).and_then(|s| s.parse::<u64>().ok()), fields.get(7).and_then(|u| u.parse::<u32>().ok())) else {
                continue;
            };
            usage.segments += 1;
            usage.pages = usage.pages.saturating_add(size.div_ceil(page));
            *owners.entry(uid).or_default() += 1;
        }
        usage.by_owner = owners.into_iter().collect();
        usage.by_owner.sort_by_key(|(uid, n)| (std::cmp::Reverse(*n), *uid));
        usage
    }

    /// The limit a new segment of `bytes` would pass, named, or `None`.
    pub fn limit_reached(&self, bytes: u64, page: u64) -> Option<String> {
        if self.segments >= self.max_segments {
            return Some(format!("this IPC namespace has {} shared-memory segments, the most kernel.shmmni ({}) allows", self.segments, self.max_segments));
        }
        if self.pages.saturating_add(bytes.div_ceil(page)) > self.max_pages {
            return Some(format!(
                "this IPC namespace's shared-memory segments take {} pages, and one more of {bytes} bytes would pass kernel.shmall ({} pages)",
                self.pages, self.max_pages
            ));
        }
        None
    }

    /// "uid 1001 holds 4090 of them, uid 0 holds 6".
    pub fn owners(&self) -> String {
        let named: Vec<String> = self.by_owner.iter().take(3).map(|(uid, n)| format!("uid {uid} holds {n}")).collect();
        let rest = self.by_owner.len().saturating_sub(named.len());
        let more = if rest > 0 { format!(", and {rest} more users some") } else { String::new() };
        format!("{}{more}", named.join(", "))
    }
}

/// Why a segment of `bytes` could not be made, after `shmget` failed with `ENOSPC` or
/// `ENOMEM`: the limit it reached and who holds the segments, or what is known.
pub fn why_no_segment(bytes: u64) -> String {
    match ShmUsage::here() {
        Some(usage) => match usage.limit_reached(bytes, page_size()) {
            Some(limit) => format!("{limit} ({}; `ipcs -m` lists them)", usage.owners()),
            None => format!(
                "the kernel has no memory left for it ({} of kernel.shmmni {} segments and {} of kernel.shmall {} pages are in use)",
                usage.segments, usage.max_segments, usage.pages, usage.max_pages
            ),
        },
        None => "no memory left, or a limit of the kernel's shared memory reached (kernel.shmmni, kernel.shmall)".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &str = "       key      shmid perms                  size  cpid  lpid nattch   uid   gid  cuid  cgid      atime      dtime      ctime                   rss                  swap
         0          0   600                  4096 21094     0      0  1001  1001  1001  1001          0          0 1796425148                     0                     0
         0          1   600                598016 21094     0      1     0     0     0     0          0          0 1796425148                     0                     0
         0          2   600                  4096 21094     0      0  1001  1001  1001  1001          0          0 1796425148                     0                     0
";

    #[test]
    fn the_limit_reached_is_named_with_who_holds_the_segments() {
        let usage = ShmUsage::parse(TABLE, 3, 1 << 40, 4096);
        assert_eq!((usage.segments, usage.pages), (3, 1 + 146 + 1));
        assert_eq!(usage.by_owner, vec![(1001, 2), (0, 1)]);
        let why = usage.limit_reached(598016, 4096).unwrap();
        assert!(why.contains("kernel.shmmni (3)"), "{why}");
        assert_eq!(usage.owners(), "uid 1001 holds 2, uid 0 holds 1");
        let roomy = ShmUsage::parse(TABLE, 4096, 1 << 40, 4096);
        assert_eq!(roomy.limit_reached(598016, 4096), None);
        let few_pages = ShmUsage::parse(TABLE, 4096, 200, 4096);
        assert!(few_pages.limit_reached(598016, 4096).unwrap().contains("kernel.shmall (200 pages)"));
        assert!(ShmUsage::parse("header only\n", 1, 1, 4096).limit_reached(1, 4096).is_none());
    }
}
