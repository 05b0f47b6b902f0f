//! Which lines of `/proc/PID/maps` are attachments of System V shared memory, or mappings of
//! a served ledger's memory file ([`memfd_ledger`]), decided from the line alone.
//!
//! The kernel writes a process's maps, but not the names in them: a file's path is what
//! whoever made it chose, and a tenant can map a file of its own of any size under a path
//! that starts with `/SYSV` (on a FUSE mount it serves itself, which answers when it
//! pleases). Anything done to such a file, even a `stat` of `/proc/PID/map_files/...`,
//! reaches that file system and can wait forever. So an attachment is recognised by fields
//! no tenant can choose, and nothing of the file is touched:
//!
//! - the **device**: every System V segment is a file of one internal shmem mount of the
//!   kernel, the same for all processes and all IPC namespaces, which no user can mount
//!   again; its device number is learnt from an attachment this process makes itself
//!   ([`shm_device`]). A FUSE file, a tmpfs file, a file anywhere a user can reach has
//!   another device number;
//! - the **name**: `/SYSV` and eight hex digits (the segment's key), then ` (deleted)`.
//!   Other files of that mount are named otherwise (`/memfd:NAME`, `/dev/zero`), and a name
//!   the kernel writes escapes any line break, so a name cannot fake a line.
//!
//! On that mount the kernel numbers a segment's inode with the segment's id, so the id is
//! the line's inode field, which no tenant can choose there either. (The name holds the
//! segment's key, not its id: every fgpu ledger is made with `IPC_PRIVATE`, key 0.)

use std::sync::OnceLock;

/// One attachment of a System V segment, as one line of `/proc/PID/maps` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attachment {
    pub start: u64,
    pub end: u64,
    /// Mapped shared (`s` in the permissions), as every `shmat` is.
    pub shared: bool,
    /// The segment's id in the IPC namespace of the process that maps it.
    pub shmid: i32,
}

/// The `MAJOR:MINOR` device field (as `/proc/PID/maps` writes it) of the kernel's System V
/// segments: learnt once per process from a segment it attaches itself, else (when no
/// segment can be made: `kernel.shmmni` reached) from a shared anonymous mapping, which the
/// kernel backs with a file of the same mount. `None` if neither can be made or found.
pub fn shm_device() -> Option<&'static str> {
    static DEVICE: OnceLock<Option<String>> = OnceLock::new();
    DEVICE.get_or_init(|| learn_shm_device(&own_maps)).as_deref()
}

fn learn_shm_device(maps: &dyn Fn() -> Option<String>) -> Option<String> {
    let page = 4096;
    if let Ok(shmid) = crate::sys::shm_create(page, 0o600) {
        let attached = crate::sys::shm_attach(shmid, true);
        crate::sys::shm_remove(shmid);
        if let Ok(base) = attached {
            let device = maps().and_then(|maps| device_at(&maps, base.as_ptr() as u64));
            // SAFETY: attached just above, detached once, and nothing of it was borrowed.
            unsafe { crate::sys::shm_detach(base) };
            if device.is_some() {
                return device;
            }
        }
    }
    let mapping = crate::sys::SharedAnonymous::new(page).ok()?;
    device_at(&maps()?, mapping.address())
}

fn own_maps() -> Option<String> {
    std::fs::read_to_string("/proc/self/maps").ok()
}

/// The device field of the line of `maps` that starts at `address`.
fn device_at(maps: &str, address: u64) -> Option<String> {
    maps.lines().find_map(|line| {
        let mut fields = line.split_ascii_whitespace();
        let start = u64::from_str_radix(fields.next()?.split_once('-')?.0, 16).ok()?;
        (start == address).then(|| fields.nth(2).map(str::to_string)).flatten()
    })
}

/// The attachment a line of `/proc/PID/maps` shows, if it is one of a System V segment:
/// its device is `shm_device` and its name `/SYSV` and eight hex digits. Reads the line
/// only.
pub fn attachment(line: &str, shm_device: &str) -> Option<Attachment> {
    let line = MapsLine::on_device(line, shm_device)?;
    let key = line.name.strip_prefix("/SYSV")?;
    if key.len() != 8 || !key.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    Some(Attachment { start: line.start, end: line.end, shared: line.shared, shmid: line.inode.parse::<u32>().ok().and_then(|id| i32::try_from(id).ok())? })
}

/// The fields of one line of `/proc/PID/maps` that the recognisers read.
struct MapsLine<'a> {
    start: u64,
    end: u64,
    shared: bool,
    inode: &'a str,
    /// The path, without the kernel's ` (deleted)`.
    name: &'a str,
}

impl<'a> MapsLine<'a> {
    /// The line's fields, if its device field is `device`.
    fn on_device(line: &'a str, device: &str) -> Option<MapsLine<'a>> {
        let mut fields = line.splitn(6, ' ');
        let (range, perms, _offset, on, inode) = (fields.next()?, fields.next()?, fields.next()?, fields.next()?, fields.next()?);
        if on != device {
            return None;
        }
        let name = fields.next().unwrap_or("").trim_start_matches(' ');
        let (start, end) = range.split_once('-')?;
        Some(MapsLine {
            start: u64::from_str_radix(start, 16).ok()?,
            end: u64::from_str_radix(end, 16).ok()?,
            shared: perms.as_bytes().get(3) == Some(&b's'),
            inode,
            name: name.strip_suffix(" (deleted)").unwrap_or(name),
        })
    }
}

/// One mapping of a served ledger's memory file (`served.rs`), as one line of
/// `/proc/PID/maps` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemfdMapping {
    pub start: u64,
    pub end: u64,
    pub shared: bool,
    /// The memory file's inode (on the internal shmem mount, where no tenant chooses it).
    pub ino: u64,
}

