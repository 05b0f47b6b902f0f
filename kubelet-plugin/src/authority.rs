//! What kubelet sends as `:authority`, made acceptable to the gRPC server.
//!
//! kubelet's gRPC client is grpc-go. It dials the registration socket by its bare path (the
//! plugin watcher), and older kubelets the DRA socket too, with no authority option, and
//! grpc-go then sends the path, percent-encoded, as the request's `:authority`
//! (`%2Fvar%2Flib%2Fkubelet%2Fplugins_registry%2Fgpu.fgpu.io-reg.sock`). h2, which tonic
//! serves with, parses every request's authority with the `http` crate, which refuses a
//! `%` in a host, and resets the stream (`PROTOCOL_ERROR`): no option of h2, hyper or tonic
//! changes that. Newer kubelets dial `unix:<path>` and send `localhost`; other clients send
//! none.
//!
//! So each connection on the plugin's sockets goes through this relay, in the process, to
//! the tonic server on an in-memory pipe. The relay reads the client's HTTP/2 frames with
//! h2's own frame codec (`h2::Codec`, from h2's `unstable` feature; the version is pinned
//! in Cargo.toml because that interface may change in any release), replaces an
//! `:authority` that `http` cannot parse with `localhost`, and passes every other frame on
//! as it came, both ways: settings, flow control, pings, resets and the end of the
//! connection are the two ends' own. What the relay has to keep in step itself:
//! - the frame codecs' limits follow the SETTINGS each end sends (frame size, header table);
//! - a padded DATA frame loses its padding on the way (h2's codec does not keep it): the
//!   padding's share of the flow-control window is given back to the client at once;
//! - a request h2's codec finds malformed is reset towards the client, and never reaches
//!   the server, as h2 itself would have answered it.
//!
//! docs/architecture.md says why this design, and not a patched h2.

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use h2::frame::{self, Frame, Reason, StreamId};
use h2::proto::Error as H2Error;
use h2::Codec;
use std::collections::{HashSet, VecDeque};
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream, ReadBuf};
use tokio::net::UnixStream;
use tokio::sync::mpsc;

/// The client connection preface of HTTP/2 (RFC 9113, 3.4).
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// The authority put in place of one the server cannot parse.
pub const REPLACEMENT: &str = "localhost";

/// The in-memory pipe's buffer between the relay and the server.
const PIPE: usize = 256 * 1024;

/// How long the server may take to finish after the client went away.
const DRAIN: Duration = Duration::from_secs(5);

