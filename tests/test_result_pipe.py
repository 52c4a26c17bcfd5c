"""The result pipe's reader: whatever arrives, a result is read only from one complete JSON
line of this pipeline, and nothing raises."""

from __future__ import annotations

import os

from hypothesis import given, settings
from hypothesis import strategies as st

from privsched.jobs.runner import JobResult
from privsched.service.executors.result_pipe import ResultPipe

RESULT = JobResult(7, True, {"b0": [0.25, 0.0]}, True, "", {"value": 41.5})


def sent(data: bytes, *, close: bool = True) -> JobResult | None:
    pipe = ResultPipe()
    try:
        os.write(pipe.write_fd, data)
        if close:
            pipe.handed_over()
        return pipe.result(7)
    finally:
        pipe.close()


def test_a_complete_line_is_the_result():
    assert sent(RESULT.to_json().encode() + b"\n", close=False) == RESULT


def test_a_line_not_yet_complete_or_of_another_pipeline_is_no_result():
    line = RESULT.to_json().encode()
    assert sent(line, close=False) is None
    assert sent(line) is None  # the writer closed before the end of the line
    other = JobResult(8, True, {"b0": [0.25, 0.0]}).to_json().encode() + b"\n"
    assert sent(other) is None


LINE = RESULT.to_json().encode()
#: Random bytes, and the result's line cut anywhere, with random bytes after it.
ARRIVALS = st.one_of(
    st.binary(max_size=4096),
    st.tuples(st.integers(0, len(LINE)), st.booleans(), st.binary(max_size=256)).map(
        lambda cut: LINE[: cut[0]] + (b"\n" if cut[1] else b"") + cut[2]
    ),
)


@settings(max_examples=200, deadline=None)
@given(ARRIVALS)
def test_any_bytes_give_a_result_only_when_they_are_one(data: bytes):
    result = sent(data)
    first, newline, _ = data.partition(b"\n")
    if first == LINE and newline:
        assert result == RESULT
    elif result is not None:
        assert newline and JobResult.from_json(first.decode()) == result and result.pipeline_id == 7
