"""The client side of the job service: the REST client, finding or starting a home's server,
and the homes known to have one. It imports the shared layer (``models``, ``errors``, ``home``,
``files``), never the service.

The public entry points are re-exported here (the documented API)::

    from ringtrain.jobs.client import JobsClient, connect
"""

from ringtrain.jobs.client.connection import connect
from ringtrain.jobs.client.jobs_client import JobsClient

__all__ = ["JobsClient", "connect"]
