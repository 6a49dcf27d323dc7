"""Governance workflows: promotion through the gates, task and task-set admission,
rollback, and people's writes to versioned data (task-set registration among them).

Deterministic code only: every read and write is an activity named in
``governance_loop.contracts`` (this package imports no database, HTTP
or policy code; import-linter checks it).
"""

from governance_loop.workflows.admission import AdmissionWorkflow
from governance_loop.workflows.promotion import PromotionWorkflow
from governance_loop.workflows.rollback import RollbackWorkflow
from governance_loop.workflows.task_set_admission import TaskSetAdmissionWorkflow
from governance_loop.workflows.task_sets import TaskSetRegistration
from governance_loop.workflows.writes import GovernanceWriteWorkflow

__all__ = [
    "AdmissionWorkflow", "GovernanceWriteWorkflow", "PromotionWorkflow", "RollbackWorkflow",
    "TaskSetAdmissionWorkflow", "TaskSetRegistration",
]
