"""The endpoint client against a real HTTP server on 127.0.0.1 that speaks both APIs, streaming and
not: what comes back, what is retried (and after how long), what is not, and what the user is told."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from pkb_tui.errors import PkbError
from pkb_tui.generate.client import ChatClient, EndpointError, Message, QuotaError
from pkb_tui.generate.config import find_endpoint, load_endpoints
from pkb_tui.generate.extract import extract_code
from tests._llm_server import LlmServer, Scripted, models_toml

ONE_BLOCK = "Here:\n```python\nimport torch\n\n\ndef solution(x):\n    return x * 2\n```\nDone."
SEVERAL = ("Kernel source:\n```python\nSRC = 'extern \"C\" __global__ void k() {}'\n```\nInstall:\n```bash\npip install cupy\n```\n"
           "Wrapper:\n```python\ndef solution(x):\n    return len(SRC) + x\n```\n")
MODES = [("openai", True), ("openai", False), ("anthropic", True), ("anthropic", False)]


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PKB_TEST_KEY", "sk-local")


def _client(tmp_path: Path, server: LlmServer, api: str, stream: bool, **extra) -> ChatClient:
    config = models_toml(tmp_path / "models.toml", server.url, api=api, stream=stream, **extra)
    return ChatClient(load_endpoints(config)["local"])


def _ask(client: ChatClient, **kw):
    return client.complete("You write kernels.", [Message("user", "Write all_reduce.")], **kw)


@pytest.mark.parametrize("api,stream", MODES)
def test_a_reply_with_one_block_and_its_usage(tmp_path: Path, api: str, stream: bool) -> None:
    with LlmServer([Scripted(text=ONE_BLOCK, completion_tokens=42)]) as server:
        pieces: list[str] = []
        reply = _ask(_client(tmp_path, server, api, stream), on_delta=pieces.append)
        sent = server.requests[0]
    assert reply.text == ONE_BLOCK
    assert reply.finish_reason == ("end_turn" if api == "anthropic" else "stop")
    assert reply.model == "served-model-2026" and reply.attempts == 1
    assert (reply.prompt_tokens, reply.completion_tokens, reply.cached_tokens) == (120, 42, 20)
    assert reply.reasoning_tokens == (7 if api == "openai" else None)
    assert ("".join(pieces) == ONE_BLOCK) if stream else pieces == []
    assert extract_code(reply.text).code == "import torch\n\n\ndef solution(x):\n    return x * 2\n"
    # What was sent: the API's own shape, our key, max tokens and temperature from the config.
    body = sent["body"]
    assert body["max_tokens"] == 4096 and body["temperature"] == 0.2 and body["stream"] is stream
    if api == "openai":
        assert sent["path"] == "/chat/completions" and sent["headers"]["authorization"] == "Bearer sk-local"
        assert body["messages"][0] == {"role": "system", "content": "You write kernels."}
    else:
        assert sent["path"] == "/v1/messages" and sent["headers"]["x-api-key"] == "sk-local"
        assert body["system"] == "You write kernels." and body["messages"][0]["role"] == "user"
        assert sent["headers"]["anthropic-version"]


@pytest.mark.parametrize("api,stream", MODES)
def test_several_blocks_and_no_code(tmp_path: Path, api: str, stream: bool) -> None:
    with LlmServer([Scripted(text=SEVERAL), Scripted(text="I'd rather explain: use a ring.")]) as server:
        client = _client(tmp_path, server, api, stream)
        several, none = _ask(client), _ask(client)
    extracted = extract_code(several.text)
    assert extracted.code is not None and "SRC = " in extracted.code and "def solution" in extracted.code
    assert "pip install" not in extracted.code and extracted.blocks == 3
    assert extract_code(none.text).code is None and extract_code(none.text).how == "no code in reply"


@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_finish_reason_length_is_kept_and_the_cut_block_still_extracted(tmp_path: Path, api: str) -> None:
    cut_reply = "```python\ndef solution(x):\n    out = x.clone()\n    for i in range("
    reason = "max_tokens" if api == "anthropic" else "length"
    with LlmServer([Scripted(text=cut_reply, finish_reason=reason)]) as server:
        reply = _ask(_client(tmp_path, server, api, True))
    assert reply.finish_reason == reason and reply.hit_token_limit
    extracted = extract_code(reply.text)
    assert extracted.unterminated and "cut off" in extracted.how


@pytest.mark.parametrize("api,stream", MODES)
def test_429_with_retry_after_and_500s_are_retried(tmp_path: Path, api: str, stream: bool) -> None:
    script = [Scripted(status=429, headers={"retry-after": "0.3"}, error={"type": "rate_limit_error", "message": "slow down"}),
              Scripted(status=500), Scripted(status=503), Scripted(text=ONE_BLOCK)]
    with LlmServer(script) as server:
        reply = _ask(_client(tmp_path, server, api, stream))
        times = [r["at"] for r in server.requests]
    assert reply.text == ONE_BLOCK and reply.attempts == 4
    assert reply.retry_waits_s == [0.3, 0.1, 0.2]  # the server's retry-after, then back-off from 0.05 s doubling
    assert "HTTP 429" in reply.retries[0] and "retry-after" in reply.retries[0] and "HTTP 500" in reply.retries[1]
    assert times[1] - times[0] >= 0.3  # it did wait as long as the server asked


@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_a_cut_stream_is_retried_and_a_stream_always_cut_fails_with_its_partial_text(tmp_path: Path, api: str) -> None:
    with LlmServer([Scripted(text=ONE_BLOCK, cut_after=2), Scripted(text=ONE_BLOCK)]) as server:
        reply = _ask(_client(tmp_path, server, api, True))
    assert reply.text == ONE_BLOCK and reply.attempts == 2 and "stream ended" in reply.retries[0]
    with LlmServer([Scripted(text=ONE_BLOCK, cut_after=1)] * 3) as server:
        with pytest.raises(EndpointError) as info:
            _ask(_client(tmp_path, server, api, True, max_retries=2))
        assert len(server.requests) == 3
    assert "gave up after 3 attempts" in str(info.value) and info.value.partial_text == ONE_BLOCK[:24]


@pytest.mark.parametrize("api,status,error", [
    ("openai", 429, {"type": "insufficient_quota", "code": "insufficient_quota",
                     "message": "You exceeded your current quota, please check your plan and billing details."}),
    ("anthropic", 400, {"type": "invalid_request_error",
                        "message": "Your credit balance is too low to access the Anthropic API."}),
    ("anthropic", 402, {"type": "billing_error", "message": "Payment required."}),
])
def test_quota_errors_are_not_retried(tmp_path: Path, api: str, status: int, error: dict) -> None:
    with LlmServer([Scripted(status=status, error=error), Scripted(text=ONE_BLOCK)]) as server:
        with pytest.raises(QuotaError) as info:
            _ask(_client(tmp_path, server, api, True))
        assert len(server.requests) == 1
    assert "quota or billing" in str(info.value) and "add credit" in str(info.value)


def test_other_client_errors_fail_at_once_with_a_sentence(tmp_path: Path) -> None:
    script = [Scripted(status=400, error={"message": "max_tokens: 64000 > 32000, the maximum for this model"}),
              Scripted(status=401, error={"message": "invalid x-api-key"})]
    with LlmServer(script) as server:
        client = _client(tmp_path, server, "anthropic", True)
        with pytest.raises(EndpointError, match="max_tokens: 64000 > 32000.*max_output_tokens"):
            _ask(client)
        with pytest.raises(EndpointError, match=r"refused the key .*check \$PKB_TEST_KEY"):
            _ask(client)
        assert len(server.requests) == 2


def test_a_silent_server_times_out_and_is_retried(tmp_path: Path) -> None:
    hold = threading.Event()
    with LlmServer([Scripted(text=ONE_BLOCK, hold=hold), Scripted(text=ONE_BLOCK)]) as server:
        client = _client(tmp_path, server, "openai", False, timeout_s=0.5)
        try:
            reply = _ask(client)
        finally:
            hold.set()
    assert reply.attempts == 2 and "timed out" in reply.retries[0]


def test_the_concurrency_limit_holds_requests_in_flight(tmp_path: Path) -> None:
    in_flight, peak, lock = [0], [0], threading.Lock()

    def respond(record: dict) -> Scripted:
        return Scripted(text=ONE_BLOCK)

    with LlmServer(respond) as server:
        original = server._answer

        def slow_answer(handler, record, scripted):
            with lock:
                in_flight[0] += 1
                peak[0] = max(peak[0], in_flight[0])
            time.sleep(0.2)
            with lock:
                in_flight[0] -= 1
            original(handler, record, scripted)

        server._answer = slow_answer  # type: ignore[method-assign]
        client = _client(tmp_path, server, "openai", True, concurrency=2)
        threads = [threading.Thread(target=_ask, args=(client,)) for _ in range(5)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert len(server.requests) == 5
    assert peak[0] == 2


def test_max_completion_tokens_for_openai_reasoning_models(tmp_path: Path) -> None:
    with LlmServer([Scripted(text=ONE_BLOCK)]) as server:
        _ask(_client(tmp_path, server, "openai", False, max_tokens_param="max_completion_tokens"))
    body = server.requests[0]["body"]
    assert body["max_completion_tokens"] == 4096 and "max_tokens" not in body


def test_config_mistakes_are_one_sentence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    missing = tmp_path / "nope.toml"
    with pytest.raises(PkbError, match="No models config at .*nope.toml.*--models-config") as info:
        load_endpoints(missing)
    assert info.value.exit_code == 2
    bad = tmp_path / "bad.toml"
    bad.write_text('[endpoints.x]\napi = "gemini"\nbase_url = "http://127.0.0.1:1"\nmodel = "m"\n')
    with pytest.raises(PkbError, match="api must be one of openai, anthropic"):
        load_endpoints(bad)
    bad.write_text('[endpoints.x]\napi = "openai"\nmodel = "m"\n')
    with pytest.raises(PkbError, match="lacks base_url"):
        load_endpoints(bad)
    bad.write_text('[endpoints.x]\napi = "openai"\nbase_url = "http://127.0.0.1:1"\nmodel = "m"\nmax_tokens = 5\n')
    with pytest.raises(PkbError, match="unknown key.*max_tokens"):
        load_endpoints(bad)
    bad.write_text("[endpoints.x\n")
    with pytest.raises(PkbError, match="not valid TOML"):
        load_endpoints(bad)
    good = models_toml(tmp_path / "good.toml", "http://127.0.0.1:1", key_env="PKB_UNSET_KEY_FOR_TEST")
    monkeypatch.delenv("PKB_UNSET_KEY_FOR_TEST", raising=False)
    with pytest.raises(PkbError, match=r"\$PKB_UNSET_KEY_FOR_TEST, which is not set; export") as info:
        ChatClient(find_endpoint("local", good))
    assert info.value.exit_code == 2
    with pytest.raises(PkbError, match="No endpoint 'other'.*it has local"):
        find_endpoint("other", good)


def test_the_cli_says_what_to_fix_for_a_missing_key(cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = models_toml(tmp_path / "models.toml", "http://127.0.0.1:9", key_env="PKB_UNSET_KEY_FOR_TEST")
    monkeypatch.delenv("PKB_UNSET_KEY_FOR_TEST", raising=False)
    result = cli("--db", str(tmp_path / "runs.db"), "generate", "--task", "all_reduce", "--model", "local",
                 "--models-config", str(config))
    assert result.code == 2
    assert "PKB_UNSET_KEY_FOR_TEST, which is not set" in result.err and "Traceback" not in result.err
