"""BaseServer and SimpleServer: a gym server is a FastAPI app plus the runtime around it.

Subclass :class:`SimpleServer` and implement ``setup_webserver() -> FastAPI``. ``build_app()`` returns the
fully wrapped ASGI app (telemetry set up first, liveness routes, optional profiling, then the gym layers in
the order ``_stack.LAYER_ORDER`` declares: owner routing, context, the one SERVER span, sessions, failure
reply, disconnect cancellation, model calls); it runs under any ASGI server and in tests.
``run_webserver()`` serves it under uvicorn from the global config. Servers are started by the launcher
(``gym-obs serve``), which imports ``entrypoint`` and calls :func:`load_server` in each child process.
"""

from __future__ import annotations

import abc
import contextlib
import importlib
import os
from collections.abc import AsyncIterator, Callable
from typing import Any, ClassVar

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp

from gym_obs.client import ServerClient, global_config_from_environment
from gym_obs.client.http_client import close_global_aiohttp_client, is_global_aiohttp_client_setup
from gym_obs.config import GlobalConfig, ServerInstanceConfig
from gym_obs.failures.kinds import Boundary
from gym_obs.server._access_log import install_query_free_access_log
from gym_obs.server._context import PathContext
from gym_obs.server._disconnect import DEFAULT_WATCH_DELAY_S, DisconnectWatch
from gym_obs.server._failure_reply import FailureReplies, boundary_for_server_type
from gym_obs.server._heap import freeze_startup_heap
from gym_obs.server._instrumentation import HEALTH_ROUTES
from gym_obs.server._native_telemetry import disable_native_telemetry, drop_exception_observer
from gym_obs.server._profiler import profiler_for
from gym_obs.server._server_errors import steps_on_top
from gym_obs.server._session_routing import (
    OwnerRoutingMiddleware,
    owner_routing_dir,
    worker_routing_environment,
)
from gym_obs.server._span import add_server_span
from gym_obs.server._stack import Install, build_stack
from gym_obs.server._validation_log import log_validation_failures
from gym_obs.server.inflight_route import InflightRoute, inflight_route_for
from gym_obs.server.model_calls import install_model_calls
from gym_obs.server.ops import nofile_needed, set_ulimit
from gym_obs.server.sessions import (
    OwnedSessionRouting,
    SessionLayer,
    SessionSigner,
    derive_session_key,
    ensure_session_secret,
)
from gym_obs.server.startup import app_build, emit_process_startup, mark_entered, mark_workers_spawning
from gym_obs.server.uvicorn import (
    ServerStartupError,
    bind_listen_socket,
    build_uvicorn_config,
    check_worker_count,
    serve_uvicorn,
    validate_forwarded_allow_ips,
)
from gym_obs.telemetry import names
from gym_obs.telemetry.logging import configure_logging, get_logger
from gym_obs.telemetry.resources import process_gauges_requested, start_process_gauges
from gym_obs.telemetry.settings import resolve_server_instrumentation
from gym_obs.telemetry.setup import TelemetryHandle, setup_telemetry, shutdown_telemetry

__all__ = ["BaseServer", "SimpleServer", "import_server_class", "load_server"]

_WORKER_FACTORY = "gym_obs.server.base_server:_worker_app"
_FLUSH_TIMEOUT_S = 5.0

_log = get_logger("gym_obs.server")


class BaseServer:
    """What every gym server process has: its name, the global config, its own entry and a ServerClient."""

    def __init__(self, server_name: str, global_config: GlobalConfig) -> None:
        self.server_name = server_name
        self.global_config = global_config
        self.config: ServerInstanceConfig = global_config.server(server_name)
        self.server_type: str = self.config.server_type
        self._server_client: ServerClient | None = None

    @property
    def where(self) -> str:
        """This server's key in the global config, for error messages."""
        return f"servers.{self.server_name}"

    @property
    def failure_boundary(self) -> Boundary:
        """The boundary this server's own failures are reported at (follows ``server_type``)."""
        return boundary_for_server_type(self.server_type)

    @property
    def server_client(self) -> ServerClient:
        """Reaches the other servers of the same global config."""
        if self._server_client is None:
            self._server_client = ServerClient(self.global_config)
        return self._server_client

    def multiple_workers_unsupported_reason(self) -> str | None:
        """Why this server cannot run ``num_workers > 1`` (state in process memory), else ``None``."""
        return None


