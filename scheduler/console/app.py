"""The console's routes: pages over ``LiveView`` (reads) and ``Cluster`` (actions), the
JSON API in ``cluster_json``'s forms, and the history pages over ``HistoryReader``.

Invariants:
- reads come from the watch-fed ``LiveView`` (no registry round trip per page); every
  action goes through ``Cluster``, whose writes are versioned, so a page a moment behind
  never makes a write land over a newer state;
- ``GET /api/jobs`` is exactly ``shardjob jobs --json`` and ``GET /api/jobs/{name}``
  exactly ``shardjob status JOB --json`` (same functions of the same views);
- no GET changes anything; every POST needs the admin (session or, for the API, HTTP
  basic auth) and, when the session authenticates it, the session's CSRF token;
- the registry URL is only ever shown masked; the admin password is never shown.
Blocking calls (registry writes, history queries) run in Starlette's thread pool.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from scheduler.console import INSTALL_HINT, ConsoleUnavailable

try:
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.requests import Request
    from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
    from starlette.routing import Route
    from starlette.templating import Jinja2Templates
except ImportError as exc:  # the optional extra is not installed
    raise ConsoleUnavailable(f"the console needs {exc.name or 'starlette'}: {INSTALL_HINT}") from None

from registry.errors import RegistryError, ShardJobError
from registry.protocol import RegistryCenter
from scheduler.cli_format import iso_utc
from scheduler.cli_ops import parse_field
from scheduler.cluster import Cluster, LiveInstances, StaleConfig
from scheduler.cluster_json import brief_json, detail_json, dump_json, server_json
from scheduler.cluster_views import JobStatus, detail_of
from scheduler.config import JobConfig
from scheduler.console.auth import ADMIN, AdminPassword, Session, SessionCodec, basic_credentials
from scheduler.console.forms import (
    FIXED_FIELDS,
    form_values,
    format_items,
    history_query,
    json_body,
    parse_items,
)
from scheduler.console.live_view import LiveView
from scheduler.console.sparkline import sparkline_svg
from sharding.operations import NoSuchJob

__all__ = ["COOKIE", "Console"]

log = logging.getLogger(__name__)

#: the session cookie's name
COOKIE = "shardjob_session"
#: rows per history page
PAGE_SIZE = 50
#: the runs the job page draws its sparklines from
SPARK_RUNS = 60

_TEMPLATES = Path(__file__).with_name("templates")

Endpoint = Callable[[Request], Awaitable[Response]]


class Forbidden(Exception):
    """A POST refused: no admin, or a missing/wrong CSRF token."""


class Console:
    """One console over one registry namespace (and optionally a history database)."""

    def __init__(
        self,
        reg: RegistryCenter,
        *,
        registry_label: str,
        password: AdminPassword | None,
        history_url: str | None = None,
        login_required: bool = False,
        refresh_seconds: float = 2.0,
        secure_cookies: bool = False,
    ) -> None:
        self.view = LiveView(reg).start()
        self.cluster = Cluster(reg)
        self._label = registry_label
        self._password = password
        self._history_url = history_url
        self._history: Any = None
        self._login_required = login_required
        self._refresh_ms = int(refresh_seconds * 1000)
        self._secure = secure_cookies
        self._codec = SessionCodec()
        self._templates = Jinja2Templates(directory=str(_TEMPLATES))
        self._templates.env.filters["when"] = lambda t: "" if t is None else iso_utc(t)[:19].replace("T", " ")
        self.app = Starlette(routes=self._routes())

    def close(self) -> None:
        self.view.close()
        if self._history is not None:
            self._history.close()

    # -- routing --------------------------------------------------------------------------
    def _routes(self) -> list[Route]:
        return [
            Route("/", self._page(self.jobs_page)),
            Route("/jobs/{name}", self._page(self.job_page)),
            Route("/jobs/{name}/dump", self._page(self.dump_page)),
            Route("/jobs/{name}/config", self._page(self.config_page), methods=["GET"]),
            Route("/jobs/{name}/config", self._action(self.config_post), methods=["POST"]),
            Route("/jobs/{name}/action", self._action(self.job_action), methods=["POST"]),
            Route("/servers", self._page(self.servers_page)),
            Route("/history", self._page(self.history_page)),
            Route("/login", self._open(self.login_page), methods=["GET"]),
            Route("/login", self._open(self.login_post), methods=["POST"]),
            Route("/logout", self._action(self.logout), methods=["POST"]),
            Route("/api/jobs", self._api_read(self.api_jobs)),
            Route("/api/jobs/{name}", self._api_read(self.api_job)),
            Route("/api/servers", self._api_read(self.api_servers)),
            Route("/api/jobs/{name}/{verb:str}", self.api_action, methods=["POST"]),
        ]

    def _session(self, request: Request) -> tuple[Session, bool]:
        found = self._codec.decode(request.cookies.get(COOKIE))
        return (found, False) if found is not None else (Session(), True)

    def _with_cookie(self, response: Response, session: Session) -> Response:
        response.set_cookie(
            COOKIE,
            self._codec.encode(session),
            httponly=True,
            samesite="strict",
            secure=self._secure,
            path="/",
        )
        return response

    def _open(self, handler: Callable[[Request, Session], Awaitable[Response]]) -> Endpoint:
        async def endpoint(request: Request) -> Response:
            session, _ = self._session(request)
            try:
                response = await handler(request, session)
            except Forbidden as exc:
                response = self._render(request, session, "error.html", {"message": str(exc)}, 403)
            return self._with_cookie(response, session)

        return endpoint

    def _page(self, handler: Callable[[Request, Session], Awaitable[Response]]) -> Endpoint:
        async def endpoint(request: Request, session: Session) -> Response:
            if self._login_required and not session.admin:
                return RedirectResponse("/login?" + urlencode({"next": request.url.path}), 303)
            try:
                return await handler(request, session)
            except NoSuchJob as exc:
                return self._render(request, session, "error.html", {"message": f"no such job: {exc}"}, 404)

        return self._open(endpoint)

    def _action(self, handler: Callable[[Request, Session, Any], Awaitable[Response]]) -> Endpoint:
        async def endpoint(request: Request, session: Session) -> Response:
            form = await request.form()
            if not session.csrf_ok(_text(form.get("csrf"))):
                raise Forbidden("refused: the form's CSRF token is missing or wrong (reload the page and retry)")
            if not session.admin:
                raise Forbidden("refused: only the admin may act; log in first")
            return await handler(request, session, form)

        return self._open(endpoint)

    def _render(
        self, request: Request, session: Session, template: str, context: dict[str, Any], status: int = 200
    ) -> HTMLResponse:
        fragment = request.query_params.get("fragment") == "1"
        flash = None
        if not fragment:
            flash, session.flash = session.flash, None
        base = {
            "session": session,
            "admin": session.admin,
            "can_login": self._password is not None,
            "read_only": self._password is None,
            "registry": self._label,
            "has_history": self._history_url is not None,
            "flash": flash,
            "fragment": fragment,
            "refresh_ms": self._refresh_ms,
            "fragment_src": _with_query(request, fragment="1"),
        }
        response: HTMLResponse = self._templates.TemplateResponse(
            request, template, {**base, **context}, status_code=status
        )
        return response

    # -- pages ----------------------------------------------------------------------------
    async def jobs_page(self, request: Request, session: Session) -> Response:
        briefs = await run_in_threadpool(self.view.jobs)
        counts = {status.name: 0 for status in JobStatus}
        for brief in briefs:
            counts[brief.status.name] += 1
        query = request.query_params.get("q", "").strip()
        status = request.query_params.get("status", "").strip().upper()
        if status and status not in counts:
            status = ""
        shown = [
            b for b in briefs if (not query or query.lower() in b.name.lower()) and (not status or b.status.name == status)
        ]
        context = {"jobs": shown, "total": len(briefs), "counts": counts, "q": query, "status": status}
        return self._render(request, session, "jobs.html", context)

    async def job_page(self, request: Request, session: Session) -> Response:
        name = request.path_params["name"]
        state = await run_in_threadpool(self.view.state, name)
        runs, sparks = await run_in_threadpool(self._recent_runs, name)
        context = {"job": detail_of(state), "queue": sorted(state.failover.entries), "runs": runs, "sparks": sparks}
        return self._render(request, session, "job.html", context)

    async def dump_page(self, request: Request, session: Session) -> Response:
        """Every node of the job as stored (``shardjob dump JOB --json``), read afresh."""
        dump = await run_in_threadpool(self.cluster.dump, request.path_params["name"])
        return Response(json.dumps(dump_json(dump), indent=2, sort_keys=True), media_type="application/json")

    async def servers_page(self, request: Request, session: Session) -> Response:
        servers = await run_in_threadpool(self.view.servers)
        return self._render(request, session, "servers.html", {"servers": servers})

    async def history_page(self, request: Request, session: Session) -> Response:
        params = request.query_params
        filters = {k: params.get(k, "").strip() for k in ("job", "item", "instance", "outcome", "since", "until")}
        context: dict[str, Any] = {"filters": filters, "runs": [], "error": None, "page": 1, "more": False}
        if self._history_url is None:
            context["error"] = "no history database: start the console with --history DB_URL"
            return self._render(request, session, "history.html", context)
        try:
            page = max(1, int(params.get("page", "1")))
            query = history_query(filters)
        except ValueError as exc:
            context["error"] = str(exc)
            return self._render(request, session, "history.html", context, 400)
        try:
            rows = await run_in_threadpool(self._executions, query, (page - 1) * PAGE_SIZE)
        except Exception as exc:  # the database's own error, shown, not a 500
            context["error"] = f"history database error: {exc}"
            return self._render(request, session, "history.html", context, 500)
        context.update(
            runs=rows[:PAGE_SIZE],
            page=page,
            more=len(rows) > PAGE_SIZE,
            prev_url=_with_query(request, page=str(page - 1)),
            next_url=_with_query(request, page=str(page + 1)),
        )
        return self._render(request, session, "history.html", context)

    async def config_page(self, request: Request, session: Session) -> Response:
        name = request.path_params["name"]
        config, version = await run_in_threadpool(self.cluster.config_version, name)
        return self._config_form(request, session, name, config, version, {}, None)

    def _config_form(
        self,
        request: Request,
        session: Session,
        name: str,
        config: JobConfig,
        version: int,
        entered: dict[str, str],
        error: str | None,
        status: int = 200,
    ) -> Response:
        current = form_values(config)
        fields = [(field, entered.get(field, value), value) for field, value in current.items()]
        context = {"name": name, "fields": fields, "version": version, "error": error, "fixed": FIXED_FIELDS}
        return self._render(request, session, "config.html", context, status)

    # -- actions (pages) --------------------------------------------------------------------
    async def config_post(self, request: Request, session: Session, form: Any) -> Response:
        name = request.path_params["name"]
        config, version = await run_in_threadpool(self.cluster.config_version, name)
        current = form_values(config)
        # a field the form did not send is left as it is (never blanked)
        entered = {field: text for field in current if (text := _text(form.get(f"field_{field}"))) is not None}
        try:
            expected = int(_text(form.get("version")) or "")
        except ValueError:
            return self._config_form(request, session, name, config, version, entered, "the form has no version; reload it")
        try:
            changes = dict(parse_field(f"{field}={text}") for field, text in entered.items() if text != current[field])
            if changes:
                await run_in_threadpool(lambda: self.cluster.update_config(name, expected_version=expected, **changes))
        except StaleConfig as exc:
            message = f"{exc}. The form now shows the current values; your entries were not saved."
            return self._config_form(request, session, name, exc.current, exc.version, {}, message, 409)
        except ValueError as exc:
            return self._config_form(request, session, name, config, version, entered, str(exc), 400)
        if changes:
            session.flash = ("ok", f"job {name}: configuration saved ({', '.join(sorted(changes))})")
        else:
            session.flash = ("ok", f"job {name}: nothing changed")
        return RedirectResponse(f"/jobs/{name}", 303)

    async def job_action(self, request: Request, session: Session, form: Any) -> Response:
        name = request.path_params["name"]
        action = _text(form.get("action")) or ""
        server = _text(form.get("server")) or None
        instance = _text(form.get("instance")) or None
        items_text = _text(form.get("items")) or ""
        try:
            items = parse_items(items_text)
            message = await run_in_threadpool(self._act, name, action, server, items, instance, form.get("force") == "1")
            session.flash = ("ok", message)
        except (NoSuchJob, LiveInstances, ValueError, RegistryError, ShardJobError, TimeoutError) as exc:
            session.flash = ("error", f"job {name}: {action} refused: {exc}")
        target = "/" if action == "remove" and session.flash[0] == "ok" else f"/jobs/{name}"
        return RedirectResponse(target, 303)

    def _act(
        self, name: str, action: str, server: str | None, items: list[int] | None, instance: str | None, force: bool
    ) -> str:
        scope = f" on server {server}" if server else f" items {format_items(items)}" if items else ""
        if action == "trigger":
            asked = self.cluster.trigger(name)
            return f"job {name}: triggered on {len(asked)} instance(s)"
        if action in ("disable", "enable"):
            getattr(self.cluster, action)(name, server=server, items=items)
            return f"job {name}: {action}d{scope or ' everywhere'}"
        if action == "shutdown":
            asked = self.cluster.shutdown(name, instance=instance)
            return f"job {name}: asked {', '.join(asked) or 'no instance'} to shut down"
        if action == "remove":
            self.cluster.remove(name, force=force, timeout=30.0)
            return f"job {name}: removed"
        raise ValueError(f"unknown action {action!r} (trigger, disable, enable, shutdown, remove)")

    async def login_page(self, request: Request, session: Session) -> Response:
        return self._render(request, session, "login.html", {"error": None, "next": _safe_next(request)})

    async def login_post(self, request: Request, session: Session) -> Response:
        form = await request.form()
        if not session.csrf_ok(_text(form.get("csrf"))):
            raise Forbidden("refused: the form's CSRF token is missing or wrong (reload the page and retry)")
        password = _text(form.get("password")) or ""
        user = _text(form.get("user")) or ADMIN
        target = _safe_next(request, _text(form.get("next")))
        if self._password is None:
            error = "no admin password is set (SHARDJOB_CONSOLE_PASSWORD or --password-file): read-only console"
        elif await run_in_threadpool(self._password.check, user, password):
            fresh = Session(user=ADMIN, flash=("ok", "logged in as admin"))
            session.__dict__.update(dataclasses.asdict(fresh))  # a new CSRF token on login
            return RedirectResponse(target, 303)
        else:
            log.warning("console: failed login for user %r from %s", user[:40], request.client)
            error = "wrong user or password"
        return self._render(request, session, "login.html", {"error": error, "next": target}, 401)

    async def logout(self, request: Request, session: Session, form: Any) -> Response:
        session.__dict__.update(dataclasses.asdict(Session(flash=("ok", "logged out"))))
        return RedirectResponse("/", 303)

    # -- API --------------------------------------------------------------------------------
    def _api_read(self, handler: Callable[[Request], Awaitable[Any]]) -> Endpoint:
        async def endpoint(request: Request) -> Response:
            if self._login_required and not await run_in_threadpool(self._api_admin, request):
                return _api_error(401, "log in: HTTP basic auth as admin", basic=True)
            try:
                return JSONResponse(await handler(request))
            except NoSuchJob as exc:
                return _api_error(404, f"no such job: {exc}")
            except ValueError as exc:
                return _api_error(400, str(exc))

        return endpoint

    def _api_admin(self, request: Request) -> bool:
        """The request is the admin's (basic auth, or the session): a scrypt check, so it
        runs in the thread pool, never on the event loop."""
        credentials = basic_credentials(request.headers.get("authorization"))
        if credentials is not None:
            return self._password is not None and self._password.check(*credentials)
        session, _ = self._session(request)
        return session.admin

    async def api_jobs(self, request: Request) -> Any:
        return [brief_json(b) for b in await run_in_threadpool(self.view.jobs)]

    async def api_job(self, request: Request) -> Any:
        return detail_json(await run_in_threadpool(self.view.job, request.path_params["name"]))

    async def api_servers(self, request: Request) -> Any:
        return [server_json(s) for s in await run_in_threadpool(self.view.servers)]

    async def api_action(self, request: Request) -> Response:
        name, verb = request.path_params["name"], request.path_params["verb"]
        credentials = basic_credentials(request.headers.get("authorization"))
        if credentials is not None:
            ok = self._password is not None and await run_in_threadpool(self._password.check, *credentials)
            if not ok:
                return _api_error(401, "wrong user or password", basic=True)
        else:
            session = self._codec.decode(request.cookies.get(COOKIE))
            if session is None:
                return _api_error(401, "authenticate: HTTP basic auth as admin", basic=True)
            if not session.admin:
                return _api_error(403, "only the admin may act")
            if not session.csrf_ok(request.headers.get("x-csrf-token")):
                return _api_error(403, "a session needs its CSRF token in the X-CSRF-Token header")
        if verb not in ("trigger", "disable", "enable"):
            return _api_error(404, f"no action {verb!r} (trigger, disable, enable)")
        try:
            body = json_body(await request.body())
            server = body.get("server")
            items = body.get("items")
            if server is not None and not isinstance(server, str):
                raise ValueError('"server" must be a string (an IP)')
            if items is not None and (
                not isinstance(items, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in items)
            ):
                raise ValueError('"items" must be a list of whole numbers')
            if verb == "trigger" and (server is not None or items is not None):
                raise ValueError("trigger takes no server or items")
            message = await run_in_threadpool(self._act, name, verb, server, items, None, False)
        except NoSuchJob as exc:
            return _api_error(404, f"no such job: {exc}")
        except (ValueError, LiveInstances) as exc:
            return _api_error(400, str(exc))
        except (RegistryError, ShardJobError) as exc:
            return _api_error(503, str(exc))
        return JSONResponse({"ok": True, "message": message})

    # -- history ------------------------------------------------------------------------------
    def _reader(self) -> Any:
        if self._history is None:
            from scheduler.history import HistoryReader

            self._history = HistoryReader(self._history_url) if self._history_url else None
        return self._history

    def _executions(self, query: dict[str, Any], offset: int) -> list[Any]:
        rows: list[Any] = self._reader().executions(limit=PAGE_SIZE + 1, offset=offset, **query)
        return rows

    def _recent_runs(self, name: str) -> tuple[list[Any], dict[str, str]]:
        if self._history_url is None:
            return [], {}
        try:
            runs: list[Any] = self._reader().executions(name, limit=SPARK_RUNS)
        except Exception as exc:  # a history problem must not take the job page down
            log.warning("console: history unavailable for job %s: %s", name, exc)
            return [], {}
        oldest_first = list(reversed(runs))
        durations = [r.end_time - r.start_time for r in oldest_first if r.end_time is not None]
        lateness = [max(0.0, r.start_time - r.fire_time) for r in oldest_first]
        sparks = {
            "duration": sparkline_svg(durations, label="duration of recent runs"),
            "lateness": sparkline_svg(lateness, label="lateness of recent runs"),
        }
        return runs[:10], sparks


# -- helpers ------------------------------------------------------------------------------------
def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _with_query(request: Request, **changes: str) -> str:
    params = dict(request.query_params)
    params.update(changes)
    return f"{request.url.path}?{urlencode(params)}"


def _safe_next(request: Request, given: str | None = None) -> str:
    """Where to go after login: a path of this console only (never another site)."""
    target = given if given is not None else request.query_params.get("next", "/")
    return target if target.startswith("/") and not target.startswith("//") else "/"


def _api_error(status: int, message: str, *, basic: bool = False) -> JSONResponse:
    headers = {"WWW-Authenticate": 'Basic realm="shardjob console"'} if basic else None
    return JSONResponse({"error": message}, status_code=status, headers=headers)
