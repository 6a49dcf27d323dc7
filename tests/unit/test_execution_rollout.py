"""Pure parts of the rollout: episode ids, result counts, routing, shadow agreement, errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy.exc
from temporalio.exceptions import ApplicationError

from execution_loop.activities import episode_seed, is_infrastructure_error, non_retryable
from execution_loop.admission_probe import verifier_hash
from execution_loop.inference.base import InferenceServerError, PromptTooLongError
from execution_loop.routing import (
    NoProductionCheckpoint,
    Routes,
    assign,
    canary_bucket,
    situation_hashes,
    step_agreement,
)
from execution_loop.serving import UnsupportedArtifactUri, checkpoint_dir
from execution_loop.workflows import EpisodeSummary, plan_episodes, shadow_spec, summarize
from triloop.policy import Actor, Decision, PolicyDenied, Resource
from triloop.workflow_api import RolloutBatchInput, RolloutItem


def batch(*items: RolloutItem) -> RolloutBatchInput:
    return RolloutBatchInput(batch_id="b1", purpose="training", items=list(items))


def test_episode_ids_are_batch_item_sample_and_groups_share_a_task() -> None:
    specs = plan_episodes(batch(RolloutItem("t1", 3, 2), RolloutItem("t2", 5, 1)), "ck")
    assert [s.episode_id for s in specs] == ["b1:0:0", "b1:0:1", "b1:1:0"]
    assert [s.group_id for s in specs] == ["b1:0", "b1:0", "b1:1"]
    assert [(s.task_id, s.task_seed, s.sample_index) for s in specs] == [
        ("t1", 3, 0), ("t1", 3, 1), ("t2", 5, 0)]
    assert plan_episodes(batch(RolloutItem("t1", 3, 2)), "ck") == specs[:2]


def test_shadow_episode_mirrors_task_and_seed_under_its_own_id() -> None:
    spec = plan_episodes(batch(RolloutItem("t1", 3)), "prod")[0]
    spec.shadow_checkpoint_id = "cand"
    shadow = shadow_spec(spec)
    assert (shadow.episode_id, shadow.purpose, shadow.checkpoint_id) == (
        "b1:0:0:shadow", "shadow", "cand")
    assert (shadow.task_id, shadow.task_seed, shadow.shadow_of) == ("t1", 3, "b1:0:0")
    assert episode_seed("b1:0:0") == episode_seed("b1:0:0") != episode_seed("b1:0:1")


def test_summary_counts_every_episode_once() -> None:
    specs = plan_episodes(batch(RolloutItem("t", 1, 4)), "ck")
    summaries = {
        "b1:0:0": EpisodeSummary("b1:0:0", "completed", True, 1.0, 3),
        "b1:0:1": EpisodeSummary("b1:0:1", "truncated", False, 0.0, 5),
    }
    statuses = {"b1:0:0": "completed", "b1:0:1": "truncated", "b1:0:2": "truncated",
                "b1:0:3": "failed"}
    result = summarize("b1", specs, summaries, statuses, {"b1:0:0", "b1:0:1", "b1:0:2"})
    assert (result.completed, result.truncated, result.failed) == (1, 2, 1)
    assert result.trajectory_ids == ["b1:0:0", "b1:0:1", "b1:0:2"]
    assert result.mean_reward == 0.5 and result.success_rate == 0.25


def test_canary_share_is_deterministic_and_proportional() -> None:
    routes = Routes(production="p", canary="c", canary_share=0.2, shadow="s")
    ids = [f"batch:{i}:0" for i in range(4000)]
    first = [assign(e, routes) for e in ids]
    assert first == [assign(e, routes) for e in ids]
    share = sum(a.purpose == "canary" for a in first) / len(ids)
    assert 0.17 < share < 0.23
    for a in first:
        if a.purpose == "canary":
            assert (a.checkpoint_id, a.shadow_checkpoint_id) == ("c", None)
        else:
            assert (a.checkpoint_id, a.shadow_checkpoint_id) == ("p", "s")
    assert all(0 <= canary_bucket(e) < 1 for e in ids[:50])


@pytest.mark.parametrize("share", [0.0, float("nan"), -1.0])
def test_no_canary_traffic_without_a_positive_share(share: float) -> None:
    routes = Routes(production="p", canary="c", canary_share=share)
    assert {assign(f"e{i}", routes).purpose for i in range(200)} == {"production"}


def test_full_canary_share_and_no_shadow_of_production_itself() -> None:
    assert assign("e", Routes(production="p", canary="c", canary_share=1.0)).purpose == "canary"
    assert assign("e", Routes(production="p", shadow="p")).shadow_checkpoint_id is None


def test_production_traffic_without_a_production_checkpoint_is_refused() -> None:
    with pytest.raises(NoProductionCheckpoint, match="promote a checkpoint"):
        assign("e", Routes(production=None))


def test_shadow_steps_compare_only_while_the_situation_is_the_same() -> None:
    production = list(zip(situation_hashes("h0", ["a", "b", "c"]), ["R", "D", "R"], strict=True))
    same_then_diverged = list(zip(
        situation_hashes("h0", ["a", "x", "y", "z"]), [" R", "L", "R", "U"], strict=True))
    agreement = step_agreement(production, same_then_diverged)
    assert [(s["compared"], s["agreed"]) for s in agreement] == [
        (True, True), (True, False), (False, False), (False, False)]
    assert agreement[1]["production_action"] == "D" and agreement[3]["production_action"] is None


def test_only_infrastructure_errors_are_retried() -> None:
    denied = PolicyDenied(Actor("execution"), "create", Resource("trajectory"),
                          Decision(False, ("no",), None, None))
    assert is_infrastructure_error(InferenceServerError("http://x", "down"))
    assert is_infrastructure_error(sqlalchemy.exc.OperationalError("s", {}, Exception("gone")))
    assert is_infrastructure_error(ConnectionResetError())
    for exc in (denied, PromptTooLongError("long"), ValueError("bad contract"), LookupError()):
        assert not is_infrastructure_error(exc)
    wrapped = non_retryable(ValueError("bad contract"))
    assert isinstance(wrapped, ApplicationError) and wrapped.non_retryable
    assert wrapped.type == "ValueError" and "bad contract" in str(wrapped)


def test_checkpoint_directories_from_artifact_uris(tmp_path: Path) -> None:
    assert checkpoint_dir((tmp_path / "m").as_uri(), home=Path("/h")) == tmp_path / "m"
    assert checkpoint_dir("/abs/m", home=Path("/h")) == Path("/abs/m")
    assert checkpoint_dir("artifacts/m", home=Path("/h")) == Path("/h/artifacts/m")
    with pytest.raises(UnsupportedArtifactUri, match="local paths and artifact:// URIs"):
        checkpoint_dir("s3://bucket/m", home=Path("/h"))


def test_verifier_hash_covers_the_verifier_module_and_what_it_reaches() -> None:
    import hashlib

    import execution_loop.environments.frozen_lake as module
    from triloop.environment_code import code_hashes, digest, environment_verifier_hash

    reached = code_hashes(["execution_loop.environments.frozen_lake"])
    assert reached["execution_loop.environments.frozen_lake"] == hashlib.sha256(
        Path(module.__file__).read_bytes()).hexdigest()
    assert "execution_loop.verification" in reached
    expected = digest(reached)
    assert verifier_hash(["execution_loop.environments.frozen_lake:verify"] * 2) == expected
    assert environment_verifier_hash("frozen_lake") == expected  # what registration pins
    assert verifier_hash([]) is None
