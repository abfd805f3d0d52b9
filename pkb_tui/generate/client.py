"""Chat requests to an endpoint over httpx, with our own retry rules.

Both APIs, streaming (server-sent events) or not:
- OpenAI-compatible: POST {base_url}/chat/completions, Bearer key; usage from the last chunk
  (stream_options.include_usage), cached and reasoning tokens from its *_details.
- Anthropic Messages: POST {base_url}/v1/messages, x-api-key + anthropic-version.

Retried (at most max_retries times): HTTP 408, 409, 429 and 5xx, timeouts, refused or dropped
connections, a stream that ends before the API's end marker (a cut stream) and Anthropic's
in-stream overloaded/api errors. The wait is the server's retry-after(-ms) when it gives one, else
retry_base_s doubling. Never retried: quota and billing errors (OpenAI `insufficient_quota`,
Anthropic `billing_error` / "credit balance"), which stop the whole generation (QuotaError), and
other 4xx (a bad key, max_tokens above the model's cap), which fail that request. A limit per
endpoint (its `concurrency`) holds how many requests are in flight at once in this process.
"""

from __future__ import annotations

import email.utils
import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx

from pkb_tui.errors import PkbError
from pkb_tui.generate.config import Endpoint

ANTHROPIC_VERSION = "2023-06-01"
RETRY_STATUSES = frozenset({408, 409, 429})
QUOTA_MARKERS = ("insufficient_quota", "billing_error", "credit balance", "billing_not_active", "quota exceeded")

OnDelta = Callable[[str], None]  # called with each piece of streamed text ("" for a piece of reasoning)


@dataclass
class Message:
    role: str  # user or assistant
    content: str


@dataclass
class Reply:
    text: str
    finish_reason: str | None  # as the API said it: stop, length, end_turn, max_tokens, ...
    model: str | None  # the model id the server says answered
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    reasoning_tokens: int | None = None
    latency_us: float = 0.0  # from sending the (last) attempt to the reply's end
    attempts: int = 1
    retries: list[str] = field(default_factory=list)  # one sentence per retry: what happened, how long we waited
    retry_waits_s: list[float] = field(default_factory=list)

    @property
    def hit_token_limit(self) -> bool:
        return self.finish_reason in ("length", "max_tokens")


