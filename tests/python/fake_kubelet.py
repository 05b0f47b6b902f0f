"""A fake kubelet for fgpu-kubelet-plugin's tests: the calls kubelet makes to a DRA driver,
made the way kubelet makes them.

kubelet is grpc-go. Its plugin watcher dials the registration socket by its bare path, and
(older) kubelets dial the DRA socket the same way, with no authority option: grpc-go then
sends the path, percent-encoded by its encodeAuthority, as the request's :authority
(`%2Fvar%2Flib%2Fkubelet%2Fplugins_registry%2Fgpu.fgpu.io-reg.sock`). Newer kubelets dial
`unix:<path>` and send `localhost`. This client sends exactly one of:

  --authority grpc-go    the socket's path, escaped as grpc-go's encodeAuthority escapes it
  --authority localhost  `localhost`
  --authority absent     no :authority at all (a plain HTTP/2 request, through the h2 library)

grpcio is told the authority with the `grpc.default_authority` channel option (its own default
for a unix: target is not relied on). The messages come from this directory's own
transcription of Kubernetes' .proto files (kubelet/), compiled with grpcio-tools at each run,
so nothing here is shared with the plugin.

Usage (every command prints one JSON object):
  fake_kubelet.py [--authority A] register REG_SOCKET
      GetInfo, then NotifyRegistrationStatus(registered=true), as kubelet's plugin watcher.
  fake_kubelet.py [--authority A] notify REG_SOCKET false "why"
  fake_kubelet.py [--authority A] prepare DRA_SOCKET CLAIMS_JSON
  fake_kubelet.py [--authority A] unprepare DRA_SOCKET CLAIMS_JSON
      CLAIMS_JSON: [{"namespace": ..., "name": ..., "uid": ...}, ...]; one call for all.
  fake_kubelet.py [--authority A] concurrent DRA_SOCKET CLAIMS_JSON
      one NodePrepareResources per claim, all at once (kubelet prepares different pods'
      claims concurrently), each with kubelet's 45 s deadline; prints every answer and how
      long each call took.
A call that fails as a whole prints {"error": ...} and exits 3.
"""

import argparse
import importlib
import json
import os
import socket
import struct
import sys
import tempfile
import threading
import time

import grpc
from grpc_tools import protoc

HERE = os.path.dirname(os.path.abspath(__file__))
PROTOS = os.path.join(HERE, "kubelet")
# kubelet's deadline for one NodePrepareResources or NodeUnprepareResources call.
DEADLINE = 45.0


