"""`llmir serve ART --ray`: the same app as single-process serve, as a Ray Serve deployment.

The one module that imports ray (lazily: `require_ray` says how to install it). Each replica is a
Ray actor that opens the artifact once with `open_served_model` (every file hashed against the
manifest) and serves `app.create_app` through `serve.ingress`, with its own scheduler and
continuous batching; Ray Serve's proxy routes requests to the replicas (power of two choices on
their ongoing requests). A replica takes up to --max-batch + --max-queue requests
(`max_ongoing_requests`), so a full replica answers 429 as single-process serve does; with
--autoscale MIN,MAX Ray Serve keeps `target_ongoing_requests` = --max-batch per replica.

`/metrics` is aggregated: every replica pushes its metrics text each `PUSH_PERIOD_S` to one small
named actor (`_MetricsBoard`, no CPU), and a scrape of any replica merges the texts of the
replicas heard from in the last `STALE_S` seconds, labelled `replica="ID"` (`metrics_merge`).

`build_app(args)` is Ray Serve's application builder, for `serve run` / KubeRay's RayService
(`import_path: llmir_core.serve.cluster:build_app`, see docs/cluster.md); `run` is the driver
of `llmir serve --ray`: it connects to (or starts) a cluster, deploys, waits for SIGTERM or
Ctrl-C, then `serve.shutdown()` drains the replicas (requests in flight finish).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from llmir_core.errors import CheckFailed, InputError, LlmirError

APP_NAME = "llmir"
BOARD_NAMESPACE = "llmir"
PUSH_PERIOD_S = 1.0
STALE_S = 5.0
ENV_AUTOSCALING = "LLMIR_RAY_AUTOSCALING"  # JSON object: overrides of Ray's AutoscalingConfig
INSTALL = "pip install 'llmir[cluster]'"
_REPLICA_ERROR = "llmir replica error: "


@dataclass(frozen=True)
class ClusterSpec:
    """Where and how many: replicas (fixed) or autoscale (min, max), the cluster address (None:
    start a local one on 127.0.0.1), the HTTP proxy's host and port, CPUs per replica."""

    replicas: int = 1
    autoscale: tuple[int, int] | None = None
    address: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    cpus: float = 1.0


@dataclass
class ReplicaArgs:
    """What every replica needs: the artifact (a path each node can read), open_served_model's
    keyword arguments, the API key and the Playground's data."""

    art_dir: str
    open_opts: dict[str, Any] = field(default_factory=dict)
    api_key: str | None = None
    playground: dict[str, Any] = field(default_factory=dict)
    key_env: str | None = None  # else the key from this variable of the replica's environment


def require_ray() -> None:
    """Raise a one-line InputError when Ray Serve is not installed."""
    try:
        import ray  # noqa: F401
        from ray import serve  # noqa: F401
    except ImportError:
        raise InputError(f"--ray needs Ray Serve, which is not installed: {INSTALL}") from None


def parse_autoscale(text: str) -> tuple[int, int]:
    """'MIN,MAX' -> (MIN, MAX), 0 <= MIN <= MAX, MAX >= 1."""
    m = re.fullmatch(r"\s*(\d+)\s*,\s*(\d+)\s*", text)
    if m is None:
        raise InputError(f"--autoscale must be MIN,MAX (two whole numbers), got {text!r}")
    lo, hi = int(m.group(1)), int(m.group(2))
    if hi < 1 or lo > hi:
        raise InputError(f"--autoscale MIN,MAX needs 0 <= MIN <= MAX and MAX >= 1, got {text!r}")
    return lo, hi


def autoscaling_overrides() -> dict[str, Any]:
    """LLMIR_RAY_AUTOSCALING: a JSON object merged into Ray's AutoscalingConfig (delays, look-back
    period; the tests shorten them)."""
    raw = os.environ.get(ENV_AUTOSCALING, "").strip()
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise InputError(f"{ENV_AUTOSCALING} is not JSON: {exc.msg}") from None
    if not isinstance(value, dict):
        raise InputError(f"{ENV_AUTOSCALING} must be a JSON object, got {type(value).__name__}")
    return value


