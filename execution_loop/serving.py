"""What episodes run with, cached per worker: policy clients and task environments.

``PolicyCache``: checkpoint id -> ``PolicyClient``. The checkpoint's directory comes
from its ``checkpoint.artifact_uri`` row; the backend (in-process torch, or an
OpenAI-compatible vLLM server) from settings. Loading a model is slow and holds
memory, so each worker keeps the few it serves (production, canary, shadow, or a
run's current policy) and evicts the least recently used beyond ``capacity``. An
in-process client owns its checkpoint's batching engine, so concurrent episodes on one
checkpoint share micro-batches; eviction closes it. Every
load first checks that the directory's weights hash to the checkpoint id (and again
once loaded, so a file swapped while it was read is caught too); a mismatch refuses
to serve with ``WeightsIntegrityError`` and is recorded as an integrity event. A checkpoint
whose weights retention pruned is refused first, with ``CheckpointPruned`` naming the rule.
A LoRA adapter checkpoint is served on its base: the base is the checkpoint its adapter
config names (which its id includes) and its row's ``base_model``; the base's weights are
verified too, and the factory gets its directory (``base_dir``).

``TaskEnvironments``: task id -> its registered contract and environment factory.
Episodes run only on admitted tasks; the admission probe may open pending ones.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, cast

from sqlalchemy import Engine
from sqlmodel import Session

from execution_loop.environments.base import Environment, EnvironmentFactory
from execution_loop.inference.base import PolicyClient
from triloop.artifacts import ArtifactCorrupted, ArtifactStore
from triloop.config import Settings
from triloop.contracts import EnvironmentContract, parse_contract_text
from triloop.models import Checkpoint, EnvironmentVersion, Task
from triloop.retention import CheckpointPruned, refuse_pruned
from triloop.statuses import TaskStatus
from triloop.weights import (
    UnsupportedArtifactUri,
    WeightsIntegrityError,
    adapter_base_id,
    checkpoint_dir,
    is_adapter_dir,
    record_integrity_event,
    verify_weights,
)

__all__ = [
    "CheckpointPruned", "EnvironmentLookup", "OpenedTask", "PolicyCache", "PolicyFactory",
    "TaskEnvironments", "TaskNotAdmitted", "UnknownCheckpoint", "UnsupportedArtifactUri",
    "WeightsIntegrityError",
    "backend_factory", "checkpoint_dir", "serving_refusals",
]

class PolicyFactory(Protocol):
    """Builds a client for (checkpoint id, checkpoint directory); an adapter's also gets
    its base's directory, ``base_dir`` (a factory that serves no adapters may omit it)."""

    def __call__(self, checkpoint_id: str, model_dir: Path, /) -> PolicyClient: ...


class AdapterFactory(Protocol):
    """A ``PolicyFactory`` that also serves LoRA adapter checkpoints on their base."""

    def __call__(self, checkpoint_id: str, model_dir: Path, /, *,
                 base_dir: Path | None = None) -> PolicyClient: ...


class UnknownCheckpoint(LookupError):
    """No checkpoint row with that id: the caller or the routing names a missing checkpoint."""


def backend_factory(
    settings: Settings, *, audit: Callable[[WeightsIntegrityError], None] | None = None,
) -> PolicyFactory:
    """The configured backend: ``torch`` loads in-process, ``openai`` asks a server.

    ``audit`` records a refusal found while serving rather than loading (a full-weight
    server that another worker moved, then reloaded wrongly); loading refusals are
    recorded by ``PolicyCache``.
    """
    if settings.inference_backend == "openai":
        if not settings.inference_url:
            raise ValueError(
                "TRILOOP_INFERENCE_BACKEND=openai needs TRILOOP_INFERENCE_URL (the vLLM server)"
            )
        base_url = settings.inference_url
        full_server = None
        if settings.inference_reload == "full":
            from execution_loop.inference.full_weights import DevModeControl, FullWeightServer
            from execution_loop.inference.openai_backend import normalise_base_url

            # One per worker: every checkpoint's client shares the server's lease.
            full_server = FullWeightServer(DevModeControl(normalise_base_url(base_url)))

        def remote(checkpoint_id: str, model_dir: Path, *,
                   base_dir: Path | None = None) -> PolicyClient:
            from execution_loop.inference.openai_backend import OpenAICompatiblePolicyClient

            # LoRA: the server serves the checkpoint under its id; an adapter checkpoint
            # always goes this way (vLLM loads it on the base it serves). Full: under its
            # served model name, reloaded to this checkpoint. The tokenizer is read locally.
            full = None if base_dir is not None else full_server
            model = checkpoint_id if full is None else full.served_model()
            client = OpenAICompatiblePolicyClient(
                base_url, model, model_dir, checkpoint_id=checkpoint_id,
                full_weights=full, audit=audit,
            )
            try:  # before the first request: the server loads it, or the batch is refused
                client.ensure_served(model_dir)
            except BaseException:
                client.close()
                raise
            return client

        return remote

    def local(checkpoint_id: str, model_dir: Path, *,
              base_dir: Path | None = None) -> PolicyClient:
        from execution_loop.inference.torch_backend import TorchPolicyClient

        return TorchPolicyClient(model_dir, checkpoint_id=checkpoint_id,
                                 gather_wait_s=settings.batch_gather_ms / 1000.0,
                                 torch_threads=settings.torch_threads, base_dir=base_dir)

    return local


