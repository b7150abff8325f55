"""HTTP jobs (``JobType.HTTP``): each item is one request, as ElasticJob's HTTP job.

Configured by the job's ``props`` under ElasticJob's names:

=====================================  ==================================  ========
prop                                   meaning                             default
=====================================  ==================================  ========
``http.uri``                           the URL (http or https)             required
``http.method``                        GET, POST, PUT, PATCH, DELETE, HEAD  required
``http.data``                          the request body (not with GET)     none
``http.connect.timeout.milliseconds``  connect timeout                     3000
``http.read.timeout.milliseconds``     read timeout                        5000
``http.content.type``                  the body's ``Content-Type``         none
=====================================  ==================================  ========

Each request carries the item's ``ShardingContext`` as JSON (``ShardingContext.to_json``,
camelCase) in the ``shardingContext`` header, non-ASCII characters escaped (``\\uXXXX``: a
header is ASCII). A status outside 2xx is a failure (``HttpJobFailed``, with the status and
the start of the body), and so is no response: a refused connection or a timeout. Redirects
are not followed (a 3xx fails, naming its status), unlike ElasticJob, which counts any
status below 400 as success and only logs the others.

The props used are the ones given to ``add_job``: like a script job's command, they are
what this process runs, whatever another instance stored in the registry.

Proxies and CA certificates come from the environment as httpx reads it (``HTTPS_PROXY``,
``NO_PROXY``, ``SSL_CERT_FILE``, ...).

Sending needs httpx, the ``http`` extra (``pip install 'shardjob[http]'``); without it,
adding an HTTP job raises ``HttpUnavailable``.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from scheduler.context import ShardingContext
from scheduler.errors import HttpJobFailed, mask_password

if TYPE_CHECKING:
    import httpx

    from scheduler.timeouts import Deadline

__all__ = [
    "HTTP_METHODS",
    "INSTALL_HINT",
    "SHARDING_CONTEXT_HEADER",
    "HttpItemRunner",
    "HttpProps",
    "HttpUnavailable",
    "check_http_props",
]

log = logging.getLogger("scheduler.jobs")

INSTALL_HINT = "pip install 'shardjob[http]'"
#: the request header holding the item's context (ElasticJob's ``HttpJobProperties.SHARDING_CONTEXT_KEY``)
SHARDING_CONTEXT_HEADER = "shardingContext"
#: a response body is read (a connection is reused only once its response was read) up to
#: this much; the rest is dropped with the connection
_BODY_LIMIT = 64 * 1024

HTTP_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE", "HEAD")
URI, METHOD, DATA = "http.uri", "http.method", "http.data"
CONNECT_TIMEOUT, READ_TIMEOUT = "http.connect.timeout.milliseconds", "http.read.timeout.milliseconds"
CONTENT_TYPE = "http.content.type"
KNOWN_PROPS = (URI, METHOD, DATA, CONNECT_TIMEOUT, READ_TIMEOUT, CONTENT_TYPE)


class HttpProps:
    """An HTTP job's props, checked (``check_http_props``)."""

    __slots__ = ("connect_timeout", "content_type", "data", "method", "read_timeout", "uri")

    def __init__(self, props: Mapping[str, str]) -> None:
        uri = props.get(URI, "").strip()
        parts = urlsplit(uri)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"props {URI!r} {mask_password(uri)!r}: an HTTP job needs an http:// or https:// URL")
        try:
            parts.port  # noqa: B018 (raises on a port that is not a number in 0-65535)
        except ValueError as exc:
            raise ValueError(f"props {URI!r} {mask_password(uri)!r}: {exc}") from None
        method = props.get(METHOD, "").strip().upper()
        if method not in HTTP_METHODS:
            raise ValueError(f"props {METHOD!r} {props.get(METHOD)!r}: must be one of {', '.join(HTTP_METHODS)}")
        data = props.get(DATA)
        if data is not None and method in ("GET", "HEAD"):
            raise ValueError(f"props {DATA!r}: a {method} request carries no body")
        self.uri = uri
        self.method = method
        self.data = data
        self.connect_timeout = _millis(props, CONNECT_TIMEOUT, 3000)
        self.read_timeout = _millis(props, READ_TIMEOUT, 5000)
        self.content_type = props.get(CONTENT_TYPE)


def _millis(props: Mapping[str, str], name: str, default: int) -> float:
    raw = props.get(name)
    if raw is None:
        return default / 1000
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value <= 0:
        raise ValueError(f"props {name!r} {raw!r}: must be a whole number of milliseconds > 0")
    return value / 1000


def check_http_props(props: Mapping[str, str]) -> HttpProps:
    """The props of an HTTP job, or ``ValueError`` naming the prop that is wrong."""
    return HttpProps(props)


class HttpUnavailable(RuntimeError):
    """An HTTP job was added but httpx (the ``http`` extra) is not installed."""


def require_httpx() -> None:
    """``HttpUnavailable`` naming the pip install unless httpx imports."""
    try:
        import httpx  # noqa: F401
    except ImportError:
        raise HttpUnavailable(f"HTTP jobs need httpx: {INSTALL_HINT}") from None


