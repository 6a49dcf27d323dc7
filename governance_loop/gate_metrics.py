"""Gate states on the governance worker's /metrics, read from the database at each scrape.

Read, not counted in process: the rows are the truth whichever worker wrote them, and a
restarted worker reports the same numbers. Three families:

- ``triloop_promotions{status}``: promotions by status (open, promoted, rolled_back, ...);
- ``triloop_promotions_open{gate}``: open promotions by the gate they stand at;
- ``triloop_gate_results{gate, verdict}``: gate verdicts recorded so far.

If the database does not answer, the scrape still succeeds and says so with
``triloop_gate_states_up 0`` (and the worker's log says why), so one slow query never
hides the worker's other metrics.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import Engine, text
from sqlalchemy.exc import SQLAlchemyError

log = logging.getLogger("governance.metrics")

_BY_STATUS = text("SELECT status, count(*) FROM promotion GROUP BY status")
_OPEN_BY_GATE = text("SELECT coalesce(current_gate, 'none'), count(*) FROM promotion"
                     " WHERE status = 'open' GROUP BY 1")
_VERDICTS = text("SELECT gate, coalesce(evidence ->> 'verdict',"
                 " CASE WHEN passed THEN 'pass' ELSE 'fail' END), count(*)"
                 " FROM gate_result GROUP BY 1, 2")


class GateStates(Collector):
    """Promotions by status and by gate, and gate verdicts, as gauges read at each scrape."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def describe(self) -> list[Metric]:
        """Nothing at registration: describing would query the database there."""
        return []

    def collect(self) -> Iterator[Metric]:
        """One query per family, in one read-only transaction."""
        up = GaugeMetricFamily("triloop_gate_states_up",
                               "1 when the gate states below were read from the database.")
        try:
            with self._engine.connect() as conn:
                by_status = conn.execute(_BY_STATUS).all()
                open_by_gate = conn.execute(_OPEN_BY_GATE).all()
                verdicts = conn.execute(_VERDICTS).all()
        except SQLAlchemyError as exc:
            log.warning("gate states not read for /metrics: %s", exc)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        promotions = GaugeMetricFamily("triloop_promotions", "Promotions by status.",
                                       labels=["status"])
        for status, count in by_status:
            promotions.add_metric([str(status)], count)
        yield promotions
        at_gate = GaugeMetricFamily("triloop_promotions_open",
                                    "Open promotions by the gate they stand at.",
                                    labels=["gate"])
        for gate, count in open_by_gate:
            at_gate.add_metric([str(gate)], count)
        yield at_gate
        results = GaugeMetricFamily("triloop_gate_results", "Gate verdicts recorded so far.",
                                    labels=["gate", "verdict"])
        for gate, verdict, count in verdicts:
            results.add_metric([str(gate), str(verdict)], count)
        yield results
