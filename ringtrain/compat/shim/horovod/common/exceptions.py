"""``horovod.common.exceptions``."""

from ringtrain.errors import HorovodInternalError  # noqa: F401
from ringtrain.torch.elastic import HostsUpdatedInterrupt  # noqa: F401
