"""ringsgd: data-parallel CNN training with a chunked ring all-reduce overlapped with backward."""
from .comm import all_reduce, all_reduce_async, native_all_reduce, ps_all_reduce, ring_all_reduce
from .launch import launch
from .parallel import RingDataParallel

__version__ = "0.1.0"
__all__ = ["RingDataParallel", "all_reduce", "all_reduce_async", "launch", "native_all_reduce", "ps_all_reduce",
           "ring_all_reduce"]
