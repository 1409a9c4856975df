"""DDP, FSDP1 and FSDP2 train on the polycast backend exactly as on gloo (losses within
1e-6 relative over 5 steps, fp32), with FSDP's all-gathers on ring and on multicast; the
examples train under torchrun and under `polycast run`."""

from __future__ import annotations

import re

import pytest

from torch_helpers import ROOT, needs_torch, polycast_run, results, torchrun

pytestmark = needs_torch
REL = 1e-6


@pytest.mark.slow                   # three trainings under torchrun
def test_ddp_fsdp1_fsdp2_losses_equal_gloo_under_torchrun(tmp_path):
    proc = torchrun(4, ROOT / "tests" / "torch_train_worker.py", RESULT_DIR=tmp_path)
    got = results(tmp_path)
    assert proc.returncode == 0 and len(got) == 4, proc.stdout[-3000:] + proc.stderr[-3000:]
    for r in got:
        assert r["mcast_error"] is None, f"multicast unavailable: {r['mcast_error']}"
        assert r["mcast_datagrams_out"] > 0           # FSDP's all-gathers rode multicast
        assert r["ring_datagrams_out"] == 0
        runs = r["runs"]
        assert set(runs) == {"ddp/gloo", "ddp/auto", "ddp/ring", "fsdp1/gloo", "fsdp1/ring",
                             "fsdp1/mcast", "fsdp2/gloo", "fsdp2/auto", "fsdp2/ring",
                             "fsdp2/mcast"}
        for name, losses in runs.items():
            ref = runs[name.split("/")[0] + "/gloo"]
            assert len(losses) == 5
            for a, b in zip(losses, ref):
                assert abs(a - b) <= REL * abs(b), (name, losses, ref)
        assert runs["fsdp2/gloo"][-1] < runs["fsdp2/gloo"][0]      # it did learn


STEP = re.compile(r"step (\d) loss (\d+\.\d+)")
SMALL = ["--steps", "3", "--width", "64", "--layers", "2", "--seq", "16", "--vocab", "128"]


def _losses(text: str) -> list[float]:
    return [float(m.group(2)) for m in STEP.finditer(text)]


@pytest.mark.parametrize("script,launcher", [("fsdp_train.py", "polycast run"),
                                             ("ddp_train.py", "torchrun")])
@pytest.mark.slow                   # each trains the examples' model
def test_examples_train(script, launcher):
    """The examples run as documented (their losses against gloo's are checked above,
    through the same model and data)."""
    run = polycast_run if launcher == "polycast run" else torchrun
    proc = run(2, ROOT / "examples" / script, "--backend", "polycast", *SMALL)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    losses = _losses(proc.stdout)
    assert len(losses) == 3, proc.stdout
    assert losses[-1] < losses[0], losses
