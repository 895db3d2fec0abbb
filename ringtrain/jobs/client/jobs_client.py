"""The Python client of the job service (httpx); the CLI is a thin shell over it.

HTTP errors come back as the service's own exceptions (``NotFoundError`` for 404, ``SpecError``
with the bad fields for 422, ...): one error family in-process or over the network. Ids and names
are checked against their patterns and escaped before they go into a URL, so
``../clusters/victim`` never becomes another route.

A submit (retried with the same idempotency key, so never two jobs), a download and a followed log
(resumed where they stopped) outlive a lost connection: the client backs off and, given a
``locate`` function, finds the server again, which may listen on another port after a restart.

An https server given a fingerprint is trusted by that pin alone
(:mod:`ringtrain.jobs.client.pinning`): its certificate is read and compared once when the
client opens, and is then the only one its connections accept.
"""

from __future__ import annotations

import ssl
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

import httpx

from ringtrain.jobs.client.endpoint import Endpoint
from ringtrain.jobs.client.pinning import explain_failed_handshake, pinned_context
from ringtrain.jobs.errors import (
    AuthError,
    CertificateError,
    ConflictError,
    ForbiddenError,
    InvalidRequestError,
    JobsError,
    NotFoundError,
    ServiceUnavailableError,
    SpecError,
    brief,
)
from ringtrain.jobs.files.extract import Extractor, TruncatedArchive
from ringtrain.jobs.files.upload_tar import Packed
from ringtrain.jobs.models import (
    ClusterInfo,
    ClusterSpec,
    FileInfo,
    JobInfo,
    JobSpec,
    JobState,
)
from ringtrain.jobs.models.deployment import DeploymentInfo
from ringtrain.jobs.models.ids import check_job_id, check_name
from ringtrain.jobs.models.paging import FilePage
from ringtrain.jobs.models.schemas import API_PREFIX, Health, LoginCode
from ringtrain.jobs.models.tokens import NewToken, TokenInfo, TokenRequest, check_token_id

_BY_STATUS: dict[int, type[JobsError]] = {
    400: InvalidRequestError, 401: AuthError, 403: ForbiddenError, 404: NotFoundError,
    409: ConflictError,
    503: ServiceUnavailableError,  # busy: a download waits and asks again
}
T = TypeVar("T")
#: Finds the server again after a lost connection: its url, token and pin.
Locate = Callable[[], Endpoint]


