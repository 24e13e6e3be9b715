"""The worker's outcome labels are a contract: `toolfence_worker_messages_total{outcome}`
is read by the Grafana dashboard, the alert rules and the fleet tests by value."""

from __future__ import annotations

from executor.worker.outcomes import OutcomeLabel


def test_outcome_labels__values__unchanged_metric_label_values() -> None:
    assert sorted(label.value for label in OutcomeLabel) == sorted([
        "bad_message", "unknown_operation", "duplicate", "not_due", "predecessor_failed",
        "owned_elsewhere", "not_ready", "succeeded", "failed_terminal", "retry_wait",
        "reconciliation_pending", "stale_complete", "fenced_downstream", "lost_ownership",
    ])

