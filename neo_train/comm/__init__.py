"""The collective layer: every collective of the sharding code goes through a Communicator."""
from .autograd import all_gather_v, all_to_all_v, reduce_scatter_v
from .codecs import CODECS, Codec, make_codec
from .interface import CollectiveError, Communicator, Handle, check_splits
from .native import NativeCommunicator, init_distributed

__all__ = [
    "Communicator",
    "Handle",
    "CollectiveError",
    "check_splits",
    "NativeCommunicator",
    "init_distributed",
    "all_to_all_v",
    "reduce_scatter_v",
    "all_gather_v",
    "Codec",
    "make_codec",
    "CODECS",
]
