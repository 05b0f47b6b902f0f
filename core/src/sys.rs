//! Every system call fgpu-core makes, as safe functions: the one place (with the ledger's
//! mapping in `ledger/` and its byte-range locks in `ledger/lock.rs`) that may use `unsafe`.
//! Each function names the C call it models; the rest of the crate is `#![deny(unsafe_code)]`.
//! The calls fgpu's command line makes are here too (it is `#![deny(unsafe_code)]` as a
//! whole): [`signals`], [`files`] (`access`, `flock`, `mkdtemp`, `mkfifo`) and [`host`]
//! (glibc's version, the local time, a user's home, `dlopen`).

mod fd_passing;
pub mod files;
pub mod host;
mod memfd;
pub mod signals;

pub use fd_passing::{poll_readable, recv_with_fd, send_with_fd, shutdown};
pub use memfd::{add_seals, get_seals, memfd_create, mmap_shared, munmap, pidfd_getfd, pidfd_open};

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;

/// `geteuid(2)`.
pub fn geteuid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// `clock_gettime(2)` of `CLOCK_MONOTONIC`, in nanoseconds.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec into the valid local `ts`.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// `write(2)` of `bytes` to standard error; errors (a closed stderr) are ignored on purpose.
pub fn write_stderr(bytes: &[u8]) {
    // SAFETY: fd 2 is a plain integer; write(2) reads `bytes.len()` bytes from a live buffer.
    unsafe { libc::write(2, bytes.as_ptr().cast(), bytes.len()) };
}

/// `prctl(PR_GET_NAME)`: the calling thread's command name, NUL-padded.
pub fn thread_name() -> [u8; 16] {
    let mut name = [0u8; 16];
    // SAFETY: PR_GET_NAME writes at most 16 bytes, NUL included, into the 16-byte buffer.
    unsafe { libc::prctl(libc::PR_GET_NAME, name.as_mut_ptr()) };
    name
}

/// `getrandom(2)` (the system call: glibc 2.17, which release builds target, has no
/// wrapper), 16 bytes; `None` if the kernel could not give them.
pub fn random_16() -> Option<[u8; 16]> {
    let mut bytes = [0u8; 16];
    // SAFETY: models getrandom(2) writing at most 16 bytes into a 16-byte buffer.
    let n = unsafe { libc::syscall(libc::SYS_getrandom, bytes.as_mut_ptr(), 16usize, 0u32) };
    (n == 16).then_some(bytes)
}

/// `kill(getpid(), SIGKILL)`: dies at once, as `kill -9` would.
pub fn kill_self() {
    // SAFETY: models kill(2) of the calling process with SIGKILL; it does not return.
    unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
    // Still here: this is the init of a PID namespace, which the kernel does not signal from
    // inside its namespace. End it as abruptly (no handler, no flush), with the status a
    // shell gives a process killed by SIGKILL.
    // SAFETY: models _exit(2); it does not return.
    unsafe { libc::_exit(128 + libc::SIGKILL) };
}