def serving_refusals(engine: Engine) -> Callable[[WeightsIntegrityError], None]:
    """Records, as an integrity event, a server refused while serving (not while loading)."""

    def record(error: WeightsIntegrityError) -> None:
        record_integrity_event(engine, service="execution", error=error,
                               during="serving from the inference server")

    return record


class PolicyCache:
    """Thread-safe LRU of policy clients keyed by checkpoint id."""

    def __init__(
        self, *, engine: Engine, factory: PolicyFactory, home: Path, capacity: int = 4,
        store: ArtifactStore | None = None,
    ) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        self._engine = engine
        self._factory = factory
        self._home = home
        self._store = store  # the shared artifact store, for artifact:// checkpoints
        self._capacity = capacity
        self._clients: OrderedDict[str, PolicyClient] = OrderedDict()
        self._lock = threading.Lock()  # guards the two maps, never held while loading
        self._loading: dict[str, threading.Lock] = {}  # one per checkpoint being loaded

    def get(self, checkpoint_id: str) -> PolicyClient:
        """The client serving ``checkpoint_id``, loaded on first use.

        Episodes of one new checkpoint load it once (the others wait for that load); a
        load never holds up episodes of checkpoints already loaded. (The in-process torch
        backend builds one model at a time, so there two new checkpoints load in turn.)
        """
        with self._lock:
            client = self._cached(checkpoint_id)
            if client is not None:
                return client
            loading = self._loading.setdefault(checkpoint_id, threading.Lock())
        with loading:
            with self._lock:
                client = self._cached(checkpoint_id)
            if client is not None:  # loaded while this one waited
                return client
            try:
                client = self._load(checkpoint_id)
            finally:
                with self._lock:
                    if self._loading.get(checkpoint_id) is loading:
                        del self._loading[checkpoint_id]
            with self._lock:
                self._clients[checkpoint_id] = client
                evicted = [self._clients.popitem(last=False)[1]
                           for _ in range(len(self._clients) - self._capacity)]
            for old in evicted:
                _close(old)
            return client

    def _cached(self, checkpoint_id: str) -> PolicyClient | None:
        """The loaded client, now the most recently used; under ``self._lock``."""
        client = self._clients.get(checkpoint_id)
        if client is not None:
            self._clients.move_to_end(checkpoint_id)
        return client

    def _load(self, checkpoint_id: str) -> PolicyClient:
        """Verify the checkpoint's weights, build its client, and verify them again."""
        model_dir = self.model_dir(checkpoint_id)
        self._verify(model_dir, checkpoint_id)
        base_dir = self._adapter_base(checkpoint_id, model_dir)
        try:
            if base_dir is None:
                client = self._factory(checkpoint_id, model_dir)
            else:
                client = cast(AdapterFactory, self._factory)(checkpoint_id, model_dir,
                                                             base_dir=base_dir)
        except WeightsIntegrityError as error:  # an inference server serving other weights
            record_integrity_event(self._engine, service="execution", error=error,
                                   during="loading into the inference server")
            raise
        try:
            self._verify(model_dir, checkpoint_id)
        except WeightsIntegrityError:
            _close(client)
            raise
        return client

    def _adapter_base(self, checkpoint_id: str, model_dir: Path) -> Path | None:
        """The verified directory of an adapter checkpoint's base (None: full weights).

        The id already binds the adapter to the base its config names; the row must name
        the same base, so lineage and weights never tell two stories.
        """
        if not is_adapter_dir(model_dir):
            return None
        base_id = adapter_base_id(model_dir)
        with Session(self._engine) as session:
            row = session.get(Checkpoint, checkpoint_id)
        if row is not None and row.base_model != base_id:
            error = WeightsIntegrityError(
                checkpoint_id, model_dir,
                f"the adapter is on base {base_id} but its row names base {row.base_model}")
            record_integrity_event(self._engine, service="execution", error=error,
                                   during="loading to serve or evaluate")
            raise error
        base_dir = self.model_dir(base_id)
        self._verify(base_dir, base_id)
        return base_dir

    def _verify(self, model_dir: Path, checkpoint_id: str) -> None:
        """Refuse weights that are not the checkpoint's, and record the refusal."""
        try:
            verify_weights(model_dir, checkpoint_id)
        except WeightsIntegrityError as error:
            record_integrity_event(self._engine, service="execution", error=error,
                                   during="loading to serve or evaluate")
            raise

    def model_dir(self, checkpoint_id: str) -> Path:
        """Where the checkpoint's weights are, from its row."""
        with Session(self._engine) as session:
            row = session.get(Checkpoint, checkpoint_id)
        if row is None:
            raise UnknownCheckpoint(
                f"checkpoint {checkpoint_id!r} is not registered; the learning loop registers "
                "checkpoints, and routing may only name registered ones"
            )
        refuse_pruned(row, wanted_for="served")  # a clear error, not a missing file
        try:
            return checkpoint_dir(row.artifact_uri, home=self._home, store=self._store,
                                  checkpoint_id=checkpoint_id)
        except ArtifactCorrupted as corrupted:
            error = WeightsIntegrityError(checkpoint_id, Path(row.artifact_uri),
                                          f"a stored file is corrupt ({corrupted})")
            record_integrity_event(self._engine, service="execution", error=error,
                                   during="reading from the artifact store")
            raise error from corrupted

    def cached(self) -> list[str]:
        """Checkpoint ids currently loaded, least recently used first."""
        with self._lock:
            return list(self._clients)