def deployment_options(spec: ClusterSpec, max_batch: int, max_queue: int) -> dict[str, Any]:
    """The options of `serve.deployment` for spec (no Ray needed)."""
    opts: dict[str, Any] = {
        "name": APP_NAME,
        "max_ongoing_requests": max_batch + max_queue,
        "ray_actor_options": {"num_cpus": spec.cpus},
        "graceful_shutdown_timeout_s": 60.0,
        "health_check_period_s": 2.0,
        "health_check_timeout_s": 30.0,
    }
    if spec.autoscale is None:
        opts["num_replicas"] = spec.replicas
    else:
        lo, hi = spec.autoscale
        opts["autoscaling_config"] = {
            "min_replicas": lo,
            "initial_replicas": max(lo, 1),
            "max_replicas": hi,
            "target_ongoing_requests": max_batch,
        } | autoscaling_overrides()
    return opts


class _MetricsBoard:
    """The latest metrics text of every replica (one named actor per cluster)."""

    def __init__(self) -> None:
        self.texts: dict[str, tuple[float, str, dict[str, str]]] = {}

    def put(self, replica: str, text: str, info: dict[str, str]) -> None:
        self.texts[replica] = (time.monotonic(), text, info)

    def drop(self, replica: str) -> None:
        self.texts.pop(replica, None)

    def fresh(self, max_age: float) -> dict[str, tuple[str, dict[str, str]]]:
        now = time.monotonic()
        for k in [k for k, v in self.texts.items() if now - v[0] > max_age]:
            del self.texts[k]
        return {k: (t, i) for k, (_, t, i) in self.texts.items()}


def _board() -> Any:
    """The metrics board actor of this cluster (created by the first replica that asks)."""
    import ray

    actor = ray.remote(num_cpus=0)(_MetricsBoard)
    return actor.options(  # type: ignore[attr-defined]
        name=f"{APP_NAME}-metrics",
        namespace=BOARD_NAMESPACE,
        get_if_exists=True,
        lifetime="detached",
    ).remote()


class _MetricsRoute:
    """ASGI layer of a replica: GET /metrics answers the merged text of all live replicas."""

    def __init__(self, app: Any, replica: LlmirReplica) -> None:
        self.app = app
        self.replica = replica

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] != "/metrics" or scope["method"] != "GET":
            await self.app(scope, receive, send)
            return
        from starlette.responses import PlainTextResponse

        from .metrics_merge import merge

        rep = self.replica
        rep.model.metrics.request("/metrics", 200)
        texts: dict[str, tuple[str, dict[str, str]]] = {}
        try:
            texts = await rep.board.fresh.remote(STALE_S)
        except Exception:  # the board is gone: this replica's own numbers still answer
            texts = {}
        texts[rep.rid] = (rep.model.metrics.render(), rep.info)
        body = merge({k: t for k, (t, _) in texts.items()}, {k: i for k, (_, i) in texts.items()})
        response = PlainTextResponse(body, media_type="text/plain; version=0.0.4")
        await response(scope, receive, send)


class LlmirReplica:
    """One Ray Serve replica: the artifact opened once, the app of single-process serve."""

    def __init__(self, args: ReplicaArgs) -> None:
        from ray import serve

        from .model import open_served_model

        try:
            self.model = open_served_model(args.art_dir, **args.open_opts)
        except LlmirError as exc:  # the driver finds this line in Ray's error and shows it
            raise RuntimeError(_REPLICA_ERROR + exc.message) from None
        self.args = args
        ctx = serve.get_replica_context()
        rid = getattr(ctx.replica_id, "unique_id", None) or str(ctx.replica_id)
        self.rid = str(rid)
        self.info = {"pid": str(os.getpid()), "node": socket.gethostname()}
        self.board = _board()
        self._stop = threading.Event()
        threading.Thread(target=self._push, name="llmir-metrics-push", daemon=True).start()

    def _push(self) -> None:
        while not self._stop.wait(PUSH_PERIOD_S):
            try:
                self.board.put.remote(self.rid, self.model.metrics.render(), self.info)
            except Exception:  # the board restarts with the cluster; skip this period
                continue

    def __serve_build_asgi_app__(self) -> Any:
        from .app import create_app

        a = self.args
        key = a.api_key or (os.environ.get(a.key_env) or None if a.key_env else None)
        app = create_app(self.model, api_key=key, playground=a.playground)
        return _MetricsRoute(app, self)

    def __del__(self) -> None:
        stop = getattr(self, "_stop", None)
        if stop is not None:
            stop.set()
            try:
                self.board.drop.remote(self.rid)
            except Exception:
                pass


