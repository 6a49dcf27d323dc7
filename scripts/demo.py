"""The main job: one full governed cycle on this machine (``make demo``).

Stack up → environments registered and tasks admitted → frozen eval set and
thresholds → the ML engineer submits two runs on the tiny model: a short one with the
collapse guard off, whose candidate the stability gate holds on its alarms (shown, and left
held), and the README's example, whose candidate then passes stability (no alarms lately),
offline eval, shadow and canary on its own → the auditor
signs and the operator approves through the API → promotion → an injected
regression (a game-day serving fault degrades the new checkpoint) → the watch
gate rolls back automatically → a summary. The stack is left running.

Offline eval asks where a rise in held-out reward came from (``attribution`` in the
thresholds): when the candidate's gain is shaping or format reward, not goals, the gate
holds it, the demo prints the terms the gain came from, and the walk ends there (exit 0:
the gates did their job); the summary reports goals and holes beside reward either way.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import yaml
from rich.console import Console

os.environ.setdefault("TRILOOP_GATE_PROFILE", "demo")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from scripts import demo_world as world  # noqa: E402
from scripts.demo_traffic import TrafficGenerator, wait_for  # noqa: E402
from triloop.config import get_settings  # noqa: E402

console = Console(highlight=False, width=110)
STARTED = time.monotonic()

# The README's example run (examples/tiny-frozen-lake.run.yaml), on the demo's base and tasks.
EXAMPLE_RUN = Path(__file__).resolve().parents[1] / "examples" / "tiny-frozen-lake.run.yaml"
RUN_CONFIG: dict[str, Any] = {**yaml.safe_load(EXAMPLE_RUN.read_text()),
                              "name": "frozen-lake demo"}
RUN_CONFIG["rollout"] = {**RUN_CONFIG["rollout"], "deadline_s": 300}
# A second, shorter run without the example's guard for randomly initialised models: its
# detector calls the base model's input-blind answers what they are, template collapse, so
# governance's stability gate holds its candidate (the demo's blocked candidate).
UNGUARDED_RUN: dict[str, Any] = {
    **RUN_CONFIG, "name": "frozen-lake demo, collapse guard off",
    "stability": {**RUN_CONFIG["stability"], "collapse_requires_prior_discrimination": False},
    "schedule": {**RUN_CONFIG["schedule"], "iterations": 6, "propose_every": 6},
}


def step(title: str) -> None:
    """Print a numbered stage with the elapsed time."""
    console.print(f"\n[bold cyan]▶ {title}[/bold cyan]  [dim](+{time.monotonic() - STARTED:.0f}s)"
                  "[/dim]")


class Api:
    """The web API as one person sees it."""

    def __init__(self, base: str, person: world.Person) -> None:
        self.person = person
        self._client = httpx.Client(base_url=base, timeout=60.0,
                                    headers={"Authorization": f"Bearer {person.token}"})

    def get(self, path: str, **params: Any) -> Any:
        response = self._client.get(path, params=params)
        response.raise_for_status()
        return response.json()

    def exists(self, path: str) -> bool:
        return self._client.get(path).status_code == 200

    def post(self, path: str, body: dict[str, Any]) -> Any:
        response = self._client.post(path, json=body)
        if response.status_code >= 400:
            raise RuntimeError(f"POST {path} as {self.person.name}: {response.status_code} "
                               f"{response.text[:400]}")
        return response.json()


def main() -> int:
    """Run the governed cycle; return the exit status."""
    settings = get_settings()
    suffix = time.strftime("%H%M%S")
    api_base = f"http://{settings.web_host}:{settings.web_port}"

    step("Bringing the stack up (PostgreSQL, Temporal, OPA, the verifier, three loop workers,"
         " web)")
    from triloop.devstack.stack import up

    for line in up(settings):
        console.print(f"  {line}")

    step("Creating the tiny base model locally (no download)")
    from learning_loop.checkpoints import readable_by_readers
    from learning_loop.tiny_model import create_tiny_model, tiny_model_info

    base_dir = (settings.home / "models" / "tiny-base").resolve()
    if not (base_dir / "config.json").exists():
        create_tiny_model(base_dir, seed=0)
    readable_by_readers(base_dir)  # one made before each loop ran as its own OS user
    info = tiny_model_info(base_dir)
    console.print(f"  {base_dir}: {info.num_parameters:,} parameters, vocab {info.vocab_size}")

    step("Two founding admins: the first creates people through the API (an ML engineer, an"
         " auditor, an operator), the second confirms the auditor's and the operator's roles")
    people = world.create_people(settings, suffix, api_base)
    for role, person in people.items():
        console.print(f"  {person.name:<14} {role}")
    engineer, auditor, operator = (Api(api_base, people[r])
                                   for r in ("ml_engineer", "auditor", "operator"))

    step("Governance registers the built-in environments and admits tasks (four questions)")
    versions = world.register_environments(settings, people["operator"])
    for name, version in versions.items():
        console.print(f"  {name:<16} {version[:16]}…")
    lake = world.add_tasks(settings, versions["frozen_lake"], world.TRAINING_SEEDS,
                           people["operator"])
    held_out = world.add_tasks(settings, versions["frozen_lake"], world.EVAL_SEEDS,
                               people["operator"])
    traffic_tasks = world.add_tasks(settings, versions["frozen_lake"], world.TRAFFIC_SEEDS,
                                    people["operator"])
    ci = world.add_tasks(settings, versions["fix_ci_failure"], world.CI_SEEDS, people["operator"])
    def admit(task_id: str) -> dict[str, Any]:
        return operator.post(f"/api/tasks/{task_id}/admission", {
            "decision": "approve", "comment": "evidence answers all four questions"})

    for line in asyncio.run(world.admit_tasks(settings, lake + held_out + traffic_tasks + ci,
                                              admit)):
        console.print(f"  {line}")
    console.print(f"  (evidence per task: {api_base}/environments/frozen_lake)")

    step("Governance freezes an eval set on held-out maps and sets the promotion thresholds")
    eval_set_id, eval_hash, threshold_id = world.freeze_eval_set_and_threshold(
        settings, held_out, people["operator"])
    console.print(f"  eval set {eval_set_id} (sha256 {eval_hash[:16]}…), threshold {threshold_id}")

    step(f"{engineer.person.name} submits two training runs through the API: the README's"
         " example, and a short one with the collapse guard off")
    def submit(template: dict[str, Any]) -> dict[str, Any]:
        # The example's own tasks are the README's task set; the demo trains on the maps it
        # admitted one by one above (the same seeds as that set's train split).
        config = {**template, "model": {"base": str(base_dir)},
                  "rollout": {**template["rollout"], "task_ids": lake, "task_sets": []}}
        run: dict[str, Any] = engineer.post("/api/runs", {"config": config})
        console.print(f"  {template['name']}: run {run['id']}  {api_base}/runs/{run['id']}")
        return run

    run = submit(RUN_CONFIG)
    unguarded = submit(UNGUARDED_RUN)

    from learning_loop.checkpoints import saved_weights_digest

    # The learning loop registers the base as a root checkpoint whose id is its weights' hash.
    base_id = saved_weights_digest(base_dir)
    wait_for(lambda: engineer.exists(f"/api/checkpoints/{base_id}"), timeout_s=300,
             what=f"the base checkpoint {base_id[:16]}… to be registered")
    from governance_loop.activities.rollback import bootstrap_production
    from triloop.db import role_engine
    from triloop.wiring import build_authorizer

    bootstrap_production(engine=role_engine(settings, "governance"),
                         authorizer=build_authorizer(settings, "governance"),
                         checkpoint_id=str(base_id), requested_by=operator.person.name,
                         roles=operator.person.roles, replace=True)
    console.print(f"  production serves the base checkpoint {str(base_id)[:16]}…")

    step("Training, the short run first (GRPO on frozen_lake): rollout on the execution loop,"
         " update on learning")
    _follow_training(engineer, unguarded["id"])
    step("The short run's candidate meets the stability gate")
    blocked_id = _show_blocked(operator, unguarded["id"], api_base)

    step("Training, the README's example run")
    detail = _follow_training(engineer, run["id"])
    rewards = [m["reward_mean"] for m in detail["metrics"] if m.get("reward_mean") is not None]

    step("The learning loop proposed a candidate; governance runs the gates")
    promotion = wait_for(lambda: _promotion_of(operator, run["id"]), timeout_s=300,
                         what="the promotion opened for the run's proposal")
    traffic = TrafficGenerator(api_base, operator.person.token,
                               dict(zip(traffic_tasks, world.TRAFFIC_SEEDS, strict=True)))
    traffic.start()
    try:
        final = _walk_gates(operator, auditor, promotion["id"], api_base)
    finally:
        traffic.stop()
        _triloop("faults", "clear", token=operator.person.token, api_url=api_base)

    _summary(auditor, run["id"], final, rewards, api_base, traffic, blocked_id, people)
    console.print("\nThe stack is still running; stop it with [bold]triloop dev down[/bold].")
    # Either ending shows the gates at work: the watch rolled the promoted candidate back, or
    # offline eval held a candidate whose gain was shaping only.
    held = final["status"] == "rejected" and bool(held_for_shaping(final))
    return 0 if final["status"] == "rolled_back" or held else 1


def _follow_training(api: Api, run_id: str) -> dict[str, Any]:
    seen = -1
    while True:
        detail = api.get(f"/api/runs/{run_id}")
        for point in detail["metrics"]:
            if point["iteration"] > seen:
                seen = point["iteration"]
                values = {k: point.get(k) or 0.0 for k in
                          ("reward_mean", "entropy", "grad_norm", "discrimination")}
                console.print(
                    f"  iteration {point['iteration']:>2}: reward {values['reward_mean']:+.3f}"
                    f"  entropy {values['entropy']:.2f}  grad norm {values['grad_norm']:.2f}"
                    f"  discrimination {values['discrimination']:.2f}"
                )
        if detail["status"] in ("completed", "completed_with_alarms", "failed", "cancelled"):
            console.print(f"  run {detail['status']} after {detail['iterations_done']} iterations")
            for alarm in detail["alarms"]:
                console.print(f"  [red]alarm[/red] {alarm['name']} at iteration "
                              f"{alarm['iteration']}")
            if detail["status"] not in ("completed", "completed_with_alarms"):
                raise RuntimeError(f"training run {detail['status']}: {detail['status_reason']}")
            return detail
        time.sleep(3)


def _show_blocked(operator: Api, run_id: str, api_base: str) -> str:
    """Wait until the run's candidate is held at the stability gate; show why, and leave it."""
    promotion = wait_for(lambda: _promotion_of(operator, run_id), timeout_s=300,
                         what="the promotion opened for the short run's proposal")
    detail = wait_for(lambda: _held_at_stability(operator, promotion["id"]), timeout_s=300,
                      what="the stability gate's verdict on the short run's candidate")
    named = ", ".join(f"{a['kind']} at iteration {a['iteration']}"
                      for a in detail.get("alarms") or [])
    why = (detail.get("status_reason") or detail.get("reason")
           or "at the stability gate, on its run's alarms")
    console.print(f"  [red]held[/red]: {why}")
    console.print(f"  governance read the run's alarms from the database ({named}) and compared "
                  "them with the proposal's copies; nothing else runs for this candidate")
    console.print(f"  the evidence is on the console: {api_base}/promotions/{promotion['id']}; "
                  "an operator who did not submit the run could override it with a written "
                  "reason. Nobody does: it stays held, and is rejected at its deadline")
    return str(promotion["id"])


