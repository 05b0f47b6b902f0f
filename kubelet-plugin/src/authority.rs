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

use h2::Codec;
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio::net::UnixStream;
use tokio::sync::mpsc;

mod directions;
mod halves;
mod shared;
#[cfg(test)]
mod tests;

pub use shared::{acceptable, Notice, RelayError, REPLACEMENT};

use directions::{downstream, upstream, ReadCodec, WriteCodec};
use halves::{OneWay, PaddedLengths, Tap, WriteOnly};

/// The client connection preface of HTTP/2 (RFC 9113, 3.4).
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// The in-memory pipe's buffer between the relay and the server.
const PIPE: usize = 256 * 1024;

/// A pipe to the server for `client`, and the relay that runs between them until either
/// end closes.
pub fn connect(client: UnixStream, notice: Arc<Notice>) -> DuplexStream {
    let (server_end, relay_end) = tokio::io::duplex(PIPE);
    let running = notice.running();
    tokio::spawn(async move {
        let _running = running;
        if let Err(e) = relay(client, relay_end, notice).await {
            crate::log(&format!("a kubelet connection ended: {e}"));
        }
    });
    server_end
}

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