/// `setns(2)` of the calling thread into the IPC namespace open at `ns`.
pub fn enter_ipc_namespace(ns: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: models setns(2) with an open namespace file; it affects only this thread.
    if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWIPC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

// ---- System V shared memory ----

/// `shmctl(IPC_STAT)`: the segment's description, if it exists and may be looked at.
pub fn shm_stat(shmid: i32) -> Option<libc::shmid_ds> {
    // SAFETY: all-zero bytes are a valid shmid_ds.
    let mut ds: libc::shmid_ds = unsafe { std::mem::zeroed() };
    // SAFETY: models shmctl(2) IPC_STAT into a valid, exclusively borrowed shmid_ds.
    let rc = unsafe { libc::shmctl(shmid, libc::IPC_STAT, &mut ds) };
    (rc == 0).then_some(ds)
}

/// `shmget(IPC_PRIVATE, size, IPC_CREAT | IPC_EXCL | mode)`: a new segment's id.
pub fn shm_create(size: usize, mode: i32) -> io::Result<i32> {
    // SAFETY: models shmget(2) creating a new private segment; the result is checked.
    let shmid = unsafe { libc::shmget(libc::IPC_PRIVATE, size, libc::IPC_CREAT | libc::IPC_EXCL | mode) };
    if shmid < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(shmid)
}

/// `shmctl(IPC_RMID)`: the kernel frees the segment when its last attachment goes.
pub fn shm_remove(shmid: i32) {
    // SAFETY: models shmctl(2) IPC_RMID, which takes no buffer.
    unsafe { libc::shmctl(shmid, libc::IPC_RMID, std::ptr::null_mut()) };
}

/// `shmat(2)` at an address the kernel chooses, read-write or read-only.
pub fn shm_attach(shmid: i32, read_only: bool) -> io::Result<NonNull<u8>> {
    let flags = if read_only { libc::SHM_RDONLY } else { 0 };
    // SAFETY: models shmat(2) with a kernel-chosen address; the result is checked below.
    let ptr = unsafe { libc::shmat(shmid, std::ptr::null(), flags) };
    if ptr as isize == -1 {
        return Err(io::Error::last_os_error());
    }
    NonNull::new(ptr.cast::<u8>()).ok_or_else(|| io::Error::other("shmat returned a null address"))
}

/// `shmdt(2)`.
///
/// # Safety
/// `base` was returned by [`shm_attach`] and is not detached yet, and no reference into the
/// segment is used afterwards.
pub unsafe fn shm_detach(base: NonNull<u8>) {
    // SAFETY: models shmdt(2) of an address shmat returned (the caller's contract).
    unsafe { libc::shmdt(base.as_ptr().cast()) };
}

/// A shared anonymous mapping (`mmap(MAP_SHARED | MAP_ANONYMOUS)`), unmapped on drop. The
/// kernel backs it with a file of the same internal shmem mount as System V segments.
pub struct SharedAnonymous {
    base: NonNull<u8>,
    len: usize,
}

impl SharedAnonymous {
    pub fn new(len: usize) -> io::Result<SharedAnonymous> {
        // SAFETY: models mmap(2) of new anonymous memory at an address the kernel chooses;
        // nothing existing is replaced, and the result is checked.
        let ptr = unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_SHARED | libc::MAP_ANONYMOUS, -1, 0) };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(SharedAnonymous { base: NonNull::new(ptr.cast()).ok_or_else(|| io::Error::other("mmap returned a null address"))?, len })
    }

    pub fn address(&self) -> u64 {
        self.base.as_ptr() as u64
    }
}