def _held_at_stability(api: Api, promotion_id: str) -> dict[str, Any] | None:
    detail: dict[str, Any] = api.get(f"/api/promotions/{promotion_id}")
    if detail["status"] != "open":
        raise RuntimeError(f"the short run's promotion ended {detail['status']} instead of "
                           "being held at the stability gate")
    return detail if detail.get("current_gate") == "stability" and detail.get("alarms") else None


def _promotion_of(api: Api, run_id: str) -> dict[str, Any] | None:
    page = api.get("/api/promotions", limit=50)
    return next((p for p in page["items"] if p["run_id"] == run_id), None)


def _walk_gates(operator: Api, auditor: Api, promotion_id: str, api_base: str
                ) -> dict[str, Any]:
    printed: set[str] = set()
    signed = approved = injected = overridden = False
    url = f"{api_base}/promotions/{promotion_id}"
    while True:
        detail = operator.get(f"/api/promotions/{promotion_id}")
        for gate in detail["gates"]:
            key = f"{gate['gate']}:{gate['passed']}:{gate.get('created_at')}"
            if key not in printed:
                printed.add(key)
                mark = "[green]passed[/green]" if gate["passed"] else "[red]did not pass[/red]"
                console.print(f"  gate {gate['gate']:<12} {mark}: {'; '.join(gate['reasons'])}")
        gate_now, status = detail.get("current_gate"), detail["status"]
        watch = next((g for g in detail["gates"] if g["gate"] == "watch"), None)
        # A failed watch is followed by the rollback: wait for the status that records it.
        if status not in ("open", "promoted") or (watch is not None and watch["passed"]):
            shaping = held_for_shaping(detail)
            if shaping:
                console.print("  [yellow]held at offline eval[/yellow]: the candidate's "
                              "held-out reward rose, but not because it reached more goals")
                for line in shaping:
                    console.print(f"    {line}")
                console.print("  the promotion ends here (rejected): no shadow, canary, audit "
                              "or promotion follows, and production keeps serving the base")
            return dict(detail)
        if gate_now == "stability" and status == "open" and not overridden:
            named = ", ".join(f"{a['kind']} at iteration {a['iteration']}"
                              for a in detail.get("alarms") or [])
            console.print(f"  the stability gate holds the candidate: its run raised {named}."
                          " Governance read them from the database and compared them with the"
                          " proposal's copies.")
            console.print(f"  {operator.person.name} (operator, not the run's submitter) would "
                          f"open {url} and click 'Override alarms' with a reason; the demo "
                          "does it through the API, and the decision is recorded and audited")
            operator.post(f"/api/promotions/{promotion_id}/override-alarms", {
                "comment": "demo: a tiny model from random weights on a toy task; collapse "
                           "alarms are expected here, and every later gate still applies"})
            overridden = True
        if gate_now == "audit" and not signed:
            console.print(f"  {auditor.person.name} (auditor) would open {url} and click "
                          "'Sign audit' with a comment; the demo does it through the API")
            auditor.post(f"/api/promotions/{promotion_id}/sign-audit",
                         {"comment": "gates and lineage reviewed; evidence matches thresholds"})
            signed = True
        if gate_now == "approval" and not approved:
            console.print(f"  {operator.person.name} (operator) would open {url} and click "
                          "'Approve' with a comment; the demo does it through the API")
            operator.post(f"/api/promotions/{promotion_id}/approve",
                          {"comment": "audited; canary clean; promote"})
            approved = True
        if status == "promoted" and not injected:
            step("Promoted; the watch gate is on. Injecting a regression: a game-day serving "
                 "fault degrades the new checkpoint")
            _triloop("faults", "inject", detail["checkpoint_id"], "--temperature", "8",
                     "--note", "demo: injected regression", token=operator.person.token,
                     api_url=api_base)
            injected = True
        time.sleep(2)


