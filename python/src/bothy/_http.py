"""The SDK's one HTTP client: base URL and API key from arguments or BOTHY_URL / BOTHY_API_KEY,
problem+json answers turned into typed errors, and a deadline on every request except streams
the caller paces (uploads, downloads, event streams)."""

from __future__ import annotations

import json
import os
from typing import Any, AsyncIterator, Dict, Mapping, Optional, Union

import httpx

from .errors import ConnectionError, SandboxError, TimeoutError, error_from_problem

DEFAULT_BASE_URL = "http://127.0.0.1:8080"
#: Creates can boot a VM under software emulation: a generous default per request.
DEFAULT_REQUEST_TIMEOUT = 120.0

Query = Mapping[str, Union[str, int, bool, None]]
Content = Union[bytes, str, AsyncIterator[bytes]]


def _env(name: str) -> Optional[str]:
    value = os.environ.get(name)
    return value if value else None


class ConnectionConfig:
    """Where the server is and the key to send: arguments, else BOTHY_URL / BOTHY_API_KEY."""

    def __init__(
        self,
        base_url: Optional[str] = None,
        api_key: Optional[str] = None,
        request_timeout: Optional[float] = None,
    ) -> None:
        #: The server's address, e.g. ``http://127.0.0.1:8080``.
        self.base_url = (base_url or _env("BOTHY_URL") or DEFAULT_BASE_URL).rstrip("/")
        #: Sent as ``Authorization: Bearer KEY``.
        self.api_key = api_key if api_key is not None else _env("BOTHY_API_KEY")
        #: Seconds each plain request may take.
        self.request_timeout = DEFAULT_REQUEST_TIMEOUT if request_timeout is None else request_timeout

    def auth_headers(self) -> Dict[str, str]:
        """The Authorization header for this key (none without a key)."""
        return {} if self.api_key is None else {"authorization": f"Bearer {self.api_key}"}

    def url(self, path: str) -> str:
        """The absolute URL of an API path."""
        return f"{self.base_url}{path}"

    def ws_url(self, path: str) -> str:
        """The WebSocket URL of an API path."""
        url = self.url(path)
        return "ws" + url[4:] if url.startswith("http") else url


def _clean(query: Optional[Query]) -> Dict[str, str]:
    out: Dict[str, str] = {}
    for k, v in (query or {}).items():
        if v is None:
            continue
        out[k] = ("true" if v else "false") if isinstance(v, bool) else str(v)
    return out


class AsyncHttp:
    """An httpx.AsyncClient bound to one server and key; made in, and used from, one event loop."""

    def __init__(self, config: ConnectionConfig) -> None:
        self.config = config
        self._client: Optional[httpx.AsyncClient] = None

    def _get(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=None)
        return self._client

    async def aclose(self) -> None:
        """Closes the connection pool."""
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def _unreachable(self, err: Exception) -> ConnectionError:
        return ConnectionError(
            f"Cannot reach bothy at {self.config.base_url} ({type(err).__name__}: {err}); is `bothy serve` running "
            "there? Set BOTHY_URL or base_url to its address.",
            "connection_failed",
        )

    async def send(
        self,
        method: str,
        path: str,
        *,
        query: Optional[Query] = None,
        json_body: Any = None,
        content: Optional[Content] = None,
        headers: Optional[Mapping[str, str]] = None,
        stream: bool = False,
        timeout: bool = True,
    ) -> httpx.Response:
        """Sends a request; a non-2xx answer raises its typed error. ``stream`` leaves the body unread."""
        client = self._get()
        hdrs = {**self.config.auth_headers(), **(headers or {})}
        body: Any = content
        if json_body is not None:
            hdrs["content-type"] = "application/json"
            body = json.dumps(json_body).encode()
        request = client.build_request(
            method,
            self.config.url(path),
            params=_clean(query),
            content=body,
            headers=hdrs,
            timeout=self.config.request_timeout if timeout else None,
        )
        try:
            res = await client.send(request, stream=True)
        except httpx.TimeoutException as err:
            raise TimeoutError(
                f"{method} {path} got no answer within {self.config.request_timeout:g} s.", "request_timeout"
            ) from err
        except httpx.TransportError as err:
            raise self._unreachable(err) from err
        if res.status_code >= 400:
            try:
                text = (await res.aread()).decode("utf-8", "replace")
            finally:
                await res.aclose()
            raise error_from_problem(res.status_code, text)
        if not stream:
            try:
                await res.aread()
            except httpx.TransportError as err:
                raise self._unreachable(err) from err
            finally:
                await res.aclose()
        return res

    async def json(self, method: str, path: str, **kwargs: Any) -> Any:
        """A request whose answer is JSON."""
        res = await self.send(method, path, **kwargs)
        try:
            return res.json()
        except ValueError as err:
            raise SandboxError(
                f"{method} {path} answered something that is not JSON; is BOTHY_URL ({self.config.base_url}) a "
                "bothy server?",
                "bad_response",
            ) from err
