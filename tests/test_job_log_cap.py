"""A job's log stays bounded while the job writes to it, and keeps its tail."""

from __future__ import annotations

import subprocess
import sys

from privsched.service.logcap import cap_log

WRITER = """
import sys
with open(sys.argv[1], "ab", buffering=0) as log:
    for i in range(200_000):
        log.write(b"line %d\\n" % i)
    log.write(b"the last line\\n")
"""


def test_a_log_written_while_it_is_cut_keeps_its_tail_within_the_limit(tmp_path):
    log = tmp_path / "job.log"
    log.touch()
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(log)])
    dropped = 0
    while writer.poll() is None:
        dropped += cap_log(log, limit=64_000, keep=32_000)
    dropped += cap_log(log, limit=64_000, keep=32_000)
    text = log.read_bytes()
    assert writer.returncode == 0 and dropped > 0
    assert len(text) <= 64_000
    assert text.startswith(b"[privsched: ") and text.endswith(b"the last line\n")
    assert b"line 199999\n" in text  # the tail is whole lines, in order


def test_a_small_or_missing_log_is_left_alone(tmp_path):
    log = tmp_path / "job.log"
    assert cap_log(log) == 0
    log.write_bytes(b"hello\n")
    assert cap_log(log, limit=10, keep=5) == 0 and log.read_bytes() == b"hello\n"
