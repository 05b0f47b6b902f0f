//! The relay's two halves of a connection as h2's codec takes them: the client's read
//! half, which notes each padded DATA frame's length, and one-way wrappers.

use std::collections::VecDeque;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Sizes of padded DATA frames as they came from the client, in order, read from the
/// frame headers as the bytes go by: h2's codec drops the padding and does not say how
/// long it was.
pub(super) type PaddedLengths = Arc<Mutex<VecDeque<usize>>>;

/// The client's read half, noting each padded DATA frame's length.
pub(super) struct Tap<R> {
    pub(super) inner: R,
    pub(super) padded: PaddedLengths,
    pub(super) header: [u8; 9],
    pub(super) have: usize,
    pub(super) skip: usize,
}

impl<R: AsyncRead + Unpin> AsyncRead for Tap<R> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let this = &mut *self;
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = polled {
            let mut fresh = &buf.filled()[before..];
            while !fresh.is_empty() {
                if this.skip > 0 {
                    let n = this.skip.min(fresh.len());
                    this.skip -= n;
                    fresh = &fresh[n..];
                    continue;
                }
                let n = (9 - this.have).min(fresh.len());
                this.header[this.have..this.have + n].copy_from_slice(&fresh[..n]);
                this.have += n;
                fresh = &fresh[n..];
                if this.have == 9 {
                    let length = usize::from(this.header[0]) << 16 | usize::from(this.header[1]) << 8 | usize::from(this.header[2]);
                    // DATA is type 0, PADDED flag 0x8.
                    if this.header[3] == 0 && this.header[4] & 0x8 != 0 {
                        this.padded.lock().unwrap_or_else(|e| e.into_inner()).push_back(length);
                    }
                    this.have = 0;
                    this.skip = length;
                }
            }
        }
        polled
    }
}

/// One direction of a split stream, given the other trait so that h2's codec takes it; the
/// missing direction is never used.
pub(super) struct OneWay<T>(pub(super) T);

impl<T: AsyncRead + Unpin> AsyncRead for OneWay<T> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl<T: Unpin> AsyncWrite for OneWay<T> {
    fn poll_write(self: Pin<&mut Self>, _: &mut Context<'_>, _: &[u8]) -> Poll<io::Result<usize>> {
        Poll::Ready(Err(io::Error::from(io::ErrorKind::Unsupported)))
    }
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// A write half, for the codec that only writes.
pub(super) struct WriteOnly<T>(pub(super) T);

impl<T: Unpin> AsyncRead for WriteOnly<T> {
    fn poll_read(self: Pin<&mut Self>, _: &mut Context<'_>, _: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for WriteOnly<T> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}