impl Drop for SharedAnonymous {
    fn drop(&mut self) {
        // SAFETY: models munmap(2) of the mapping this value made, which nothing borrows.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

// ---- Unix sockets ----

/// `getsockopt(SO_PEERCRED)`: the peer's PID as this process's PID namespace sees it (0 when
/// it cannot) and its user.
pub fn peer_credentials(fd: BorrowedFd<'_>) -> io::Result<(u32, u32)> {
    // SAFETY: all-zero bytes are a valid ucred.
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: models getsockopt(2) SO_PEERCRED into a ucred of the size passed.
    let rc = unsafe { libc::getsockopt(fd.as_raw_fd(), libc::SOL_SOCKET, libc::SO_PEERCRED, (&mut cred as *mut libc::ucred).cast(), &mut len) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((cred.pid.max(0) as u32, cred.uid))
}

/// `listen(2)` again on a listening socket, to set its backlog (`fgpu service` asks for the
/// longest the kernel allows; tests fill it).
pub fn relisten(fd: BorrowedFd<'_>, backlog: i32) -> io::Result<()> {
    // SAFETY: models listen(2) on a descriptor the caller owns.
    if unsafe { libc::listen(fd.as_raw_fd(), backlog) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC)` + `connect(2)` to `path`.
pub fn unix_connect_nonblocking(path: &std::path::Path) -> io::Result<OwnedFd> {
    use std::os::unix::ffi::OsStrExt;
    let bytes = path.as_os_str().as_bytes();
    // SAFETY: all-zero bytes are a valid sockaddr_un.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    if bytes.len() >= addr.sun_path.len() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "path too long for a socket"));
    }
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (dst, src) in addr.sun_path.iter_mut().zip(bytes) {
        *dst = *src as libc::c_char;
    }
    // SAFETY: models socket(2); the result is checked and owned below.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a new descriptor that nothing else owns.
    let socket = unsafe { OwnedFd::from_raw_fd(fd) };
    let len = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
    // SAFETY: models connect(2) with a valid sockaddr_un of the length passed.
    let rc = unsafe { libc::connect(socket.as_raw_fd(), (&addr as *const libc::sockaddr_un).cast(), len) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(socket)
}

/// `recv(MSG_DONTWAIT | MSG_PEEK)`: what has arrived, without waiting or consuming it.
pub fn peek_nonblocking(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: models recv(2) into a buffer of the length passed; MSG_DONTWAIT never blocks.
    let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT | libc::MSG_PEEK) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

// ---- Opening paths other processes name (see `resolve.rs`) ----

/// `openat2(2)` of `path` under `dir` with `O_PATH | O_NOFOLLOW | O_CLOEXEC` and the given
/// `RESOLVE_*` flags: a descriptor that names the file without opening it for I/O.
/// `ENOSYS` on kernels before 5.6 (and `EPERM` where a seccomp filter refuses the call).
pub fn openat2_path(dir: BorrowedFd<'_>, path: &std::ffi::CStr, resolve: u64) -> io::Result<OwnedFd> {
    /// `struct open_how` of `<linux/openat2.h>` (libc's is non-exhaustive).
    #[repr(C)]
    struct OpenHow {
        flags: u64,
        mode: u64,
        resolve: u64,
    }
    let how = OpenHow { flags: (libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC) as u64, mode: 0, resolve };
    // SAFETY: models openat2(2): `path` is NUL-terminated, `how` is a valid open_how (three
    // u64s, the kernel's first and only version) whose size is passed; the result is checked
    // before it is owned.
    let fd = unsafe { libc::syscall(libc::SYS_openat2, dir.as_raw_fd(), path.as_ptr(), &how as *const OpenHow, std::mem::size_of::<OpenHow>()) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// `openat(2)` of one name under `dir` with `flags | O_CLOEXEC` (`O_PATH | O_NOFOLLOW` for a
/// step of a walk, `O_DIRECTORY` for a `/proc/PID` directory).
pub fn openat(dir: Option<BorrowedFd<'_>>, path: &std::ffi::CStr, flags: i32) -> io::Result<OwnedFd> {
    let dirfd = dir.map(|d| d.as_raw_fd()).unwrap_or(libc::AT_FDCWD);
    // SAFETY: models openat(2) with a NUL-terminated path and no mode (no O_CREAT); the
    // result is checked before it is owned.
    let fd = unsafe { libc::openat(dirfd, path.as_ptr(), flags | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `fstat(2)`: works on `O_PATH` descriptors too.
pub fn fstat(fd: BorrowedFd<'_>) -> io::Result<libc::stat> {
    // SAFETY: all-zero bytes are a valid stat.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: models fstat(2) into a valid, exclusively borrowed stat.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st)
}

/// `sysconf(_SC_CLK_TCK)`: the unit of the times in `/proc/PID/stat` (100 where unknown).
pub fn clock_ticks_per_second() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 {
        ticks as u64
    } else {
        100
    }
}

/// `sysconf(_SC_PAGESIZE)` (4096 where unknown).
pub fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if size > 0 {
        size as u64
    } else {
        4096
    }
}

// ---- glibc's own dlsym and dlvsym ----

/// `dlsym(3)`'s C prototype.
pub type DlsymFn = unsafe extern "C" fn(*mut std::ffi::c_void, *const std::ffi::c_char) -> *mut std::ffi::c_void;
/// `dlvsym(3)`'s C prototype.
pub type DlvsymFn = unsafe extern "C" fn(*mut std::ffi::c_void, *const std::ffi::c_char, *const std::ffi::c_char) -> *mut std::ffi::c_void;

/// The libraries that define glibc's lookup functions: libc.so.6 since glibc 2.34,
/// libdl.so.2 before.
const LOOKUP_LIBRARIES: [&[u8]; 2] = [b"libc.so.6", b"libdl.so.2"];

/// The address of glibc's own `name` (`dlsym`, `dlvsym`), read from the dynamic symbol
/// table of the libc.so.6 (else libdl.so.2) this process has loaded; null when neither
/// defines it.
///
/// No lookup function is called for it: fgpu's front (and the shim, when preloaded
/// directly) define `dlsym` and `dlvsym` themselves, and hand out their own for a lookup of
/// either through any handle or version, so that a capped program cannot reach glibc's and
/// through it the driver. Every call of `dlsym` or `dlvsym` in the process, fgpu's own
/// included, lands in those; the table itself is what is left. Allocates nothing (an
/// allocator may be what looks a symbol up).
pub fn glibc_symbol(name: &std::ffi::CStr) -> *mut std::ffi::c_void {
    for library in LOOKUP_LIBRARIES {
        let mut search = SymbolSearch { library, name: name.to_bytes(), found: std::ptr::null_mut() };
        // SAFETY: models dl_iterate_phdr(3) with a callback that only reads the loader's
        // structures while it runs, and `search`, which outlives the call.
        unsafe { libc::dl_iterate_phdr(Some(search_object), (&mut search as *mut SymbolSearch).cast()) };
        if !search.found.is_null() {
            return search.found;
        }
    }
    std::ptr::null_mut()
}

/// glibc's own `dlsym` (see [`glibc_symbol`]).
pub fn glibc_dlsym() -> Option<DlsymFn> {
    let found = glibc_symbol(c"dlsym");
    // SAFETY: `found` is glibc's dlsym, whose C prototype DlsymFn describes.
    (!found.is_null()).then(|| unsafe { std::mem::transmute::<*mut std::ffi::c_void, DlsymFn>(found) })
}

/// glibc's own `dlvsym` (see [`glibc_symbol`]).
pub fn glibc_dlvsym() -> Option<DlvsymFn> {
    let found = glibc_symbol(c"dlvsym");
    // SAFETY: `found` is glibc's dlvsym, whose C prototype DlvsymFn describes.
    (!found.is_null()).then(|| unsafe { std::mem::transmute::<*mut std::ffi::c_void, DlvsymFn>(found) })
}

struct SymbolSearch<'a> {
    library: &'a [u8],
    name: &'a [u8],
    found: *mut std::ffi::c_void,
}

/// `ElfW(Dyn)` (elf.h) on the 64-bit targets fgpu supports.
#[repr(C)]
struct Dyn {
    tag: i64,
    value: u64,
}

const DT_NULL: i64 = 0;
const DT_HASH: i64 = 4;
const DT_STRTAB: i64 = 5;
const DT_SYMTAB: i64 = 6;
const DT_GNU_HASH: i64 = 0x6fff_fef5;
const DT_VERSYM: i64 = 0x6fff_fff0;
const STT_FUNC: u8 = 2;
/// The bit of a `.gnu.version` entry that marks a version other than the default.
const VERSYM_HIDDEN: u16 = 0x8000;

/// dl_iterate_phdr's callback: in the first loaded object named `search.library`, the
/// function `search.name` (its default version first). Returns 1 (stop) at that object.
unsafe extern "C" fn search_object(info: *mut libc::dl_phdr_info, _size: libc::size_t, data: *mut std::ffi::c_void) -> libc::c_int {
    // SAFETY: dl_iterate_phdr passes a valid info and the `data` given, a SymbolSearch.
    let (info, search) = unsafe { (&*info, &mut *data.cast::<SymbolSearch>()) };
    if info.dlpi_name.is_null() {
        return 0;
    }
    // SAFETY: the loader's NUL-terminated name of the object.
    let path = unsafe { std::ffi::CStr::from_ptr(info.dlpi_name) }.to_bytes();
    if path.rsplit(|b| *b == b'/').next() != Some(search.library) {
        return 0;
    }
    // SAFETY: the object's program headers, as the loader describes them.
    let headers = unsafe { std::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum as usize) };
    let Some(dynamic) = headers.iter().find(|h| h.p_type == libc::PT_DYNAMIC) else { return 1 };
    let base = info.dlpi_addr;
    // The loader relocates the dynamic section's addresses in place on these targets; one
    // it left as it is on disk is below the load address.
    let at = |value: u64| if value < base { value + base } else { value };
    let (mut strtab, mut symtab, mut gnu, mut sysv, mut versym) = (0u64, 0u64, 0u64, 0u64, 0u64);
    let mut entry = (base + dynamic.p_vaddr) as *const Dyn;
    loop {
        // SAFETY: the dynamic section of a loaded object ends with DT_NULL.
        let d = unsafe { &*entry };
        match d.tag {
            DT_NULL => break,
            DT_STRTAB => strtab = at(d.value),
            DT_SYMTAB => symtab = at(d.value),
            DT_GNU_HASH => gnu = at(d.value),
            DT_HASH => sysv = at(d.value),
            DT_VERSYM => versym = at(d.value),
            _ => {}
        }
        // SAFETY: still inside the section: DT_NULL was not reached.
        entry = unsafe { entry.add(1) };
    }
    if strtab == 0 || symtab == 0 {
        return 1;
    }
    let symbols = symtab as *const libc::Elf64_Sym;
    // Whether symbol `index` is the function sought, and (when `default_only`) of its
    // default version.
    let matches = |index: u32, default_only: bool| -> bool {
        // SAFETY: an index the object's own hash table gives, into its symbol table.
        let sym = unsafe { &*symbols.add(index as usize) };
        if sym.st_shndx == 0 || sym.st_info & 0xf != STT_FUNC || sym.st_value == 0 {
            return false;
        }
        // SAFETY: the string table holds NUL-terminated names at each symbol's offset.
        let name = unsafe { std::ffi::CStr::from_ptr((strtab + sym.st_name as u64) as *const std::ffi::c_char) }.to_bytes();
        // SAFETY: .gnu.version has one entry per symbol.
        let hidden = versym != 0 && unsafe { *(versym as *const u16).add(index as usize) } & VERSYM_HIDDEN != 0;
        name == search.name && !(default_only && hidden)
    };
    for default_only in [true, false] {
        // SAFETY: the hash tables of a loaded object, laid out as the ELF and GNU formats say.
        let index = unsafe {
            if gnu != 0 {
                gnu_lookup(gnu as *const u32, search.name, |i| matches(i, default_only))
            } else if sysv != 0 {
                sysv_lookup(sysv as *const u32, search.name, |i| matches(i, default_only))
            } else {
                None
            }
        };
        if let Some(index) = index {
            // SAFETY: as in `matches`.
            search.found = (base + unsafe { &*symbols.add(index as usize) }.st_value) as *mut std::ffi::c_void;
            return 1;
        }
    }
    1
}

/// Looks `name` up in a `DT_GNU_HASH` table: the first index of its chain that `matches`.
///
/// # Safety
/// `table` is a loaded object's GNU hash table.
unsafe fn gnu_lookup(table: *const u32, name: &[u8], matches: impl Fn(u32) -> bool) -> Option<u32> {
    let hash = name.iter().fold(5381u32, |h, b| h.wrapping_mul(33).wrapping_add(*b as u32));
    // SAFETY: the header is four words: buckets, first symbol, bloom words, bloom shift.
    let (buckets, first, bloom_words) = unsafe { (*table, *table.add(1), *table.add(2)) };
    if buckets == 0 {
        return None;
    }
    // SAFETY: the bloom filter (64-bit words) follows the header, then the buckets, then
    // one chain word per symbol from `first` on; a chain ends at a word with bit 0 set.
    unsafe {
        let bucket_words = table.add(4 + 2 * bloom_words as usize);
        let chain = bucket_words.add(buckets as usize);
        let mut index = *bucket_words.add((hash % buckets) as usize);
        if index < first {
            return None;
        }
        loop {
            let word = *chain.add((index - first) as usize);
            if (word | 1) == (hash | 1) && matches(index) {
                return Some(index);
            }
            if word & 1 != 0 {
                return None;
            }
            index += 1;
        }
    }
}

/// Looks `name` up in a `DT_HASH` table: the first index of its chain that `matches`.
///
/// # Safety
/// `table` is a loaded object's ELF hash table.
unsafe fn sysv_lookup(table: *const u32, name: &[u8], matches: impl Fn(u32) -> bool) -> Option<u32> {
    let hash = name.iter().fold(0u32, |h, b| {
        let h = (h << 4).wrapping_add(*b as u32);
        let high = h & 0xf000_0000;
        (h ^ (high >> 24)) & !high
    });
    // SAFETY: nbucket, nchain, then the buckets and the chains (one word per symbol).
    unsafe {
        let (buckets, chains) = (*table, *table.add(1));
        if buckets == 0 {
            return None;
        }
        let chain = table.add(2 + buckets as usize);
        let mut index = *table.add(2 + (hash % buckets) as usize);
        let mut steps = 0;
        while index != 0 && index < chains && steps <= chains {
            if matches(index) {
                return Some(index);
            }
            index = *chain.add(index as usize);
            steps += 1;
        }
    }
    None
}
