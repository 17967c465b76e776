"""The GPU scripts' shell plumbing, run here with a stand-in for Python (no GPU, nothing trained):
benchmarks/gpu_predictor.sh takes its paths from wherever it is called and, with PACK=FILE.tgz
(benchmarks/gpu_common.sh), hands its outputs back as one archive, as a device that returns only a few
files needs."""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Stands in for python3: writes the file after --out and crossfit_predictions.json in --work, and logs its
# working directory and arguments.
FAKE_PYTHON = """#!/usr/bin/env bash
out=""; work=""
while [ $# -gt 0 ]; do
  case "$1" in --out) out=$2; shift;; --work) work=$2; shift;; --data-dir) data=$2; shift;; esac; shift
done
echo "cwd=$PWD data=$data" >> "$LOG"
[ -d "$data" ] || exit 9
mkdir -p "$work" && echo '{}' > "$work/crossfit_predictions.json" && echo '{"ok": 1}' > "$out"
"""


@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("tar") is None, reason="needs bash and tar")
def test_gpu_predictor_runs_from_the_repository_root_and_packs_its_outputs(tmp_path):
    fake = tmp_path / "python"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    (tmp_path / "data").mkdir()
    env = dict(os.environ, PYTHON=str(fake), WORK=str(tmp_path / "work"), LOG=str(tmp_path / "log"),
               PACK="packed/run.tgz")
    done = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_predictor.sh"), "data", "out"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    log = (tmp_path / "log").read_text().splitlines()
    assert log == [f"cwd={ROOT} data={tmp_path / 'data'}"] * 2  # run from the root, the data dir made absolute
    names = {"predictor_h200.json", "predictor_h200_pretrain.json", "crossfit_h200_direct.json",
             "crossfit_h200_pretrain.json"}
    assert {p.name for p in (tmp_path / "out").iterdir()} == names
    with tarfile.open(tmp_path / "packed" / "run.tgz") as tar:  # PACK is relative to where it was called
        assert {Path(m.name).name for m in tar.getmembers() if m.isfile()} == names
    assert "== packed" in done.stdout


def test_gpu_predictor_stops_on_a_missing_data_dir(tmp_path):
    done = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_predictor.sh"), "nowhere", "out"], cwd=tmp_path,
                          env=dict(os.environ, PYTHON="false", WORK=str(tmp_path / "work")), capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 1 and "nowhere" in done.stderr
