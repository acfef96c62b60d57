"""ctrkit.progress: a bar on a terminal, periodic log lines in a file or a pipe, nothing when disabled; and the
trainer and `preprocess criteo` writing no carriage return into a pipe."""

from __future__ import annotations

import io
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tqdm import tqdm

import ctrkit
from ctrkit.progress import LogProgress, progress_bar

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "examples" / "data" / "criteo_sample.tsv.gz"


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_terminal_gets_a_bar_a_pipe_log_lines_and_disabled_nothing():
    bar = progress_bar(10, desc="x", file=Terminal())
    assert isinstance(bar, tqdm) and not bar.disable
    bar.close()
    assert isinstance(progress_bar(10, desc="x", file=io.StringIO()), LogProgress)
    for enabled, file in ((False, Terminal()), (False, io.StringIO()), (None, io.StringIO())):
        bar = progress_bar(10, desc="x", enabled=enabled, file=file)
        assert isinstance(bar, tqdm) and bar.disable, (enabled, file)
    bar = progress_bar(10, desc="x", enabled=None, file=Terminal())
    assert isinstance(bar, tqdm) and not bar.disable
    bar.close()


def test_log_lines_come_every_interval_and_at_close(caplog):
    clock = Clock()
    p = LogProgress(200, desc="train", initial=20, interval_s=30.0, clock=clock)
    with caplog.at_level(logging.INFO, logger="ctrkit.progress"):
        for _ in range(20):  # 10 s of steps: under the interval, no line
            clock.now += 0.5
            p.update(1)
        assert caplog.messages == []
        for _ in range(60):
            clock.now += 0.5
            p.update(1)
            p.set_postfix({"loss": 0.25}, refresh=False)
        p.close()
        p.close()  # once
    assert caplog.messages == ["train: 80/200 (40%), 2it/s, loss=0.25",
                               "train: 100/200 (50%), 2it/s, done in 40.0s, loss=0.25"]
    assert all("\r" not in m for m in caplog.messages)


def test_bytes_are_written_with_si_prefixes():
    clock = Clock()
    p = LogProgress(4_000_000, desc="criteo", unit="B", unit_scale=True, clock=clock)
    clock.now += 2.0
    p.update(1_500_000)
    assert p.line(clock.now) == "criteo: 1.50MB/4.00MB (38%), 750kB/s"


@pytest.mark.slow
def test_training_and_preprocessing_into_a_pipe_write_log_lines_not_carriage_returns(tmp_path):
    code = f"""
import logging, sys
from pathlib import Path
logging.basicConfig(level=logging.INFO, stream=sys.stderr)
from ctrkit.cli import main
from ctrkit.data.sources.criteo import preprocess_criteo
out = Path({str(tmp_path)!r})
preprocess_criteo(Path({str(SAMPLE)!r}), out / "criteo", min_freq=8, embedding_dim=4, progress=True)
sys.exit(main(["train", "--config", {str(REPO / "configs" / "criteo" / "dlrm.yaml")!r},
               f"--data.train={{out}}/criteo/train", f"--data.valid={{out}}/criteo/valid",
               f"--data.test={{out}}/criteo/test", "--train.epochs=1", "--train.max_steps=20",
               "--model.params.dense_arch=[8]", "--model.params.over_arch=[8]", f"--run.dir={{out}}/runs",
               "--run.name=pipe"]))
"""
    env = {**os.environ, "PYTHONPATH": str(Path(ctrkit.__file__).resolve().parents[1])}  # this ctrkit
    # bytes, not text: universal newlines would turn the bar's carriage returns into line ends
    proc = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, cwd=tmp_path, env=env)
    err = proc.stderr.decode()
    assert proc.returncode == 0, err[-3000:]
    assert b"\r" not in proc.stderr, err[-3000:]
    lines = [line for line in err.splitlines() if "ctrkit.progress" in line]
    assert any("progress:criteo: " in line and "(100%)" in line for line in lines), err[-3000:]
    assert any("progress:train: 20/20 (100%)" in line and "done in" in line for line in lines), err[-3000:]
