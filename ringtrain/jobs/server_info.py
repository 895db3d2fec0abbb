"""``server.json``: how clients on this host find the running job server of a home.

The server writes it once it listens and removes it when it stops; the CLI reads it to connect,
and to stop the server. Its fields never change name, since a newer CLI may meet the file of a
server started before an upgrade.
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from ringtrain.jobs.errors import RecordError
from ringtrain.jobs.files.record_file import read_record_file


class ServerInfo(BaseModel):
    """The running server of one home."""

    model_config = ConfigDict(frozen=True)

    pid: int
    url: str
    host: str
    port: int
    token: str | None = None
    home: str
    started_at: float
    #: The certificate of an https server (:mod:`ringtrain.jobs.cert_fingerprint`); ``None``
    #: for plain HTTP, and in the files of servers older than TLS.
    fingerprint: str | None = None

    def write(self, path: Path) -> None:
        """Replace ``path`` atomically; only the user may read it, since it may hold the token."""
        tmp = path.with_suffix(".tmp")
        tmp.write_text(self.model_dump_json())
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)

    @classmethod
    def read(cls, path: Path) -> ServerInfo | None:
        """The server recorded in ``path``, or ``None`` if there is no such file.

        Raises:
            RecordError: the file cannot be read, is not JSON, or lacks a field.
        """
        raw = read_record_file(path.parent, path.name, str(path))
        if raw is None:
            return None
        try:
            return cls.model_validate_json(raw)
        except ValidationError as e:
            problems = "; ".join(f"{'.'.join(map(str, err['loc'])) or 'file'}: {err['msg']}"
                                 for err in e.errors())
            raise RecordError(f"{path} is not a job server record ({problems}); if no server "
                              "runs for this home, delete the file") from None