def encode_authority(text):
    """grpc-go's encodeAuthority: every byte outside RFC 3986's unreserved characters,
    sub-delims and the authority's own delimiters is percent-encoded, upper-case hex."""
    keep = set(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.~!$&'()*+,;=:[]@")
    return "".join(chr(b) if b in keep else "%%%02X" % b for b in text.encode())


def load_messages(out_dir):
    """Compiles the transcribed protos into out_dir; returns (registration, dra) modules."""
    for name in ("pluginregistration.proto", "dra_v1.proto"):
        rc = protoc.main(["protoc", "-I" + PROTOS, "--python_out=" + out_dir, os.path.join(PROTOS, name)])
        if rc != 0:
            raise SystemExit("protoc failed on %s" % name)
    sys.path.insert(0, out_dir)
    return importlib.import_module("pluginregistration_pb2"), importlib.import_module("dra_v1_pb2")


class Caller:
    """Unary gRPC calls on one Unix socket, with the chosen :authority."""

    def __init__(self, socket_path, authority):
        self.path = socket_path
        self.authority = authority
        self.channel = None
        if authority != "absent":
            value = encode_authority(socket_path) if authority == "grpc-go" else "localhost"
            self.channel = grpc.insecure_channel("unix:" + socket_path, options=[("grpc.default_authority", value)])

    def call(self, method, request, response_type, timeout=DEADLINE):
        if self.channel is not None:
            rpc = self.channel.unary_unary(method, request_serializer=lambda m: m.SerializeToString(), response_deserializer=response_type.FromString)
            return rpc(request, timeout=timeout)
        return response_type.FromString(raw_unary(self.path, method, request.SerializeToString(), timeout))

    def close(self):
        if self.channel is not None:
            self.channel.close()


def raw_unary(socket_path, method, message, timeout):
    """One gRPC call as a plain HTTP/2 request with no :authority (and no Host)."""
    import h2.config
    import h2.connection
    import h2.events

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    sock.connect(socket_path)
    config = h2.config.H2Configuration(client_side=True, header_encoding="utf-8", validate_outbound_headers=False)
    conn = h2.connection.H2Connection(config=config)
    conn.initiate_connection()
    stream = conn.get_next_available_stream_id()
    headers = [(":method", "POST"), (":scheme", "http"), (":path", method), ("content-type", "application/grpc"), ("te", "trailers")]
    conn.send_headers(stream, headers)
    conn.send_data(stream, b"\x00" + struct.pack(">I", len(message)) + message, end_stream=True)
    sock.sendall(conn.data_to_send())
    body, status, trailers, done = b"", None, {}, False
    try:
        while not done:
            data = sock.recv(65536)
            if not data:
                raise RuntimeError("the server closed the connection")
            for event in conn.receive_data(data):
                if isinstance(event, h2.events.ResponseReceived):
                    status = dict(event.headers)
                    trailers.update(status)
                elif isinstance(event, h2.events.DataReceived):
                    body += event.data
                    conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                elif isinstance(event, h2.events.TrailersReceived):
                    trailers.update(dict(event.headers))
                elif isinstance(event, h2.events.StreamReset):
                    raise RuntimeError("the server reset the stream: error code %d" % event.error_code)
                elif isinstance(event, h2.events.StreamEnded):
                    done = True
            sock.sendall(conn.data_to_send())
    finally:
        sock.close()
    if status is None or status.get(":status") != "200":
        raise RuntimeError("HTTP status %s" % (status or {}).get(":status"))
    if trailers.get("grpc-status") != "0":
        raise RuntimeError("gRPC status %s: %s" % (trailers.get("grpc-status"), trailers.get("grpc-message", "")))
    if len(body) < 5 or body[0] != 0:
        raise RuntimeError("not one uncompressed gRPC message")
    return body[5:]


def device(d):
    out = {"requestNames": list(d.request_names), "poolName": d.pool_name, "deviceName": d.device_name, "cdiDeviceIds": list(d.cdi_device_ids)}
    if d.HasField("share_id"):
        out["shareId"] = d.share_id
    return out


def prepared(answer):
    return {uid: {"devices": [device(d) for d in r.devices], "error": r.error} for uid, r in answer.claims.items()}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--authority", choices=["grpc-go", "localhost", "absent"], default="grpc-go")
    parser.add_argument("command", choices=["register", "notify", "prepare", "unprepare", "concurrent"])
    parser.add_argument("socket")
    parser.add_argument("rest", nargs="*")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="fake-kubelet-") as out_dir:
        reg, dra = load_messages(out_dir)
        caller = Caller(args.socket, args.authority)
        base = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/"
        try:
            if args.command == "register":
                info = caller.call("/pluginregistration.Registration/GetInfo", reg.InfoRequest(), reg.PluginInfo)
                caller.call("/pluginregistration.Registration/NotifyRegistrationStatus", reg.RegistrationStatus(plugin_registered=True), reg.RegistrationStatusResponse)
                result = {"info": {"type": info.type, "name": info.name, "endpoint": info.endpoint, "supportedVersions": list(info.supported_versions)}}
            elif args.command == "notify":
                registered = args.rest[0] == "true"
                caller.call("/pluginregistration.Registration/NotifyRegistrationStatus", reg.RegistrationStatus(plugin_registered=registered, error=args.rest[1]), reg.RegistrationStatusResponse)
                result = {"notified": True}
            else:
                claims = [dra.Claim(namespace=c["namespace"], name=c["name"], uid=c["uid"]) for c in json.loads(args.rest[0])]
                if args.command == "prepare":
                    result = {"claims": prepared(caller.call(base + "NodePrepareResources", dra.NodePrepareResourcesRequest(claims=claims), dra.NodePrepareResourcesResponse))}
                elif args.command == "unprepare":
                    answer = caller.call(base + "NodeUnprepareResources", dra.NodeUnprepareResourcesRequest(claims=claims), dra.NodeUnprepareResourcesResponse)
                    result = {"claims": {uid: {"error": r.error} for uid, r in answer.claims.items()}}
                else:
                    result = concurrent(args.socket, args.authority, claims, dra)
        except (grpc.RpcError, RuntimeError, OSError) as e:
            detail = "%s: %s" % (e.code(), e.details()) if isinstance(e, grpc.RpcError) else str(e)
            print(json.dumps({"error": detail}))
            sys.exit(3)
        finally:
            caller.close()
    print(json.dumps(result))


def concurrent(socket_path, authority, claims, dra):
    """One call per claim, each on a connection of its own, all released at once."""
    answers, seconds, errors = {}, {}, {}
    start = threading.Barrier(len(claims))

    def one(claim):
        caller = Caller(socket_path, authority)
        try:
            start.wait()
            t0 = time.monotonic()
            request = dra.NodePrepareResourcesRequest(claims=[claim])
            answer = caller.call("/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources", request, dra.NodePrepareResourcesResponse)
            seconds[claim.uid] = time.monotonic() - t0
            answers.update(prepared(answer))
        except (grpc.RpcError, RuntimeError, OSError) as e:
            errors[claim.uid] = "%s: %s" % (e.code(), e.details()) if isinstance(e, grpc.RpcError) else str(e)
        finally:
            caller.close()

    threads = [threading.Thread(target=one, args=(c,)) for c in claims]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {"claims": answers, "seconds": seconds, "slowest": max(seconds.values(), default=0.0), "errors": errors}


if __name__ == "__main__":
    main()
