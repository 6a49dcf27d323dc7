"""Full-weight reload of a vLLM server (dev mode), and a lease so checkpoints never mix.

The learner writes full checkpoints; vLLM's runtime LoRA endpoint cannot load them. With
``TRILOOP_INFERENCE_RELOAD=full`` a worker makes the server reload its one model in place
through vLLM's dev-mode routes (``VLLM_SERVER_DEV_MODE=1``):

1. ``POST /pause?mode=wait``: in-flight requests finish on the old weights; new ones wait.
2. ``POST /update_weight_version`` to a *loading* marker, so no worker trusts the server
   while its weights are half-replaced (a failed reload leaves the marker in place).
3. ``POST /collective_rpc`` ``update_config({"model_config": {"model": DIR}})`` then
   ``reload_weights()``: every model worker reads the checkpoint's weights from DIR.
4. ``POST /reset_prefix_cache``: no cached KV computed with the old weights is reused.
5. ``POST /update_weight_version`` to the checkpoint's *tag*, ``<checkpoint id>@<nonce>``.
6. ``POST /resume``; then ``GET /weight_info`` must report that tag.

The nonce makes every reload's tag unique, so "the server reports the tag I saw before I
sent the request" proves no reload started in between (a reload away and back again would
carry another nonce). That is the staleness check: a worker holds a checkpoint through a
``FullWeightServer`` lease while it sends a completion, then reads ``/weight_info``; if
another worker (or process) moved the server meanwhile, the answer is discarded and the
request is sent again after reloading. Inside one worker the lease lets requests for the
held checkpoint run together and makes requests for another checkpoint wait until they
drain, so one worker never interleaves two checkpoints on one server. Across workers the
check is what protects: a full-weight server holds one checkpoint at a time, so each
checkpoint served at once (production, canary, a run's policy) should get its own server.

vLLM reports no digest of the weights it holds; triloop's own server adds
``weights_sha256`` to ``/weight_info``, and when present it must equal the checkpoint id.
"""

from __future__ import annotations

import re
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from execution_loop.inference.base import InferenceResponseError, InferenceServerError
from execution_loop.inference.served_weights import (
    FULL_HINT,
    ServedWeightsMismatch,
    error_message,
)

TAG_SEPARATOR = "@"
LOADING_PREFIX = "loading-"  # never a checkpoint id: no worker adopts a half-loaded server
_CHECKPOINT_ID = re.compile(r"^[0-9a-f]{64}$")

Audit = Callable[[ServedWeightsMismatch], None]
"""Records a refusal found while serving (the first load is audited by ``PolicyCache``)."""


def new_tag(checkpoint_id: str) -> str:
    """A weight version naming the checkpoint, unique to one reload."""
    return f"{checkpoint_id}{TAG_SEPARATOR}{uuid.uuid4().hex[:16]}"


def tagged_checkpoint(version: str | None) -> str | None:
    """The checkpoint id a weight version names, if it is a tag this protocol wrote."""
    if not version or TAG_SEPARATOR not in version:
        return None
    checkpoint = version.split(TAG_SEPARATOR, 1)[0]
    return checkpoint if _CHECKPOINT_ID.match(checkpoint) else None


@dataclass(frozen=True)
class WeightInfo:
    """``GET /weight_info``: the version tag, and (triloop's server) the weights' digest."""

    version: str | None
    weights_sha256: str | None = None


class ControlRefused(Exception):
    """A dev-mode route answered 4xx: the server will not do it."""


class DevModeControl:
    """vLLM's dev-mode control routes on one server (unauthenticated in vLLM)."""

    def __init__(self, base_url: str, *, timeout: float = 600.0,
                 headers: dict[str, str] | None = None,
                 transport: httpx.BaseTransport | None = None) -> None:
        self.base_url = base_url
        # A reload reads a whole checkpoint from storage: the timeout is generous.
        self._http = httpx.Client(base_url=base_url, timeout=timeout, headers=headers or {},
                                  transport=transport)

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        url = f"{self.base_url}{path}"
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise InferenceServerError(url, f"unreachable: {exc}") from exc
        if response.status_code >= 500:  # the server's trouble: worth retrying
            raise InferenceServerError(url, error_message(response),
                                       status_code=response.status_code)
        if response.status_code != 200:
            raise ControlRefused(f"{method} {path} answered HTTP {response.status_code}: "
                                 f"{error_message(response)}")
        try:
            return response.json() if response.content else None
        except ValueError as exc:
            raise InferenceResponseError(url, "the body is not JSON") from exc

    def weight_info(self) -> WeightInfo:
        """The server's current weight version (and digest, where it reports one)."""
        body = self._call("GET", "/weight_info")
        if not isinstance(body, dict) or "weight_version" not in body:
            raise InferenceResponseError(f"{self.base_url}/weight_info",
                                         "no 'weight_version' in the body")
        version, digest = body.get("weight_version"), body.get("weights_sha256")
        return WeightInfo(None if version is None else str(version),
                          None if digest is None else str(digest))

    def served_model(self) -> str:
        """The name completions must ask for: the server's first ``--served-model-name``."""
        body = self._call("GET", "/v1/models")
        data = body.get("data") if isinstance(body, dict) else None
        if not isinstance(data, list) or not data or not isinstance(data[0], dict):
            raise InferenceResponseError(f"{self.base_url}/v1/models", "no model is listed")
        return str(data[0]["id"])

    def pause(self) -> None:
        """Stop admitting requests once those in flight have finished (``mode=wait``)."""
        self._call("POST", "/pause", params={"mode": "wait"})

    def resume(self) -> None:
        """Admit requests again."""
        self._call("POST", "/resume")

    def collective_rpc(self, method: str, *args: Any) -> None:
        """Run a method on every model worker of the server."""
        self._call("POST", "/collective_rpc", json={"method": method, "args": list(args)})

    def reset_prefix_cache(self) -> None:
        """Drop cached prefixes (their KV was computed with the old weights)."""
        self._call("POST", "/reset_prefix_cache")

    def set_version(self, version: str) -> None:
        """Label the weights the server now holds."""
        self._call("POST", "/update_weight_version", json={"new_version": version})

    def close(self) -> None:
        """Close the HTTP connection pool."""
        self._http.close()


