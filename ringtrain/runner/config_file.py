"""`--config-file`: a YAML file of `ringtrain run` options.

Two layouts are read. The flat one uses the options' long names (``num-proc`` or ``num_proc``,
``hosts``, ``fusion-threshold-mb``, ...) plus ``command`` (a list or a string). Horovod's own
layout, with sections ``params``, ``autotune``, ``timeline``, ``stall_check`` and ``logging``, is
read as well so that an existing horovodrun config file keeps working.
"""

from __future__ import annotations

import logging
import shlex
from pathlib import Path
from typing import Any

from ringtrain.errors import ConfigError
from ringtrain.runner.options import coerce, config_file_key

log = logging.getLogger(__name__)

# Horovod's sections: section -> {key in the section -> option dest}.
_SECTIONS: dict[str, dict[str, str]] = {
    "params": {k: k for k in ("fusion_threshold_mb", "cycle_time_ms", "cache_capacity",
                              "bucket_mb", "threads_per_rank", "hierarchical_allreduce")},
    "autotune": {"enabled": "autotune"} | {
        k: f"autotune_{k}" for k in ("log_file", "warmup_samples", "steps_per_sample",
                                     "bayes_opt_max_samples", "gaussian_process_noise")},
    "timeline": {"filename": "timeline_filename", "mark_cycles": "timeline_mark_cycles"},
    "stall_check": {"warning_time_seconds": "stall_check_warning_time_seconds",
                    "shutdown_time_seconds": "stall_check_shutdown_time_seconds"},
    "logging": {"level": "log_level"},
}
# Horovod settings that have no meaning here (MPI and hierarchical-collective options).
_IGNORED = {"params": {"hierarchical_allgather"},
            "logging": {"hide_timestamp"}, "library_options": None}


def read_config_file(path: str) -> tuple[dict[str, Any], list[str]]:
    """The options (by ``dest``) and the command (empty when there is none) of the YAML file
    given to ``--config-file``.

    Raises:
        ConfigError: the file is missing, is not YAML, or has an unknown key or a bad value.
    """
    import yaml  # only `--config-file` needs it

    try:
        data = yaml.safe_load(Path(path).read_text())
    except OSError as e:
        raise ConfigError(f"--config-file {path}: cannot read it ({e.strerror})") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"--config-file {path}: not valid YAML ({e})") from None
    if data is None:
        return {}, []
    if not isinstance(data, dict):
        raise ConfigError(f"--config-file {path}: expected a mapping of option names to values")
    options: dict[str, Any] = {}
    command: list[str] = []
    for key, value in data.items():
        where = f"--config-file {path}, key {key!r}"
        key = str(key)
        if key == "command":
            command = _command(value, where)
        elif key in _SECTIONS or key in _IGNORED:
            options.update(_section(key, value, where))
        elif (dest := config_file_key(key)) is not None and dest != "config_file":
            options[dest] = coerce(dest, _verbosity(dest, value), where)
        else:
            raise ConfigError(f"{where}: not an option of `ringtrain run` (see --help for the "
                              "long option names)")
    return options, command


def _section(name: str, value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: expected a mapping")
    ignored = _IGNORED.get(name, set())
    options = {}
    for key, item in value.items():
        if ignored is None or key in ignored:
            log.warning("%s.%s: ignored (no equivalent in ringtrain)", where, key)
        elif name == "stall_check" and key == "enabled":
            options["no_stall_check"] = not coerce("no_stall_check", item, f"{where}.{key}")
        elif key in _SECTIONS.get(name, {}):
            dest = _SECTIONS[name][key]
            options[dest] = coerce(dest, item, f"{where}.{key}")
        else:
            raise ConfigError(f"{where}: unknown key {key!r} in Horovod's {name!r} section")
    return options


def _command(value: Any, where: str) -> list[str]:
    if isinstance(value, str):
        return shlex.split(value)
    if isinstance(value, list) and all(isinstance(v, (str, int, float)) for v in value):
        return [str(v) for v in value]
    raise ConfigError(f"{where}: expected a command line (a string or a list of arguments)")


def _verbosity(dest: str, value: Any) -> Any:
    # Horovod's YAML writes `verbose: 2`; any level turns the launcher's verbose output on.
    if dest == "verbose" and isinstance(value, int) and not isinstance(value, bool):
        return value > 0
    return value
