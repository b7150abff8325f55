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
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import urlsplit

__all__ = ["HTTP_METHODS", "HttpProps", "check_http_props"]

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
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"props {URI!r} {uri!r}: an HTTP job needs an http:// or https:// URL")
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