class HttpItemRunner:
    """One item of an HTTP job: one request (see the module doc). An ``ItemRunner``.

    Invariants: one ``httpx.Client`` per job, made at the first request and shared by every
    item and fire (httpx clients may be shared between threads; connections stay open
    between fires); ``close()`` closes it once no item is using it. An item that starts
    after ``close()`` (a shutdown that does not wait) gets a client of its own, closed
    after its request, so a closed client is never used and none is left open.
    """

    def __init__(self, props: HttpProps) -> None:
        require_httpx()  # at add_job, not at the first fire
        self.props = props
        self._lock = threading.Lock()
        self._client: httpx.Client | None = None
        self._in_use = 0
        self._closed = False

    def __call__(self, ctx: ShardingContext, keep_going: Callable[[], bool]) -> None:
        client, shared = self._take_client()
        try:
            self._send(client, ctx)
        finally:
            self._give_back(client, shared)

    def close(self) -> None:
        """The job stopped here: close the client now, or when its last request ends."""
        with self._lock:
            self._closed = True
            client, idle = self._client, self._in_use == 0
            if idle:
                self._client = None
        if client is not None and idle:
            client.close()

    def _take_client(self) -> tuple[httpx.Client, bool]:
        """The job's client and True, or after ``close()`` a client of its own and False."""
        with self._lock:
            if not self._closed:
                if self._client is None:
                    self._client = self._new_client()
                self._in_use += 1
                return self._client, True
        return self._new_client(), False

    def _give_back(self, client: httpx.Client, shared: bool) -> None:
        last = False
        if shared:
            with self._lock:
                self._in_use -= 1
                last = self._closed and self._in_use == 0 and self._client is client
                if last:
                    self._client = None
        if last or not shared:
            client.close()

    def _new_client(self) -> httpx.Client:
        import http.cookiejar

        import httpx

        props = self.props
        # Hazard: httpx keeps cookies between requests by default, so a Set-Cookie in one
        # response would be sent with every later item and fire; a jar that accepts none
        # keeps each request as independent as ElasticJob's connection per item.
        no_cookies = http.cookiejar.CookieJar(http.cookiejar.DefaultCookiePolicy(allowed_domains=[]))
        return httpx.Client(
            timeout=httpx.Timeout(props.read_timeout, connect=props.connect_timeout),
            cookies=no_cookies,
            follow_redirects=False,
        )

    def _send(self, client: httpx.Client, ctx: ShardingContext) -> None:
        import httpx

        props = self.props
        # re-encoded with ASCII escapes: httpx encodes header values as ASCII
        context = json.dumps(json.loads(ctx.to_json()), sort_keys=True)
        headers = {SHARDING_CONTEXT_HEADER: context}
        if props.content_type:
            headers["Content-Type"] = props.content_type
        body = props.data.encode("utf-8") if props.data is not None else None
        # a job's timeout_seconds caps the request: a sync call cannot be cancelled, but
        # its own timeouts can end it at the attempt's deadline
        deadline = ctx.deadline
        timeout = client.timeout
        if deadline is not None:
            left = max(deadline.remaining(), 0.001)
            timeout = httpx.Timeout(min(props.read_timeout, left), connect=min(props.connect_timeout, left))
        try:
            with client.stream(props.method, props.uri, content=body, headers=headers, timeout=timeout) as response:
                status = response.status_code
                read = bytearray()
                for chunk in response.iter_bytes():
                    read += chunk
                    if len(read) >= _BODY_LIMIT:
                        break
        except httpx.ConnectTimeout as exc:
            _expire_if_reached(deadline)
            raise self._failed(f"no connection within {_ms(props.connect_timeout)} ms ({CONNECT_TIMEOUT})") from exc
        except httpx.ReadTimeout as exc:
            _expire_if_reached(deadline)
            raise self._failed(f"no response within {_ms(props.read_timeout)} ms ({READ_TIMEOUT})") from exc
        except (httpx.HTTPError, httpx.InvalidURL) as exc:
            raise self._failed(f"{type(exc).__name__}: {exc}") from exc
        if not 200 <= status < 300:
            raise HttpJobFailed(props.method, props.uri, status=status, body=_text(bytes(read), response))
        log.debug(
            "job %s item %d: %s %s: status %d",
            ctx.job_name, ctx.sharding_item, props.method, mask_password(props.uri), status,
        )

    def _failed(self, reason: str) -> HttpJobFailed:
        return HttpJobFailed(self.props.method, self.props.uri, reason=reason)


def _expire_if_reached(deadline: Deadline | None) -> None:
    """A timeout cut to the attempt's deadline ended the request: expire the deadline now,
    so the item fails with ``JobTimeout``. Hazard: the timer expires it on a coordinator
    thread, and on a loaded machine the socket's timeout comes first; the item then failed
    as a request to the URL that timed out, not as the job's timeout."""
    if deadline is not None and deadline.remaining() <= 0:
        deadline.expire()


def _text(body: bytes, response: httpx.Response) -> str:
    try:
        return body.decode(response.charset_encoding or "utf-8", errors="replace")
    except LookupError:  # a charset Python does not know
        return body.decode("utf-8", errors="replace")


def _ms(seconds: float) -> int:
    return round(seconds * 1000)
