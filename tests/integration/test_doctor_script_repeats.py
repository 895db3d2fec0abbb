"""`ringtrain doctor -- SCRIPT` repeats its trials and gives every figure a 95 % interval: two
trials that cost the same are no finding, a slow loader is one, and `--repeats 1` measures the
noise from windows of steps within the one run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: Batches from a ready-made TensorDataset (nothing to decode) into an MLP whose step costs
#: tens of ms: real and synthetic data cost the same.
SAME_COST = """import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
import ringtrain.torch as hvd
torch.set_num_threads(1)
hvd.init()
data = TensorDataset(torch.randn(512, 256), torch.randint(0, 10, (512,)))
model = torch.nn.Sequential(torch.nn.Linear(256, 1536), torch.nn.ReLU(),
                            torch.nn.Linear(1536, 1536), torch.nn.ReLU(),
                            torch.nn.Linear(1536, 10))
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                               named_parameters=model.named_parameters())
for epoch in range(100):
    for x, y in DataLoader(data, batch_size=32):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
"""


def _doctor(args: list[str], cwd: Path) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RINGTRAIN_", "HOROVOD_"))}
    env["PYTHONPATH"] = str(ROOT)
    result = subprocess.run([sys.executable, "-m", "ringtrain.cli", "doctor", *args], cwd=cwd,
                            env=env, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    return result.stdout


def test_trials_of_the_same_cost_are_no_finding_and_every_figure_has_an_interval(tmp_path):
    (tmp_path / "train.py").write_text(SAME_COST)
    out = _doctor(["--steps", "4", "--warmup", "1", "--repeats", "2", "--work-dir",
                   str(tmp_path / "doc"), "-o", "json", "--", sys.executable, "train.py"],
                  tmp_path)
    report = json.loads(next(x for x in out.splitlines() if x.startswith("{")))
    assert report["repeats"] == 2 and report["noise_from"] == "2 runs of each trial"
    assert report["rate_unit"] == "img/s" and "batch 32 per rank" in report["title"]
    for trial in report["trials"]:
        assert len(trial["rates"]) == 2  # one rate per run
        low, high = trial["images_per_second_interval"]
        assert low <= trial["images_per_second"] <= high and high > low
        assert set(trial["breakdown_ms_interval"]) == set(trial["breakdown_ms"])
        for phase, (lo, hi) in trial["breakdown_ms_interval"].items():
            assert lo <= trial["breakdown_ms"][phase] <= hi
        assert len(trial["step_half_ms_per_rank"]) == 1
    assert not report["verdict"].startswith("the input pipeline is your bottleneck"), report
    assert not any(a["message"].startswith("data wait is") or "slow training down" in
                   a["message"] for a in report["advice"]), report["advice"]
    for trial in ("synthetic", "real"):  # each run in its own folder
        assert sorted(p.name for p in (tmp_path / "doc" / trial).iterdir()) == \
            ["run1", "run2"]


def test_a_slow_loader_is_a_finding_measured_from_windows_of_one_run(tmp_path):
    # 8 items of 5 ms each, made in the training process: ~40 ms of waiting per step
    script = ROOT / "tests" / "integration" / "scripts" / "loader_train.py"
    out = _doctor(["--steps", "10", "--warmup", "1", "--repeats", "1", "--work-dir",
                   str(tmp_path / "doc"), "--", sys.executable, str(script), "--item-ms", "5",
                   "--epochs", "50"], tmp_path)
    lines = out.splitlines()
    start = next(i for i, x in enumerate(lines) if x.startswith("ringtrain doctor: "))
    assert lines[start + 2].startswith("verdict: the input pipeline is your bottleneck: real "
                                       "data runs at "), out
    assert "windows of consecutive steps in its one run" in out
    table = lines[start + 4:start + 9]
    assert table[1].startswith("synthetic") and table[3].startswith("real")
    assert table[2].split()[0].startswith("±") and table[4].split()[0].startswith("±")
    assert "x synth" in table[0] and "±" in table[3].split()[4]  # the ratio's interval
    advice = out[out.index("advice:"):]
    assert "data wait is" in advice and " ± " in advice.splitlines()[1]
