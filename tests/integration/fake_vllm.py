#!/usr/bin/python3
"""fake_vllm.py -- a fake vLLM MoRIIO instance for pdlink-router tests (Python stdlib + zmq + msgpack).

It registers with the router's discovery socket the way vLLM's MoRIIO connector does (a ZeroMQ
DEALER sending a msgpack map every --ping-ms; G2 by default, G1 with --g1), and answers
/v1/completions and /v1/chat/completions like a prefill (role P: kv_transfer_params echoed with
remote_block_ids etc.) or a decode (role D: JSON or SSE chunks). Every request it receives is
recorded (path, headers, body, the exact bytes it answered) and can be read back with
GET /_requests, so a test can check the legs the router sent and compare what the client got with
what the worker sent byte for byte. POST /_control {json} changes its behaviour at run time:
  fail_status, fail_body    answer completions with this status/body
  delay_ms                  wait before answering
  chunk_delay_ms, n_chunks  SSE pacing and length (default 0 ms, max_tokens or 8 chunks)
  ping                      false stops the registration pings (to test the router's TTL)
  drop_mid_stream           close the connection after half the chunks
  block_until_url           before answering, poll this URL (another fake's /_requests) until it lists
                            a request; 500 after 20 s. Proves two legs were in flight at once.
POST /_reset clears the request log. The bound port is written to --port-file.
"""
import argparse
import hashlib
import json
import os
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import msgpack
import zmq


class State:
    def __init__(self, args):
        self.args = args
        self.lock = threading.Lock()
        self.requests = []
        self.control = {"fail_status": 0, "fail_body": "", "delay_ms": 0, "chunk_delay_ms": 0, "n_chunks": 0,
                        "ping": True, "drop_mid_stream": False, "block_until_url": ""}
        self.port = 0
        self.stop = threading.Event()


def completion_text(prompt_key, i):
    h = hashlib.sha256(f"{prompt_key}:{i}".encode()).hexdigest()[:6]
    return f" t{i}-{h}"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "fake-vllm/1"

    def log_message(self, fmt, *a):  # keep test output quiet
        pass

    @property
    def st(self):
        return self.server.state

    def _send(self, status, body, ctype="application/json", extra=None, rec=None):
        if isinstance(body, str):
            body = body.encode()
        if rec is not None:  # record before answering: the client may ask for the log right after
            rec["status"], rec["response"] = status, body.decode("utf-8", "replace")
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)
        return body

    def _read_body(self):
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n > 0 else b""

    def do_GET(self):
        if self.path == "/health":
            self._send(200, "{}")
        elif self.path == "/v1/models":
            self._send(200, json.dumps({"object": "list", "data": [
                {"id": "fake-model", "object": "model", "owned_by": f"fake-{self.st.args.role}-{self.st.port}"}]}))
        elif self.path == "/_requests":
            with self.st.lock:
                self._send(200, json.dumps(self.st.requests))
        else:
            self._send(404, json.dumps({"error": "not found"}))

    def do_POST(self):
        raw = self._read_body()
        if self.path == "/_control":
            with self.st.lock:
                self.st.control.update(json.loads(raw or b"{}"))
            self._send(200, "{}")
            return
        if self.path == "/_reset":
            with self.st.lock:
                self.st.requests.clear()
            self._send(200, "{}")
            return
        if self.path not in ("/v1/completions", "/v1/chat/completions"):
            self._send(404, json.dumps({"error": "not found"}))
            return
        with self.st.lock:
            ctl = dict(self.st.control)
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        rec = {"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()},
               "body": body, "raw": raw.decode("utf-8", "replace"), "response": None, "status": None,
               "t_start": time.monotonic(), "client_gone": False}
        with self.st.lock:
            self.st.requests.append(rec)
        if ctl["delay_ms"]:
            time.sleep(ctl["delay_ms"] / 1000.0)
        if ctl["block_until_url"]:
            import urllib.request
            deadline = time.monotonic() + 20
            seen = False
            while not seen and time.monotonic() < deadline:
                with urllib.request.urlopen(ctl["block_until_url"]) as r:
                    seen = len(json.loads(r.read())) > 0
                if not seen:
                    time.sleep(0.02)
            if not seen:
                self._send(500, "peer leg never arrived", rec=rec)
                return
        if ctl["fail_status"]:
            self._send(int(ctl["fail_status"]), ctl["fail_body"] or "worker failure", rec=rec)
            return
        if body is None or not isinstance(body, dict):
            self._send(400, json.dumps({"error": "bad json"}), rec=rec)
            return
        rid = self.headers.get("X-Request-Id", "none")
        prompt_key = json.dumps(body.get("prompt", body.get("messages")), sort_keys=True)
        chat = self.path.endswith("chat/completions")
        if self.st.args.role == "P":
            kv_in = body.get("kv_transfer_params") or {}
            a = self.st.args
            kv = {"do_remote_prefill": True, "do_remote_decode": False, "remote_block_ids": [1, 2, 3],
                  "remote_engine_id": f"{a.host}:{a.handshake_port}", "remote_host": a.host,
                  "remote_handshake_port": a.handshake_port, "remote_notify_port": a.notify_port,
                  "remote_dp_size": a.dp, "tp_size": a.tp, "transfer_id": kv_in.get("transfer_id")}
            resp = {"id": f"cmpl-{rid}", "object": "chat.completion" if chat else "text_completion",
                    "model": "fake-model", "choices": [{"index": 0, "text": completion_text(prompt_key, 0),
                                                        "finish_reason": "length"}],
                    "kv_transfer_params": kv}
            self._send(200, json.dumps(resp), rec=rec)
            return
        # decode
        n = int(ctl["n_chunks"] or body.get("max_tokens") or 8)
        if body.get("stream"):
            rec["status"], rec["response"] = 200, ""
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.send_header("X-Fake-Worker", str(self.st.port))
            self.end_headers()
            out = []
            try:
                for i in range(n):
                    if ctl["drop_mid_stream"] and i == n // 2:
                        self.wfile.flush()
                        self.connection.shutdown(socket.SHUT_RDWR)
                        self.close_connection = True
                        return
                    ev = {"id": f"cmpl-{rid}", "object": "text_completion", "model": "fake-model",
                          "choices": [{"index": 0, "text": completion_text(prompt_key, i),
                                       "finish_reason": "length" if i == n - 1 else None}]}
                    chunk = f"data: {json.dumps(ev)}\n\n"
                    out.append(chunk)
                    rec["response"] = "".join(out)
                    b = chunk.encode()
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(b), b))
                    self.wfile.flush()
                    if ctl["chunk_delay_ms"]:
                        time.sleep(ctl["chunk_delay_ms"] / 1000.0)
                done = "data: [DONE]\n\n"
                out.append(done)
                rec["response"] = "".join(out)
                self.wfile.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done.encode()))
                self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                rec["client_gone"] = True
                self.close_connection = True
            return
        text = "".join(completion_text(prompt_key, i) for i in range(n))
        if chat:
            resp = {"id": f"chatcmpl-{rid}", "object": "chat.completion", "model": "fake-model",
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                 "finish_reason": "length"}], "kv_transfer_params": None}
        else:
            resp = {"id": f"cmpl-{rid}", "object": "text_completion", "model": "fake-model",
                    "choices": [{"index": 0, "text": text, "finish_reason": "length"}], "kv_transfer_params": None}
        self._send(200, json.dumps(resp), extra={"X-Fake-Worker": str(self.st.port)}, rec=rec)


