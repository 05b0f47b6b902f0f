use super::*;
use std::time::Duration;
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