def _triloop(*args: str, token: str, api_url: str) -> None:
    """Run a triloop command as the person whose API token it is (as they would)."""
    import subprocess

    env = {**os.environ, "TRILOOP_TOKEN": token, "TRILOOP_API_URL": api_url}
    result = subprocess.run([sys.executable, "-m", "triloop.cli", *args], capture_output=True,
                            text=True, check=False, env=env)
    answer = result.stdout.strip() or result.stderr.strip()
    console.print(f"  $ triloop {' '.join(args)}\n  {answer}")


def _offline_eval(promotion: dict[str, Any]) -> dict[str, Any] | None:
    """The last offline-eval verdict (a re-run gate decides again)."""
    evals = [g for g in promotion.get("gates") or [] if g.get("gate") == "offline_eval"]
    return evals[-1] if evals else None


def held_out_lines(promotion: dict[str, Any]) -> list[str]:
    """Held-out goals (and holes, when the behaviour audit counted them) and reward, base
    (production) before and candidate after, from the offline-eval gate's evidence on each
    frozen eval set (the verifier's verdicts)."""
    lines: list[str] = []
    gate = _offline_eval(promotion)
    evidence = (gate or {}).get("evidence") or {}
    holes = _holes(evidence)
    for result in evidence.get("eval_sets") or []:
        before, after = result.get("production"), result.get("candidate")
        if not before or not after:
            continue
        lines.append(
            f"held-out goals ({result['eval_set']}): before {_share(before)}"
            f"{holes.get('baseline', '')} → after {_share(after)}{holes.get('candidate', '')};"
            f" reward {before['reward_mean']['estimate']:+.3f} →"
            f" {after['reward_mean']['estimate']:+.3f}")
    return lines