def application(args: ReplicaArgs, spec: ClusterSpec, max_batch: int, max_queue: int) -> Any:
    """The Ray Serve application (bound deployment) for args and spec."""
    from ray import serve

    cls = serve.deployment(**deployment_options(spec, max_batch, max_queue))(
        serve.ingress()(LlmirReplica)
    )
    return cls.bind(args)


def build_app(cfg: dict[str, str]) -> Any:
    """Ray Serve's application builder (`serve run llmir_core.serve.cluster:build_app
    artifact=/shared/art replicas=2`, or a RayService's `args`): artifact (required),
    replicas or autoscale "MIN,MAX", max_batch, max_queue, threads, model_name; the API key
    from LLMIR_API_KEY in each replica's environment (the builder runs elsewhere)."""
    if "artifact" not in cfg:
        raise InputError("build_app needs args.artifact: the artifact folder every node can read")
    max_batch, max_queue = int(cfg.get("max_batch", 8)), int(cfg.get("max_queue", 64))
    threads = int(cfg["threads"]) if "threads" in cfg else None
    spec = ClusterSpec(
        replicas=int(cfg.get("replicas", 1)),
        autoscale=parse_autoscale(cfg["autoscale"]) if "autoscale" in cfg else None,
        cpus=float(threads or 1),
    )
    opts: dict[str, Any] = {"max_batch": max_batch, "max_queue": max_queue, "threads": threads}
    if "model_name" in cfg:
        opts["name"] = cfg["model_name"]
    args = ReplicaArgs(str(cfg["artifact"]), opts, key_env="LLMIR_API_KEY")
    return application(args, spec, max_batch, max_queue)


