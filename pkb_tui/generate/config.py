"""Endpoints from a TOML file (`~/.config/pkb-tui/models.toml` or --models-config):

    [endpoints.claude]
    api = "anthropic"                      # or "openai" (any OpenAI-compatible chat completions server)
    base_url = "https://api.anthropic.com" # openai: the URL that /chat/completions hangs from (…/v1)
    model = "claude-sonnet-4-5"
    api_key_env = "ANTHROPIC_API_KEY"      # the NAME of the environment variable; the key never enters runs.db
    max_output_tokens = 16000
    temperature = 0.7
    price_input_per_mtok = 3.0             # USD per million tokens
    price_output_per_mtok = 15.0
    concurrency = 4                        # requests in flight at once on this endpoint
    timeout_s = 600                        # per request; a stream fails when silent this long
    stream = true
    max_retries = 4
    max_tokens_param = "max_tokens"        # openai: "max_completion_tokens" for OpenAI's reasoning models

A local server (vLLM, Ollama) may leave api_key_env out.
"""

from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pkb_tui.errors import PkbError

APIS = ("openai", "anthropic")
DEFAULT_CONFIG = Path("~/.config/pkb-tui/models.toml")


@dataclass(frozen=True)
class Endpoint:
    name: str
    api: str
    base_url: str
    model: str
    api_key_env: str | None = None
    max_output_tokens: int = 8192
    temperature: float | None = None
    price_input_per_mtok: float = 0.0
    price_output_per_mtok: float = 0.0
    concurrency: int = 4
    timeout_s: float = 600.0
    stream: bool = True
    max_retries: int = 4
    retry_base_s: float = 1.0  # first back-off when the server gives no retry-after; doubles each time
    retry_max_wait_s: float = 120.0  # a longer retry-after fails the request instead of stalling the run
    # OpenAI's reasoning models refuse max_tokens and want max_completion_tokens; most other servers take max_tokens.
    max_tokens_param: str = "max_tokens"

    @property
    def slug(self) -> str:
        """The model id as a folder name: solutions/gen/<slug>/..."""
        return re.sub(r"[^A-Za-z0-9._-]+", "-", self.model).strip("-").lower() or self.name

    def api_key(self) -> str | None:
        """The key from the environment variable the file names; PkbError when it is unset."""
        if not self.api_key_env:
            return None
        key = os.environ.get(self.api_key_env, "").strip()
        if not key:
            raise PkbError(
                f"Endpoint {self.name!r} takes its API key from ${self.api_key_env}, which is not set; "
                f"export {self.api_key_env}=... (or remove api_key_env for a server that needs no key)."
            )
        return key

    def cost_usd(self, prompt_tokens: int | None, completion_tokens: int | None) -> float:
        return ((prompt_tokens or 0) * self.price_input_per_mtok + (completion_tokens or 0) * self.price_output_per_mtok) / 1e6

    def describe(self) -> dict[str, Any]:
        """What runs.db keeps of the endpoint (no key, only the variable's name)."""
        return {k: getattr(self, k) for k in (
            "name", "api", "base_url", "model", "api_key_env", "max_output_tokens", "temperature",
            "price_input_per_mtok", "price_output_per_mtok", "concurrency", "timeout_s", "stream", "max_retries")}


_TYPES: dict[str, tuple[type, ...]] = {
    "api": (str,), "base_url": (str,), "model": (str,), "api_key_env": (str,), "max_output_tokens": (int,),
    "temperature": (int, float), "price_input_per_mtok": (int, float), "price_output_per_mtok": (int, float),
    "concurrency": (int,), "timeout_s": (int, float), "stream": (bool,), "max_retries": (int,),
    "retry_base_s": (int, float), "retry_max_wait_s": (int, float), "max_tokens_param": (str,),
}


def config_path(given: str | Path | None = None) -> Path:
    if given:
        return Path(given).expanduser()
    env = os.environ.get("PKB_MODELS_CONFIG")
    return Path(env).expanduser() if env else DEFAULT_CONFIG.expanduser()


def load_endpoints(path: str | Path | None = None) -> dict[str, Endpoint]:
    """Every endpoint of the file by name; PkbError saying what to fix for a missing or bad file."""
    file = config_path(path)
    if not file.is_file():
        raise PkbError(
            f"No models config at {file}; create it with an [endpoints.NAME] table (api, base_url, model, "
            "api_key_env) or pass --models-config PATH (README: Generate)."
        )
    try:
        data = tomllib.loads(file.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise PkbError(f"{file} is not valid TOML ({exc}); fix it.") from exc
    tables = data.get("endpoints")
    if not isinstance(tables, dict) or not tables:
        raise PkbError(f"{file} defines no endpoint; add an [endpoints.NAME] table with api, base_url and model.")
    return {name: _endpoint(file, name, table) for name, table in tables.items()}


def _endpoint(file: Path, name: str, table: Any) -> Endpoint:
    where = f"{file} [endpoints.{name}]"
    if not isinstance(table, dict):
        raise PkbError(f"{where} must be a table.")
    unknown = sorted(set(table) - set(_TYPES))
    if unknown:
        raise PkbError(f"{where} has unknown key(s) {', '.join(unknown)}; known: {', '.join(_TYPES)}.")
    for key in ("api", "base_url", "model"):
        if not table.get(key):
            raise PkbError(f"{where} lacks {key}; add it.")
    for key, value in table.items():
        if not isinstance(value, _TYPES[key]) or (isinstance(value, bool) and bool not in _TYPES[key]):
            wanted = " or ".join(t.__name__ for t in _TYPES[key])
            raise PkbError(f"{where}: {key} must be a {wanted} (got {value!r}).")
    if table["api"] not in APIS:
        raise PkbError(f"{where}: api must be one of {', '.join(APIS)} (got {table['api']!r}).")
    if not str(table["base_url"]).startswith(("http://", "https://")):
        raise PkbError(f"{where}: base_url must start with http:// or https:// (got {table['base_url']!r}).")
    if table.get("max_tokens_param", "max_tokens") not in ("max_tokens", "max_completion_tokens"):
        raise PkbError(f"{where}: max_tokens_param must be max_tokens or max_completion_tokens.")
    for key in ("max_output_tokens", "concurrency"):
        if key in table and table[key] < 1:
            raise PkbError(f"{where}: {key} must be at least 1.")
    values: dict[str, Any] = {k: float(v) if _TYPES[k] == (int, float) else v for k, v in table.items()}
    return Endpoint(name=name, **values)


def find_endpoint(name: str, path: str | Path | None = None) -> Endpoint:
    endpoints = load_endpoints(path)
    if name not in endpoints:
        raise PkbError(f"No endpoint {name!r} in {config_path(path)}; it has {', '.join(endpoints)}.")
    return endpoints[name]