class JobsClient:
    """Calls one job server.

    Args:
        url: the server, e.g. ``http://127.0.0.1:8123``.
        token: the bearer token, if the server requires one.
        timeout_s: per-request timeout (streams wait without one).
        locate: finds the server again after a lost connection (default: the same url).
        reconnect_s: how long a submit or a followed log keeps trying to reach the server
            without progress before it gives up.
        fingerprint: for an https ``url``, the certificate the server must show (a pin);
            without, the server's certificate must be one a CA of this machine vouches for.

    Raises:
        CertificateError: an https server shows another certificate than ``fingerprint``.
        ServiceUnavailableError: with a ``fingerprint``, the server could not be reached to
            read its certificate.
    """

    def __init__(self, url: str, token: str | None = None, timeout_s: float = 30.0,
                 locate: Locate | None = None, reconnect_s: float = 60.0,
                 fingerprint: str | None = None):
        self._timeout_s = timeout_s
        self._locate = locate
        self.reconnect_s = reconnect_s
        self._open(Endpoint(url, token, fingerprint))

    @classmethod
    def of(cls, endpoint: Endpoint, **options: Any) -> JobsClient:
        """A client of ``endpoint`` (``options``: those of the constructor)."""
        return cls(endpoint.url, endpoint.token, fingerprint=endpoint.fingerprint, **options)

    def _open(self, endpoint: Endpoint) -> None:
        url = endpoint.url.rstrip("/")
        verify: ssl.SSLContext | bool = True
        if url.startswith("https://") and endpoint.fingerprint is not None:
            verify = pinned_context(url, endpoint.fingerprint, min(self._timeout_s, 10.0))
        self.url = url
        self._token = endpoint.token
        self._fingerprint = endpoint.fingerprint
        headers = {"Authorization": f"Bearer {endpoint.token}"} if endpoint.token else {}
        self._http = httpx.Client(base_url=self.url + API_PREFIX, headers=headers,
                                  timeout=self._timeout_s, verify=verify)

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def reconnect(self) -> None:
        """After a lost connection: talk to wherever the server is now (a restarted one may
        listen on another port), if ``locate`` can tell; else nothing changes."""
        if self._locate is None:
            return
        try:
            found = self._locate()
            if (found.url.rstrip("/"), found.token, found.fingerprint) \
                    == (self.url, self._token, self._fingerprint):
                return
            old = self._http
            self._open(found)  # a certificate that is not the pinned one is raised
        except ServiceUnavailableError:  # not back yet: the next try fails, and backs off
            return
        except CertificateError:
            raise
        except JobsError:
            return
        old.close()

    def _retrying(self, call: Callable[[], T]) -> T:
        """``call()``, tried again while the server cannot be reached (for ``reconnect_s``)."""
        backoff = _Backoff(self.reconnect_s)
        while True:
            try:
                return call()
            except ServiceUnavailableError as e:
                backoff.wait(e)
            self.reconnect()

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.TransportError as e:
            raise self._unreachable(e) from None
        _raise_for(response)
        return None if response.status_code == 204 else response.json()

    def _unreachable(self, cause: Exception) -> JobsError:
        untrusted = explain_failed_handshake(self.url, self._fingerprint, cause)
        if untrusted is not None:  # not a lost connection: trying again cannot help
            return untrusted
        return ServiceUnavailableError(f"cannot reach the job service at {self.url}: {cause}")

    @contextmanager
    def _stream(self, method: str, path: str, params: dict[str, Any]
                ) -> Iterator[httpx.Response]:
        """A streamed response whose error status is raised as the service's exception."""
        with ExitStack() as stack:
            try:
                response = stack.enter_context(self._http.stream(
                    method, path, params=params, timeout=httpx.Timeout(30, read=None)))
            except httpx.TransportError as e:
                raise self._unreachable(e) from None
            if response.status_code >= 400:
                response.read()
                _raise_for(response)
            yield response

    # -- clusters ----------------------------------------------------------------------------

    def health(self) -> Health:
        """Who serves. Raises ServiceUnavailableError if nobody does."""
        return Health.model_validate(self._call("GET", "/health"))

    def create_cluster(self, spec: ClusterSpec) -> ClusterInfo:
        """Create a cluster (a private Ray cluster, ``address="local"``, starts its nodes
        first: up to a few minutes on a loaded machine)."""
        timeout = max(self._timeout_s, 300.0) if spec.address == "local" else self._timeout_s
        return ClusterInfo.model_validate(self._call("POST", "/clusters", json=spec.model_dump(),
                                                     timeout=timeout))

    def list_clusters(self) -> list[ClusterInfo]:
        """All clusters."""
        return [ClusterInfo.model_validate(c) for c in self._call("GET", "/clusters")]

    def get_cluster(self, name: str) -> ClusterInfo:
        """One cluster."""
        return ClusterInfo.model_validate(self._call("GET", _cluster_path(name)))

    def resize_cluster(self, name: str, nodes: int | None = None,
                       slots: int | None = None) -> ClusterInfo:
        """Change a cluster's number of nodes and/or its slots per node."""
        body = {k: v for k, v in (("nodes", nodes), ("slots", slots)) if v is not None}
        return ClusterInfo.model_validate(self._call("PATCH", _cluster_path(name), json=body))

    def delete_cluster(self, name: str) -> ClusterInfo:
        """Delete a cluster (once its running jobs end)."""
        return ClusterInfo.model_validate(self._call("DELETE", _cluster_path(name)))

    # -- jobs --------------------------------------------------------------------------------

    def submit(self, cluster: str, spec: JobSpec, idempotency_key: str | None = None) -> JobInfo:
        """Submit a job to a cluster, exactly once however often the connection fails: every
        retry sends ``idempotency_key`` (default: a new random key), so the server records one
        job whatever reached it.

        Raises:
            ServiceUnavailableError: the server stayed unreachable for ``reconnect_s``.
            ConflictError: the key was used before for another spec or cluster.
        """
        body = {"cluster": check_name(cluster),
                "spec": spec.model_dump(mode="json", exclude_unset=True)}
        key = idempotency_key or uuid.uuid4().hex
        headers = {"Idempotency-Key": key}
        try:
            return JobInfo.model_validate(self._retrying(
                lambda: self._call("POST", "/jobs", json=body, headers=headers)))
        except ServiceUnavailableError as e:
            # A request may have reached the service, its answer lost: the job may exist.
            raise ServiceUnavailableError(
                f"{e}\nThe service may have created the job before the connection was lost. "
                f"Its idempotency key is {key}: once the service answers, "
                f"`ringtrain job list --idempotency-key {key}` shows it, and submitting again "
                f"with `--idempotency-key {key}` never creates a second one.") from None

    def upload(self, idempotency_key: str, packed: Packed) -> int:
        """Send ``packed`` (a remote submit's working dir and inputs) as the upload the submit
        with ``idempotency_key`` will name, resuming after what the service already has (a
        killed client's earlier try, a lost connection). Returns the byte it resumed at.

        Raises:
            ServiceUnavailableError: the server stayed unreachable for ``reconnect_s``.
            SpecError: the service refused the archive (a link, an unsafe path, too large).
        """
        path = f"/uploads/{quote(idempotency_key, safe='')}"
        backoff = _Backoff(self.reconnect_s)
        resumed: int | None = None
        while True:
            try:
                try:
                    status = self._call("GET", path)
                except NotFoundError:
                    status = {"received": 0, "manifest": "", "complete": False}
                same = status["manifest"] == packed.manifest
                if same and status["complete"]:
                    return status["received"] if resumed is None else resumed
                start = status["received"] if same else 0
                resumed = start if resumed is None else resumed
                try:
                    response = self._http.put(
                        path, params={"offset": start, "manifest": packed.manifest},
                        content=packed.stream(start),
                        # A length, not chunks: the server's parser takes it faster.
                        headers={"Content-Length": str(packed.size - start)},
                        timeout=httpx.Timeout(self._timeout_s, write=None, read=None))
                except httpx.TransportError as e:
                    raise self._unreachable(e) from None
                _raise_for(response)
                backoff.reset()
            except ServiceUnavailableError as e:  # lost, or the killed try not yet ended there
                backoff.wait(e)
                self.reconnect()
            except ConflictError:  # someone moved the upload on: ask again
                backoff.wait(ServiceUnavailableError("the upload kept changing"))

    def find_job(self, idempotency_key: str) -> JobInfo | None:
        """The job submitted with ``idempotency_key``, if the service created one."""
        jobs = self._call("GET", "/jobs", params={"idempotency_key": idempotency_key})
        return JobInfo.model_validate(jobs[0]) if jobs else None

    def list_jobs(self, experiment: str | None = None, cluster: str | None = None,
                  state: JobState | None = None) -> list[JobInfo]:
        """Jobs in submission order."""
        if experiment is not None:
            check_name(experiment, "experiment")
        if cluster is not None:
            check_name(cluster)
        params = {k: v for k, v in (("experiment", experiment), ("cluster", cluster),
                                    ("state", state.value if state else None)) if v is not None}
        return [JobInfo.model_validate(j) for j in self._call("GET", "/jobs", params=params)]

    def get_job(self, job_id: str) -> JobInfo:
        """One job."""
        return JobInfo.model_validate(self._call("GET", _job_path(job_id)))

    def terminate(self, job_id: str) -> JobInfo:
        """Stop a job."""
        return JobInfo.model_validate(self._call("POST", _job_path(job_id, "terminate")))

    def delete_job(self, job_id: str) -> None:
        """Forget a finished job and delete its folder."""
        self._call("DELETE", _job_path(job_id))

    def list_files(self, job_id: str, path: str = "") -> list[FileInfo]:
        """Every file under a path of the job's folder (all pages; see :meth:`iter_files`)."""
        return list(self.iter_files(job_id, path))

    def iter_files(self, job_id: str, path: str = "", page_size: int | None = None
                   ) -> Iterator[FileInfo]:
        """The files under ``path`` (relative to the job's folder), sorted by path, fetched a
        page of ``page_size`` (default: the server's) at a time as the caller goes on."""
        params: dict[str, Any] = {"path": path}
        if page_size is not None:
            params["limit"] = page_size
        while True:
            page = FilePage.model_validate(
                self._call("GET", _job_path(job_id, "files"), params=params))
            yield from page.files
            if page.next_cursor is None:
                return
            params["cursor"] = page.next_cursor

    def download(self, job_id: str, path: str, dest: str | Path) -> list[Path]:
        """Copy a file or folder of a job into the folder ``dest``, like ``cp -r PATH DEST/``.

        The files come in one streamed archive (see :mod:`ringtrain.jobs.files.archive`); after a
        lost connection the download goes on after the last file received whole.

        Returns:
            The local paths written (``outputs/model`` lands in ``DEST/model/``).

        Raises:
            InvalidRequestError: ``path`` ends in ``..`` (which folder it names, and so where it
                would land, is not what it says), or the server sent a path outside ``path``.
            ServiceUnavailableError: the server stayed unreachable for ``reconnect_s``.
        """
        return list(self.iter_download(job_id, path, dest))

    def iter_download(self, job_id: str, path: str, dest: str | Path) -> Iterator[Path]:
        """:meth:`download`, yielding each local path once its file is written whole."""
        if path.rstrip("/").split("/")[-1] == "..":
            raise InvalidRequestError(f"path {brief(path)} ends in '..': name the folder itself "
                                      "(e.g. outputs, or . for the whole job folder)")
        extract = Extractor(Path(dest), path)
        params: dict[str, Any] = {"path": path}
        backoff = _Backoff(self.reconnect_s)
        while True:
            if extract.last is not None:
                params["after"] = extract.last
            try:
                with self._stream("GET", _job_path(job_id, "archive"), params) as r:
                    for written in extract.members(r.iter_raw()):
                        backoff.reset()
                        yield written
                return
            except (ServiceUnavailableError, httpx.TransportError, TruncatedArchive) as e:
                backoff.wait(e)
            self.reconnect()

    def logs(self, job_id: str, rank: int = 0, stream: str = "stdout",
             follow: bool = False) -> Iterator[bytes]:
        """One rank's ``stdout``, ``stderr`` or ``output`` (both, as written), or node ``rank``'s
        ``prep.stdout`` / ``prep.stderr``; with ``follow``, until it ends.

        A followed log outlives the server: on a lost connection it reconnects and goes on
        from the last byte received.

        Raises:
            ServiceUnavailableError: the server stayed unreachable for ``reconnect_s``.
        """
        path = _job_path(job_id, "logs")
        params: dict[str, Any] = {"rank": rank, "stream": stream, "follow": follow}
        if not follow:
            with self._stream("GET", path, params) as r:
                yield from r.iter_raw()
            return
        offset = 0
        backoff = _Backoff(self.reconnect_s)
        while True:
            try:
                with self._stream("GET", path, {**params, "offset": offset}) as r:
                    for chunk in r.iter_raw():
                        offset += len(chunk)
                        backoff.reset()
                        yield chunk
                # The stream ends with the job, or with a server that stopped serving it.
                if self.get_job(job_id).state.is_terminal():
                    return
            except (ServiceUnavailableError, httpx.TransportError) as e:
                backoff.wait(e)
            self.reconnect()

    # -- deployments -------------------------------------------------------------------------

    def scalars(self, job_id: str, cursor: int = 0) -> dict[str, Any]:
        """The training scalars a job logged: ``{"cursor", "series", "points", "truncated"}``,
        ``points`` being ``[series index, step, wall_time, value]`` after ``cursor``."""
        return self._retrying(lambda: self._call("GET", _job_path(job_id, "scalars"),
                                                 params={"cursor": cursor}))

    def dashboard_url(self) -> str:
        """The dashboard's address with this client's token, to open in a browser (it sets a
        cookie and drops the token from the address bar)."""
        query = f"?token={quote(self._token, safe='')}" if self._token else ""
        return f"{self.url}/dashboard{query}"

    def dashboard_login_url(self) -> str:
        """An address that signs a browser in to the dashboard once, within a minute, with no
        token in it: what to give a browser's command line, which every local account can
        read."""
        found = LoginCode.model_validate(self._call("POST", "/dashboard/login-codes"))
        return f"{self.url}{found.url_path}"

    def deploy(self, job_id: str, replicas: int = 1, cluster: str | None = None, *,
               port: int = 0, replica_port: int = 0,
               max_restarts: int | None = None) -> DeploymentInfo:
        """Serve a succeeded job's saved model with ``replicas`` servers (a new deployment):
        its front on ``port``, replica K on ``replica_port + K`` (0: free ones), each replica
        restarted up to ``max_restarts`` times in a row (default: the service's)."""
        body: dict[str, Any] = {"replicas": replicas, "port": port, "replica_port": replica_port}
        if max_restarts is not None:
            body["max_restarts"] = max_restarts
        if cluster is not None:
            body["cluster"] = check_name(cluster)
        return DeploymentInfo.model_validate(
            self._call("POST", _job_path(job_id, "deploy"), json=body))

    def list_deployments(self) -> list[DeploymentInfo]:
        """Every deployment, in creation order."""
        return [DeploymentInfo.model_validate(d) for d in self._call("GET", "/deployments")]

    def get_deployment(self, deployment_id: str) -> DeploymentInfo:
        """One deployment: its state and the URLs of its replicas."""
        return DeploymentInfo.model_validate(self._call("GET", _deployment_path(deployment_id)))

    def stop_deployment(self, deployment_id: str) -> DeploymentInfo:
        """Stop a deployment's servers (after the requests in flight)."""
        return DeploymentInfo.model_validate(
            self._call("POST", _deployment_path(deployment_id, "stop")))

    # -- scoped tokens (the admin token's calls) ---------------------------------------------

    def create_token(self, request: TokenRequest) -> NewToken:
        """A new scoped token: its text is in the answer, and the service keeps only its hash."""
        return NewToken.model_validate(self._call(
            "POST", "/tokens", json=request.model_dump(mode="json", exclude_defaults=True)))

    def list_tokens(self) -> list[TokenInfo]:
        """Every scoped token's record (never the tokens)."""
        return [TokenInfo.model_validate(t) for t in self._call("GET", "/tokens")]

    def revoke_token(self, token_id: str) -> TokenInfo:
        """Revoke a scoped token: its next request is refused."""
        path = f"/tokens/{quote(check_token_id(token_id), safe='')}/revoke"
        return TokenInfo.model_validate(self._call("POST", path))