def free_port(host: str) -> int:
    """A port nobody listens on now (Ray's proxy takes a fixed port: --port 0 picks one here)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _connect(spec: ClusterSpec) -> str:
    """ray.init on spec.address, or a local head on 127.0.0.1 with enough logical CPUs for the
    replicas (they share the machine's cores). Returns a phrase for the start line."""
    import logging

    import ray

    quiet: dict[str, Any] = {"logging_level": logging.WARNING, "log_to_driver": False}
    if spec.address:
        try:
            ray.init(address=spec.address, namespace=BOARD_NAMESPACE, **quiet)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise InputError(
                f"cannot join the Ray cluster at {spec.address}: {first}", hint=_auth_hint(spec)
            ) from None
        return f"the Ray cluster at {spec.address}"
    most = spec.autoscale[1] if spec.autoscale else spec.replicas
    cpus = max(os.cpu_count() or 1, int(most * spec.cpus + 0.999))
    ray.init(
        address="local",  # a new head, even when `ray start` left one (or its address file)
        num_cpus=cpus,
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        namespace=BOARD_NAMESPACE,
        **quiet,
    )
    return f"a local Ray head ({cpus} logical CPUs on {os.cpu_count()} cores)"


def _auth_hint(spec: ClusterSpec) -> str | None:
    """Ray sends its token only when told to for an explicit address (`ray start` clusters
    use token authentication by default since Ray 2.5x; `--address auto` finds the token)."""
    if spec.address == "auto" or os.environ.get("RAY_AUTH_MODE", "").lower() == "token":
        return None
    return (
        "if the cluster uses token authentication (`ray start`'s default), set "
        "RAY_AUTH_MODE=token and give its token (RAY_AUTH_TOKEN, or the file ~/.ray/auth_token "
        "that `ray get-auth-token` prints)"
    )


def _deploy(app: Any, spec: ClusterSpec, port: int) -> None:
    from ray import serve

    serve.start(
        http_options={"host": spec.host, "port": port}, logging_config={"log_level": "WARNING"}
    )
    try:
        serve.run(app, name=APP_NAME, route_prefix="/", blocking=False)
    except Exception as exc:
        text = f"{exc}\n{_status_text()}"
        found = re.search(re.escape(_REPLICA_ERROR) + r"([^\n]*)", text)
        if found:
            raise CheckFailed(f"a replica could not open the artifact: {found.group(1)}") from None
        last = [ln for ln in text.splitlines() if ln.strip()][-1:] or [type(exc).__name__]
        raise LlmirError(f"Ray Serve could not deploy llmir: {last[0].strip()}") from None


def _status_text() -> str:
    """The deployment's status messages (where Ray keeps a replica constructor's error)."""
    from ray import serve

    try:
        app = serve.status().applications[APP_NAME]
    except Exception:
        return ""
    return "\n".join([app.message, *(d.message for d in app.deployments.values())])


class _Stop(BaseException):
    """A signal that came before the deployment was ready (raised out of Ray's wait)."""


def run(
    args: ReplicaArgs,
    spec: ClusterSpec,
    slots: tuple[int, int],
    log: Callable[[str], None],
) -> int:
    """Deploy on the cluster, log the URL, wait for SIGTERM / SIGINT, drain; return the signal.

    The signal handler only appends to a list (no lock: a second signal can arrive while the
    first one's handler runs). Before the deployment is ready the first signal also leaves the
    wait for it (replicas the cluster cannot place would keep it waiting forever)."""
    import ray

    got: list[int] = []
    waiting = [True]  # the deployment is not ready: the first signal leaves the wait

    def on_signal(sig: int, frame: Any) -> None:
        got.append(sig)
        if waiting[0]:
            waiting[0] = False
            raise _Stop

    where = _connect(spec)
    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        try:
            port = spec.port or free_port(spec.host)
            _deploy(application(args, spec, *slots), spec, port)
            host_, port = _proxy_address(spec.host, port)
            waiting[0] = False
            log(_start_line(args, spec, (host_, port), where, slots))
            while not got:
                time.sleep(0.2)
            log("draining: requests in flight finish, then the replicas stop")
        except _Stop:
            log("stopping before the deployment was ready: removing it")
        _remove(spec)
        return got[0]
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        ray.shutdown()


def _remove(spec: ClusterSpec) -> None:
    """Drain and remove the deployment: only llmir's application on a cluster it joined."""
    from ray import serve

    if spec.address:
        serve.delete(APP_NAME)
    else:
        serve.shutdown()
    _kill_board()


def _start_line(
    args: ReplicaArgs, spec: ClusterSpec, at: tuple[str, int], where: str, slots: tuple[int, int]
) -> str:
    name = args.open_opts.get("name") or os.path.basename(os.path.normpath(args.art_dir))
    host = f"[{at[0]}]" if ":" in at[0] else at[0]
    if spec.autoscale:
        count = f"{spec.autoscale[0]}..{spec.autoscale[1]} replicas (autoscaled)"
    else:
        count = f"{spec.replicas} replica{'s' * (spec.replicas != 1)}"
    key = ", API key required" if args.api_key else ""
    return (
        f"serving {name} on http://{host}:{at[1]}/ with Ray Serve on {where}: {count}, each "
        f"{slots[0]} slots, queue {slots[1]}{key}; Ctrl-C stops"
    )


def _proxy_address(host: str, port: int) -> tuple[str, int]:
    """Where Ray Serve's proxies listen: a cluster that already ran Serve keeps its own HTTP
    options (Ray warns), so ask its controller (a private API: the requested address when it
    is not there)."""
    try:
        from ray.serve.context import _get_global_client

        client = _get_global_client()
        if client is None:
            return host, port
        return str(client.http_config.host), int(client.http_config.port)
    except Exception:
        return host, port


def _kill_board() -> None:
    import ray

    try:
        ray.kill(ray.get_actor(f"{APP_NAME}-metrics", namespace=BOARD_NAMESPACE))
    except Exception:  # never created (no replica started) or already gone
        pass


__all__ = [
    "ClusterSpec",
    "LlmirReplica",
    "ReplicaArgs",
    "application",
    "autoscaling_overrides",
    "build_app",
    "deployment_options",
    "parse_autoscale",
    "require_ray",
    "run",
]
