//! The stub API server's HTTP helpers: JSON answers and `Status` objects as the API server
//! words them, the query string, and field selectors over ResourceSlices.

use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Full};
use hyper::Response;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::convert::Infallible;

pub type Body = BoxBody<Bytes, Infallible>;

pub fn full(code: u16, value: &Value) -> Response<Body> {
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(serde_json::to_vec(value).unwrap())).boxed())
        .unwrap()
}

pub fn status(code: u16, reason: &str, message: &str) -> (u16, Value) {
    (code, json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message, "reason": reason, "code": code}))
}

pub fn not_found(what: &str, name: &str) -> (u16, Value) {
    status(404, "NotFound", &format!("{what} \"{name}\" not found"))
}

fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok().and_then(|h| u8::from_str_radix(h, 16).ok());
                match hex {
                    Some(b) => {
                        out.push(b);
                        i += 3;
                    }
                    None => {
                        out.push(b'%');
                        i += 1;
                    }
                }
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

pub fn query(url: &str) -> (String, BTreeMap<String, String>) {
    let (path, q) = url.split_once('?').unwrap_or((url, ""));
    let params = q.split('&').filter(|p| !p.is_empty()).filter_map(|p| p.split_once('=')).map(|(k, v)| (k.to_string(), decode(v))).collect();
    (path.to_string(), params)
}

/// Whether a slice passes a `fieldSelector` such as `spec.nodeName=n,spec.driver=d`.
pub fn selected(slice: &Value, selector: Option<&String>) -> Result<bool, String> {
    let Some(selector) = selector else { return Ok(true) };
    for term in selector.split(',').filter(|t| !t.is_empty()) {
        let (field, want) = term.split_once('=').ok_or_else(|| format!("bad field selector {term:?}"))?;
        let want = want.trim_start_matches('=');
        let have = match field {
            "spec.nodeName" => slice.pointer("/spec/nodeName"),
            "spec.driver" => slice.pointer("/spec/driver"),
            "metadata.name" => slice.pointer("/metadata/name"),
            other => return Err(format!("field label not supported: {other}")),
        };
        if have.and_then(Value::as_str).unwrap_or("") != want {
            return Ok(false);
        }
    }
    Ok(true)
}