class SimpleServer(BaseServer, abc.ABC):
    """A gym server: implement :meth:`setup_webserver`; the runtime adds everything else."""

    #: Delay before a running handler starts watching for the caller's disconnect (see _disconnect);
    #: ``None``: handlers are never cancelled for a caller that went away.
    disconnect_watch_delay_s: ClassVar[float | None] = DEFAULT_WATCH_DELAY_S
    #: Give every caller a signed session id (``request.session["session_id"]``; see ``sessions``).
    sessions_enabled: ClassVar[bool] = True
    #: With ``num_workers > 1``, serve every request of a session on the worker that owns it, so per-session
    #: state in process memory is never split across workers (see ``_session_routing``).
    routes_sessions_to_owner: ClassVar[bool] = False

    def __init__(self, server_name: str, global_config: GlobalConfig) -> None:
        super().__init__(server_name, global_config)
        self.telemetry: TelemetryHandle | None = None
        self._started = False
        self._session_key: bytes | None = None

    # -- sessions ------------------------------------------------------------------------------------------

    def get_session_middleware_key(self) -> bytes:
        """The HMAC key of this server's session tokens: from ``session_secret`` when configured, else
        from the deployment's generated secret (shared with this server's workers through the
        environment). Per server: a token of one server is worthless at another."""
        if self._session_key is None:
            self._session_key = derive_session_key(self.server_name, self.config.session_secret)
        return self._session_key

    def owned_session_routing(self) -> OwnedSessionRouting:
        """Where requests name their session (cookie, header, JSON field) and how long a session and its
        owning worker stay bound; override to name sessions by a JSON field or to expire them."""
        return OwnedSessionRouting()

    def _workers_reason(self) -> str | None:
        reason = self.multiple_workers_unsupported_reason()
        if reason is None and self.routes_sessions_to_owner and not self.sessions_enabled:
            reason = "routes_sessions_to_owner needs sessions_enabled"
        return reason

    def _session_layers(self) -> tuple[SessionLayer | None, Install | None]:
        """The sessions step and the owner-routing layer (only under several workers, an installer)."""
        if not self.sessions_enabled:
            return None, None
        signer = SessionSigner(self.get_session_middleware_key())
        routing = self.owned_session_routing()
        routing_dir = owner_routing_dir()
        workers = self.config.num_workers
        if not (self.routes_sessions_to_owner and workers > 1 and routing_dir is not None):
            return SessionLayer(signer=signer, routing=routing, excluded_paths=HEALTH_ROUTES), None
        router: OwnerRoutingMiddleware | None = None

        def owns(session_id: str) -> bool:
            return router is None or router.owns(session_id)

        def route(inner: ASGIApp) -> ASGIApp:
            nonlocal router
            router = OwnerRoutingMiddleware(
                inner,
                signer=signer,
                routing=routing,
                num_workers=workers,
                routing_dir=routing_dir,
                excluded_paths=HEALTH_ROUTES,
            )
            return router

        sessions = SessionLayer(signer=signer, routing=routing, owns=owns, excluded_paths=HEALTH_ROUTES)
        return sessions, route

    @abc.abstractmethod
    def setup_webserver(self) -> FastAPI:
        """Build this server's FastAPI app (routes, its own middlewares)."""

    # -- readiness -----------------------------------------------------------------------------------------

    def is_ready(self) -> bool:
        """``/readyz`` answers 200 when this is True; override to wait for a model load, for example."""
        return self._started

    def _add_liveness_routes(self, app: FastAPI) -> None:
        existing = {getattr(route, "path", None) for route in app.router.routes}

        async def livez() -> JSONResponse:
            return JSONResponse({"status": "ok", "server_name": self.server_name, **_process_ids()})

        async def readyz() -> JSONResponse:
            ready = self.is_ready()
            body = {
                "status": "ready" if ready else "starting",
                "server_name": self.server_name,
                **_process_ids(),
            }
            return JSONResponse(body, status_code=200 if ready else 503)

        for path, endpoint in zip(HEALTH_ROUTES, (livez, readyz), strict=True):
            if path not in existing:
                app.add_api_route(path, endpoint, methods=["GET"], include_in_schema=False)

    def _track_lifespan(self, app: FastAPI) -> None:
        inner = app.router.lifespan_context

        @contextlib.asynccontextmanager
        async def lifespan(lifespan_app: Any) -> AsyncIterator[Any]:
            try:
                async with inner(lifespan_app) as state:
                    if self.telemetry is not None and self.telemetry.enabled and process_gauges_requested():
                        start_process_gauges()  # idempotent, never raises; sampled off the request path
                    self._started = True
                    emit_process_startup(self.server_name)  # the startup trace's server stages
                    try:
                        yield state
                    finally:
                        self._started = False
            finally:
                # After the app's own shutdown (it may still call other servers): the process-wide client
                # sessions of this loop are closed on this loop, as aiohttp requires; left open, every stop
                # logs "Unclosed client session" and leaks their connections.
                await _close_client_sessions()
                if self.telemetry is not None and self.telemetry.enabled:
                    self.telemetry.force_flush(_FLUSH_TIMEOUT_S)

        app.router.lifespan_context = lifespan

    # -- the app -------------------------------------------------------------------------------------------

    def build_app(self) -> ASGIApp:
        """The fully wrapped ASGI app. Telemetry is set up first, so the app is built with it in place."""
        self.telemetry = setup_telemetry(
            self.server_name, self.server_type, config=self.global_config.telemetry
        )
        app = self.setup_webserver()
        if not isinstance(app, FastAPI):
            raise TypeError(f"{type(self).__name__}.setup_webserver() must return a FastAPI app, got {app!r}")
        disable_native_telemetry(app)
        drop_exception_observer(app)
        install_query_free_access_log()
        log_validation_failures(app)
        self._add_liveness_routes(app)
        profiler = profiler_for(self.server_name, self.config, where=self.where)
        if profiler is not None:
            profiler.attach(app)
        self._track_lifespan(app)
        sessions, owner_routing = self._session_layers()
        # The one SERVER span: gym_obs's native layer, or contrib's (which needs the query hidden from it).
        instrumentation = self._server_instrumentation()
        hide_query = instrumentation == names.SERVER_INSTRUMENTATION_CONTRIB
        # Telemetry off: no SERVER-span layer, so the context layer runs as the first step of the gym
        # layers' one frame (one frame per request less), with the control routes answered first in it.
        context_step = not self.telemetry.enabled

        def context(inner: ASGIApp) -> PathContext:
            # With nothing between them (no owner routing), the control routes are answered in the
            # context layer's frame, first, as if outside it.
            control = self._control_routes(inner) if owner_routing is None else None
            return PathContext(hide_query=hide_query, control=control, control_paths=InflightRoute.PATHS)

        built = build_stack(
            app,
            {
                "control": self._control_routes if owner_routing is not None else None,
                "owner_routing": owner_routing,
                "context": context(app) if context_step else lambda inner: context(inner).around(inner),
                "span": None if context_step else lambda inner: add_server_span(inner, instrumentation),
                "sessions": sessions,
                "failure_reply": FailureReplies(boundary=self.failure_boundary, restore_query=hide_query),
                "disconnect": self._disconnect_step(),
                "model_calls": self._install_model_calls,
            },
        )
        # The gym frame at the top of the app's stack, with Starlette's error layers as its steps. After the
        # SERVER span: contrib's instrumentation wraps FastAPI's own top (then the stack is left as it is).
        steps_on_top(app)
        return built

    def _control_routes(self, app: ASGIApp) -> ASGIApp:
        return inflight_route_for(app, self.server_name, self.server_type, self.global_config)

    def _disconnect_step(self) -> DisconnectWatch | None:
        delay = self.disconnect_watch_delay_s
        return None if delay is None else DisconnectWatch(watch_delay_s=delay)

    def _install_model_calls(self, app: ASGIApp) -> ASGIApp:
        """Model servers: GenAI metrics off the reply (when their config and telemetry say so)."""
        install_model_calls(
            app,
            server_name=self.server_name,
            server_type=self.server_type,
            own_config=self.config.own_config(),
            where=self.where,
        )
        return app

    def _server_instrumentation(self) -> str:
        choice, problem = resolve_server_instrumentation(self.global_config.telemetry, os.environ)
        if problem is not None:
            _log.warning(problem)
        return choice

    def run_webserver(self) -> None:
        """Serve under uvicorn as configured in the global config until SIGINT/SIGTERM, then flush telemetry.

        Raises :class:`ServerStartupError` (naming the config key) before anything starts when the
        configuration cannot work: proxy allow-list, worker count, an address already in use.
        """
        server = self.config
        check_worker_count(server.num_workers, self._workers_reason(), where=self.where)
        validate_forwarded_allow_ips(
            server.forwarded_allow_ips,
            proxy_headers=server.proxy_headers,
            where=f"{self.where}.forwarded_allow_ips",
        )
        needed = nofile_needed(server, self.global_config.client, len(self.global_config.servers))
        limit = set_ulimit(needed=needed)  # warns only when the soft limit stays below what this needs
        _log.info(
            "open-file limit",
            before=limit.before,
            after=limit.after,
            hard=limit.hard,
            needed=limit.needed,
            changed=limit.changed,
            reason=limit.reason,
        )
        sock = bind_listen_socket(server.host, server.port, reuse_port=server.reuse_port, where=self.where)
        routing: contextlib.AbstractContextManager[object] = contextlib.nullcontext()
        try:
            if server.num_workers > 1:
                # Each worker builds its own app (own telemetry, own service.instance.id) from the env.
                os.environ[names.ENV_GLOBAL_CONFIG] = self.global_config.model_dump_json()
                os.environ[names.ENV_SERVER_NAME] = self.server_name
                ensure_session_secret()  # before the workers start: all of them accept each other's tokens
                mark_workers_spawning()
                if self.routes_sessions_to_owner and self.sessions_enabled:
                    routing = worker_routing_environment(self.server_name)
                config = build_uvicorn_config(
                    _WORKER_FACTORY, server, self.global_config.client, where=self.where, factory=True
                )
                on_exit: Callable[[], object] | None = None
            else:
                with app_build():
                    app = self.build_app()
                config = build_uvicorn_config(app, server, self.global_config.client, where=self.where)
                on_exit = _flush_and_shutdown
        except BaseException:
            sock.close()
            raise
        _log.info(
            "serving",
            server_type=self.server_type,
            url=f"http://{server.host}:{server.port}",
            workers=server.num_workers,
        )
        with routing:
            serve_uvicorn(config, sock, on_exit=on_exit)


