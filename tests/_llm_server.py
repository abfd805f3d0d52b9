"""A language-model endpoint for tests: a real HTTP server on 127.0.0.1 (http.server in a thread)
that speaks OpenAI chat completions and Anthropic Messages, streaming (SSE) and not, and answers
what the test scripts: replies with code, no code, a cut stream, finish reason length, 429 with
retry-after, 500s, quota errors. It records every request it received."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable


@dataclass
class Scripted:
    text: str = ""
    status: int = 200
    finish_reason: str | None = None  # None: the API's normal end (stop / end_turn)
    headers: dict[str, str] = field(default_factory=dict)
    error: dict[str, Any] | None = None  # the error body for status >= 400
    cut_after: int | None = None  # streaming: drop the connection after this many text pieces
    model: str = "served-model-2026"
    prompt_tokens: int = 120
    completion_tokens: int | None = None  # None: one per piece
    cached_tokens: int = 20
    reasoning_tokens: int = 7
    hold: threading.Event | None = None  # wait for it (at most 60 s) before answering


Responder = Callable[[dict[str, Any]], Scripted]


def pieces(text: str, size: int = 24) -> list[str]:
    return [text[i:i + size] for i in range(0, len(text), size)] or [""]


class LlmServer:
    def __init__(self, script: Responder | list[Scripted]) -> None:
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        if isinstance(script, list):
            queue = list(script)

            def respond(_: dict[str, Any]) -> Scripted:
                return queue.pop(0) if queue else Scripted(status=500, error={"message": "script exhausted"})

            self.respond: Responder = respond
        else:
            self.respond = script
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))))
                record = {"path": self.path, "body": body, "headers": dict(self.headers), "at": time.time()}
                with server._lock:
                    server.requests.append(record)
                    scripted = server.respond(record)
                if scripted.hold is not None:
                    scripted.hold.wait(60)
                try:
                    server._answer(self, record, scripted)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self) -> "LlmServer":
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    # ------------------------------------------------------------------ answers
    def _answer(self, h: BaseHTTPRequestHandler, record: dict[str, Any], s: Scripted) -> None:
        anthropic = record["path"].endswith("/v1/messages")
        if s.status >= 400:
            payload = json.dumps({"error": s.error or {"message": f"HTTP {s.status}"}} if not anthropic else
                                 {"type": "error", "error": s.error or {"type": "api_error", "message": f"HTTP {s.status}"}}).encode()
            h.send_response(s.status)
            for key, value in {"content-type": "application/json", **s.headers}.items():
                h.send_header(key, value)
            h.send_header("content-length", str(len(payload)))
            h.end_headers()
            h.wfile.write(payload)
            return
        parts = pieces(s.text)
        completion = s.completion_tokens if s.completion_tokens is not None else len(parts)
        finish = s.finish_reason or ("end_turn" if anthropic else "stop")
        if not record["body"].get("stream"):
            if anthropic:
                data = {"id": "msg_1", "type": "message", "role": "assistant", "model": s.model, "stop_reason": finish,
                        "content": [{"type": "text", "text": s.text}],
                        "usage": {"input_tokens": s.prompt_tokens - s.cached_tokens, "output_tokens": completion,
                                  "cache_read_input_tokens": s.cached_tokens}}
            else:
                data = {"id": "cmpl-1", "object": "chat.completion", "model": s.model,
                        "choices": [{"index": 0, "message": {"role": "assistant", "content": s.text}, "finish_reason": finish}],
                        "usage": {"prompt_tokens": s.prompt_tokens, "completion_tokens": completion,
                                  "prompt_tokens_details": {"cached_tokens": s.cached_tokens},
                                  "completion_tokens_details": {"reasoning_tokens": s.reasoning_tokens}}}
            payload = json.dumps(data).encode()
            h.send_response(200)
            h.send_header("content-type", "application/json")
            h.send_header("content-length", str(len(payload)))
            h.end_headers()
            h.wfile.write(payload)
            return
        h.send_response(200)
        h.send_header("content-type", "text/event-stream")
        h.end_headers()  # HTTP/1.0, no length: the body ends when the connection closes

        def send(data: Any, event: str | None = None) -> None:
            text = data if isinstance(data, str) else json.dumps(data)
            h.wfile.write(((f"event: {event}\n" if event else "") + f"data: {text}\n\n").encode())
            h.wfile.flush()

        if anthropic:
            send({"type": "message_start", "message": {"model": s.model, "usage": {
                "input_tokens": s.prompt_tokens - s.cached_tokens, "output_tokens": 1, "cache_read_input_tokens": s.cached_tokens}}},
                "message_start")
            send({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}, "content_block_start")
        h.wfile.write(b": keep-alive comment\n\n")
        for index, piece in enumerate(parts):
            if s.cut_after is not None and index >= s.cut_after:
                return  # connection closes with no end marker
            if anthropic:
                send({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": piece}},
                     "content_block_delta")
            else:
                send({"model": s.model, "choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]})
        if anthropic:
            send({"type": "content_block_stop", "index": 0}, "content_block_stop")
            send({"type": "message_delta", "delta": {"stop_reason": finish}, "usage": {"output_tokens": completion}},
                 "message_delta")
            send({"type": "message_stop"}, "message_stop")
        else:
            send({"model": s.model, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
            send({"model": s.model, "choices": [], "usage": {
                "prompt_tokens": s.prompt_tokens, "completion_tokens": completion,
                "prompt_tokens_details": {"cached_tokens": s.cached_tokens},
                "completion_tokens_details": {"reasoning_tokens": s.reasoning_tokens}}})
            send("[DONE]")


def models_toml(path: Any, url: str, *, name: str = "local", api: str = "openai", stream: bool = True,
                concurrency: int = 2, max_retries: int = 3, key_env: str | None = "PKB_TEST_KEY", **extra: Any) -> Any:
    """Write a models config pointing at the test server; returns its path."""
    fields: dict[str, Any] = {
        "api": api, "base_url": url, "model": "test-model-1", "max_output_tokens": 4096, "temperature": 0.2,
        "price_input_per_mtok": 3.0, "price_output_per_mtok": 15.0, "concurrency": concurrency, "timeout_s": 20.0,
        "stream": stream, "max_retries": max_retries, "retry_base_s": 0.05,
    }
    if key_env:
        fields["api_key_env"] = key_env
    fields.update(extra)
    lines = [f"[endpoints.{name}]"] + [f"{key} = {json.dumps(value)}" for key, value in fields.items()]
    path.write_text("\n".join(lines) + "\n")
    return path
