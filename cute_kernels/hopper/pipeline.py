"""mbarrier pipelines: a TMA producer feeding wgmma consumers, and the TMA-store buffer ring.

Mainloop pipeline (`make_mainloop_pipeline`): `stages` smem slots, each with a *full* barrier
(armed with the stage's TMA byte count; completes when the bytes land) and an *empty* barrier
(one arrive per consumer warp from every CTA that reads the slot through multicast).
Producer: acquire(empty) -> TMA -> (commit is implicit in the tx bytes). Consumer: wait(full)
-> wgmma -> release(empty) once the wgmma reading that slot has retired.
"""

from __future__ import annotations

import cutlass.cute as cute
import cutlass.pipeline as pipeline


def make_mainloop_pipeline(barrier_storage, *, stages: int, tx_bytes: int, consumer_warps: int,
                           cluster_layout_mnk, mcast_a: int, mcast_b: int):
    """A PipelineTmaAsync whose empty barriers expect arrivals from every consumer warp of every
    CTA that shares a slot through multicast (`mcast_a + mcast_b - 1` CTAs, this one included)."""
    producer = pipeline.CooperativeGroup(pipeline.Agent.Thread)
    peers = mcast_a + mcast_b - 1
    consumer = pipeline.CooperativeGroup(pipeline.Agent.Thread, peers * consumer_warps)
    return pipeline.PipelineTmaAsync.create(
        barrier_storage=barrier_storage,
        num_stages=stages,
        producer_group=producer,
        consumer_group=consumer,
        tx_count=tx_bytes,
        cta_layout_vmnk=cute.make_layout((1, *cluster_layout_mnk.shape)),
    )


def make_store_pipeline(*, stages: int, threads: int):
    """The TMA-store ring: commit after issuing a store, acquire before reusing a buffer."""
    return pipeline.PipelineTmaStore.create(
        num_stages=stages, producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, threads)
    )


def producer_state(stages: int):
    return pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, stages)


def consumer_state(stages: int):
    return pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, stages)
