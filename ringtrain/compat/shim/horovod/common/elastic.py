"""``horovod.common.elastic``: the base state classes (see ringtrain.torch.elastic)."""

from ringtrain.torch.elastic import ObjectState, State  # noqa: F401