def registration(args, port):
    if args.g1:
        return {"type": "register", "role": args.role, "index": "0",
                "request_address": f"http://{args.host}:{port}/v1/completions",
                "handshake_port": args.handshake_port, "notify_port": args.notify_port,
                "dp_size": args.dp, "tp_size": args.tp, "transfer_mode": args.mode}
    return {"type": args.role, "http_address": f"{args.host}:{port}",
            "zmq_address": f"host:{args.host},handshake:{args.handshake_port},notify:{args.notify_port}",
            "dp_size": args.dp, "tp_size": args.tp, "transfer_mode": args.mode}


def pinger(state):
    ctx = zmq.Context()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(f"tcp://{state.args.discovery}")
    msg = msgpack.dumps(registration(state.args, state.port))
    while not state.stop.is_set():
        with state.lock:
            ping = state.control["ping"]
        if ping:
            s.send(msg)
        state.stop.wait(state.args.ping_ms / 1000.0)
    s.close()
    ctx.term()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--role", choices=["P", "D"], required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--port-file")
    ap.add_argument("--discovery", help="router discovery HOST:PORT; no pings without it")
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--dp", type=int, default=1)
    ap.add_argument("--mode", default="READ")
    ap.add_argument("--handshake-port", type=int, default=6301)
    ap.add_argument("--notify-port", type=int, default=61005)
    ap.add_argument("--ping-ms", type=int, default=200)
    ap.add_argument("--g1", action="store_true")
    args = ap.parse_args()
    state = State(args)
    ThreadingHTTPServer.request_queue_size = 1024
    ThreadingHTTPServer.daemon_threads = True
    srv = ThreadingHTTPServer((args.host, args.port), Handler)
    srv.state = state
    state.port = srv.server_address[1]
    if args.port_file:
        tmp = args.port_file + ".tmp"
        with open(tmp, "w") as f:
            f.write(f"{state.port}\n")
        os.rename(tmp, args.port_file)
    if args.discovery:
        threading.Thread(target=pinger, args=(state,), daemon=True).start()
    import signal
    signal.signal(signal.SIGTERM, lambda *a: threading.Thread(target=srv.shutdown).start())
    try:
        srv.serve_forever(poll_interval=0.1)
    except KeyboardInterrupt:
        pass
    state.stop.set()
    return 0


if __name__ == "__main__":
    sys.exit(main())
