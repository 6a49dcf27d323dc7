"""The command harness: an agent program in the sandbox plays tool_arithmetic through the
gateway, and its episode becomes steps the learner can train on.

The agent is the shipped example (``fixtures/agents/arithmetic_agent.py``, real HTTP from
a real subprocess); the policy is scripted so that what the agent does is known: two tool
calls, then (after its context compression) the right answer.
"""

from __future__ import annotations

import json
import socket
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from transformers import PreTrainedTokenizerBase

from execution_loop.command_agent import run_command_episode
from execution_loop.environments.registry import (
    CONTRACTS_DIR,
    make_environment,
    reference_solution,
)
from execution_loop.sandbox import (
    LocalProcessSandbox,
    SandboxBackend,
    SandboxResult,
)
from execution_loop.sandboxes import BubblewrapSandbox, bubblewrap_problem
from learning_loop.tiny_model import build_tokenizer
from tests.gateway_standins import ScriptedPolicy
from triloop.contracts import (
    ContractError,
    EnvironmentContract,
    contract_id,
    load_contract,
    parse_contract_text,
)

pytestmark = pytest.mark.slow
AGENT_CONTRACT = CONTRACTS_DIR / "tool_arithmetic_agent.yaml"
SEED = 11


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerBase:
    return build_tokenizer()


@pytest.fixture(scope="module")
def contract() -> EnvironmentContract:
    return load_contract(AGENT_CONTRACT)


class RecordingLocal(LocalProcessSandbox):
    """The local backend, keeping each command's result (the test reads the agent's stderr)."""

    results: list[SandboxResult]

    def run(self, *args: Any, **kwargs: Any) -> SandboxResult:
        result = super().run(*args, **kwargs)
        self.results.append(result)
        return result


class RecordingBubblewrap(BubblewrapSandbox):
    """Bubblewrap, keeping each command's result (its copies share the list)."""

    results: list[SandboxResult]

    def run(self, *args: Any, **kwargs: Any) -> SandboxResult:
        result = super().run(*args, **kwargs)
        self.results.append(result)
        return result


@pytest.fixture(params=["local", "bubblewrap"])
def sandbox(request: pytest.FixtureRequest) -> LocalProcessSandbox:
    """Every test runs the agent locally and, where it works, under bubblewrap."""
    chosen: LocalProcessSandbox
    if request.param == "local":
        chosen = RecordingLocal()
    else:
        problem = bubblewrap_problem()
        if problem is not None:
            pytest.skip(f"bubblewrap cannot run here: {problem}")
        chosen = RecordingBubblewrap()
    chosen.results = []
    return chosen


def play(contract: EnvironmentContract, policy: ScriptedPolicy,
         sandbox: SandboxBackend | None = None, **kwargs: object) -> Any:
    env = make_environment(contract)
    try:
        return run_command_episode(env, policy, contract=contract,
                                   sandbox=sandbox or LocalProcessSandbox(), seed=3,
                                   task_seed=SEED, limits=contract.limits, **kwargs)
    finally:
        env.close()


