"""``horovod.common.util``: the build probes, with Horovod's ``verbose`` argument.

Horovod's probes look for its compiled extensions; ringtrain has one frontend, ``horovod.torch``,
and answers for this build as ``ringtrain.torch``'s probes do.
"""

from ringtrain.torch import build

_FRONTEND = "horovod.torch"


def extension_available(ext_base_name: str, verbose: bool = False) -> bool:
    """Whether the frontend ``ext_base_name`` exists: only ``horovod.torch`` does."""
    return ext_base_name == _FRONTEND


def gloo_built(verbose: bool = False) -> bool:
    return build.gloo_built()


def mpi_built(verbose: bool = False) -> bool:
    return build.mpi_built()


def nccl_built(verbose: bool = False) -> bool:
    return build.nccl_built()


def ddl_built(verbose: bool = False) -> bool:
    return build.ddl_built()


def ccl_built(verbose: bool = False) -> bool:
    return build.ccl_built()


def cuda_built(verbose: bool = False) -> bool:
    return build.cuda_built()


def rocm_built(verbose: bool = False) -> bool:
    return build.rocm_built()