class EndpointError(PkbError):
    """A request that failed for good (after its retries, or not retryable). The generation goes on."""

    exit_code = 3

    def __init__(self, message: str, *, status: int | None = None, partial_text: str = "",
                 attempts: int = 1, retries: list[str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.partial_text = partial_text
        self.attempts = attempts
        self.retries = retries or []


class QuotaError(EndpointError):
    """Quota or billing: no retry, and no point sending the other requests either."""

    exit_code = 2


class _Retryable(Exception):
    def __init__(self, reason: str, retry_after_s: float | None = None, partial_text: str = "") -> None:
        super().__init__(reason)
        self.retry_after_s = retry_after_s
        self.partial_text = partial_text


_SEMAPHORES: dict[tuple[str, str], threading.BoundedSemaphore] = {}
_SEMAPHORES_LOCK = threading.Lock()


def _slot(endpoint: Endpoint) -> threading.BoundedSemaphore:
    key = (endpoint.name, endpoint.base_url)
    with _SEMAPHORES_LOCK:
        if key not in _SEMAPHORES:
            _SEMAPHORES[key] = threading.BoundedSemaphore(endpoint.concurrency)
        return _SEMAPHORES[key]


def retry_after_s(headers: httpx.Headers) -> float | None:
    """retry-after-ms, retry-after in seconds, or retry-after as an HTTP date; None when absent."""
    if headers.get("retry-after-ms"):
        try:
            return max(0.0, float(headers["retry-after-ms"]) / 1000)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        when = email.utils.parsedate_to_datetime(value) if value else None
        return max(0.0, when.timestamp() - time.time()) if when else None


def _error_fields(body: bytes) -> tuple[str, str]:
    """(message, type/code words) of an error body in either API's shape, or its raw text."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return body.decode("utf-8", "replace").strip()[:300], ""
    error = data.get("error", data) if isinstance(data, dict) else {}
    if not isinstance(error, dict):
        return str(error)[:300], ""
    words = " ".join(str(error.get(k) or "") for k in ("type", "code"))
    return str(error.get("message") or data)[:300], words


class ChatClient:
    """One endpoint. Thread-safe: the generation loop calls complete() from several threads."""

    def __init__(self, endpoint: Endpoint, *, sleep: Callable[[float], None] = time.sleep) -> None:
        self.endpoint = endpoint
        self._key = endpoint.api_key()  # a missing key fails here, before anything is sent
        self._sleep = sleep
        self._http = httpx.Client(timeout=httpx.Timeout(endpoint.timeout_s, connect=min(30.0, endpoint.timeout_s)))

    def close(self) -> None:
        self._http.close()

    # ------------------------------------------------------------------ public
    def complete(self, system: str, messages: list[Message], *, on_delta: OnDelta | None = None) -> Reply:
        retries: list[str] = []
        waits: list[float] = []
        limit = self.endpoint.max_retries
        for attempt in range(1, limit + 2):
            try:
                with _slot(self.endpoint):
                    reply = self._attempt(system, messages, on_delta)
                reply.attempts, reply.retries, reply.retry_waits_s = attempt, retries, waits
                return reply
            except _Retryable as exc:
                if attempt > limit:
                    raise EndpointError(
                        f"{self.endpoint.name}: gave up after {attempt} attempts; last: {exc}.",
                        partial_text=exc.partial_text, attempts=attempt, retries=retries,
                    ) from None
                wait = exc.retry_after_s if exc.retry_after_s is not None else self.endpoint.retry_base_s * 2 ** (attempt - 1)
                if wait > self.endpoint.retry_max_wait_s:
                    raise EndpointError(
                        f"{self.endpoint.name}: {exc}, and the server asks to wait {wait:.0f} s, more than "
                        f"retry_max_wait_s ({self.endpoint.retry_max_wait_s:.0f} s); try later.",
                        attempts=attempt, retries=retries,
                    ) from None
                how = "retry-after" if exc.retry_after_s is not None else "back-off"
                retries.append(f"attempt {attempt}: {exc}; waited {wait:.2f} s ({how})")
                waits.append(wait)
                self._sleep(wait)
            except EndpointError as exc:
                exc.attempts, exc.retries = attempt, retries
                raise
        raise AssertionError("unreachable")

    # ------------------------------------------------------------------ one attempt
    def _request(self, system: str, messages: list[Message]) -> tuple[str, dict[str, str], dict[str, Any]]:
        e = self.endpoint
        base = e.base_url.rstrip("/")
        turns = [{"role": m.role, "content": m.content} for m in messages]
        if e.api == "openai":
            headers = {"content-type": "application/json"}
            if self._key:
                headers["authorization"] = f"Bearer {self._key}"
            body: dict[str, Any] = {
                "model": e.model, "messages": [{"role": "system", "content": system}, *turns] if system else turns,
                e.max_tokens_param: e.max_output_tokens, "stream": e.stream,
            }
            if e.stream:
                body["stream_options"] = {"include_usage": True}
            url = f"{base}/chat/completions"
        else:
            headers = {"content-type": "application/json", "anthropic-version": ANTHROPIC_VERSION}
            if self._key:
                headers["x-api-key"] = self._key
            body = {"model": e.model, "messages": turns, "max_tokens": e.max_output_tokens, "stream": e.stream}
            if system:
                body["system"] = system
            url = f"{base}/v1/messages"
        if e.temperature is not None:
            body["temperature"] = e.temperature
        return url, headers, body

    def _attempt(self, system: str, messages: list[Message], on_delta: OnDelta | None) -> Reply:
        url, headers, body = self._request(system, messages)
        started = time.perf_counter()
        try:
            with self._http.stream("POST", url, headers=headers, json=body) as response:
                if response.status_code >= 400:
                    self._raise_for_status(response, response.read())
                if self.endpoint.stream:
                    reply = self._read_stream(response, on_delta)
                else:
                    reply = self._parse_whole(json.loads(response.read()))
        except httpx.TimeoutException as exc:
            raise _Retryable(f"timed out ({type(exc).__name__}, timeout_s {self.endpoint.timeout_s:g})") from None
        except (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as exc:
            raise _Retryable(f"connection failed or dropped ({type(exc).__name__}: {exc})") from None
        except (ValueError, KeyError, TypeError) as exc:
            raise EndpointError(f"{self.endpoint.name} answered something that is not a {self.endpoint.api} reply ({exc}).") from None
        reply.latency_us = (time.perf_counter() - started) * 1e6
        return reply

    def _raise_for_status(self, response: httpx.Response, body: bytes) -> None:
        status = response.status_code
        message, words = _error_fields(body)
        lowered = f"{message} {words}".lower()
        name = self.endpoint.name
        if status == 402 or any(marker in lowered for marker in QUOTA_MARKERS):
            raise QuotaError(f"{name} refused the request for quota or billing (HTTP {status}: {message}); "
                             "add credit or raise the quota, or pick another endpoint.", status=status)
        if status in RETRY_STATUSES or status >= 500:
            raise _Retryable(f"HTTP {status} ({message[:120]})", retry_after_s(response.headers))
        if status in (401, 403):
            where = f"${self.endpoint.api_key_env}" if self.endpoint.api_key_env else "the endpoint's api_key_env"
            raise EndpointError(f"{name} refused the key (HTTP {status}: {message}); check {where}.", status=status)
        raise EndpointError(f"{name} rejected the request (HTTP {status}: {message}); check the endpoint's "
                            "model and max_output_tokens in the models config.", status=status)

    # ------------------------------------------------------------------ replies
    def _parse_whole(self, data: dict[str, Any]) -> Reply:
        if self.endpoint.api == "openai":
            choice = data["choices"][0]
            usage = data.get("usage") or {}
            return Reply(text=choice["message"].get("content") or "", finish_reason=choice.get("finish_reason"),
                         model=data.get("model"), **_openai_usage(usage))
        text = "".join(block.get("text", "") for block in data.get("content", []) if block.get("type") == "text")
        return Reply(text=text, finish_reason=data.get("stop_reason"), model=data.get("model"),
                     **_anthropic_usage(data.get("usage") or {}))

    def _read_stream(self, response: httpx.Response, on_delta: OnDelta | None) -> Reply:
        parts: list[str] = []
        reply = Reply(text="", finish_reason=None, model=None)
        ended = False
        anthropic_usage: dict[str, Any] = {}
        for event in _sse_events(response.iter_lines()):
            if self.endpoint.api == "openai":
                if event == "[DONE]":
                    ended = True
                    break
                data = json.loads(event)
                if data.get("error"):
                    self._stream_error(data["error"], parts)
                reply.model = data.get("model") or reply.model
                if data.get("usage"):
                    for key, value in _openai_usage(data["usage"]).items():
                        setattr(reply, key, value)
                for choice in data.get("choices") or []:
                    delta = choice.get("delta") or {}
                    piece = delta.get("content")
                    if piece:
                        parts.append(piece)
                        if on_delta:
                            on_delta(piece)
                    elif on_delta and (delta.get("reasoning_content") or delta.get("reasoning")):
                        on_delta("")  # reasoning is not the reply, but the count should move while it streams
                    if choice.get("finish_reason"):
                        reply.finish_reason = choice["finish_reason"]
            else:
                data = json.loads(event)
                kind = data.get("type")
                if kind == "message_start":
                    message = data.get("message") or {}
                    reply.model = message.get("model")
                    anthropic_usage.update(message.get("usage") or {})
                elif kind == "content_block_delta":
                    delta = data.get("delta") or {}
                    if delta.get("type") == "text_delta" and delta.get("text"):
                        parts.append(delta["text"])
                        if on_delta:
                            on_delta(delta["text"])
                    elif on_delta and delta.get("type") == "thinking_delta":
                        on_delta("")
                elif kind == "message_delta":
                    reply.finish_reason = (data.get("delta") or {}).get("stop_reason") or reply.finish_reason
                    anthropic_usage.update(data.get("usage") or {})
                elif kind == "message_stop":
                    ended = True
                    break
                elif kind == "error":
                    self._stream_error(data.get("error") or {}, parts)
        if self.endpoint.api == "anthropic":
            for key, value in _anthropic_usage(anthropic_usage).items():
                setattr(reply, key, value)
        reply.text = "".join(parts)
        if not ended:
            raise _Retryable(f"the stream ended before the reply did ({len(reply.text)} characters in)",
                             partial_text=reply.text)
        return reply

    def _stream_error(self, error: dict[str, Any], parts: list[str]) -> None:
        message = str(error.get("message") or error)
        words = f"{message} {error.get('type') or ''} {error.get('code') or ''}".lower()
        if any(marker in words for marker in QUOTA_MARKERS):
            raise QuotaError(f"{self.endpoint.name} refused the request for quota or billing ({message}); add credit "
                             "or raise the quota, or pick another endpoint.")
        raise _Retryable(f"error inside the stream ({message[:120]})", partial_text="".join(parts))


def _sse_events(lines: Iterator[str]) -> Iterator[str]:
    """The data of each server-sent event (data lines joined), skipping comments and event names."""
    data: list[str] = []
    for line in lines:
        if not line.strip():
            if data:
                yield "\n".join(data)
                data = []
            continue
        if line.startswith("data:"):
            data.append(line[5:].lstrip())
    if data:
        yield "\n".join(data)


def _openai_usage(usage: dict[str, Any]) -> dict[str, Any]:
    return {
        "prompt_tokens": usage.get("prompt_tokens"), "completion_tokens": usage.get("completion_tokens"),
        "cached_tokens": (usage.get("prompt_tokens_details") or {}).get("cached_tokens"),
        "reasoning_tokens": (usage.get("completion_tokens_details") or {}).get("reasoning_tokens"),
    }


def _anthropic_usage(usage: dict[str, Any]) -> dict[str, Any]:
    prompt = usage.get("input_tokens")
    cached = usage.get("cache_read_input_tokens")
    if prompt is not None:
        # Anthropic counts cache reads and writes apart from input_tokens; the prompt is all three.
        prompt += (cached or 0) + (usage.get("cache_creation_input_tokens") or 0)
    return {"prompt_tokens": prompt, "completion_tokens": usage.get("output_tokens"), "cached_tokens": cached,
            "reasoning_tokens": None}