def test_the_agent_solves_the_task_and_every_model_token_is_accounted_for(
    contract: EnvironmentContract, tokenizer: PreTrainedTokenizerBase,
    sandbox: LocalProcessSandbox,
) -> None:
    answer = reference_solution("tool_arithmetic", SEED, contract)[-1]
    tool = "python: print(2)"  # the reference's own tool call is longer than 24 tokens
    policy = ScriptedPolicy(tokenizer, ["python: print(1)", tool, "I ran two tools.", answer])
    progress: list[int] = []
    record = play(contract, policy, sandbox, on_progress=progress.append)
    assert record.status == "completed" and record.success, record.extra["agent"]
    assert record.total_reward == 1.0 and record.outcome_reward == 1.0
    gateway = record.extra["gateway"]
    assert gateway["kinds"] == {"main": 3, "compression": 1}
    assert [c["kind"] for c in gateway["calls"]] == ["main", "main", "compression", "main"]
    assert [c["requested_temperature"] for c in gateway["calls"]] == [0.7] * 4
    assert [c.get("step") for c in gateway["calls"]] == [0, 1, None, 2]
    compression = gateway["calls"][2]  # not a step: its sampled ids are kept in the record
    assert len(compression["sampled_token_ids"]) == compression["completion_tokens"]
    assert compression["behaviour_logprobs"] == [-0.25] * compression["completion_tokens"]
    assert policy.temperatures == [1.0] * 4  # the episode's temperature sampled
    # The compression rewrote the context: the third main call starts a new segment.
    assert gateway["segments"] == 2
    [cut] = gateway["breaks"]
    assert cut["call"] == 2 and "compressed or rewrote" in cut["reason"]

    steps = record.steps
    assert len(steps) == 3  # one per main-loop call; the compression is not trained on
    for step, prompt in zip(steps, [policy.prompts[0], policy.prompts[1], policy.prompts[3]],
                            strict=True):
        assert step.prompt_token_ids == prompt  # exactly what the model was fed
        assert step.action_mask == [0] * len(prompt) + [1] * len(step.action_token_ids)
        assert step.behaviour_logprobs == [-0.25] * len(step.action_token_ids)
    # Within a segment the next prompt extends prompt + sampled ids; between the two, the
    # tokens that are not the model's (the environment's reply) are outside every mask.
    first, second, third = steps
    joined = first.prompt_token_ids + first.action_token_ids
    assert second.prompt_token_ids[: len(joined)] == joined
    assert second.feedback["observation_tokens"] == len(second.prompt_token_ids) - len(joined)
    assert "trajectory_break" in third.feedback and third.feedback["segment"] == 1
    assert [s.action_text for s in steps] == ["python: print(1)", tool, answer]
    assert [len(s.feedback["environment_steps"]) for s in steps] == [1, 1, 1]
    assert third.done and third.observation
    assert progress and progress[-1] <= 4
    assert record.extra["agent"]["exit_code"] == 0
    assert record.extra["agent"]["sandbox"]["backend"] == sandbox.name


def test_an_agent_that_quits_early_is_truncated_and_says_so(
    contract: EnvironmentContract, tokenizer: PreTrainedTokenizerBase, tmp_path: Path,
    sandbox: LocalProcessSandbox,
) -> None:
    quitter = _with_agent(contract, tmp_path, "import sys\nsys.stdin.read()\nsys.exit(0)\n")
    record = play(quitter, ScriptedPolicy(tokenizer, []), sandbox)
    assert (record.status, record.failure_reason) == ("truncated", "agent_exited")
    assert record.steps == [] and record.extra["agent"]["exit_code"] == 0


def test_an_agent_that_crashes_on_import_failed_with_its_stderr_tail(
    contract: EnvironmentContract, tokenizer: PreTrainedTokenizerBase, tmp_path: Path,
    sandbox: LocalProcessSandbox,
) -> None:
    crasher = _with_agent(contract, tmp_path, "import no_such_agent_library\n")
    record = play(crasher, ScriptedPolicy(tokenizer, []), sandbox)
    assert record.status == "failed", record.failure_reason
    assert record.failure_reason.startswith("agent_failed (exit 1): ")
    assert "ModuleNotFoundError: No module named 'no_such_agent_library'" in (
        record.failure_reason)
    assert "no_such_agent_library" in record.extra["agent"]["stderr_tail"]
    assert record.steps == [] and not record.success and record.outcome_reward == 0.0
    # A program that exits non-zero later, without a traceback, fails as well.
    quitter = _with_agent(contract, tmp_path / "q", "import sys\nsys.stdin.read()\nsys.exit(4)\n")
    record = play(quitter, ScriptedPolicy(tokenizer, []), sandbox)
    assert (record.status, record.failure_reason) == (
        "failed", "agent_failed (exit 4): nothing on stderr")


def test_an_agent_past_its_token_budget_is_truncated(
    contract: EnvironmentContract, tokenizer: PreTrainedTokenizerBase,
    sandbox: LocalProcessSandbox,
) -> None:
    text = AGENT_CONTRACT.read_text().replace("max_total_tokens: 160", "max_total_tokens: 50")
    tight = parse_contract_text(text, base_dir=CONTRACTS_DIR)
    long_answers = ScriptedPolicy(tokenizer, ["word " * 50] * 20)  # each cut at 24 tokens
    record = play(tight, long_answers, sandbox)
    # 24 + 24 + 2 (the compression, cut at what was left), then the gateway answers 429.
    assert (record.status, record.failure_reason) == ("truncated", "max_total_tokens")
    assert record.generated_tokens == 50 and record.extra["agent"]["exit_code"] == 3
    assert [s.finish_reason for s in record.steps] == ["length", "length"]


