//! Signals, for fgpu's command line: handlers that are told the signal and its `si_code`,
//! `kill(2)`, and dying of a signal the way a job did.

use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};

/// What a handler installed with [`handle`] runs: the signal and the `si_code` of its
/// delivery (`SI_USER` and other values <= 0 when a process sent it, `SI_KERNEL` when the
/// terminal driver did). It runs inside the signal handler, so it may only do what is
/// async-signal-safe: atomics and [`kill`].
pub type Handler = fn(signal: i32, si_code: i32);

/// One slot per signal number (Linux has 64), each 0 or a [`Handler`].
const SIGNALS: usize = 65;
static HANDLERS: [AtomicUsize; SIGNALS] = [const { AtomicUsize::new(0) }; SIGNALS];

extern "C" fn trampoline(signal: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo_t (or none) to an SA_SIGINFO handler.
    let code = if info.is_null() { 0 } else { unsafe { (*info).si_code } };
    let Some(slot) = usize::try_from(signal).ok().and_then(|s| HANDLERS.get(s)) else { return };
    let raw = slot.load(Ordering::SeqCst);
    if raw != 0 {
        // SAFETY: only `handle` stores into a slot, and what it stores is a `Handler`.
        let handler = unsafe { std::mem::transmute::<usize, Handler>(raw) };
        handler(signal, code);
    }
}

fn set_action(signal: i32, action: libc::sighandler_t, flags: i32) -> io::Result<()> {
    // SAFETY: all-zero bytes are a valid sigaction (no handler, no flags, an empty mask).
    let mut act: libc::sigaction = unsafe { std::mem::zeroed() };
    act.sa_sigaction = action;
    act.sa_flags = flags;
    // SAFETY: models sigemptyset(3) and sigaction(2) with a valid, exclusively borrowed
    // sigaction whose handler has the type its flags say (SA_SIGINFO: `trampoline`).
    let rc = unsafe {
        libc::sigemptyset(&mut act.sa_mask);
        libc::sigaction(signal, &act, std::ptr::null_mut())
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `sigaction(2)` of `signal` with `SA_SIGINFO` (and `SA_RESTART` when `restart`): each
/// delivery runs `handler`. A handler, not `SIG_IGN`, so that a program exec'd later starts
/// with the default disposition (exec resets handled signals, keeps ignored ones ignored).
pub fn handle(signal: i32, handler: Handler, restart: bool) -> io::Result<()> {
    let slot = usize::try_from(signal).ok().and_then(|s| HANDLERS.get(s)).ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
    slot.store(handler as usize, Ordering::SeqCst);
    let trampoline: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) = trampoline;
    let flags = libc::SA_SIGINFO | if restart { libc::SA_RESTART } else { 0 };
    set_action(signal, trampoline as libc::sighandler_t, flags)
}

/// `sigaction(2)` of `signal` back to `SIG_DFL`.
pub fn default_action(signal: i32) -> io::Result<()> {
    set_action(signal, libc::SIG_DFL, 0)
}

/// `kill(2)`: async-signal-safe, so a [`Handler`] may call it.
pub fn kill(pid: i32, signal: i32) -> io::Result<()> {
    // SAFETY: models kill(2); it takes no pointers.
    if unsafe { libc::kill(pid, signal) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Dies of `signal` as a job did, without a core file: `setrlimit(RLIMIT_CORE, 0)`,
/// `signal(SIG_DFL)`, `sigprocmask(SIG_UNBLOCK)` and `raise(3)`. Returns only when the
/// signal does not kill.
pub fn raise_default(signal: i32) {
    let no_core = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: all-zero bytes are a valid sigset_t, filled by sigemptyset before use.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: models setrlimit(2), signal(2), sigemptyset(3), sigaddset(3), sigprocmask(2)
    // and raise(3) on this process, with valid, exclusively borrowed arguments.
    unsafe {
        libc::setrlimit(libc::RLIMIT_CORE, &no_core);
        libc::signal(signal, libc::SIG_DFL);
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, signal);
        libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
        libc::raise(signal);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicI32;

    static SEEN: AtomicI32 = AtomicI32::new(0);
    static CODE: AtomicI32 = AtomicI32::new(1);

    fn record(signal: i32, si_code: i32) {
        SEEN.store(signal, Ordering::SeqCst);
        CODE.store(si_code, Ordering::SeqCst);
    }

    #[test]
    fn a_handler_is_told_the_signal_and_who_sent_it() {
        handle(libc::SIGUSR2, record, true).unwrap();
        kill(std::process::id() as i32, libc::SIGUSR2).unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while SEEN.load(Ordering::SeqCst) == 0 && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        default_action(libc::SIGUSR2).unwrap();
        assert_eq!(SEEN.load(Ordering::SeqCst), libc::SIGUSR2);
        assert_eq!(CODE.load(Ordering::SeqCst), libc::SI_USER, "kill(2) gives SI_USER");
        assert!(handle(100, record, false).is_err(), "no such signal");
    }
}