async def _close_client_sessions() -> None:
    try:
        if is_global_aiohttp_client_setup():
            await close_global_aiohttp_client()
            _log.info("client sessions closed")
    except Exception:
        _log.warning("closing the client sessions failed", exc_info=True)


def _process_ids() -> dict[str, int]:
    """pid and parent pid: the launcher checks that the process answering is the one it started."""
    return {"pid": os.getpid(), "ppid": os.getppid()}


def _flush_and_shutdown() -> None:
    shutdown_telemetry(_FLUSH_TIMEOUT_S)


def import_server_class(entrypoint: str, *, where: str = "server") -> type[SimpleServer]:
    """Import ``package.module:ClassName``; errors name the config key and what went wrong."""
    module_name, _, qualname = entrypoint.partition(":")
    try:
        target: Any = importlib.import_module(module_name)
    except Exception as error:
        raise ServerStartupError(
            f"{where}.entrypoint: cannot import module {module_name!r}: {type(error).__name__}: {error}"
        ) from error
    for part in qualname.split("."):
        target = getattr(target, part, None)
        if target is None:
            raise ServerStartupError(f"{where}.entrypoint: module {module_name!r} has no {qualname!r}")
    if not (isinstance(target, type) and issubclass(target, SimpleServer)):
        raise ServerStartupError(f"{where}.entrypoint: {entrypoint!r} is not a SimpleServer subclass")
    return target


def load_server(server_name: str, global_config: GlobalConfig) -> SimpleServer:
    """Instantiate the configured server class for ``server_name``."""
    where = f"servers.{server_name}"
    try:
        entry = global_config.server(server_name)
    except KeyError as error:
        raise ServerStartupError(str(error.args[0])) from None
    cls = import_server_class(entry.entrypoint, where=where)
    return cls(server_name, global_config)


def _worker_app() -> ASGIApp:
    """uvicorn worker factory (``num_workers > 1``): rebuild the server from the environment."""
    mark_entered()
    configure_logging()
    config = global_config_from_environment()
    name = os.environ.get(names.ENV_SERVER_NAME)
    if config is None or not name:
        raise ServerStartupError(f"{names.ENV_GLOBAL_CONFIG} and {names.ENV_SERVER_NAME} must be set")
    with app_build():
        app = load_server(name, config).build_app()
    freeze_startup_heap()
    return app