def test_the_deadline_stops_a_slow_agent(
    contract: EnvironmentContract, tokenizer: PreTrainedTokenizerBase, tmp_path: Path,
    sandbox: LocalProcessSandbox,
) -> None:
    sleeper = _with_agent(contract, tmp_path, "import time\ntime.sleep(60)\n")
    record = play(sleeper, ScriptedPolicy(tokenizer, []), sandbox,
                  deadline=time.time() + 1.0)
    assert (record.status, record.failure_reason) == ("truncated", "deadline")


def test_the_agent_section_is_checked_and_left_out_of_old_identities(
    contract: EnvironmentContract,
) -> None:
    text = AGENT_CONTRACT.read_text()
    unlisted = text.replace("fixtures: [fixtures/agents/arithmetic_agent.py]\n", "")
    with pytest.raises(ContractError, match="agent.files must be listed under fixtures"):
        parse_contract_text(unlisted, base_dir=CONTRACTS_DIR)
    no_command = text.replace('  command: ["{python}", "arithmetic_agent.py"]\n', "")
    with pytest.raises(ContractError, match="command"):
        parse_contract_text(no_command, base_dir=CONTRACTS_DIR)
    # A contract without an agent hashes as it did before the section existed.
    builtin = load_contract(CONTRACTS_DIR / "tool_arithmetic.yaml")
    assert builtin.agent is None
    assert "agent" not in builtin.model_dump(mode="json", exclude_none=True)
    assert contract_id(builtin) != contract_id(contract)


def _with_agent(contract: EnvironmentContract, tmp_path: Path, program: str,
                replaced: dict[str, str] | None = None) -> EnvironmentContract:
    """The same contract with another agent program (loaded from a copy of the folder)."""
    folder = tmp_path / "contract"
    (folder / "fixtures" / "agents").mkdir(parents=True)
    (folder / "fixtures" / "agents" / "arithmetic_agent.py").write_text(textwrap.dedent(program))
    text = AGENT_CONTRACT.read_text()
    for old, new in (replaced or {}).items():
        text = text.replace(old, new)
    (folder / "c.yaml").write_text(text)
    return load_contract(folder / "c.yaml")


class Cancelled(Exception):
    """What the activity raises from its progress callback when Temporal cancels it."""


def test_a_cancelled_episode_refuses_the_agent_and_raises(
    contract: EnvironmentContract, tokenizer: PreTrainedTokenizerBase, tmp_path: Path,
    sandbox: LocalProcessSandbox,
) -> None:
    # The agent calls the model until refused and says how on stderr, which the test's
    # sandbox keeps. No budget could stop it before the cancel.
    chatty = _with_agent(contract, tmp_path, """
        import json, os, sys, urllib.error, urllib.request
        sys.stdin.read()
        body = json.dumps({"messages": [{"role": "user", "content": "go"}]}).encode()
        url = os.environ["OPENAI_BASE_URL"] + "/chat/completions"
        while True:
            request = urllib.request.Request(url, data=body, method="POST",
                                             headers={"Content-Type": "application/json"})
            try:
                urllib.request.urlopen(request, timeout=30).read()
            except urllib.error.HTTPError as error:
                sys.stderr.write(f"refused {error.code}")
                sys.exit(4)
    """, {"max_total_tokens: 160": "max_total_tokens: 100000000"})
    policy = ScriptedPolicy(tokenizer, ["x"] * 100000)

    def cancel_after_the_first_call(calls: int) -> None:
        if calls >= 1:
            raise Cancelled("the batch deadline passed")

    with pytest.raises(Cancelled):
        play(chatty, policy, sandbox, on_progress=cancel_after_the_first_call)
    # Its session was closed; it had ended before the raise.
    [result] = sandbox.results  # type: ignore[attr-defined]
    assert (result.exit_code, result.stderr) == (4, "refused 404")


