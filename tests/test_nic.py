"""The SmartNIC chunk-rate model (polycast.models.nic), ``polycast nic`` and the host
measurement behind the host-python preset."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from polycast.cli.main import main
from polycast.errors import InvalidArgument, UnknownName
from polycast.models.nic import (HOST_NATIVE_FALLBACK, HOST_PYTHON_FALLBACK, NicModel,
                                 host_native, host_python, load_host_native, load_host_python,
                                 nic_preset, parse_nic)

GIB = 1 << 30
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _model(**kw):
    base = dict(name="t", clock_hz=1e9, cores=4, threads_per_core=8, cycles_per_chunk=100.0)
    base.update(kw)
    return NicModel(**base)


# -- the DPA preset against the paper ---------------------------------------------------

def test_dpa_preset_reproduces_the_paper():
    m = nic_preset("bf3-dpa")
    assert (m.cores, m.threads_per_core, m.clock_hz) == (16, 16, 1.8e9)
    # a core's receive path: 11.9 GiB/s of 4 KiB chunks; one thread 11.9 Gibit/s
    assert m.core_chunks_per_s(4096) * 4096 / GIB == pytest.approx(11.9, rel=1e-9)
    assert m.thread_chunks_per_s(4096) * 4096 * 8 / GIB == pytest.approx(11.9, rel=1e-9)
    s = m.size_for(1.6e12, 4096)
    # 1.6 Tbit/s of 4 KiB chunks = 48.8 M chunks/s
    assert s.link_chunks_per_s == pytest.approx(48.83e6, rel=1e-3)
    assert s.keeps_up and s.chunks_per_s >= s.link_chunks_per_s
    assert s.threads_to_saturate_core == 8
    assert 120 < s.threads_needed <= 128                # the paper: at most 128 threads
    assert s.cores_needed == 16
    # "about 590 cycles per chunk per core at 1.8 GHz": the link's budget, which the
    # core's 577 cycles of work fit
    assert s.cycle_budget_per_core == pytest.approx(590, abs=0.5)
    assert s.work_cycles == pytest.approx(577.0, abs=0.1)
    assert s.work_cycles < s.cycle_budget_per_core


def test_dpa_literal_reading_one_thread_fills_a_core():
    """The issue's words read literally (one *thread* at 11.9 GiB/s, no stall): the same
    NIC capacity, but one thread per core suffices."""
    base = nic_preset("bf3-dpa")
    m = base.with_overrides(stall_cycles_per_chunk=0.0)
    s = m.size_for(1.6e12, 4096)
    assert m.thread_chunks_per_s(4096) * 4096 / GIB == pytest.approx(11.9, rel=1e-9)
    assert s.threads_to_saturate_core == 1
    assert s.keeps_up and s.cores_needed == 16 == s.threads_needed
    assert s.chunks_per_s == pytest.approx(base.chunks_per_s(4096), rel=1e-12)


def test_issue_example_590_cycles_falls_just_short_of_1_6_tbps():
    m = parse_nic("clock=1.8GHz,cores=16,threads=16,cycles=590,chunk=4KiB")
    s = m.size_for(1.6e12)
    assert s.chunks_per_s == pytest.approx(16 * 1.8e9 / 590)
    assert s.gbps == pytest.approx(1599.52, abs=0.01)
    assert not s.keeps_up and s.link_fraction == pytest.approx(0.9997, abs=1e-4)
    assert s.cores_needed == 17 and s.threads_needed == 17


# -- the model's arithmetic ------------------------------------------------------------

def test_hardware_threads_hide_stalls_up_to_the_issue_limit():
    m = _model(stall_cycles_per_chunk=300.0)            # latency 400 = 4 x work
    assert m.threads_to_saturate_core() == 4
    thread = 1e9 / 400
    assert m.thread_chunks_per_s() == pytest.approx(thread)
    assert m.core_chunks_per_s(threads=2) == pytest.approx(2 * thread)
    assert m.core_chunks_per_s(threads=4) == pytest.approx(1e9 / 100)
    assert m.core_chunks_per_s(threads=8) == pytest.approx(1e9 / 100)     # issue bound
    # threads spread evenly: 6 threads on 4 cores = 2 cores x 2 + 2 cores x 1
    assert m.chunks_per_s(threads=6) == pytest.approx(2 * 2 * thread + 2 * thread)
    assert m.chunks_per_s() == pytest.approx(4 * 1e7)


def test_per_byte_cycles_make_large_chunks_cost_more():
    m = _model(cycles_per_byte=0.5)
    assert m.work_cycles(1000) == 600
    assert m.bytes_per_s(4000) > m.bytes_per_s(1000)      # fixed cost amortised
    assert m.chunks_per_s(4000) < m.chunks_per_s(1000)


@pytest.mark.parametrize("kw", [dict(stall_cycles_per_chunk=0.0),
                                dict(stall_cycles_per_chunk=350.0, cores=3),
                                dict(stall_cycles_per_chunk=1234.5, cycles_per_byte=0.01)])
@pytest.mark.parametrize("gbps", [1, 10, 37, 100, 400, 1600])
def test_threads_and_cores_needed_are_minimal(kw, gbps):
    m = _model(**kw)
    s = m.size_for(gbps * 1e9, 4096)
    k = max(m.cores, s.cores_needed)
    assert m.chunks_per_s(4096, s.threads_needed, k) * (1 + 1e-12) >= s.link_chunks_per_s
    if s.threads_needed > 1:
        assert m.chunks_per_s(4096, s.threads_needed - 1, k) < s.link_chunks_per_s
    full = m.core_chunks_per_s(4096)
    assert s.cores_needed * full * (1 + 1e-12) >= s.link_chunks_per_s
    assert s.cores_needed == 1 or (s.cores_needed - 1) * full < s.link_chunks_per_s
    assert s.keeps_up == (s.cores_needed <= m.cores)


@pytest.mark.parametrize("kw", [dict(clock_hz=0), dict(clock_hz=-1e9), dict(cores=0),
                                dict(threads_per_core=-2), dict(cycles_per_chunk=0),
                                dict(cycles_per_byte=-1), dict(stall_cycles_per_chunk=-1),
                                dict(chunk_nbytes=0), dict(queue_chunks=0),
                                dict(cores=2.5), dict(clock_hz=math.inf)])
def test_bad_parameters_are_refused(kw):
    with pytest.raises(InvalidArgument):
        _model(**kw)


def test_parse_nic_presets_overrides_and_parameters():
    assert parse_nic("bf3-dpa") == nic_preset("bf3-dpa")
    m = parse_nic("bf3-dpa:cores=8,queue=4096")
    assert (m.cores, m.queue_chunks, m.threads_per_core) == (8, 4096, 16)
    m = parse_nic("clock=2GHz,cores=2,cycles=1000,cycles_per_byte=0.25,stall=50,chunk=8KiB")
    assert (m.clock_hz, m.cores, m.threads_per_core, m.chunk_nbytes) == (2e9, 2, 1, 8192)
    assert m.latency_cycles() == 1000 + 0.25 * 8192 + 50
    for bad in ("nope", "bf3-dpa:cores=0", "bf3-dpa:colour=red", "clock=1.8,cores=1,cycles=5",
                "clock=1GHz,cores=1", "bf3-dpa:chunk=4096", "bf3-dpa:cycles=-3",
                "bf3-dpa:cores"):
        with pytest.raises(InvalidArgument):
            parse_nic(bad)
    with pytest.raises(UnknownName, match="bf3-dpa, host-native, host-python"):
        parse_nic("bf3")


# -- host-python: the measured data file and its fallback -------------------------------

def test_host_python_loads_the_measured_file_and_falls_back(tmp_path):
    data = load_host_python()
    assert data["seconds_per_chunk"] > 0 and data["seconds_per_byte"] >= 0
    m = host_python()
    assert (m.cores, m.threads_per_core) == (1, 1)
    assert m.cycles_per_chunk == pytest.approx(data["seconds_per_chunk"] * data["clock_hz"])
    f = tmp_path / "host.json"
    f.write_text(json.dumps({"seconds_per_chunk": 1e-6, "seconds_per_byte": 0.0,
                             "clock_hz": 1e9}))
    assert host_python(str(f)).thread_chunks_per_s() == pytest.approx(1e6)
    assert load_host_python(str(tmp_path / "missing.json"))["seconds_per_chunk"] == \
        HOST_PYTHON_FALLBACK["seconds_per_chunk"]
    f.write_text("{not json")
    assert load_host_python(str(f))["source"] == HOST_PYTHON_FALLBACK["source"]
    f.write_text(json.dumps({"seconds_per_chunk": 0, "seconds_per_byte": 0, "clock_hz": 1}))
    assert load_host_python(str(f))["source"] == HOST_PYTHON_FALLBACK["source"]


def test_host_native_preset_is_the_compiled_path_and_faster(tmp_path):
    """host-native loads its own measured file (bench/nic.py writes both in one run), falls
    back the same way, and models a faster receiver than host-python."""
    native, python = host_native(), host_python()
    assert native.name == "host-native" and (native.cores, native.threads_per_core) == (1, 1)
    assert native.gbps(8928) > python.gbps(8928)
    assert load_host_native(str(tmp_path / "missing.json"))["seconds_per_chunk"] == \
        HOST_NATIVE_FALLBACK["seconds_per_chunk"]
    assert nic_preset("host-native").name == "host-native"


def test_bench_measures_the_real_receive_path():
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    try:
        import nic as bench_nic
    finally:
        sys.path.pop(0)
    # engine_cost checks the receiver's buffer equals the root's after placement
    assert 0 < bench_nic.engine_cost(4096, 64, 1) < 1e-2
    rx, tx = bench_nic.udp_cost(4096, 64, 1)
    assert 0 < rx < 1e-2 and 0 < tx < 1e-2
    nat = bench_nic.native_cost(4096, 64, 1)    # None without the helper
    assert nat is None or (0 < nat[0] < 1e-2 and 0 < nat[1] < 1e-2)
    a, b = bench_nic.fit([1000, 2000, 4000], [2e-6, 3e-6, 5e-6])
    assert a == pytest.approx(1e-6) and b == pytest.approx(1e-9)


# -- the command ------------------------------------------------------------------------

def test_cli_issue_example_json(capsys):
    rc = main(["nic", "--link", "1.6Tbps", "--chunk", "4KiB", "--cycles-per-chunk", "590",
               "--clock", "1.8GHz", "--cores", "16", "--threads-per-core", "16", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["chunks_per_s"] == pytest.approx(48.81e6, rel=1e-3)
    assert out["gbps"] == pytest.approx(1599.5, abs=0.1)
    assert out["threads_needed"] == 17 and out["keeps_up"] is False


def test_cli_preset_table_and_plot(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "rate.png"
    assert main(["nic", "--preset", "bf3-dpa", "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "keeps up with the link: yes" in out and "16 cores, 126 threads" in out
    assert png.stat().st_size > 10_000
    assert main(["nic", "--preset", "host-python", "--link", "100Gbps", "--cores", "4",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["cores"] == 4 and out["keeps_up"] is False and out["threads_needed"] > 4


@pytest.mark.parametrize("argv,what", [
    (["--clock", "0GHz", "--cores", "1", "--cycles-per-chunk", "5"], "frequency"),
    (["--clock", "1.8", "--cores", "1", "--cycles-per-chunk", "5"], "unit"),
    (["--preset", "bf3-dpa", "--link", "100"], "unit"),
    (["--preset", "bf3-dpa", "--link", "0Gbps"], "rate"),
    (["--preset", "bf3-dpa", "--chunk", "4096"], "unit"),
    (["--preset", "bf3-dpa", "--chunk", "0KiB"], "chunk"),
    (["--preset", "bf3-dpa", "--cores", "-1"], "--cores"),
    (["--preset", "bf3-dpa", "--cycles-per-chunk", "0"], "--cycles-per-chunk"),
    (["--preset", "dpu9000"], "bf3-dpa, host-native, host-python"),
    (["--cores", "2"], "missing --clock"),
    (["--preset", "bf3-dpa", "--plot", "rate.txt"], ".png"),
    (["--preset", "bf3-dpa", "--plot", "/nonexistent-dir/rate.png"], "does not exist"),
])
def test_cli_bad_input_one_line_exit_2(argv, what, capsys, tmp_path):
    png = tmp_path / "never.png"
    if "--plot" not in argv:
        argv = [*argv, "--plot", str(png)]
    assert main(["nic", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and what in err and err.startswith("polycast nic:")
    assert not png.exists()                        # refused before any work


def test_cli_runs_as_a_command():
    env = dict(os.environ, PYTHONPATH=ROOT)
    r = subprocess.run([sys.executable, "-m", "polycast.cli.main", "nic", "--preset",
                        "bf3-dpa", "--json"], capture_output=True, text=True, env=env,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["threads_needed"] == 126
