"""Ctrl-C during `ringtrain doctor -- SCRIPT` prints what was measured so far; each run shows
its progress with the time left."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """import os, time, torch
from torch.utils.data import DataLoader, TensorDataset
import ringtrain.torch as hvd
if os.environ.get("RINGTRAIN_SYNTHETIC_DATA") != "1":
    time.sleep(600)  # the real-data run never gets anywhere: the user presses Ctrl-C
hvd.init()
data = TensorDataset(torch.randn(64, 8), torch.randint(0, 3, (64,)))
model = torch.nn.Linear(8, 3)
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                               named_parameters=model.named_parameters())
for _ in range(100):
    for x, y in DataLoader(data, batch_size=8):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
"""


def test_ctrl_c_reports_the_finished_run(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RINGTRAIN_", "HOROVOD_"))}
    env["PYTHONPATH"] = str(ROOT)
    err = open(tmp_path / "stderr", "w+")  # noqa: SIM115 - read while the doctor runs
    doctor = subprocess.Popen([sys.executable, "-m", "ringtrain.cli", "doctor", "--steps", "3",
                               "--warmup", "1", "--work-dir", str(tmp_path / "doc"), "--",
                               sys.executable, str(tmp_path / "train.py")], env=env,
                              stdout=subprocess.PIPE, stderr=err, text=True, cwd=tmp_path,
                              # as a shell's background job starts it: Ctrl-C must still work
                              preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        def real_data_run() -> bool:
            assert doctor.poll() is None, (tmp_path / "stderr").read_text()
            return "trial real-data run" in (tmp_path / "stderr").read_text()

        wait_until(real_data_run, "the real-data run's start", timeout_s=180)
        doctor.send_signal(signal.SIGINT)
        doctor.wait(60)
    finally:
        if doctor.poll() is None:
            doctor.kill()
    said = (tmp_path / "stderr").read_text()
    assert doctor.returncode == 130, said
    assert "trial synthetic-data run 1/3: done in" in said
    assert "interrupted; measured so far: synthetic:" in said and "img/s" in said
