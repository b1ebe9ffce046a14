"""The runner SDK scenarios of `tests/integration/test_runner_sdk.py`, with the events folded
in-process by the engine's pure core instead of going through Kafka (no broker needed).

Same test bodies, another `world`: what differs is only the transport.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration import test_runner_sdk as scenarios
from tests.unit.consumers.sdk_world import World, fold_world


@pytest.fixture
def world(tmp_path: Path) -> World:
    return fold_world(tmp_path)


test_fault_then_restore_never_duplicates_and_never_loses = (
    scenarios.test_fault_then_restore_never_duplicates_and_never_loses
)
test_partial_commit_is_withheld_and_history_is_left_alone = (
    scenarios.test_partial_commit_is_withheld_and_history_is_left_alone
)
test_foreign_writer_extending_history_is_withheld = (
    scenarios.test_foreign_writer_extending_history_is_withheld
)
test_two_copies_of_one_checkpoint_exactly_one_proceeds_and_the_late_append_is_rejected = (
    scenarios.test_two_copies_of_one_checkpoint_exactly_one_proceeds_and_the_late_append_is_rejected
)
test_sdk_gap_2_copies_of_an_approval_park_run_the_tool_once = (
    scenarios.test_sdk_gap_2_copies_of_an_approval_park_run_the_tool_once
)
test_sdk_gap_3_the_checkpoint_from_before_a_lost_ack_is_stale = (
    scenarios.test_sdk_gap_3_the_checkpoint_from_before_a_lost_ack_is_stale
)
test_sdk_gap_4_a_resume_with_another_ids_policy_is_withheld = (
    scenarios.test_sdk_gap_4_a_resume_with_another_ids_policy_is_withheld
)
test_sdk_gap_7_a_tampered_checkpoint_record_is_withheld = (
    scenarios.test_sdk_gap_7_a_tampered_checkpoint_record_is_withheld
)
test_sdk_gap_6_an_identical_foreign_copy_after_a_rollback_is_not_authorship = (
    scenarios.test_sdk_gap_6_an_identical_foreign_copy_after_a_rollback_is_not_authorship
)
test_held_park_rides_then_settles_once_and_a_second_copy_is_withheld = (
    scenarios.test_held_park_rides_then_settles_once_and_a_second_copy_is_withheld
)
test_held_settle_that_fails_is_granted_once_on_the_next_resume = (
    scenarios.test_held_settle_that_fails_is_granted_once_on_the_next_resume
)
test_sdk_gap_9_partial_evidence_is_remembered_after_the_prefix_vanishes = (
    scenarios.test_sdk_gap_9_partial_evidence_is_remembered_after_the_prefix_vanishes
)
