"""A job for the dashboard tests: each rank logs a loss scalar as TensorBoard events (rank 0 also
``total_steps``, 600, once: the jobs list's ETA), a step profiler record, a numbered line to
stdout and a progress update to stderr (a "\\r" redrawing one unfinished line, as tqdm's) every
0.2 s, echoes what the test writes to ``say.<rank>`` in the job's folder, and exits 0 once the
test creates ``release`` there (1 after 120 s without it)."""

import json
import os
import sys
import time
from pathlib import Path

from ringtrain.torch.summary_writer import without_tensorflow

without_tensorflow()  # TensorFlow's start-up lines would come first on the ranks' stderr
from tensorboard.compat.proto import event_pb2, summary_pb2  # noqa: E402
from tensorboard.summary.writer.event_file_writer import EventFileWriter  # noqa: E402

rank = int(os.environ["HOROVOD_RANK"])
job_dir = Path(os.environ["RINGTRAIN_JOB_DIR"])
writer = EventFileWriter(str(job_dir / "outputs" / "tb" / f"rank{rank}"), flush_secs=0.1)
print("<script>window.__pwned = 1</script> <b>not bold</b>", flush=True)
said = ""
(job_dir / "metrics").mkdir(exist_ok=True)
profile = open(job_dir / "metrics" / f"steps.rank{rank}.jsonl", "a")  # as the step profiler
if rank == 0:  # how a job says its total, for the dashboard's progress and ETA
    total = summary_pb2.Summary.Value(tag="total_steps", simple_value=600.0)
    writer.add_event(event_pb2.Event(wall_time=time.time(), step=0,
                                     summary=summary_pb2.Summary(value=[total])))
for step in range(600):
    phases = {"data_ms": 2.0 + rank, "forward_backward_ms": 10.0, "communication_ms": 3.0}
    profile.write(json.dumps({"step": step, "time": time.time(), "step_ms": 15.0 + rank,
                              **phases}) + "\n")
    profile.flush()
    value = summary_pb2.Summary.Value(tag="loss", simple_value=1.0 / (1 + step) + rank)
    writer.add_event(event_pb2.Event(wall_time=time.time(), step=step,
                                     summary=summary_pb2.Summary(value=[value])))
    writer.flush()
    print(f"rank {rank} step {step}", flush=True)
    sys.stderr.write(f"\rprogress {step}/600")
    sys.stderr.flush()
    say = job_dir / f"say.{rank}"
    if say.exists() and say.read_text() != said:
        said = say.read_text()
        print(said, flush=True)
    if (job_dir / "release").exists():
        writer.close()
        sys.exit(0)
    time.sleep(0.2)
sys.exit(1)
