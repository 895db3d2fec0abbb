"""`ringtrain login URL`: point the CLI at a job service on another machine, by name.

The service is remembered (:mod:`ringtrain.jobs.client.services`) with its token and, for
https, the fingerprint of its certificate, which every later command pins
(:mod:`ringtrain.jobs.client.pinning`). The fingerprint is given (``--fingerprint``, checked
against the server before anything is stored), or shown and confirmed when run in a terminal
(trust on first use, as ssh asks about a new host key); without a terminal to ask in, the login
is refused rather than trusting whatever answered. The token comes from ``--token-file`` (the
file is read at each use) or on standard input (copied into a private file), never on the
command line, where other users' ``ps`` would see it. It is tried once before anything is
stored, so a wrong one is found now rather than at the next command.
"""

from __future__ import annotations

import argparse
import getpass
import sys
from pathlib import Path
from urllib.parse import urlsplit

from ringtrain.jobs.cert_fingerprint import fingerprint_of, parse_fingerprint
from ringtrain.jobs.cli import output
from ringtrain.jobs.client import services
from ringtrain.jobs.client.jobs_client import JobsClient
from ringtrain.jobs.client.pinning import mismatch, peer_certificate
from ringtrain.jobs.errors import AuthError, InvalidRequestError, JobsError
from ringtrain.jobs.home import home_is_named, read_token_file


def add_commands(parser: argparse.ArgumentParser, common: argparse.ArgumentParser) -> None:
    """`login` takes a URL, or one of --list / --use."""
    parser.add_argument("url", nargs="?", help="the service, https://HOST:PORT (or http:// "
                                               "to a server started with --insecure)")
    parser.add_argument("--name", help="what to call it (default: the URL's host)")
    parser.add_argument("--fingerprint",
                        help="the certificate it must show, SHA256:... as `ringtrain server "
                             "status` prints it on its host (default: shown, and asked to "
                             "confirm, when run in a terminal)")
    parser.add_argument("--token-file", type=Path,
                        help="the file holding its token, read at each use (default: the token "
                             "on standard input, kept in a private copy)")
    parser.add_argument("--list", action="store_true", help="list the services logged in to")
    parser.add_argument("--use", metavar="NAME",
                        help=f"make NAME current ({services.LOCAL}: this host's own service)")
    parser.add_argument("-o", "--output", choices=["table", "json"], default="table")
    parser.set_defaults(func=_login)


def _login(args: argparse.Namespace) -> int:
    if args.list:
        return _list(args)
    if args.use:
        record = services.use_service(args.use)
        where = f"{record.url}" if record else "this host's job service (RINGTRAIN_HOME)"
        print(f"commands now use {args.use}: {where}", file=sys.stderr)
        return 0
    if not args.url:
        raise InvalidRequestError("name the service: `ringtrain login https://HOST:PORT` (or "
                                  "--list, --use NAME)")
    url, host = _check_url(args.url)
    name = services.check_service_name(args.name or _default_name(host))
    fingerprint = _trusted_fingerprint(url, args.fingerprint)
    token = None if args.token_file else _token_from_stdin(url)
    # A token file is read now too: there and readable now, not only at the first command.
    _try(url, token or read_token_file(args.token_file, "--token-file"), fingerprint)
    record = services.remember_service(name, url, fingerprint, token=token,
                                       token_file=args.token_file)
    if args.output == "json":
        output.emit_json({"name": name, **record.model_dump(mode="json"), "current": True})
    else:
        print(f"logged in to {name} at {url}" + (f", certificate {fingerprint}" if fingerprint
                                                 else "") + "; commands now use it")
    if home_is_named():
        print("note: RINGTRAIN_HOME is set in this shell, and a named home comes first: unset "
              "it to use this service", file=sys.stderr)
    return 0


def _list(args: argparse.Namespace) -> int:
    known = services.load()
    if args.output == "json":
        output.emit_json(known.model_dump(mode="json"))
    elif not known.services:
        print("no services logged in to (`ringtrain login URL` adds one)")
    else:
        print(output.table(["", "name", "url", "fingerprint"],
                           [["*" if n == known.current else "", n, r.url, r.fingerprint or "-"]
                            for n, r in sorted(known.services.items())]))
    return 0


def _check_url(url: str) -> tuple[str, str]:
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.path not in ("", "/"):
        raise InvalidRequestError(f"{url!r} is not a service URL: expected https://HOST:PORT")
    return f"{parts.scheme}://{parts.netloc}", parts.hostname


def _default_name(host: str) -> str:
    name = "".join(c if c.isalnum() or c in "._-" else "-" for c in host).strip("-.")
    return name if name and name != services.LOCAL else "service"


def _trusted_fingerprint(url: str, given: str | None) -> str | None:
    """The pin for ``url``: ``given`` once the server was seen to show it, or the fingerprint
    it shows once confirmed in a terminal; ``None`` for plain HTTP."""
    if url.startswith("http://"):
        if given:
            raise InvalidRequestError(f"{url} is plain HTTP: there is no certificate to pin")
        print(f"warning: {url} is plain HTTP: the token crosses the network in the clear (the "
              "service refuses it from other machines unless started with --insecure)",
              file=sys.stderr)
        return None
    got = fingerprint_of(peer_certificate(url))
    if given is not None:
        expected = parse_fingerprint(given)
        if expected != got:
            raise mismatch(url, expected, got)
        return got
    if not sys.stdin.isatty():
        raise InvalidRequestError(
            f"the service at {url} shows a certificate with fingerprint {got}, and there is no "
            "terminal to confirm it in: check it with the server's owner (`ringtrain server "
            "status` on its host prints it), then pass --fingerprint")
    print(f"The job service at {url} shows a certificate with fingerprint\n  {got}\nCheck it "
          "with the server's owner (`ringtrain server status` on its host prints it).",
          file=sys.stderr)
    answer = input("Trust it and log in? [yes/no] ").strip().lower()
    if answer not in ("y", "yes"):
        raise JobsError("not logged in: the certificate was not confirmed")
    return got


def _token_from_stdin(url: str) -> str:
    if sys.stdin.isatty():
        token = getpass.getpass(f"token of {url}: ")
    else:
        token = sys.stdin.read(4096)
    token = token.strip()
    if not token:
        raise InvalidRequestError("no token: pass it on standard input (`ringtrain login URL < "
                                  "FILE`) or name its file with --token-file")
    return token


def _try(url: str, token: str, fingerprint: str | None) -> None:
    """Call the service once with the token, so that a wrong one is never stored."""
    client = JobsClient(url, token, timeout_s=15, fingerprint=fingerprint)
    try:
        client.health()
    except AuthError as e:  # the reason matters for a scoped token: revoked, expired
        raise AuthError(f"the service at {url} refused the token ({e}); not logged in") from None
    finally:
        client.close()
