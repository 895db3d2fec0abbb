"""`ringtrain dashboard`: the address of the job service's web dashboard, with its token.

It prints the URL and opens nothing unless asked (``--open``): the token in it is the service's
key, so it goes to the terminal of whoever asked, not to a browser that another user's session
might own. Opening it once signs the browser in (a cookie); the token leaves the address bar.
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
                        help="also open the URL in this machine's web browser")
    parser.set_defaults(func=_dashboard)


def _dashboard(args: argparse.Namespace) -> int:
    client = connect_from(args)
    try:
        url = client.dashboard_url()
    finally:
        client.close()
    if args.output == "json":
        output.emit_json({"url": url})
    else:
        print(url)
    if args.open and not webbrowser.open(url):
        print("no web browser found here: open the URL above in one", flush=True)
    return 0
