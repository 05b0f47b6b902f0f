//! Passing a descriptor over a Unix socket (`SCM_RIGHTS`), and waiting on one: how a served
//! ledger's keeper hands its memory file out (`ledger/keeper.rs`, `ledger/served.rs`).

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

/// `sendmsg(2)` of `bytes` with `fd` passed along (`SCM_RIGHTS`) when given, without
/// waiting (`MSG_DONTWAIT`) and without `SIGPIPE` (`MSG_NOSIGNAL`).
pub fn send_with_fd(socket: BorrowedFd<'_>, bytes: &[u8], fd: Option<BorrowedFd<'_>>) -> io::Result<usize> {
    let mut iov = libc::iovec { iov_base: bytes.as_ptr() as *mut libc::c_void, iov_len: bytes.len() };
    // Room for one descriptor, aligned as a cmsghdr must be.
    let mut control = [0u64; 4];
    // SAFETY: all-zero bytes are a valid msghdr.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if let Some(fd) = fd {
        // SAFETY: CMSG_SPACE and CMSG_LEN compute sizes only.
        let (space, len) = unsafe { (libc::CMSG_SPACE(4) as usize, libc::CMSG_LEN(4) as usize) };
        debug_assert!(space <= std::mem::size_of_val(&control));
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = space as _;
        // SAFETY: the control buffer holds `space` bytes, room for one header and one int,
        // so CMSG_FIRSTHDR is non-null and its data has room for the descriptor.
        unsafe {
            let header = libc::CMSG_FIRSTHDR(&msg);
            (*header).cmsg_level = libc::SOL_SOCKET;
            (*header).cmsg_type = libc::SCM_RIGHTS;
            (*header).cmsg_len = len as _;
            std::ptr::write_unaligned(libc::CMSG_DATA(header).cast::<i32>(), fd.as_raw_fd());
        }
    }
    // SAFETY: models sendmsg(2) with a msghdr whose iovec and control buffer live across the call.
    let n = unsafe { libc::sendmsg(socket.as_raw_fd(), &msg, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// `recvmsg(2)` into `buf`, with a descriptor passed along (`SCM_RIGHTS`, received
/// close-on-exec) returned beside the byte count; extra descriptors are closed.
pub fn recv_with_fd(socket: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<(usize, Option<OwnedFd>)> {
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    // Room for a few descriptors: a peer that sends more than one gets them closed.
    let mut control = [0u64; 8];
    // SAFETY: all-zero bytes are a valid msghdr.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control) as _;
    // SAFETY: models recvmsg(2) into a msghdr whose iovec and control buffer live across the
    // call; MSG_CMSG_CLOEXEC marks received descriptors close-on-exec.
    let n = unsafe { libc::recvmsg(socket.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut received = None;
    // SAFETY: the kernel filled the control buffer: CMSG_FIRSTHDR and CMSG_NXTHDR walk the
    // headers it wrote, each within msg_controllen, and an SCM_RIGHTS header's data holds
    // (cmsg_len - CMSG_LEN(0)) / 4 descriptors, now this process's own.
    unsafe {
        let mut header = libc::CMSG_FIRSTHDR(&msg);
        while !header.is_null() {
            if (*header).cmsg_level == libc::SOL_SOCKET && (*header).cmsg_type == libc::SCM_RIGHTS {
                let count = ((*header).cmsg_len as usize - libc::CMSG_LEN(0) as usize) / 4;
                let data = libc::CMSG_DATA(header).cast::<i32>();
                for i in 0..count {
                    let fd = OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i)));
                    if received.is_none() {
                        received = Some(fd);
                    }
                }
            }
            header = libc::CMSG_NXTHDR(&msg, header);
        }
    }
    Ok((n as usize, received))
}

/// `poll(2)` of one descriptor for input, waiting at most `timeout`: whether it is readable
/// (or at its end, or in error) by then.
pub fn poll_readable(fd: BorrowedFd<'_>, timeout: std::time::Duration) -> io::Result<bool> {
    let mut entry = libc::pollfd { fd: fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
    let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
    loop {
        // SAFETY: models poll(2) of one valid, exclusively borrowed pollfd.
        let n = unsafe { libc::poll(&mut entry, 1, ms) };
        if n >= 0 {
            return Ok(n > 0);
        }
        let err = io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EINTR) {
            return Err(err);
        }
    }
}

/// `shutdown(2)` of both directions: wakes a thread blocked in `accept(2)` on a listener.
pub fn shutdown(socket: BorrowedFd<'_>) {
    // SAFETY: models shutdown(2) on a descriptor the caller owns.
    unsafe { libc::shutdown(socket.as_raw_fd(), libc::SHUT_RDWR) };
}
