"""The storage steps a node runs for a job: ``stage`` its inputs, ``upload`` its outputs.

``python -m ringtrain.storage.node_main stage PLAN RESULT`` stages every copied input of the
plan into the node cache and writes ``{name: local path}`` to RESULT; ``upload PLAN --watch``
uploads the outputs as they settle until SIGTERM, ``upload PLAN`` uploads all of them once.

The entries staged are held for ``holder`` as long as ``holder_pid`` lives (default: this
process's parent, the job runner). The plan is a JSON file the executor wrote with mode 600 (it
holds the stores' options, named secrets included); every line this program writes passes
through :func:`ringtrain.storage.locations.redacted` with those values. Exit codes: 0 done, 1 a
store or cache error (the message names the input and the store's reason), 2 a malformed plan.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from ringtrain.storage import transfers
from ringtrain.storage.locations import open_store, redacted
from ringtrain.storage.node_cache import NodeCache
from ringtrain.storage.outputs import OutputUploader
from ringtrain.storage.stage import stage_input


def _secrets(plan: dict[str, Any]) -> list[str]:
    values = []
    for item in [*plan.get("inputs", {}).values(), plan.get("outputs") or {}]:
        values += [str(v) for v in (item.get("options") or {}).values()]
    return values


def _writer(plan: dict[str, Any]) -> Any:
    secrets = _secrets(plan)

    def write(line: str) -> None:
        sys.stdout.write(redacted(line, secrets) + "\n")
        sys.stdout.flush()

    return write


def stage(plan: dict[str, Any], result: Path) -> None:
    write = _writer(plan)
    cache = NodeCache(Path(plan["cache_root"]), int(plan["cache_max_bytes"]))
    paths = {}
    for name, item in plan["inputs"].items():
        try:
            paths[name] = str(stage_input(
                name, item["url"], item.get("options") or {}, cache, plan["holder"],
                int(plan.get("holder_pid") or os.getppid()), write, int(plan.get("concurrency") or
                                                     transfers.DEFAULT_CONCURRENCY),
                float(plan.get("stall_s") or transfers.DEFAULT_STALL_S)))
        except Exception as e:  # every store library raises its own types
            _fail(write, f"input {name} ({item['url']}): {transfers.describe(e)}")
    tmp = result.with_name(result.name + ".tmp")
    tmp.write_text(json.dumps(paths))
    os.replace(tmp, result)


def upload(plan: dict[str, Any], watch: bool) -> None:
    write = _writer(plan)
    out = plan["outputs"]
    try:
        fs, prefix = open_store(out["url"], out.get("options") or {})
        uploader = OutputUploader(fs, prefix, Path(out["folder"]), Path(out["journal"]), write,
                                  int(plan.get("concurrency") or transfers.DEFAULT_CONCURRENCY),
                                  float(plan.get("stall_s") or transfers.DEFAULT_STALL_S))
        if watch:
            stopping: list[int] = []
            signal.signal(signal.SIGTERM, lambda signum, _frame: stopping.append(signum))
            uploader.watch(lambda: bool(stopping))
        else:
            count = uploader.run_pass(final=True)
            write(f"outputs: {count} files uploaded to {out['url']}" if count else
                  f"outputs: all files already in {out['url']}")
    except Exception as e:
        _fail(write, f"outputs to {out['url']}: {transfers.describe(e)}")


def _fail(write: Any, message: str) -> None:
    write(f"error: {message}")
    sys.stdout.flush()
    # a transfer thread may still sit in a store call; exiting must not wait for it
    os._exit(1)


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] not in ("stage", "upload"):
        print("usage: node_main stage PLAN RESULT | upload PLAN [--watch]", file=sys.stderr)
        return 2
    try:
        plan = json.loads(Path(argv[1]).read_text())
    except (OSError, ValueError) as e:
        print(f"error: cannot read the storage plan {argv[1]}: {e}", file=sys.stderr)
        return 2
    if argv[0] == "stage":
        stage(plan, Path(argv[2]))
    else:
        upload(plan, "--watch" in argv[2:])
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