def _close(client: PolicyClient) -> None:
    close = getattr(client, "close", None)
    if callable(close):
        close()


EnvironmentLookup = Callable[[str], EnvironmentFactory]
"""The environment factory for an environment name (the registry's, or a test's)."""


class TaskNotAdmitted(LookupError):
    """Episodes were asked for on a task governance has not admitted."""


@dataclass(frozen=True)
class OpenedTask:
    """A task with its parsed, registered contract and its environment factory."""

    task_id: str
    environment_version_id: str
    seed: int
    contract: EnvironmentContract
    factory: EnvironmentFactory
    item: dict[str, Any] | None = None  # the dataset row or generated problem it plays

    def open(self, **kwargs: Any) -> Environment:
        """A fresh environment (its own working copy) for one episode."""
        return self.factory(self.contract, **kwargs)


def _default_lookup(name: str) -> EnvironmentFactory:
    from execution_loop.environments.registry import get_environment

    return get_environment(name)


class TaskEnvironments:
    """Opens a task's environment from its registered, immutable environment version."""

    def __init__(self, *, engine: Engine, lookup: EnvironmentLookup | None = None) -> None:
        self._engine = engine
        self._lookup = lookup or _default_lookup
        self._tasks: dict[str, OpenedTask] = {}
        self._lock = threading.Lock()

    def task(self, task_id: str, *, pending_ok: bool = False) -> OpenedTask:
        """An admitted task with its contract (``pending_ok``: admission probes it first).

        Admitted tasks are cached: their version and seed never change.
        """
        with self._lock:
            opened = self._tasks.get(task_id)
        if opened is not None:
            return opened
        with Session(self._engine) as session:
            task = session.get(Task, task_id)
            if task is None:
                raise LookupError(f"task {task_id!r} does not exist")
            if task.status != TaskStatus.admitted and not pending_ok:
                raise TaskNotAdmitted(
                    f"task {task_id!r} is {task.status}: episodes run only on admitted tasks "
                    "(governance's AdmissionWorkflow admits them)"
                )
            version = session.get(EnvironmentVersion, task.environment_version_id)
        if version is None:
            raise LookupError(f"environment version {task.environment_version_id!r} is missing")
        contract = self._parse(version)
        opened = OpenedTask(task.id, version.id, task.seed, contract, self._factory(contract),
                            item=task.item)
        if task.status == TaskStatus.admitted:
            with self._lock:
                self._tasks[task_id] = opened
        return opened

    def _factory(self, contract: EnvironmentContract) -> EnvironmentFactory:
        """A served contract opens the protocol's client; any other, its named environment."""
        if contract.service is not None:
            from execution_loop.environments.registry import served_environment

            return served_environment
        return self._lookup(contract.task)

    def _parse(self, version: EnvironmentVersion) -> EnvironmentContract:
        from execution_loop.environments import registry

        # Fixtures of registered versions ship with the environment implementations.
        return parse_contract_text(
            version.contract_text, base_dir=registry.CONTRACTS_DIR,
            source=f"environment version {version.id}",
        )
