"""Training scalars read from the files a job writes: TensorBoard event files as
``torch.utils.tensorboard`` and TF2/Keras write them (read while they grow, a torn record
waited for), the step profiler's JSON lines, and the ``job metrics`` command over a real
server."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import numpy as np
import pytest
from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2

from ringtrain.jobs.home import Home
from ringtrain.jobs.service.monitor.scalars import JobScalars
from ringtrain.jobs.service.monitor.tfevents import EventFileReader, masked_crc32c

from .conftest import CLI, wait_for


def _record(event: event_pb2.Event) -> bytes:
    data = event.SerializeToString()
    header = struct.pack("<Q", len(data))
    return (header + struct.pack("<I", masked_crc32c(header)) + data
            + struct.pack("<I", masked_crc32c(data)))


def _scalar(tag: str, step: int, value: float, wall: float = 1.0) -> event_pb2.Event:
    v = summary_pb2.Summary.Value(tag=tag, simple_value=value)
    return event_pb2.Event(wall_time=wall, step=step, summary=summary_pb2.Summary(value=[v]))


def test_masked_crc32c_matches_tensorboards() -> None:
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import (
        masked_crc32c as theirs,
    )

    for data in (b"", b"a", b"123456789", bytes(range(256)) * 3):
        assert masked_crc32c(data) == theirs(data)


def test_torch_summary_writer_files_are_read_incrementally(tmp_path: Path) -> None:
    from ringtrain.torch.summary_writer import summary_writer

    writer = summary_writer(str(tmp_path))  # torch's SummaryWriter, without TensorFlow's import
    for step in range(5):
        writer.add_scalar("train/loss", 1.0 / (step + 1), step)
    writer.add_histogram("weights", np.array([0.1, 0.2, 0.3]), 0)  # not a scalar: skipped
    writer.flush()
    (path,) = tmp_path.glob("*tfevents*")
    reader = EventFileReader(path)
    got = reader.read()
    assert [(s.tag, s.step) for s in got] == [("train/loss", i) for i in range(5)]
    assert got[1].value == pytest.approx(0.5)
    assert reader.read() == []  # nothing new
    writer.add_scalar("lr", 0.1, 2**40)
    writer.close()
    (more,) = reader.read()
    assert (more.tag, more.step, more.value) == ("lr", 2**40, pytest.approx(0.1))


def test_tf2_tensor_scalars_and_a_torn_record(tmp_path: Path) -> None:
    """Keras' TensorBoard callback writes scalars as tensors; a record half written is read
    once it is whole, exactly once."""
    path = tmp_path / "events.out.tfevents.1.host"
    values = [summary_pb2.Summary.Value(tag="epoch_loss", tensor=tensor_pb2.TensorProto(
                  dtype=1, tensor_content=struct.pack("<f", 2.5))),
              summary_pb2.Summary.Value(tag="epoch_acc", tensor=tensor_pb2.TensorProto(
                  dtype=2, double_val=[0.75])),
              summary_pb2.Summary.Value(tag="text", tensor=tensor_pb2.TensorProto(
                  dtype=7, string_val=[b"not a number"]))]
    whole = _record(event_pb2.Event(step=3, wall_time=5.0, summary=summary_pb2.Summary(
        value=values)))
    path.write_bytes(_record(event_pb2.Event(file_version="brain.Event:2")) + whole[:20])
    reader = EventFileReader(path)
    assert reader.read() == []
    with path.open("ab") as f:
        f.write(whole[20:])
    got = reader.read()
    assert [(s.tag, s.step, s.value) for s in got] == [("epoch_loss", 3, 2.5),
                                                       ("epoch_acc", 3, 0.75)]
    assert reader.read() == [] and reader.broken is None


def test_a_corrupt_file_stops_its_reader_and_links_and_pipes_are_never_opened(
        tmp_path: Path) -> None:
    bad = tmp_path / "events.out.tfevents.bad"
    bad.write_bytes(b"\x10" + b"\x00" * 30)
    reader = EventFileReader(bad)
    assert reader.read() == [] and "checksum" in (reader.broken or "")
    secret = tmp_path / "secret.tfevents"
    secret.write_bytes(_record(_scalar("secret", 0, 1.0)))
    link = tmp_path / "events.out.tfevents.link"
    link.symlink_to(secret)
    assert EventFileReader(link).read() == []
    fifo = tmp_path / "events.out.tfevents.fifo"
    os.mkfifo(fifo)
    assert EventFileReader(fifo).read() == []  # returns at once: O_NONBLOCK, then fstat


def test_job_scalars_gather_runs_and_profiler_phases_behind_a_cursor(tmp_path: Path) -> None:
    job_dir = tmp_path / "job"
    for rank in (0, 1):
        folder = job_dir / "outputs" / "tb" / f"rank{rank}"
        folder.mkdir(parents=True)
        (folder / "events.out.tfevents.1").write_bytes(
            b"".join(_record(_scalar("loss", s, rank + 1.0 / (s + 1))) for s in range(3)))
    (job_dir / "metrics").mkdir()
    steps = job_dir / "metrics" / "steps.rank1.jsonl"
    steps.write_text(json.dumps({"step": 0, "time": 9.0, "step_ms": 10.0, "data_ms": 2.0,
                                 "communication_ms": 3.0}) + "\n" + '{"step": 1, "ti')
    scalars = JobScalars(job_dir)
    first = scalars.since(0)
    series = [(s["run"], s["tag"]) for s in first["series"]]
    assert set(series) == {("outputs/tb/rank0", "loss"), ("outputs/tb/rank1", "loss"),
                           ("rank 1", "step_ms"), ("rank 1", "data_ms"),
                           ("rank 1", "communication_ms")}
    assert first["cursor"] == len(first["points"]) == 9
    rank1 = series.index(("outputs/tb/rank1", "loss"))
    assert [p[1:] for p in first["points"] if p[0] == rank1] == [
        [0, 1.0, 2.0], [1, 1.0, 1.5], [2, 1.0, pytest.approx(4 / 3)]]
    with steps.open("a") as f:  # the torn line completes
        f.write('me": 9.5, "step_ms": 12.0}\n')
    again = scalars.since(first["cursor"])
    assert again["points"] == [[series.index(("rank 1", "step_ms")), 1, 9.5, 12.0]]
    assert scalars.since(again["cursor"])["points"] == []


def test_job_metrics_command_prints_the_series(home: Home, cli: CLI, tmp_path: Path) -> None:
    assert cli("cluster", "create", "c", "--nodes", "1")[0] == 0
    script = tmp_path / "log.py"
    script.write_text(
        "import os, struct\n"
        "from tensorboard.summary.writer.event_file_writer import EventFileWriter\n"
        "from tensorboard.compat.proto import event_pb2, summary_pb2\n"
        "w = EventFileWriter(os.environ['RINGTRAIN_JOB_DIR'] + '/outputs/tb')\n"
        "for s in range(4):\n"
        "    v = summary_pb2.Summary.Value(tag='loss', simple_value=4.0 - s)\n"
        "    w.add_event(event_pb2.Event(step=s, summary=summary_pb2.Summary(value=[v])))\n"
        "w.close()\n")
    import sys

    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"name": "m", "node_count": 1, "outputs": ["tb"],
                                "command": f"{sys.executable} {script}"}))
    rc, out, err = cli("job", "submit", str(spec), "--cluster", "c", "--follow")
    assert rc == 0, err
    job_id = json.loads(cli("job", "list", "-o", "json")[1])[0]["id"]
    rc, out, _ = cli("job", "metrics", job_id)
    assert rc == 0
    header, row = out.splitlines()[:2]
    assert header.split()[:3] == ["RUN", "TAG", "POINTS"]
    assert row.split() == ["outputs/tb", "loss", "4", "3", "1", "1", "4"]
    rc, out, _ = cli("job", "metrics", job_id, "-o", "json")
    (series,) = json.loads(out)["series"]
    assert series["steps"] == [0, 1, 2, 3] and series["values"] == [4.0, 3.0, 2.0, 1.0]
    assert wait_for(lambda: cli("job", "metrics", job_id, "--tag", "nope")[1].startswith(
        f"job {job_id} logged no scalars"))
