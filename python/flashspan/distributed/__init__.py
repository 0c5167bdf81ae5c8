"""flashspan.distributed: context-parallel flex attention over torch.distributed (NCCL on GPUs, gloo on CPUs).

The sequence of every sample is sharded over the ranks of a process group
(:class:`SequenceSharding`: zigzag, striped or contiguous); each rank holds its shard of
Q, K and V. :func:`create_mask_plan` turns the global interval endpoints into this rank's
mask plans once (endpoints shifted into each key shard's coordinates; pairs with no
visible key get no plan and no kernel), and :func:`flex_attn_func` runs the attention:

* ``strategy="ring"``: K/V shards travel around the ring (``batch_isend_irecv``) while the
  shard in hand is attended; partial outputs merge by their natural-log LSE; the backward
  runs the ring again and brings dK/dV home to their owners;
* ``strategy="allgather"``: K/V are all-gathered, one kernel attends to all keys, and dK/dV
  are reduce-scattered back (chosen by ``"auto"`` for GQA/MQA shapes where K/V are small,
  see :func:`choose_strategy`).

See docs/DISTRIBUTED.md for the algorithms, the rules and the cost model.
"""

from .attention import ContextParallelFlexAttnFunc, flex_attn_func, merge_partial
from .plan import ContextParallelPlan, choose_strategy, create_mask_plan
from .sharding import SCHEMES, SequenceSharding, visible_count

__all__ = [
    "SequenceSharding",
    "SCHEMES",
    "ContextParallelPlan",
    "create_mask_plan",
    "flex_attn_func",
    "choose_strategy",
    "merge_partial",
    "visible_count",
    "ContextParallelFlexAttnFunc",
]