class FullWeightServer:
    """One full-weight server as a worker sees it: the checkpoint it holds, and a lease."""

    def __init__(self, control: DevModeControl) -> None:
        self.control = control
        self._cond = threading.Condition()
        self._held: str | None = None  # the checkpoint this worker last saw loaded
        self._tag: str | None = None  # its tag; None: read the server before trusting it
        self._users = 0  # requests holding the lease now
        self._waiting: Counter[str] = Counter()
        self._served_model: str | None = None
        self.reloads = 0  # how many times this worker reloaded the server

    @property
    def base_url(self) -> str:
        """The server's base URL."""
        return self.control.base_url

    def served_model(self) -> str:
        """The server's served model name (read once)."""
        with self._cond:
            if self._served_model is None:
                self._served_model = self.control.served_model()
            return self._served_model

    def _may_enter(self, checkpoint_id: str) -> bool:
        if self._users == 0:
            return True
        # Join those serving the same checkpoint, unless a request for another one waits:
        # then let the server drain so that request is not starved.
        others_wait = any(n for c, n in self._waiting.items() if c != checkpoint_id)
        return self._held == checkpoint_id and self._tag is not None and not others_wait

    @contextmanager
    def holding(self, checkpoint_id: str, model_dir: Path) -> Iterator[str]:
        """Hold the server on ``checkpoint_id`` (reloading it if needed); yields its tag."""
        with self._cond:
            self._waiting[checkpoint_id] += 1
            try:
                while not self._may_enter(checkpoint_id):
                    self._cond.wait()
            finally:
                self._waiting[checkpoint_id] -= 1
                self._cond.notify_all()  # those held back for this request re-check
            if self._held != checkpoint_id or self._tag is None:
                self._held, self._tag = None, None
                # Under the lock: no request of this worker runs while the server changes.
                self._tag = self._take(checkpoint_id, model_dir)
                self._held = checkpoint_id
            self._users += 1
            tag = self._tag
        try:
            yield tag
        finally:
            with self._cond:
                self._users -= 1
                self._cond.notify_all()

    def still_holds(self, tag: str, checkpoint_id: str, model_dir: Path) -> bool:
        """After a request: whether the server kept the tag throughout (no reload began)."""
        try:
            info = self.control.weight_info()
        except ControlRefused as refused:
            raise self._refusal(checkpoint_id, model_dir, str(refused)) from refused
        if info.version == tag:
            self._check_digest(info, checkpoint_id, model_dir)
            return True
        with self._cond:
            if self._tag == tag:
                self._tag = None  # another worker moved it: read the server again
        return False

    def _take(self, checkpoint_id: str, model_dir: Path) -> str:
        try:
            info = self.control.weight_info()
        except ControlRefused as refused:  # no dev mode: /weight_info is not served
            raise self._refusal(checkpoint_id, model_dir,
                                f"does not report its weights ({refused})") from refused
        if tagged_checkpoint(info.version) == checkpoint_id and info.version is not None:
            self._check_digest(info, checkpoint_id, model_dir)
            return info.version  # another worker loaded it: share it
        try:
            return self._reload(checkpoint_id, model_dir)
        except ControlRefused as refused:
            raise self._refusal(checkpoint_id, model_dir,
                                f"refused to reload its weights from {model_dir} ({refused})"
                                ) from refused

    def _reload(self, checkpoint_id: str, model_dir: Path) -> str:
        tag = new_tag(checkpoint_id)
        self.reloads += 1
        self.control.pause()
        try:
            self.control.set_version(f"{LOADING_PREFIX}{tag}")
            self.control.collective_rpc(
                "update_config", {"model_config": {"model": str(model_dir)}})
            self.control.collective_rpc("reload_weights")
            self.control.reset_prefix_cache()
            # Before publishing the tag: a server that reports a digest must hold these.
            self._check_digest(self.control.weight_info(), checkpoint_id, model_dir)
            self.control.set_version(tag)
        finally:
            self.control.resume()
        info = self.control.weight_info()
        if info.version != tag:
            raise self._refusal(checkpoint_id, model_dir,
                                f"reports weight version {info.version!r} after reloading "
                                f"{model_dir} as {tag!r}")
        self._check_digest(info, checkpoint_id, model_dir)
        return tag

    def _check_digest(self, info: WeightInfo, checkpoint_id: str, model_dir: Path) -> None:
        if info.weights_sha256 is not None and info.weights_sha256 != checkpoint_id:
            raise self._refusal(checkpoint_id, model_dir,
                                f"serves weights that hash to {info.weights_sha256}")

    def _refusal(self, checkpoint_id: str, model_dir: Path, problem: str) -> ServedWeightsMismatch:
        return ServedWeightsMismatch(checkpoint_id, model_dir, self.base_url, problem,
                                     hint=FULL_HINT)

    def close(self) -> None:
        """Close the control connection."""
        self.control.close()