/// Why a relay ended before both ends closed their connections.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    #[error("the client does not speak HTTP/2 (no connection preface)")]
    NoPreface,
    /// The preface could not be passed on to the server.
    #[error("the server: {0}")]
    Server(#[source] io::Error),
    #[error("reading from the client: {kind:?} {what}")]
    ClientRead { kind: io::ErrorKind, what: String },
    #[error("relaying a frame: {0}")]
    Send(#[from] h2::SendError),
    /// One direction's task panicked or was cancelled.
    #[error("{0}")]
    Task(#[from] tokio::task::JoinError),
}

/// Whether h2 (through `http`) accepts this `:authority`.
pub fn acceptable(authority: &str) -> bool {
    authority.parse::<http::uri::Authority>().is_ok()
}

/// What a socket's relays share: the first authority one had to replace (said once), and
/// how many are still running.
pub struct Notice {
    socket: String,
    said: AtomicBool,
    live: std::sync::atomic::AtomicUsize,
}

/// Counts one relay as running until dropped.
struct Running(Arc<Notice>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.live.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Notice {
    pub fn new(socket: &std::path::Path) -> Arc<Notice> {
        Arc::new(Notice { socket: socket.display().to_string(), said: AtomicBool::new(false), live: Default::default() })
    }

    /// Waits until every relay of the socket has ended, at most `within`: once the server
    /// has stopped, that is when its last answers have reached the clients (the process
    /// must not exit before). False when some still run.
    pub async fn drained(&self, within: std::time::Duration) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        while self.live.load(Ordering::Acquire) > 0 {
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        true
    }

    fn replaced(&self, authority: &str) {
        if !self.said.swap(true, Ordering::Relaxed) {
            crate::log(&format!(
                "{}: the client sends :authority {authority:?}, which h2 refuses (grpc-go's form of a socket path); it is served as {REPLACEMENT:?} (logged once)",
                self.socket
            ));
        }
    }
}

/// A pipe to the server for `client`, and the relay that runs between them until either
/// end closes.
pub fn connect(client: UnixStream, notice: Arc<Notice>) -> DuplexStream {
    let (server_end, relay_end) = tokio::io::duplex(PIPE);
    notice.live.fetch_add(1, Ordering::AcqRel);
    let running = Running(notice.clone());
    tokio::spawn(async move {
        let _running = running;
        if let Err(e) = relay(client, relay_end, notice).await {
            crate::log(&format!("a kubelet connection ended: {e}"));
        }
    });
    server_end
}

/// Sizes of padded DATA frames as they came from the client, in order, read from the
/// frame headers as the bytes go by: h2's codec drops the padding and does not say how
/// long it was.
type PaddedLengths = Arc<Mutex<VecDeque<usize>>>;

/// The client's read half, noting each padded DATA frame's length.
struct Tap<R> {
    inner: R,
    padded: PaddedLengths,
    header: [u8; 9],
    have: usize,
    skip: usize,
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
struct OneWay<T>(T);

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
struct WriteOnly<T>(T);

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

/// Limits one end announced in its SETTINGS, which the codecs on the other side follow.
#[derive(Debug, Clone, Copy)]
struct Limits {
    max_frame_size: Option<u32>,
    header_table_size: Option<u32>,
}

impl Limits {
    fn of(settings: &frame::Settings) -> Limits {
        Limits { max_frame_size: settings.max_frame_size(), header_table_size: settings.header_table_size() }
    }
}

/// What one direction asks of the other.
enum Control {
    /// The other end's settings: apply them to the codecs of this direction.
    Limits(Limits),
    /// A frame for the client (the relay's own answers: resets, window updates, GOAWAY).
    ToClient(Frame),
    /// Send this, then close the connection to the client.
    CloseClient(Frame),
}

type ReadCodec<R> = Codec<OneWay<R>, Bytes>;
type WriteCodec<W> = Codec<WriteOnly<W>, Bytes>;

async fn relay(client: UnixStream, server: DuplexStream, notice: Arc<Notice>) -> Result<(), RelayError> {
    let (mut client_read, client_write) = client.into_split();
    let mut preface = [0u8; 24];
    if client_read.read_exact(&mut preface).await.is_err() {
        return Ok(()); // closed before saying anything (a probe of the socket)
    }
    if &preface != PREFACE {
        return Err(RelayError::NoPreface);
    }
    let (server_read, mut server_write) = tokio::io::split(server);
    server_write.write_all(PREFACE).await.map_err(RelayError::Server)?;

    let padded: PaddedLengths = Arc::default();
    let tap = Tap { inner: client_read, padded: padded.clone(), header: [0; 9], have: 0, skip: 0 };
    let client_rx: ReadCodec<_> = Codec::new(OneWay(tap));
    let client_tx: WriteCodec<_> = Codec::new(WriteOnly(client_write));
    let server_rx: ReadCodec<_> = Codec::new(OneWay(server_read));
    let server_tx: WriteCodec<_> = Codec::new(WriteOnly(server_write));

    let (to_up, up_rx) = mpsc::unbounded_channel();
    let (to_down, down_rx) = mpsc::unbounded_channel();
    let mut up = tokio::spawn(upstream(client_rx, server_tx, padded, up_rx, to_down.clone(), notice));
    let down = tokio::spawn(downstream(server_rx, client_tx, down_rx, to_up));
    tokio::select! {
        // The server ended the connection: nothing more from the client can be served.
        r = down => {
            up.abort();
            r?
        }
        // The client went away (or broke the protocol): the server finishes what it has.
        r = &mut up => {
            let up = r?;
            drop(to_down);
            up
        }
    }
}

/// Client to server: every frame passed on, an unacceptable authority replaced.
async fn upstream<R: AsyncRead + Unpin, W: AsyncWrite + Unpin>(
    mut client_rx: ReadCodec<R>,
    mut server_tx: WriteCodec<W>,
    padded: PaddedLengths,
    mut control: mpsc::UnboundedReceiver<Control>,
    to_down: mpsc::UnboundedSender<Control>,
    notice: Arc<Notice>,
) -> Result<(), RelayError> {
    // The highest stream the server has seen, and the streams reset here before it saw them.
    let mut highest_sent = 0u32;
    let mut refused: HashSet<u32> = HashSet::new();
    let to_client = |frame: Frame| {
        let _ = to_down.send(Control::ToClient(frame));
    };
    let give_back = |stream: StreamId, bytes: usize| {
        if let Ok(n @ 1..) = u32::try_from(bytes) {
            if !stream.is_zero() {
                to_client(frame::WindowUpdate::new(stream, n).into());
            }
            to_client(frame::WindowUpdate::new(StreamId::zero(), n).into());
        }
    };
    loop {
        let next = tokio::select! {
            biased;
            Some(c) = control.recv() => {
                if let Control::Limits(l) = c {
                    if let Some(size) = l.max_frame_size {
                        client_rx.set_max_recv_frame_size(size as usize);
                        server_tx.set_max_send_frame_size(size as usize);
                    }
                    if let Some(size) = l.header_table_size {
                        client_rx.set_recv_header_table_size(size as usize);
                        server_tx.set_send_header_table_size(size as usize);
                    }
                }
                continue;
            }
            next = client_rx.next() => next,
        };
        let frame = match next {
            None => break,
            Some(Ok(frame)) => frame,
            Some(Err(H2Error::Reset(stream, reason, _))) => {
                // A request h2 finds malformed: refused, as h2 would refuse it.
                to_client(frame::Reset::new(stream, reason).into());
                let id = u32::from(stream);
                if id <= highest_sent && !refused.contains(&id) {
                    send(&mut server_tx, frame::Reset::new(stream, Reason::CANCEL).into()).await?;
                } else {
                    refused.insert(id);
                    highest_sent = highest_sent.max(id);
                }
                continue;
            }
            Some(Err(H2Error::GoAway(debug, reason, _))) => {
                let away = frame::GoAway::with_debug_data(StreamId::from(highest_sent), reason, debug);
                let _ = to_down.send(Control::CloseClient(away.into()));
                break;
            }
            Some(Err(H2Error::Io(kind, what))) => {
                if kind == io::ErrorKind::UnexpectedEof || kind == io::ErrorKind::ConnectionReset {
                    break;
                }
                return Err(RelayError::ClientRead { kind, what: what.unwrap_or_default() });
            }
        };
        let frame = match frame {
            Frame::Data(data) => {
                let flow = if data.is_padded() {
                    padded.lock().unwrap_or_else(|e| e.into_inner()).pop_front().unwrap_or(data.payload().len())
                } else {
                    data.payload().len()
                };
                let stream = data.stream_id();
                if refused.contains(&u32::from(stream)) {
                    give_back(StreamId::zero(), flow);
                    continue;
                }
                if !data.is_padded() {
                    Frame::Data(data)
                } else {
                    let end = data.is_end_stream();
                    let payload = data.into_payload();
                    give_back(if end { StreamId::zero() } else { stream }, flow.saturating_sub(payload.len()));
                    let mut plain = frame::Data::new(stream, payload);
                    plain.set_end_stream(end);
                    Frame::Data(plain)
                }
            }
            Frame::Headers(mut headers) => {
                let id = u32::from(headers.stream_id());
                if refused.contains(&id) {
                    continue;
                }
                highest_sent = highest_sent.max(id);
                let pseudo = headers.pseudo_mut();
                if let Some(authority) = pseudo.authority.as_ref().filter(|a| !acceptable(a)) {
                    notice.replaced(authority);
                    pseudo.authority = Some(frame::BytesStr::try_from(Bytes::from_static(REPLACEMENT.as_bytes())).expect("ASCII"));
                }
                Frame::Headers(headers)
            }
            Frame::Settings(settings) => {
                if !settings.is_ack() {
                    // Before the server can answer them: the frames it sends after
                    // these settings may use them.
                    let _ = to_down.send(Control::Limits(Limits::of(&settings)));
                }
                Frame::Settings(settings)
            }
            Frame::WindowUpdate(w) if refused.contains(&u32::from(w.stream_id())) => continue,
            Frame::Reset(r) if refused.contains(&u32::from(r.stream_id())) => continue,
            other => other,
        };
        send(&mut server_tx, frame).await?;
    }
    let _ = server_tx.close().await;
    Ok(())
}

/// Server to client: every frame passed on, and the relay's own answers.
async fn downstream<R: AsyncRead + Unpin, W: AsyncWrite + Unpin>(
    mut server_rx: ReadCodec<R>,
    mut client_tx: WriteCodec<W>,
    mut control: mpsc::UnboundedReceiver<Control>,
    to_up: mpsc::UnboundedSender<Control>,
) -> Result<(), RelayError> {
    let mut client_gone = false;
    loop {
        let next = tokio::select! {
            biased;
            c = control.recv(), if !client_gone => {
                match c {
                    Some(Control::Limits(l)) => {
                        if let Some(size) = l.max_frame_size {
                            server_rx.set_max_recv_frame_size(size as usize);
                            client_tx.set_max_send_frame_size(size as usize);
                        }
                        if let Some(size) = l.header_table_size {
                            server_rx.set_recv_header_table_size(size as usize);
                            client_tx.set_send_header_table_size(size as usize);
                        }
                    }
                    Some(Control::ToClient(frame)) => send(&mut client_tx, frame).await?,
                    Some(Control::CloseClient(frame)) => {
                        let _ = send(&mut client_tx, frame).await;
                        break;
                    }
                    // The client went away: let the server finish, for a while.
                    None => client_gone = true,
                }
                continue;
            }
            next = tokio::time::timeout(if client_gone { DRAIN } else { Duration::MAX }, server_rx.next()) => match next {
                Ok(next) => next,
                Err(_) => break,
            },
        };
        match next {
            None | Some(Err(H2Error::Io(..))) => break,
            Some(Ok(frame)) => {
                if let Frame::Settings(s) = &frame {
                    if !s.is_ack() {
                        let _ = to_up.send(Control::Limits(Limits::of(s)));
                    }
                }
                if !client_gone {
                    send(&mut client_tx, frame).await?;
                }
            }
            Some(Err(H2Error::Reset(stream, reason, _))) => {
                if !client_gone {
                    send(&mut client_tx, frame::Reset::new(stream, reason).into()).await?;
                }
            }
            Some(Err(H2Error::GoAway(debug, reason, _))) => {
                if !client_gone {
                    let _ = send(&mut client_tx, frame::GoAway::with_debug_data(StreamId::zero(), reason, debug).into()).await;
                }
                break;
            }
        }
    }
    let _ = client_tx.close().await;
    Ok(())
}

async fn send<W: AsyncWrite + Unpin>(codec: &mut WriteCodec<W>, frame: Frame) -> Result<(), RelayError> {
    Ok(codec.send(frame).await?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    #[test]
    fn what_grpc_go_sends_for_a_socket_path_is_not_acceptable_and_localhost_is() {
        assert!(!acceptable("%2Fvar%2Flib%2Fkubelet%2Fplugins_registry%2Fgpu.fgpu.io-reg.sock"));
        assert!(acceptable("localhost"));
        assert!(acceptable("[::1]:50051"));
        assert!(acceptable("localhost:0"));
    }

    /// A frame as RFC 9113 lays it out.
    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let len = payload.len() as u32;
        let mut out = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
        out.extend_from_slice(&stream.to_be_bytes());
        out.extend_from_slice(payload);
        out
    }

    /// HPACK "literal header field without indexing, new name", no Huffman (RFC 7541, 6.2.2).
    fn literal(name: &str, value: &str) -> Vec<u8> {
        let mut out = vec![0, name.len() as u8];
        out.extend_from_slice(name.as_bytes());
        out.push(value.len() as u8);
        out.extend_from_slice(value.as_bytes());
        out
    }

    /// A client that speaks raw HTTP/2 to the relay (an authority h2 refuses, a padded DATA
    /// frame), and h2's own server behind it: the server gets the request with `localhost`
    /// and the data without the padding, and the padding's share of the connection's
    /// window comes back to the client.
    #[tokio::test]
    async fn the_relay_fixes_the_authority_and_gives_back_padding() {
        let (mut client, relay_side) = UnixStream::pair().unwrap();
        let server_io = connect(relay_side, Notice::new(std::path::Path::new("test.sock")));
        let server = tokio::spawn(async move {
            let mut conn = h2::server::handshake(server_io).await.unwrap();
            let (request, mut respond) = conn.accept().await.unwrap().unwrap();
            let authority = request.uri().authority().map(|a| a.to_string());
            let mut body = request.into_body();
            let mut data = Vec::new();
            while let Some(chunk) = body.data().await {
                let chunk = chunk.unwrap();
                let _ = body.flow_control().release_capacity(chunk.len());
                data.extend_from_slice(&chunk);
            }
            respond.send_response(http::Response::new(()), true).unwrap();
            tokio::spawn(async move { while conn.accept().await.is_some() {} });
            (authority, data)
        });
        client.write_all(PREFACE).await.unwrap();
        client.write_all(&frame(0x4, 0, 0, &[])).await.unwrap();
        let mut block = Vec::new();
        for (n, v) in [(":method", "POST"), (":scheme", "http"), (":path", "/x"), (":authority", "%2Fa%2Fb.sock")] {
            block.extend(literal(n, v));
        }
        client.write_all(&frame(0x1, 0x4, 1, &block)).await.unwrap();
        // DATA, PADDED | END_STREAM: a pad length of 10, "hello", 10 bytes of padding.
        let mut padded = vec![10u8];
        padded.extend_from_slice(b"hello");
        padded.extend_from_slice(&[0; 10]);
        client.write_all(&frame(0x0, 0x9, 1, &padded)).await.unwrap();
        let (authority, data) = tokio::time::timeout(Duration::from_secs(10), server).await.unwrap().unwrap();
        assert_eq!((authority.as_deref(), data.as_slice()), (Some("localhost"), b"hello".as_slice()));
        // The frames back: a WINDOW_UPDATE of the connection for the padding (10 and the
        // pad length's byte), among the server's own.
        let mut given_back = 0u32;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while given_back != 11 {
            let mut head = [0u8; 9];
            tokio::time::timeout_at(deadline, client.read_exact(&mut head)).await.expect("no WINDOW_UPDATE of 11 came back").unwrap();
            let len = (usize::from(head[0]) << 16) | (usize::from(head[1]) << 8) | usize::from(head[2]);
            let mut payload = vec![0u8; len];
            client.read_exact(&mut payload).await.unwrap();
            let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
            if head[3] == 0x8 && stream == 0 {
                given_back = u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]]) & 0x7fff_ffff;
            }
        }
    }
}
