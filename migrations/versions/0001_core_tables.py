"""core tables

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = '0001'
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Tables of ARCHITECTURE.md "Data" (generated from triloop.models, then reviewed).
    op.create_table('app_user',
    sa.Column('name', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('roles', postgresql.ARRAY(sa.Text()), server_default='{}', nullable=False),
    sa.Column('token_hash', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('disabled', sa.Boolean(), nullable=False),
    sa.Column('created_by', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('last_seen_at', sa.DateTime(timezone=True), nullable=True),
    sa.PrimaryKeyConstraint('name'),
    sa.UniqueConstraint('token_hash')
    )
    op.create_table('audit_event',
    sa.Column('seq', sa.BigInteger(), autoincrement=False, nullable=False),
    sa.Column('at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('actor', postgresql.JSONB(astext_type=sa.Text()), server_default='{}', nullable=False),
    sa.Column('action', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('resource', postgresql.JSONB(astext_type=sa.Text()), server_default='{}', nullable=False),
    sa.Column('decision', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('decision_id', sqlmodel.sql.sqltypes.AutoString(), nullable=True),
    sa.Column('policy_revision', sqlmodel.sql.sqltypes.AutoString(), nullable=True),
    sa.Column('payload', postgresql.JSONB(astext_type=sa.Text()), server_default='{}', nullable=False),
    sa.Column('prev_hash', sa.Text(), nullable=False),
    sa.Column('hash', sa.Text(), nullable=False),
    sa.PrimaryKeyConstraint('seq'),
    sa.UniqueConstraint('hash')
    )
    op.create_table('checkpoint',
    sa.Column('id', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('parent_id', sqlmodel.sql.sqltypes.AutoString(), nullable=True),
    sa.Column('run_id', sqlmodel.sql.sqltypes.AutoString(), nullable=True),
    sa.Column('base_model', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('iteration', sa.Integer(), nullable=True),
    sa.Column('environment_version_ids', postgresql.ARRAY(sa.Text()), server_default='{}', nullable=False),
    sa.Column('data', postgresql.JSONB(astext_type=sa.Text()), server_default='{}', nullable=False),
    sa.Column('artifact_uri', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('created_by', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.ForeignKeyConstraint(['parent_id'], ['checkpoint.id'], ),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_index(op.f('ix_checkpoint_parent_id'), 'checkpoint', ['parent_id'], unique=False)
    op.create_index(op.f('ix_checkpoint_run_id'), 'checkpoint', ['run_id'], unique=False)
    op.create_table('deployment_history',
    sa.Column('id', sa.BigInteger(), autoincrement=True, nullable=False),
    sa.Column('alias', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('checkpoint_id', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('previous_checkpoint_id', sqlmodel.sql.sqltypes.AutoString(), nullable=True),
    sa.Column('reason', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('actor', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_index(op.f('ix_deployment_history_alias'), 'deployment_history', ['alias'], unique=False)
    op.create_table('environment',
    sa.Column('name', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('description', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('created_by', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.PrimaryKeyConstraint('name')
    )
    op.create_table('eval_set',
    sa.Column('id', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('name', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.Column('content_hash', sqlmodel.sql.sqltypes.AutoString(), nullable=True),
    sa.Column('frozen_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('created_by', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('name', 'version')
    )
    op.create_index(op.f('ix_eval_set_name'), 'eval_set', ['name'], unique=False)
    op.create_table('deployment',
    sa.Column('alias', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('checkpoint_id', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('rollback_target_id', sqlmodel.sql.sqltypes.AutoString(), nullable=True),
    sa.Column('promotion_id', sqlmodel.sql.sqltypes.AutoString(), nullable=True),
    sa.Column('updated_by', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.ForeignKeyConstraint(['checkpoint_id'], ['checkpoint.id'], ),
    sa.ForeignKeyConstraint(['rollback_target_id'], ['checkpoint.id'], ),
    sa.PrimaryKeyConstraint('alias')
    )
    op.create_table('environment_version',
    sa.Column('id', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('environment_name', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.Column('contract', postgresql.JSONB(astext_type=sa.Text()), server_default='{}', nullable=False),
    sa.Column('contract_text', sa.Text(), nullable=False),
    sa.Column('fixture_hashes', postgresql.JSONB(astext_type=sa.Text()), server_default='{}', nullable=False),
    sa.Column('created_by', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('retired_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('retired_by', sqlmodel.sql.sqltypes.AutoString(), nullable=True),
    sa.ForeignKeyConstraint(['environment_name'], ['environment.name'], ),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('environment_name', 'version')
    )
    op.create_index(op.f('ix_environment_version_environment_name'), 'environment_version', ['environment_name'], unique=False)
    op.create_table('routing',
    sa.Column('slot', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('checkpoint_id', sqlmodel.sql.sqltypes.AutoString(), nullable=True),
    sa.Column('share', sa.Float(), nullable=False),
    sa.Column('promotion_id', sqlmodel.sql.sqltypes.AutoString(), nullable=True),
    sa.Column('updated_by', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.ForeignKeyConstraint(['checkpoint_id'], ['checkpoint.id'], ),
    sa.PrimaryKeyConstraint('slot')
    )
    op.create_table('threshold',
    sa.Column('id', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('name', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.Column('eval_set_id', sqlmodel.sql.sqltypes.AutoString(), nullable=True),
    sa.Column('spec', postgresql.JSONB(astext_type=sa.Text()), server_default='{}', nullable=False),
    sa.Column('created_by', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.ForeignKeyConstraint(['eval_set_id'], ['eval_set.id'], ),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('name', 'version')
    )
    op.create_index(op.f('ix_threshold_name'), 'threshold', ['name'], unique=False)
    op.create_table('training_run',
    sa.Column('id', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('name', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('submitted_by', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('config', postgresql.JSONB(astext_type=sa.Text()), server_default='{}', nullable=False),
    sa.Column('base_checkpoint_id', sqlmodel.sql.sqltypes.AutoString(), nullable=True),
    sa.Column('environment_version_ids', postgresql.ARRAY(sa.Text()), server_default='{}', nullable=False),
    sa.Column('workflow_id', sqlmodel.sql.sqltypes.AutoString(), nullable=True),
    sa.Column('status', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('status_reason', sqlmodel.sql.sqltypes.AutoString(), nullable=True),
    sa.Column('iterations_done', sa.Integer(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['base_checkpoint_id'], ['checkpoint.id'], ),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_index(op.f('ix_training_run_submitted_by'), 'training_run', ['submitted_by'], unique=False)
    op.create_index(op.f('ix_training_run_workflow_id'), 'training_run', ['workflow_id'], unique=False)
    op.create_table('proposal',
    sa.Column('id', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('checkpoint_id', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('run_id', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('submitted_by', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('evidence', postgresql.JSONB(astext_type=sa.Text()), server_default='{}', nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.ForeignKeyConstraint(['checkpoint_id'], ['checkpoint.id'], ),
    sa.ForeignKeyConstraint(['run_id'], ['training_run.id'], ),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_index(op.f('ix_proposal_checkpoint_id'), 'proposal', ['checkpoint_id'], unique=False)
    op.create_index(op.f('ix_proposal_run_id'), 'proposal', ['run_id'], unique=False)
    op.create_table('task',
    sa.Column('id', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('environment_version_id', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('seed', sa.Integer(), nullable=False),
    sa.Column('status', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('evidence', postgresql.JSONB(astext_type=sa.Text()), server_default='{}', nullable=False),
    sa.Column('decided_by', sqlmodel.sql.sqltypes.AutoString(), nullable=True),
    sa.Column('decided_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.ForeignKeyConstraint(['environment_version_id'], ['environment_version.id'], ),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('environment_version_id', 'seed')
    )
    op.create_index(op.f('ix_task_environment_version_id'), 'task', ['environment_version_id'], unique=False)
    op.create_table('training_step',
    sa.Column('run_id', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('iteration', sa.Integer(), nullable=False),
    sa.Column('loss', sa.Float(), nullable=True),
    sa.Column('kl', sa.Float(), nullable=True),
    sa.Column('entropy', sa.Float(), nullable=True),
    sa.Column('reward_mean', sa.Float(), nullable=True),
    sa.Column('reward_variance', sa.Float(), nullable=True),
    sa.Column('within_group_reward_variance', sa.Float(), nullable=True),
    sa.Column('grad_norm', sa.Float(), nullable=True),
    sa.Column('discrimination', sa.Float(), nullable=True),
    sa.Column('trainable_tokens', sa.Integer(), nullable=True),
    sa.Column('length_stats', postgresql.JSONB(astext_type=sa.Text()), server_default='{}', nullable=False),
    sa.Column('metrics', postgresql.JSONB(astext_type=sa.Text()), server_default='{}', nullable=False),
    sa.Column('alarms', postgresql.ARRAY(sa.Text()), server_default='{}', nullable=False),
    sa.Column('checkpoint_id', sqlmodel.sql.sqltypes.AutoString(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.ForeignKeyConstraint(['run_id'], ['training_run.id'], ),
    sa.PrimaryKeyConstraint('run_id', 'iteration')
    )
    op.create_table('eval_item',
    sa.Column('eval_set_id', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('ordinal', sa.Integer(), nullable=False),
    sa.Column('task_id', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.ForeignKeyConstraint(['eval_set_id'], ['eval_set.id'], ),
    sa.ForeignKeyConstraint(['task_id'], ['task.id'], ),
    sa.PrimaryKeyConstraint('eval_set_id', 'ordinal')
    )
    op.create_table('promotion',
    sa.Column('id', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('proposal_id', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('checkpoint_id', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('run_id', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('submitted_by', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('baseline_checkpoint_id', sqlmodel.sql.sqltypes.AutoString(), nullable=True),
    sa.Column('workflow_id', sqlmodel.sql.sqltypes.AutoString(), nullable=True),
    sa.Column('status', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('current_gate', sqlmodel.sql.sqltypes.AutoString(), nullable=True),
    sa.Column('status_reason', sqlmodel.sql.sqltypes.AutoString(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['checkpoint_id'], ['checkpoint.id'], ),
    sa.ForeignKeyConstraint(['proposal_id'], ['proposal.id'], ),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('proposal_id')
    )
    op.create_index(op.f('ix_promotion_checkpoint_id'), 'promotion', ['checkpoint_id'], unique=False)
    op.create_index(op.f('ix_promotion_run_id'), 'promotion', ['run_id'], unique=False)
    op.create_table('trajectory',
    sa.Column('id', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('batch_id', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('run_id', sqlmodel.sql.sqltypes.AutoString(), nullable=True),
    sa.Column('task_id', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('checkpoint_id', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('purpose', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('group_id', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('sample_index', sa.Integer(), nullable=False),
    sa.Column('policy_version', sa.Integer(), nullable=False),
    sa.Column('status', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('failure_reason', sqlmodel.sql.sqltypes.AutoString(), nullable=True),
    sa.Column('success', sa.Boolean(), nullable=False),
    sa.Column('total_reward', sa.Float(), nullable=False),
    sa.Column('num_steps', sa.Integer(), nullable=False),
    sa.Column('outcome', postgresql.JSONB(astext_type=sa.Text()), server_default='{}', nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.ForeignKeyConstraint(['task_id'], ['task.id'], ),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_index(op.f('ix_trajectory_batch_id'), 'trajectory', ['batch_id'], unique=False)
    op.create_index(op.f('ix_trajectory_checkpoint_id'), 'trajectory', ['checkpoint_id'], unique=False)
    op.create_index(op.f('ix_trajectory_run_id'), 'trajectory', ['run_id'], unique=False)
    op.create_index(op.f('ix_trajectory_task_id'), 'trajectory', ['task_id'], unique=False)
    op.create_table('approval',
    sa.Column('id', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('promotion_id', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('kind', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('decision', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('user_name', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('comment', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.ForeignKeyConstraint(['promotion_id'], ['promotion.id'], ),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_index(op.f('ix_approval_promotion_id'), 'approval', ['promotion_id'], unique=False)
    op.create_table('gate_result',
    sa.Column('id', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('promotion_id', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('gate', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('passed', sa.Boolean(), nullable=False),
    sa.Column('reasons', postgresql.ARRAY(sa.Text()), server_default='{}', nullable=False),
    sa.Column('evidence', postgresql.JSONB(astext_type=sa.Text()), server_default='{}', nullable=False),
    sa.Column('threshold_id', sqlmodel.sql.sqltypes.AutoString(), nullable=True),
    sa.Column('eval_set_id', sqlmodel.sql.sqltypes.AutoString(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.ForeignKeyConstraint(['eval_set_id'], ['eval_set.id'], ),
    sa.ForeignKeyConstraint(['promotion_id'], ['promotion.id'], ),
    sa.ForeignKeyConstraint(['threshold_id'], ['threshold.id'], ),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_index(op.f('ix_gate_result_promotion_id'), 'gate_result', ['promotion_id'], unique=False)
    op.create_table('step',
    sa.Column('trajectory_id', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('index', sa.Integer(), nullable=False),
    sa.Column('prompt_token_ids', postgresql.ARRAY(sa.Integer()), server_default='{}', nullable=False),
    sa.Column('action_token_ids', postgresql.ARRAY(sa.Integer()), server_default='{}', nullable=False),
    sa.Column('action_mask', postgresql.ARRAY(sa.SmallInteger()), server_default='{}', nullable=False),
    sa.Column('behaviour_logprobs', postgresql.ARRAY(sa.Float()), server_default='{}', nullable=False),
    sa.Column('observation', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('action_text', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
    sa.Column('feedback', postgresql.JSONB(astext_type=sa.Text()), server_default='{}', nullable=False),
    sa.Column('reward', sa.Float(), nullable=False),
    sa.Column('done', sa.Boolean(), nullable=False),
    sa.ForeignKeyConstraint(['trajectory_id'], ['trajectory.id'], ),
    sa.PrimaryKeyConstraint('trajectory_id', 'index')
    )


def downgrade() -> None:
    # Tables of ARCHITECTURE.md "Data" (generated from triloop.models, then reviewed).
    op.drop_table('step')
    op.drop_index(op.f('ix_gate_result_promotion_id'), table_name='gate_result')
    op.drop_table('gate_result')
    op.drop_index(op.f('ix_approval_promotion_id'), table_name='approval')
    op.drop_table('approval')
    op.drop_index(op.f('ix_trajectory_task_id'), table_name='trajectory')
    op.drop_index(op.f('ix_trajectory_run_id'), table_name='trajectory')
    op.drop_index(op.f('ix_trajectory_checkpoint_id'), table_name='trajectory')
    op.drop_index(op.f('ix_trajectory_batch_id'), table_name='trajectory')
    op.drop_table('trajectory')
    op.drop_index(op.f('ix_promotion_run_id'), table_name='promotion')
    op.drop_index(op.f('ix_promotion_checkpoint_id'), table_name='promotion')
    op.drop_table('promotion')
    op.drop_table('eval_item')
    op.drop_table('training_step')
    op.drop_index(op.f('ix_task_environment_version_id'), table_name='task')
    op.drop_table('task')
    op.drop_index(op.f('ix_proposal_run_id'), table_name='proposal')
    op.drop_index(op.f('ix_proposal_checkpoint_id'), table_name='proposal')
    op.drop_table('proposal')
    op.drop_index(op.f('ix_training_run_workflow_id'), table_name='training_run')
    op.drop_index(op.f('ix_training_run_submitted_by'), table_name='training_run')
    op.drop_table('training_run')
    op.drop_index(op.f('ix_threshold_name'), table_name='threshold')
    op.drop_table('threshold')
    op.drop_table('routing')
    op.drop_index(op.f('ix_environment_version_environment_name'), table_name='environment_version')
    op.drop_table('environment_version')
    op.drop_table('deployment')
    op.drop_index(op.f('ix_eval_set_name'), table_name='eval_set')
    op.drop_table('eval_set')
    op.drop_table('environment')
    op.drop_index(op.f('ix_deployment_history_alias'), table_name='deployment_history')
    op.drop_table('deployment_history')
    op.drop_index(op.f('ix_checkpoint_run_id'), table_name='checkpoint')
    op.drop_index(op.f('ix_checkpoint_parent_id'), table_name='checkpoint')
    op.drop_table('checkpoint')
    op.drop_table('audit_event')
    op.drop_table('app_user')
