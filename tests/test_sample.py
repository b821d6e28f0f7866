"""Sample invariants: every broken one raises SampleError naming the sample and the field."""

import pytest

from kernel.sample import Sample, SampleError, Status


def good(**kw) -> Sample:
    base = dict(
        prompt_ids=[1, 2],
        response_ids=[3, 4, 5],
        loss_mask=[1, 1, 0],
        rollout_logprobs=[-0.1, -0.2, 0.0],
        status=Status.COMPLETED,
        agent="solver",
        group_id=7,
        index=2,
        turn=1,
    )
    base.update(kw)
    return Sample(**base)


def test_valid_sample_passes_and_reports_length_and_key():
    s = good().validate()
    assert s.response_length == 3
    assert s.key == "g7/e2/solver/t1"


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"loss_mask": [1, 1]}, "len(loss_mask)=2 != response_length=3"),
        ({"loss_mask": [1, 2, 0]}, "loss_mask must hold only 0 and 1"),
        ({"rollout_logprobs": [-0.1]}, "len(rollout_logprobs)=1 != response_length=3"),
        ({"prompt_ids": []}, "needs prompt_ids"),
        ({"response_ids": [3, -4, 5]}, "response_ids must be non-negative ints"),
        ({"prompt_ids": [1.5]}, "prompt_ids must be non-negative ints"),
        ({"turn": -1}, "index and turn"),
        ({"status": "completed"}, "status must be a Status"),
    ],
)
def test_each_broken_invariant_names_the_field(change, needle):
    with pytest.raises(SampleError) as e:
        good(**change).validate()
    assert needle in str(e.value)
    assert "sample g7/e2/solver/t" in str(e.value)


def test_failed_sample_may_have_no_tokens():
    Sample(status=Status.FAILED).validate()
    Sample().validate()  # a fresh PENDING sample from the buffer


def test_only_completed_and_truncated_are_trainable():
    assert {s for s in Status if s.trainable} == {Status.COMPLETED, Status.TRUNCATED}
