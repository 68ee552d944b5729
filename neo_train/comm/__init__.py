"""The collective layer: every collective of the sharding code goes through a Communicator."""
from .awaitable import LazyTensor, Pending
from .autograd import all_gather_v, all_to_all_v, reduce_scatter_v
from .codecs import CODECS, Codec, make_codec
from .interface import CollectiveError, Communicator, Handle, check_splits
from .executor import Rule, ScheduleCommunicator, parse_rules
from .native import NativeCommunicator, init_distributed
from .replay import ReplayReport, replay
from .trace import TraceError, TracingCommunicator, load_trace

__all__ = [
    "Communicator",
    "Pending",
    "LazyTensor",
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
    "ScheduleCommunicator",
    "Rule",
    "parse_rules",
    "TracingCommunicator",
    "load_trace",
    "TraceError",
    "replay",
    "ReplayReport",
]