def _holes(evidence: dict[str, Any]) -> dict[str, str]:
    """", holes k" per arm from the behaviour audit's hole rate (absent: nothing)."""
    audit = evidence.get("behaviour_audit") or {}
    signal = next((s for s in audit.get("signals") or []
                   if s.get("name") == "termination/fell_in_hole"), None)
    sets = evidence.get("eval_sets") or []
    if signal is None or len(sets) != 1 or not sets[0].get("production"):
        return {}
    episodes = {"candidate": sets[0]["candidate"]["episodes"],
                "baseline": sets[0]["production"]["episodes"]}
    return {arm: f", holes {round(float(signal[arm]) * episodes[arm])}"
            for arm in episodes if isinstance(signal.get(arm), int | float)}


def held_for_shaping(promotion: dict[str, Any]) -> list[str]:
    """Why offline eval held the candidate, when its gain was shaping only: the reasons
    naming the terms, and each shaping-only set's per-term deltas."""
    gate = _offline_eval(promotion)
    if gate is None or gate.get("passed"):
        return []
    lines = []
    for result in (gate.get("evidence") or {}).get("eval_sets") or []:
        attribution = result.get("attribution") or {}
        if not attribution.get("shaping_only"):
            continue
        deltas = ", ".join(f"{t['term']} ({t['kind']}) {t['delta']:+.3f}"
                           for t in attribution.get("terms") or [] if t.get("delta"))
        lines.append(f"{result['eval_set']}: per-term change in mean reward: {deltas}")
        lines += list(attribution.get("violations") or [])
    return lines


