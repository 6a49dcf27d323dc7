"""A run's progress (n of N, elapsed, estimate, starved rollouts) and what the CLI prints
of it and of the run's proposals: pure, the clock handed in."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from web.cli_run_progress import progress_line, proposed_lines, starved_line
from web.data.run_progress import TimedIteration, duration, run_progress

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
CONFIG = {"schedule": {"iterations": 10}, "rollout": {"deadline_s": 60.0}}
FULL = {"trajectories": 32, "skipped": 0, "truncated_excluded": 0}


def _timed(*seconds: int, batch: dict[str, int] | None = None) -> list[TimedIteration]:
    """Iterations 1, 2, ... written ``seconds`` after submission."""
    return [TimedIteration(i + 1, T0 + timedelta(seconds=s), batch or FULL)
            for i, s in enumerate(seconds)]


def test_a_running_run_says_n_of_n_elapsed_and_the_time_left_at_its_pace() -> None:
    progress = run_progress(status="running", iterations_done=3, config=CONFIG, created_at=T0,
                            updated_at=None, timed=_timed(40, 60, 80),
                            now=T0 + timedelta(seconds=90))
    assert (progress.iteration, progress.iterations) == (3, 10)
    assert progress.elapsed_s == 90 and progress.seconds_per_iteration == 20
    assert progress.eta_s == 7 * 20 and progress.starved is None
    assert progress.summary == "iteration 3 of 10, elapsed 1 min 30 s, about 2 min 20 s left"


def test_one_iteration_is_timed_from_submission_and_none_gives_no_estimate_yet() -> None:
    one = run_progress(status="running", iterations_done=1, config=CONFIG, created_at=T0,
                       updated_at=None, timed=_timed(30), now=T0 + timedelta(seconds=35))
    assert one.seconds_per_iteration == 30 and one.eta_s == 9 * 30
    none = run_progress(status="starting", iterations_done=0, config=CONFIG, created_at=T0,
                        updated_at=None, timed=[], now=T0 + timedelta(seconds=5))
    assert none.eta_s is None and none.starved is None
    assert none.summary == "iteration 0 of 10, elapsed 5 s, estimate after the first iterations"


def test_an_ended_run_counts_elapsed_to_its_end_and_a_paused_one_has_no_estimate() -> None:
    ended = run_progress(status="completed", iterations_done=10, config=CONFIG, created_at=T0,
                         updated_at=T0 + timedelta(hours=1, minutes=2),
                         timed=_timed(*range(60, 700, 60)), now=T0 + timedelta(days=3))
    assert ended.elapsed_s == 3720 and ended.eta_s is None and ended.starved is None
    assert ended.summary == "iteration 10 of 10, elapsed 1 h 02 min"
    paused = run_progress(status="paused", iterations_done=2, config=CONFIG, created_at=T0,
                          updated_at=None, timed=_timed(10, 20),
                          now=T0 + timedelta(hours=5))
    assert paused.eta_s is None and paused.starved is None  # waiting on a person, not rollouts
    assert paused.summary.endswith("paused: no estimate until it resumes")


def test_a_batch_that_lost_a_quarter_of_its_episodes_starved_the_update() -> None:
    short = {"trajectories": 6, "skipped": 8, "truncated_excluded": 2}
    progress = run_progress(status="running", iterations_done=2, config=CONFIG, created_at=T0,
                            updated_at=None, timed=_timed(20, 40, batch=short),
                            now=T0 + timedelta(seconds=41))
    assert progress.starved is not None and progress.starved.kind == "lost_episodes"
    assert progress.starved.iteration == 2
    assert progress.starved.message.startswith(
        "rollouts starved: iteration 2 learnt from 6 of 16 episodes (8 failed or never"
        " started, 2 cut by the clock)")
    # One lost episode in 32 is not starvation.
    fine = run_progress(status="running", iterations_done=2, config=CONFIG, created_at=T0,
                        updated_at=None,
                        timed=_timed(20, 40, batch={"trajectories": 31, "skipped": 1}),
                        now=T0 + timedelta(seconds=41))
    assert fine.starved is None


def test_no_iteration_for_longer_than_a_batch_budget_is_starvation() -> None:
    # Iterations every 20 s, then nothing for 60 s (the deadline) + 20 s (one iteration) +.
    late = run_progress(status="running", iterations_done=2, config=CONFIG, created_at=T0,
                        updated_at=None, timed=_timed(20, 40),
                        now=T0 + timedelta(seconds=40 + 81))
    assert late.starved is not None and late.starved.kind == "no_batch"
    assert late.starved.waiting_s == 81
    assert "no iteration for 1 min 21 s since iteration 2" in late.starved.message
    assert "rollout.deadline_s = 1 min 00 s" in late.starved.message
    on_time = run_progress(status="running", iterations_done=2, config=CONFIG, created_at=T0,
                           updated_at=None, timed=_timed(20, 40),
                           now=T0 + timedelta(seconds=40 + 79))
    assert on_time.starved is None
    # Before the first iteration (which loads the model too) it waits two budgets.
    first = run_progress(status="running", iterations_done=0, config=CONFIG, created_at=T0,
                         updated_at=None, timed=[], now=T0 + timedelta(seconds=119))
    assert first.starved is None
    never = run_progress(status="running", iterations_done=0, config=CONFIG, created_at=T0,
                         updated_at=None, timed=[], now=T0 + timedelta(seconds=121))
    assert never.starved is not None and "since the run was submitted" in never.starved.message


def test_a_config_without_a_schedule_reads_the_run_config_defaults() -> None:
    progress = run_progress(status="submitted", iterations_done=0, config={}, created_at=T0,
                            updated_at=None, timed=[], now=T0 + timedelta(hours=2))
    assert progress.iterations == 10 and progress.starved is None  # not iterating yet


def test_durations_read_at_a_glance() -> None:
    assert [duration(s) for s in (0, 42.4, 185, 3600 + 125)] == \
        ["0 s", "42 s", "3 min 05 s", "1 h 02 min"]


def test_the_cli_prints_the_progress_the_starvation_and_each_proposal() -> None:
    starved = run_progress(status="running", iterations_done=0, config=CONFIG, created_at=T0,
                           updated_at=None, timed=[], now=T0 + timedelta(seconds=125))
    metrics = {"status": "running", "iterations_done": 0,
               "progress": starved.model_dump(mode="json")}
    assert progress_line("r1", metrics) == \
        "run r1: running, iteration 0 of 10, elapsed 2 min 05 s, estimate after the first " \
        "iterations"
    assert starved_line("r1", metrics).startswith("run r1: rollouts starved: no iteration")
    assert starved_line("r1", {"progress": {"starved": None}}) == ""
    lines = proposed_lines([
        {"checkpoint_id": "c1", "iteration": 5, "promotion_id": "p1",
         "promotion_status": "open", "current_gate": "shadow"},
        {"checkpoint_id": "c2", "iteration": 10, "promotion_id": None},
    ], "http://h:8000/")
    assert lines == [
        "proposed candidate c1 (iteration 5): promotion p1, open at the shadow gate; "
        "console: http://h:8000/promotions/p1",
        "proposed candidate c2 (iteration 10): governance has not opened its promotion yet "
        "(`triloop promotions list` shows it once it has)"]
    assert proposed_lines([], "http://h") == ["it proposed no candidate"]