/// The mapping a line of `/proc/PID/maps` shows, if it is of a memory file named as fgpu
/// names a ledger's (`/memfd:fgpu-ledger`, then `:` and a label or nothing, then
/// ` (deleted)`) on the device of the kernel's internal shmem mount, where memory files
/// live beside System V segments. Reads the line only. The name is the maker's choice: any
/// process can make a memory file so named; what it holds is checked once taken
/// (`memfd.rs`).
pub fn memfd_ledger(line: &str, shm_device: &str) -> Option<MemfdMapping> {
    let line = MapsLine::on_device(line, shm_device)?;
    let rest = line.name.strip_prefix(super::memfd::MAPS_PREFIX)?;
    if !(rest.is_empty() || rest.starts_with(':')) {
        return None;
    }
    Some(MemfdMapping { start: line.start, end: line.end, shared: line.shared, ino: line.inode.parse().ok()? })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_segment_is_told_by_its_device_and_name_and_its_id_is_the_inode() {
        let dev = shm_device().expect("this process can attach a segment or map shared memory");
        let line = |dev: &str, inode: &str, name: &str| format!("7f0a1c000000-7f0a1c051000 rw-s 00000000 {dev} {inode}                    {name}");
        let seen = attachment(&line(dev, "42", "/SYSV00000000 (deleted)"), dev).unwrap();
        assert_eq!(seen, Attachment { start: 0x7f0a1c000000, end: 0x7f0a1c051000, shared: true, shmid: 42 });
        assert_eq!(attachment(&line(dev, "7", "/SYSV1234abcd"), dev).unwrap().shmid, 7, "a key of its own, not deleted yet");
        // What a tenant can choose: the path, the inode of a file on its own file system.
        let fuse = if dev == "00:99" { "00:98" } else { "00:99" };
        assert_eq!(attachment(&line(fuse, "42", "/SYSV00000000 (deleted)"), dev), None, "another device");
        for name in ["/SYSVfs/ledger", "/SYSV0000000", "/SYSV000000000", "/SYSV0000000g", "/memfd:SYSV00000000 (deleted)", "/dev/zero (deleted)", "", "/SYSV"] {
            assert_eq!(attachment(&line(dev, "42", name), dev), None, "{name:?}");
        }
        assert_eq!(attachment(&line(dev, "-1", "/SYSV00000000"), dev), None, "not an id");
        assert_eq!(attachment(&line(dev, "2147483648", "/SYSV00000000"), dev), None, "not an id");
        assert_eq!(attachment("garbage", dev), None);
    }

    #[test]
    fn a_ledgers_memory_file_is_told_by_its_device_and_name() {
        let dev = shm_device().unwrap();
        let line = |dev: &str, name: &str| format!("7f0a1c000000-7f0a1c051000 rw-s 00000000 {dev} 5789                       {name}");
        let seen = memfd_ledger(&line(dev, "/memfd:fgpu-ledger:claim-0b1f (deleted)"), dev).unwrap();
        assert_eq!(seen, MemfdMapping { start: 0x7f0a1c000000, end: 0x7f0a1c051000, shared: true, ino: 5789 });
        assert!(memfd_ledger(&line(dev, "/memfd:fgpu-ledger (deleted)"), dev).is_some());
        let fuse = if dev == "00:99" { "00:98" } else { "00:99" };
        assert_eq!(memfd_ledger(&line(fuse, "/memfd:fgpu-ledger:x (deleted)"), dev), None, "another device: a file of a mount a tenant made");
        for name in ["/memfd:fgpu-ledgers (deleted)", "/memfd:other (deleted)", "/SYSV00000000 (deleted)", "/dev/zero (deleted)", "/tmp/memfd:fgpu-ledger", ""]
        {
            assert_eq!(memfd_ledger(&line(dev, name), dev), None, "{name:?}");
        }
        // A memory file is not a segment, and a segment not a memory file.
        assert_eq!(attachment(&line(dev, "/memfd:fgpu-ledger:x (deleted)"), dev), None);
        // The real thing: a ledger memory file this process maps, as its own maps show it.
        let file = super::super::memfd::create("maps-test").unwrap();
        let base = super::super::memfd::map(&file, false).unwrap();
        let maps = own_maps().unwrap();
        let found: Vec<MemfdMapping> = maps.lines().filter_map(|l| memfd_ledger(l, dev)).filter(|m| m.start == base.as_ptr() as u64).collect();
        assert_eq!(found.len(), 1, "{maps}");
        assert_eq!(found[0].ino, std::os::unix::fs::MetadataExt::ino(&file.metadata().unwrap()));
        // SAFETY: mapped above, unmapped once.
        unsafe { super::super::memfd::unmap(base) };
    }

    #[test]
    fn the_device_of_segments_is_that_of_shared_anonymous_memory() {
        // The fallback for a namespace at kernel.shmmni rests on this.
        let from_segment = shm_device().unwrap();
        let from_anonymous = learn_shm_device(&|| {
            // A look at this process's maps that hides every System V attachment, as if
            // none could be made.
            let maps = own_maps()?;
            Some(maps.lines().filter(|l| !l.contains("/SYSV")).collect::<Vec<_>>().join("\n"))
        });
        assert_eq!(from_anonymous.as_deref(), Some(from_segment));
    }
}
