"""runtime/driver/gil.py: the short GIL switch interval while a communication thread runs a job."""

import sys
import threading

import pytest

from polycast.runtime.driver import gil


@pytest.fixture
def interval():
    old = sys.getswitchinterval()
    sys.setswitchinterval(0.005)
    yield
    sys.setswitchinterval(old)


def test_short_while_a_job_runs_and_put_back_after(interval):
    if not gil.SWITCH_SECONDS:
        pytest.skip("POLYCAST_SWITCH_US=0: the interval is left alone")
    with gil.short_switch():
        assert sys.getswitchinterval() == pytest.approx(gil.SWITCH_SECONDS, abs=1e-6)
        with gil.short_switch():                     # a second communicator's worker
            assert sys.getswitchinterval() == pytest.approx(gil.SWITCH_SECONDS, abs=1e-6)
        # the inner one ending does not put it back while the outer one runs
        assert sys.getswitchinterval() == pytest.approx(gil.SWITCH_SECONDS, abs=1e-6)
    assert sys.getswitchinterval() == pytest.approx(0.005, abs=1e-6)


def test_overlapping_users_on_threads_put_it_back_once_all_ended(interval):
    inside, release = threading.Barrier(3), threading.Event()

    def job():
        with gil.short_switch():
            inside.wait(5)
            release.wait(5)

    threads = [threading.Thread(target=job) for _ in range(2)]
    for t in threads:
        t.start()
    inside.wait(5)
    seen = sys.getswitchinterval()
    release.set()
    for t in threads:
        t.join(5)
    assert seen == pytest.approx(min(0.005, gil.SWITCH_SECONDS or 0.005), abs=1e-6)
    assert sys.getswitchinterval() == pytest.approx(0.005, abs=1e-6)


def test_a_value_the_program_set_meanwhile_is_kept(interval):
    with gil.short_switch():
        sys.setswitchinterval(0.002)                 # the user's own choice
    assert sys.getswitchinterval() == pytest.approx(0.002, abs=1e-6)


def test_a_shorter_interval_already_set_is_left_alone():
    old = sys.getswitchinterval()
    try:
        sys.setswitchinterval(20e-6)
        with gil.short_switch():
            assert sys.getswitchinterval() == pytest.approx(20e-6, abs=1e-6)
        assert sys.getswitchinterval() == pytest.approx(20e-6, abs=1e-6)
    finally:
        sys.setswitchinterval(old)


def test_the_symm_worker_runs_its_jobs_with_the_short_interval(interval):
    """A job the poster leaves to the worker (Iallreduce while the caller computes) runs
    with the short interval; one the caller runs itself (Wait, blocking calls) does not."""
    from types import SimpleNamespace

    from polycast.config import Config
    from polycast.runtime.driver import Request
    from polycast.runtime.symm.queue import JobQueue
    from polycast.runtime.transport.wait import WaitPolicy
    st = SimpleNamespace(bar=SimpleNamespace(policy=WaitPolicy()),
                         comm=SimpleNamespace(id=7, timeout_seconds=10.0, config=Config()))
    q = JobQueue(st)
    seen, ran = [], threading.Event()

    def job():
        seen.append((threading.current_thread().name, sys.getswitchinterval()))
        ran.set()

    try:
        q.submit(job, Request(0, 7, "worker job", 10.0))
        assert ran.wait(5), "the worker did not run the job"
        assert q.run_now(job) is None                # on this thread
    finally:
        q.close()
    short = min(0.005, gil.SWITCH_SECONDS or 0.005)
    assert seen[0][0].startswith("polycast-symm-")
    assert seen[0][1] == pytest.approx(short, abs=1e-6)
    assert seen[1] == (threading.current_thread().name, pytest.approx(0.005, abs=1e-6))
    assert sys.getswitchinterval() == pytest.approx(0.005, abs=1e-6)