def _cluster_path(name: str) -> str:
    return f"/clusters/{quote(check_name(name), safe='')}"


def _job_path(job_id: str, *rest: str) -> str:
    return "/".join([f"/jobs/{quote(check_job_id(job_id), safe='')}", *rest])


def _deployment_path(deployment_id: str, *rest: str) -> str:
    return "/".join([f"/deployments/{quote(check_job_id(deployment_id), safe='')}", *rest])
class _Backoff:
    """Waits between tries: 0.1 s doubling to 2 s, for at most ``limit_s`` without progress."""

    def __init__(self, limit_s: float):
        self.limit_s = limit_s
        self.reset()

    def reset(self) -> None:
        """Progress was made: the next wait is short again, and the limit starts anew."""
        self.deadline = time.monotonic() + self.limit_s
        self.delay = 0.1

    def wait(self, cause: Exception) -> None:
        """Sleep before the next try; past the limit, raise instead.

        Raises:
            ServiceUnavailableError: the limit is reached (``cause`` says why).
        """
        if time.monotonic() + self.delay > self.deadline:
            if isinstance(cause, ServiceUnavailableError):
                raise cause
            raise ServiceUnavailableError(f"lost the job service and could not reconnect "
                                          f"within {self.limit_s:g} s: {cause}") from None
        time.sleep(self.delay)
        self.delay = min(2 * self.delay, 2.0)


def _raise_for(response: httpx.Response) -> None:
    if response.status_code < 400:
        return
    try:
        body = response.json()
    except ValueError:
        body = {"detail": response.text}
    detail = body.get("detail") if isinstance(body, dict) else str(body)
    if response.status_code == 422:
        first = str(detail).splitlines()[0] if detail else "invalid request:"
        source = first.removeprefix("invalid ").rstrip(":")
        raise SpecError(body.get("errors") or [{"field": "(request)", "message": str(detail)}],
                        source)
    raise _BY_STATUS.get(response.status_code, JobsError)(str(detail))
