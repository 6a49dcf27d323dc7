"""``describe_tasks``: the content digest and tags of each task of a source, computed here.

The execution loop owns environment code, so it describes; governance records what it is
told (``TaskSetRegistration``). A source is explicit (seed, item) pairs, the environment's
generator with its params, or a dataset file read from the artifact store by its sha256
(never carried in the request). Each task's content is the environment's ``describe``
(``registry.describe_task``), its digest ``base.fingerprint`` of it. A task the environment
cannot describe (an item it refuses, a fixture that does not build) is a problem named by
ordinal and seed, not a failed activity: governance refuses the registration with them.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from temporalio import activity

from execution_loop.contracts import DESCRIBE_TASKS
from execution_loop.environments.base import EnvironmentUnavailable, GeneratedTask
from execution_loop.environments.registry import describe_task, generate_tasks
from execution_loop.serving import TaskEnvironments
from triloop.artifacts import ArtifactNotFound, ArtifactStore
from triloop.task_sources import TaskSourceError, dataset_rows, take_split_field
from triloop.workflow_api import DescribedTask, DescribeTasksInput, DescribeTasksResult

_HEARTBEAT_EVERY = 25  # tasks


@dataclass(frozen=True)
class _Source:
    seed: int
    item: dict[str, Any] | None
    tags: dict[str, str]
    split: str | None = None
    keep_item: bool = False  # a generated item travels back; a dataset row stays in its file


class TaskDescriber:
    """The task-description activity, bound to the task environments and the artifact store."""

    def __init__(self, *, environments: TaskEnvironments, store: ArtifactStore | None) -> None:
        self._environments = environments
        self._store = store

    @activity.defn(name=DESCRIBE_TASKS.name)
    def describe_tasks(self, request: DescribeTasksInput) -> DescribeTasksResult:
        """Describe every task of the request's one source, in source order."""
        contract, factory = self._environments.version_contract(request.environment_version_id)
        result = DescribeTasksResult(environment_version_id=request.environment_version_id)
        try:
            sources = list(self._sources(request, contract))
        except (TaskSourceError, ValueError, ArtifactNotFound) as error:
            result.problems.append(str(error))
            return result
        for ordinal, source in enumerate(sources):
            if ordinal % _HEARTBEAT_EVERY == 0:
                activity.heartbeat(ordinal)
            try:
                content = describe_task(contract, source.seed, source.item, factory=factory)
            except EnvironmentUnavailable:
                raise  # the service is down: retried, never a verdict on the task
            except Exception as error:  # the environment's own refusal of this task
                result.problems.append(f"task {ordinal} (seed {source.seed}): "
                                       f"{type(error).__name__}: {error}"[:500])
                continue
            result.tasks.append(DescribedTask(
                ordinal=ordinal, seed=source.seed, content_digest=content.digest,
                tags={**{str(k): str(v) for k, v in content.tags.items()}, **source.tags},
                item=source.item if source.keep_item else None, split=source.split))
        return result

    def _sources(self, request: DescribeTasksInput, contract: Any) -> Iterator[_Source]:
        given = [request.tasks != [], request.generator is not None,
                 request.dataset_sha256 is not None]
        if sum(given) != 1:
            raise ValueError("describe_tasks takes exactly one source: tasks, a generator or "
                             "a dataset")
        if request.generator is not None:
            for made in generate_tasks(contract, request.generator):
                yield _generated(made)
        elif request.dataset_sha256 is not None:
            yield from self._dataset(request)
        else:
            for task in request.tasks:
                yield _Source(task.seed, task.item, {})

    def _dataset(self, request: DescribeTasksInput) -> Iterator[_Source]:
        if self._store is None:
            raise ValueError("no artifact store is configured: a dataset cannot be read")
        data = self._store.get_bytes(str(request.dataset_sha256))
        rows = dataset_rows(data, request.dataset_format or "")
        items, splits = take_split_field(rows, request.split_field)
        for ordinal, (item, split) in enumerate(zip(items, splits, strict=True)):
            yield _Source(ordinal, item, {}, split)


def _generated(made: GeneratedTask) -> _Source:
    tags = {str(k): str(v) for k, v in made.tags.items()}
    return _Source(int(made.seed), made.item, tags, keep_item=True)
