"""The job and node lifecycles: every move the tables allow, and refusals with clear messages."""

from __future__ import annotations

import itertools

import pytest

from ringtrain.jobs.errors import InvalidTransitionError
from ringtrain.jobs.models import JobState, NodeState, check_job_transition, check_node_transition
from ringtrain.jobs.models.states import JOB_TRANSITIONS

pytestmark = pytest.mark.fast  # in-process: the tier of `scripts/test.sh --fast`

ALLOWED = {
    ("staging", "queued"), ("staging", "terminated"), ("staging", "failed"),
    ("queued", "preparing"), ("queued", "terminated"), ("queued", "failed"),
    ("preparing", "running"), ("preparing", "terminating"), ("preparing", "succeeded"),
    ("preparing", "failed"), ("preparing", "queued"), ("preparing", "uploading"),
    ("running", "terminating"), ("running", "succeeded"), ("running", "failed"),
    ("running", "queued"), ("running", "uploading"),
    ("uploading", "terminating"), ("uploading", "succeeded"), ("uploading", "failed"),
    ("uploading", "queued"),
    ("terminating", "terminated"), ("terminating", "failed"),
}


@pytest.mark.parametrize("current,target", list(itertools.product(JobState, JobState)))
def test_job_transition_table(current: JobState, target: JobState) -> None:
    if (current.value, target.value) in ALLOWED:
        check_job_transition("j", current, target)
    else:
        with pytest.raises(InvalidTransitionError, match=f"job j is {current.value}"):
            check_job_transition("j", current, target)


def test_terminal_states_are_exactly_the_final_ones() -> None:
    assert {s for s in JobState if s.is_terminal()} == {
        JobState.SUCCEEDED, JobState.FAILED, JobState.TERMINATED}
    assert all(not JOB_TRANSITIONS[s] for s in JobState if s.is_terminal())


def test_refusal_names_what_is_allowed() -> None:
    with pytest.raises(InvalidTransitionError) as e:
        check_job_transition("abc", JobState.SUCCEEDED, JobState.RUNNING)
    assert "none (final)" in str(e.value)
    with pytest.raises(InvalidTransitionError) as e:
        check_job_transition("abc", JobState.QUEUED, JobState.RUNNING)
    assert "failed, preparing, terminated" in str(e.value)


def test_node_transitions() -> None:
    check_node_transition("c/0", NodeState.IDLE, NodeState.PREPARING)
    check_node_transition("c/0", NodeState.RUNNING, NodeState.LEAVING)
    for target in NodeState:
        with pytest.raises(InvalidTransitionError):
            check_node_transition("c/0", NodeState.LEAVING, target)
    with pytest.raises(InvalidTransitionError):
        check_node_transition("c/0", NodeState.IDLE, NodeState.RUNNING)