def _share(policy: dict[str, Any]) -> str:
    episodes = int(policy["episodes"])
    rate = policy["successes"] / episodes if episodes else 0.0
    return f"{policy['successes']}/{episodes} ({rate:.0%})"


def _summary(api: Api, run_id: str, promotion: dict[str, Any], rewards: list[float],
             api_base: str, traffic: TrafficGenerator, blocked_id: str,
             people: dict[str, world.Person]) -> None:
    step("Summary")
    held = api.get(f"/api/promotions/{blocked_id}")
    at = f" at {held['current_gate']}" if held.get("current_gate") else ""
    console.print(f"  the short run's candidate: promotion {blocked_id} {held['status']}{at}"
                  " on its run's alarms")
    if rewards:
        console.print(f"  training reward: first iteration {rewards[0]:+.3f} → "
                      f"last {rewards[-1]:+.3f}")
    for line in held_out_lines(promotion):
        console.print(f"  {line}")
    for line in held_for_shaping(promotion):
        console.print(f"  held: {line}")
    console.print(f"  promotion {promotion['id']}: {promotion['status']}")
    for gate in promotion["gates"]:
        verdict = "passed" if gate["passed"] else "did not pass"
        console.print(f"    {gate['gate']:<12} {verdict}: {'; '.join(gate['reasons'])[:160]}")
    lineage = api.get(f"/api/checkpoints/{promotion['checkpoint_id']}/lineage")
    chain = " → ".join(node["checkpoint"]["id"][:10] for node in lineage["chain"])
    console.print(f"  lineage base → candidate: {chain}")
    console.print(f"  {serving_line(api.get('/api/deployments/production'))}")
    console.print(f"  audit chain: {chain_line(api.post('/api/audit/verify', {}))}")
    console.print(f"  production traffic: {traffic.batches} batches sent"
                  + (f", {len(traffic.errors)} refused" if traffic.errors else ""))
    console.print(f"  console: {api_base}/  (run: {api_base}/runs/{run_id}, "
                  f"promotion: {api_base}/promotions/{promotion['id']})")
    for line in sign_in_lines(api_base, get_settings().secrets, people):
        console.print(f"  {line}", markup=False)
    console.print(f"  total time {time.monotonic() - STARTED:.0f}s")


def serving_line(production: dict[str, Any]) -> str:
    """What production serves and where a rollback would go, in words (never ``None``)."""
    target = production.get("rollback_target_id")
    return (f"production now serves {production['checkpoint_id'][:16]}… "
            + (f"(rollback target {target[:16]}…)" if target
               else "(no rollback target: no earlier revision that was not rolled back)"))


def chain_line(verified: dict[str, Any]) -> str:
    """The audit chain's verification as a sentence, not the API's JSON."""
    if verified.get("ok"):
        return f"verified, {verified.get('checked', 0)} events, no gap and no edit"
    return (f"BROKEN at seq {verified.get('broken_seq')}: {verified.get('problem')}"
            f" ({verified.get('checked', 0)} events verified before it)")


def sign_in_lines(api_base: str, secrets: Path, people: dict[str, world.Person]) -> list[str]:
    """How to sign in to the console as each of the demo's people (their API tokens are
    kept in the secrets folder, readable by this account only)."""
    lines = [f"sign in to the console at {api_base}/login with a person's API token:"]
    for role, person in people.items():
        path = secrets / world.person_token_secret(role)
        lines.append(f"  {role:<12} {person.name:<14} $(cat {path})")
    return lines


if __name__ == "__main__":
    sys.exit(main())
