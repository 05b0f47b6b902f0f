//! The relay's two directions: client to server (the authority replaced, padding given
//! back, malformed requests refused) and server to client, and what they tell each other.

use super::halves::{OneWay, PaddedLengths, WriteOnly};
use super::shared::{acceptable, Notice, RelayError, REPLACEMENT};
use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use h2::frame::{self, Frame, Reason, StreamId};
use h2::proto::Error as H2Error;
use h2::Codec;
use std::collections::HashSet;
use std::io;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;

/// How long the server may take to finish after the client went away.
const DRAIN: Duration = Duration::from_secs(5);

/// Limits one end announced in its SETTINGS, which the codecs on the other side follow.
#[derive(Debug, Clone, Copy)]
pub(super) struct Limits {
    max_frame_size: Option<u32>,
    header_table_size: Option<u32>,
}

impl Limits {
    fn of(settings: &frame::Settings) -> Limits {
        Limits { max_frame_size: settings.max_frame_size(), header_table_size: settings.header_table_size() }
    }
}

/// What one direction asks of the other.
pub(super) enum Control {
    /// The other end's settings: apply them to the codecs of this direction.
    Limits(Limits),
    /// A frame for the client (the relay's own answers: resets, window updates, GOAWAY).
    ToClient(Frame),
    /// Send this, then close the connection to the client.
    CloseClient(Frame),
}

pub(super) type ReadCodec<R> = Codec<OneWay<R>, Bytes>;
pub(super) type WriteCodec<W> = Codec<WriteOnly<W>, Bytes>;

/// Client to server: every frame passed on, an unacceptable authority replaced.
pub(super) async fn upstream<R: AsyncRead + Unpin, W: AsyncWrite + Unpin>(
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
pub(super) async fn downstream<R: AsyncRead + Unpin, W: AsyncWrite + Unpin>(
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
