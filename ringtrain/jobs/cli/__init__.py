"""`ringtrain job|cluster|server|token|login ...`: a thin shell over the client, one module per
group.

Exit codes: 0 done; 1 the operation failed (unknown id, wrong state, no server, a followed job
that did not succeed); 2 invalid input (a bad spec, flag or path).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from ringtrain.errors import ConfigError
from ringtrain.jobs.cli import (
    cluster,
    dashboard,
    deployment,
    job,
    login,
    logout,
    output,
    secret,
    server,
    token,
)
from ringtrain.jobs.cli.args import add_server_options
from ringtrain.jobs.errors import InvalidRequestError, JobsError, SpecError

_GROUPS = {"job": job, "cluster": cluster, "server": server, "deployment": deployment,
           "dashboard": dashboard, "secret": secret, "login": login, "logout": logout,
           "token": token}


def common_options() -> argparse.ArgumentParser:
    """Options every command takes: output format and which server to talk to."""
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument("-o", "--output", choices=["table", "json"], default="table",
                        help="table (default) or json: one JSON document on stdout")
    add_server_options(parent)
    return parent


def main(argv: list[str]) -> int:
    """Run one command; ``argv[0]`` is the group (job, cluster, server, deployment, dashboard,
    secret, login, logout or token)."""
    group = _GROUPS[argv[0]]
    parser = argparse.ArgumentParser(prog=f"ringtrain {argv[0]}", description=group.__doc__)
    group.add_commands(parser, common_options())
    args = parser.parse_args(argv[1:])
    if not hasattr(args, "func"):
        parser.print_help()
        return 2
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    as_json = getattr(args, "output", "table") == "json"
    try:
        return int(args.func(args) or 0)
    except SpecError as e:
        output.error(str(e), e.errors, as_json)
        return 2
    except (InvalidRequestError, ConfigError) as e:
        output.error(str(e), None, as_json)
        return 2
    except JobsError as e:
        output.error(str(e), None, as_json)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # the reader went away (`| head`): not an error of ours
        sys.stdout = open(os.devnull, "w")  # so that the flush at exit cannot fail again
        return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
