"""vLLM's dev-mode control routes on triloop's server: pause, reload full weights, version.

vLLM registers these only with ``VLLM_SERVER_DEV_MODE=1`` (here ``--dev-mode``):
``POST /pause`` (``?mode=wait``), ``POST /resume``, ``GET /is_paused``, ``POST
/collective_rpc`` (``update_config`` with ``model_config``/``load_config`` overrides, and
``reload_weights``), ``POST /reset_prefix_cache``, ``POST /update_weight_version``
(``{"new_version"}``) and ``GET /weight_info``. As in vLLM the version is a label the caller
sets; unlike vLLM, ``/weight_info`` also reports ``weights_sha256``, the digest of the
weights this server actually loaded, so a client can see when the label lies.

Differences, each refused rather than ignored: pause modes ``abort`` and ``keep`` (this
server cannot stop a sample mid-way, and ``keep`` would finish old requests on new weights),
and ``reload_weights`` on a server that is not paused (a reload under live traffic would
answer some requests with each checkpoint).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Query, Response
from pydantic import BaseModel, ConfigDict, Field

from execution_loop.inference.served_models import LoadRefused, ServedModels

UPDATABLE_CONFIGS = frozenset({"load_config", "model_config"})  # as vLLM's update_config


class PauseGate:
    """``pause(mode=wait)``: in-flight completions finish, new ones wait for ``resume``."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._paused = False
        self._in_flight = 0

    @contextmanager
    def admit(self) -> Iterator[None]:
        """Hold a completion until the server is not paused; count it while it runs."""
        with self._cond:
            while self._paused:
                self._cond.wait()
            self._in_flight += 1
        try:
            yield
        finally:
            with self._cond:
                self._in_flight -= 1
                self._cond.notify_all()

    def pause(self) -> None:
        """Stop admitting completions and wait for those in flight to finish."""
        with self._cond:
            self._paused = True
            while self._in_flight:
                self._cond.wait()

    def resume(self) -> None:
        """Admit completions again."""
        with self._cond:
            self._paused = False
            self._cond.notify_all()

    @property
    def paused(self) -> bool:
        """Whether completions are being held."""
        with self._cond:
            return self._paused


class WeightReloader:
    """The server's weight version and its in-place full-weight reload."""

    def __init__(self, models: ServedModels) -> None:
        self.models = models
        self.gate = PauseGate()
        self.version: str | None = None  # vLLM's /weight_info label; None until set
        self._next_dir: Path | None = None  # update_config's model, read by reload_weights
        self._lock = threading.Lock()
        # What happened, in order (pause, reload, version, completions and the weights that
        # answered them): the tests read it to check the protocol's ordering.
        self.events: deque[tuple[str, str | None]] = deque(maxlen=512)

    def weight_info(self) -> dict[str, Any]:
        """``GET /weight_info`` plus the digest of the weights actually served."""
        return {"weight_version": self.version,
                "weights_sha256": self.models.default().weights_sha256}

    def set_version(self, version: str) -> None:
        """``POST /update_weight_version``: a label, as in vLLM (not checked against weights)."""
        self.version = version
        self.events.append(("version", version))

    def rpc(self, method: str, args: list[Any], kwargs: dict[str, Any]) -> list[Any]:
        """``POST /collective_rpc`` on the one model worker: its per-worker results."""
        if method == "update_config":
            overrides = args[0] if args else kwargs.get("overrides")
            self._update_config(overrides)
        elif method == "reload_weights":
            self._reload()
        else:
            raise LoadRefused(f"collective_rpc method {method!r} is not supported by "
                              "triloop's server (update_config, reload_weights)")
        return [None]

    def _update_config(self, overrides: Any) -> None:
        if not isinstance(overrides, dict) or not set(overrides) <= UPDATABLE_CONFIGS:
            raise LoadRefused(f"update_config takes overrides of {sorted(UPDATABLE_CONFIGS)}")
        model_config = overrides.get("model_config") or {}
        if not isinstance(model_config, dict):
            raise LoadRefused("model_config overrides must be an object")
        model = model_config.get("model")
        if model is not None:
            with self._lock:
                self._next_dir = Path(str(model))
        self.events.append(("update_config", None if model is None else str(model)))

    def _reload(self) -> None:
        if not self.gate.paused:
            raise LoadRefused("reload_weights needs a paused server (POST /pause?mode=wait)")
        with self._lock:
            model_dir = self._next_dir or self.models.default().client.model_dir
        served = self.models.reload_default(model_dir)
        self.events.append(("reload_weights", served.weights_sha256))


class RpcRequest(BaseModel):
    """vLLM's ``/collective_rpc`` body (``kwargs`` is read from the raw body: a field of
    that name would shadow pydantic's own keyword arguments)."""

    model_config = ConfigDict(extra="allow")

    method: str
    args: list[Any] = Field(default_factory=list)
    timeout: float | None = None

    def call_kwargs(self) -> dict[str, Any]:
        """The ``kwargs`` object of the body ({} when absent)."""
        extra = self.model_extra or {}
        value = extra.get("kwargs") or {}
        if not isinstance(value, dict):
            raise LoadRefused("collective_rpc kwargs must be an object")
        return value


class VersionRequest(BaseModel):
    """vLLM's ``/update_weight_version`` body."""

    new_version: str


def attach_dev_routes(app: FastAPI, reloader: WeightReloader) -> None:
    """Register the dev-mode routes (a ``LoadRefused`` becomes a 400 in vLLM's shape)."""

    @app.post("/pause")
    def pause(mode: str = Query("abort")) -> dict[str, str]:
        if mode != "wait":
            raise LoadRefused(f"pause mode {mode!r} is not supported by triloop's server "
                              "(only 'wait')")
        reloader.gate.pause()
        reloader.events.append(("pause", mode))
        return {"status": "paused"}

    @app.post("/resume")
    def resume() -> dict[str, str]:
        reloader.gate.resume()
        reloader.events.append(("resume", None))
        return {"status": "resumed"}

    @app.get("/is_paused")
    def is_paused() -> dict[str, bool]:
        return {"is_paused": reloader.gate.paused}

    @app.post("/collective_rpc")
    def collective_rpc(request: RpcRequest) -> dict[str, list[Any]]:
        return {"results": reloader.rpc(request.method, request.args, request.call_kwargs())}

    @app.post("/reset_prefix_cache")
    def reset_prefix_cache() -> Response:
        reloader.events.append(("reset_prefix_cache", None))  # no prefix cache to drop here
        return Response(status_code=200)

    @app.post("/update_weight_version")
    def update_weight_version(request: VersionRequest) -> dict[str, Any]:
        reloader.set_version(request.new_version)
        return {"success": True, "new_version": request.new_version}

    @app.get("/weight_info")
    def weight_info() -> dict[str, Any]:
        return reloader.weight_info()
