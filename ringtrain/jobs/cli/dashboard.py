"""`ringtrain dashboard`: the address of the job service's web dashboard, with its token.

It prints the URL and opens nothing unless asked (``--open``): the token in it is the service's
key, so it goes to the terminal of whoever asked, not to a browser that another user's session
might own. Opening it once signs the browser in (a cookie); the token leaves the address bar.

``--open`` gives the browser another address: a browser's command line is readable by every
local account (``ps``), so it gets a login code the service exchanges once, within a minute, for
the same cookie (:mod:`ringtrain.jobs.service.api.login_codes`), never the token.
"""

from __future__ import annotations

import argparse
import webbrowser

from ringtrain.jobs.cli import output
from ringtrain.jobs.cli.args import add_server_options, connect_from


def add_commands(parser: argparse.ArgumentParser, common: argparse.ArgumentParser) -> None:
    """`dashboard` has no subcommands: it takes ``--open`` and the options of every command."""
    parser.add_argument("-o", "--output", choices=["table", "json"], default="table",
                        help="table (default: the URL alone) or json: {\"url\": ...}")
    add_server_options(parser)
    parser.add_argument("--open", action="store_true",
                        help="also open the dashboard in this machine's web browser (with a "
                             "single-use login code, not the token)")
    parser.set_defaults(func=_dashboard)


def _dashboard(args: argparse.Namespace) -> int:
    client = connect_from(args)
    try:
        url = client.dashboard_url()
        login_url = client.dashboard_login_url() if args.open else None
    finally:
        client.close()
    if args.output == "json":
        output.emit_json({"url": url})
    else:
        print(url)
    if login_url is not None and not webbrowser.open(login_url):
        print("no web browser found here: open the URL above in one", flush=True)
    return 0
