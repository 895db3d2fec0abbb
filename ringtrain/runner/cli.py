"""`ringtrain run [OPTIONS] COMMAND...`: parse, launch, report. A thin shell over the library."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence

from ringtrain.errors import ConfigError
from ringtrain.run_files import write_json
from ringtrain.runner.result import EXIT_START_FAILED, RunResult

log = logging.getLogger(__name__)


def main(argv: Sequence[str]) -> int:
    """Run ``ringtrain run`` with ``argv`` (the arguments after ``run``).

    Returns:
        0 when every rank succeeded, 1 when a rank failed, 2 when the job could not be started
        (bad options included), 128 + N when the launcher was stopped by signal N.
    """
    # Import here: `ringtrain --help` and the other commands never load the launcher.
    from ringtrain.runner.config import load_config
    from ringtrain.runner.launch import launch
    from ringtrain.runner.threads import threads_note

    logging.basicConfig(format="ringtrain run: %(message)s", level=logging.WARNING)
    try:
        config = load_config(argv, os.environ)
    except SystemExit as e:  # --help and --version print and exit
        return int(e.code or 0)
    except ConfigError as e:
        print(f"ringtrain run: {e}", file=sys.stderr)
        return EXIT_START_FAILED
    if config.verbose:
        logging.getLogger("ringtrain").setLevel(logging.DEBUG)
    # A follower of the ssh launch speaks only of its own failures: the launcher says the rest.
    relayed = config.node is not None and config.node.stdio
    note = None if relayed else threads_note(os.environ, _most_ranks_per_host(config))
    if note:
        print(f"ringtrain run: {note}", file=sys.stderr, flush=True)
    try:
        result = launch(config)
    except ConfigError as e:
        print(f"ringtrain run: {e}", file=sys.stderr)
        return EXIT_START_FAILED
    if config.result_file:
        _write_result(config.result_file, result)
    if result.succeeded or (relayed and result.exit_code == 0):
        log.info("%s", result.message)
    else:
        print(f"ringtrain run: {result.message}", file=sys.stderr)
    return result.exit_code


def _most_ranks_per_host(config) -> int | None:
    """The most ranks the launch starts on one host (``None``: hosts found later, elastic)."""
    from ringtrain.runner.hosts import assign

    if config.node is not None:
        return config.node.nproc_per_node
    if not config.hosts:
        return None
    try:
        slots = assign(config.hosts, config.num_proc)
    except ConfigError:
        return None
    return max(slot.local_size for slot in slots)


def _write_result(path: str, result: RunResult) -> None:
    """Replace ``path`` atomically with the result (a reader never sees half of it)."""
    try:
        write_json(path, result.report().to_json())
    except OSError as e:  # the run is over; its exit status still tells the outcome
        print(f"ringtrain run: --result-file {path}: cannot write it ({e.strerror})",
              file=sys.stderr)