def test_agent_files_may_be_a_listed_folder_or_a_file_under_one(tmp_path: Path) -> None:
    from execution_loop.command_agent import prepare_workdir

    folder = tmp_path / "contract"
    (folder / "agent" / "lib").mkdir(parents=True)
    (folder / "agent" / "main.py").write_text("print('hi')\n")
    (folder / "agent" / "lib" / "util.py").write_text("X = 1\n")
    text = AGENT_CONTRACT.read_text().replace(
        "fixtures: [fixtures/agents/arithmetic_agent.py]", "fixtures: [agent]").replace(
        "files: [fixtures/agents/arithmetic_agent.py]", "files: [agent/main.py, agent/lib]")
    (folder / "c.yaml").write_text(text)
    contract = load_contract(folder / "c.yaml")
    assert contract.agent is not None
    work = tmp_path / "work"
    work.mkdir()
    prepare_workdir(contract.agent, contract, work)
    assert (work / "main.py").is_file() and (work / "lib" / "util.py").is_file()


@pytest.fixture
def host_service() -> Iterator[tuple[int, list[object]]]:
    """Another service of the worker's host on loopback; it notes every connection."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.2)
    accepted: list[object] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                accepted.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1], accepted
    stop.set()
    thread.join()
    server.close()


def test_under_bubblewrap_the_agent_reaches_the_gateway_and_nothing_else(
    contract: EnvironmentContract, tokenizer: PreTrainedTokenizerBase, tmp_path: Path,
    host_service: tuple[int, list[object]], monkeypatch: pytest.MonkeyPatch,
) -> None:
    problem = bubblewrap_problem()
    if problem is not None:
        pytest.skip(f"bubblewrap cannot run here: {problem}")
    port, accepted = host_service
    secret_file = tmp_path / "home" / "secrets.env"
    secret_file.parent.mkdir()
    secret_file.write_text("TRILOOP_DB_PASSWORD=hunter2\n")
    monkeypatch.setenv("TRILOOP_TEST_SECRET", "hunter2")
    # The agent calls the model, then probes: the host service, the worker's secret file,
    # its variables (its own and, through /proc, every process it can see).
    prober = _with_agent(contract, tmp_path, f"""
        import json, os, socket, sys, urllib.request
        sys.stdin.read()
        body = json.dumps({{"messages": [{{"role": "user", "content": "hi"}}]}}).encode()
        request = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions",
                                         data=body, method="POST",
                                         headers={{"Content-Type": "application/json"}})
        reply = json.loads(urllib.request.urlopen(request, timeout=30).read())
        seen = {{"model": reply["choices"][0]["message"]["content"]}}
        try:
            socket.create_connection(("127.0.0.1", {port}), timeout=3).close()
            seen["host_service"] = "reached"
        except OSError as exc:
            seen["host_service"] = type(exc).__name__
        try:
            seen["secret_file"] = open({str(secret_file)!r}).read()
        except OSError as exc:
            seen["secret_file"] = type(exc).__name__
        environ = [open(f"/proc/{{p}}/environ", "rb").read() for p in os.listdir("/proc")
                   if p.isdigit() and os.access(f"/proc/{{p}}/environ", os.R_OK)]
        seen["secret_variable"] = any(b"hunter2" in e for e in environ) or any(
            "hunter2" in v for v in os.environ.values())
        sys.stderr.write(json.dumps(seen))
    """)
    sandbox = RecordingBubblewrap()
    sandbox.results = []
    record = play(prober, ScriptedPolicy(tokenizer, ["hello from the model"]), sandbox)
    assert record.extra["agent"]["sandbox"]["backend"] == "bubblewrap"
    assert record.extra["agent"]["exit_code"] == 0, record.extra["agent"]["stderr_tail"]
    [result] = sandbox.results
    seen = json.loads(result.stderr)
    assert seen["model"] == "hello from the model"  # the gateway answered through the relay
    assert seen["host_service"] in ("ConnectionRefusedError", "OSError", "TimeoutError")
    assert accepted == []  # the connection never reached the host's service
    assert seen["secret_file"] in ("FileNotFoundError", "PermissionError")
    assert seen["secret_variable"] is False
    assert len(record.extra["gateway"]["calls"]) == 1  # the gateway recorded the call


def test_a_loopback_endpoint_must_be_on_the_workers_loopback() -> None:
    problem = bubblewrap_problem()
    if problem is not None:
        pytest.skip(f"bubblewrap cannot run here: {problem}")
    with pytest.raises(ValueError, match="must be on 127.0.0.1"):
        BubblewrapSandbox().reaching({"gateway": "10.0.0.5:8080"})
    with pytest.raises(ValueError, match="host:port"):
        BubblewrapSandbox().reaching({"gateway": "no-port"})
