"""Hosts in the communication terms: the fit within a host, an analytic term across."""

from __future__ import annotations

import numpy as np
import pytest

from torchrec_dreamshard.cost.collective_models import CollectiveModels
from torchrec_dreamshard.cost.comm_model import CommModel
from torchrec_dreamshard.cost.comm_topology import (
    INTER_HOST_BW,
    INTRA_HOST_BW,
    CommTopology,
    all_to_all_ms,
    analytic_models,
    ring_ms,
)
from torchrec_dreamshard.measure.collective_timing import COLLECTIVES, wire_megabytes

GLOO = CollectiveModels(
    backend="test",
    models={k: CommModel(0.2, 0.5 + i, 0.8, source="test") for i, k in enumerate(COLLECTIVES)},
)


def test_comm_topology_from_torchrec_topology():
    from torchrec.distributed.planner.types import Topology

    topo = CommTopology.from_torchrec(
        Topology(world_size=8, local_world_size=4, compute_device="cpu")
    )
    assert (topo.world_size, topo.local_world_size, topo.num_hosts) == (8, 4, 2)
    assert topo.intra_host_bw == pytest.approx(INTRA_HOST_BW)
    assert topo.inter_host_bw == pytest.approx(INTER_HOST_BW)
    assert topo.host_ranks(1) == (4, 5, 6, 7)
    assert not topo.crosses_hosts((0, 3)) and topo.crosses_hosts((3, 4))
    with pytest.raises(ValueError, match="local_world_size must be an integer in 1..4"):
        CommTopology(world_size=4, local_world_size=5)
    with pytest.raises(ValueError, match="inter_host_bw must be a positive"):
        CommTopology(world_size=4, inter_host_bw=0.0)


def test_cross_host_terms_grow_with_inter_host_volume():
    topo = CommTopology(world_size=8, local_world_size=4, inter_host_bw=1e3)  # 1 MB/ms
    flows = np.zeros((8, 8))
    for nbytes in (1e6, 4e6):
        near, far = flows.copy(), flows.copy()
        near[0, 1], far[0, 5] = nbytes, nbytes
        same = all_to_all_ms(topo, GLOO, range(8), near)
        cross = all_to_all_ms(topo, GLOO, range(8), far)
        assert cross[0] - same[0] == pytest.approx(nbytes / 1e3)  # the senders
        assert cross[5] - same[1] == pytest.approx(nbytes / 1e3)  # the receivers
        assert cross[3] == pytest.approx(same[3])  # a rank that sends nothing across
    one_host = CommTopology(world_size=8, local_world_size=8, inter_host_bw=1e3)
    extra = [
        ring_ms(topo, GLOO, "all_reduce", range(8), s)[0]
        - ring_ms(one_host, GLOO, "all_reduce", range(8), s)[0]
        for s in (1e6, 4e6)
    ]
    # hierarchical: 2 (H - 1) / H * S / n over H = 2 hosts of n = 4 NICs
    assert extra == pytest.approx([2 * 0.5 * s / 4 / 1e3 for s in (1e6, 4e6)])
    within = ring_ms(topo, GLOO, "all_gather", (4, 5, 6, 7), 4e6)
    assert within[4] == pytest.approx(
        GLOO.ms("all_gather", 4, wire_megabytes("all_gather", 4, 4e6))
    )


def test_analytic_models_follow_the_intra_host_bandwidth():
    topo = CommTopology(world_size=8, intra_host_bw=1e5)
    models = analytic_models(topo)
    assert models.ms("all_to_all", 8, 2.0) == pytest.approx(1e6 / 1e5)  # 1 MB each way
    assert models.backend == "analytic" and "unmeasured" in models.source


def test_a_fit_timed_over_several_hosts_holds_the_cross_host_links():
    """Collectives timed on a job's own group that spans hosts carry the cross-host cost
    in their fit; the analytic cross-host term is added only to a fit timed on one host."""
    import dataclasses

    from torchrec_dreamshard.cost.collective_models import CollectiveModels
    from torchrec_dreamshard.cost.comm_model import CommModel
    from torchrec_dreamshard.cost.comm_topology import CommTopology, all_to_all_ms, ring_ms

    model = CommModel(latency_ms=0.1, per_peer_ms=0.0, ms_per_mb=1.0)
    one_host = CollectiveModels("gloo", dict.fromkeys(COLLECTIVES, model))
    two_hosts = dataclasses.replace(one_host, hosts=2)
    assert CollectiveModels.from_dict(two_hosts.to_dict()).hosts == 2
    topo = CommTopology(world_size=4, local_world_size=2)
    flows = np.full((4, 4), 1e6)
    local = all_to_all_ms(topo, one_host, range(4), flows)
    measured = all_to_all_ms(topo, two_hosts, range(4), flows)
    assert np.all(measured < local)  # the analytic term is not added twice
    assert np.allclose(measured, [model.collective_ms(4, 6.0)] * 4)
    ring = ring_ms(topo, two_hosts, "all_reduce", range(4), 1e6)
    assert np.allclose(ring, model.collective_ms(4, wire_megabytes("all_reduce", 4, 1e6)))


def test_the_local_backends_all_to_all_is_the_planners_on_one_host():
    """The table-wise all-to-all the local backend charges (``CommModel.device_comm_ms``:
    forward and backward) is the planner's all-to-all of the same flows on one host,
    uneven batch split and an empty device included."""
    dims, batch = [40, 0, 24, 8], 1001
    flows = np.zeros((4, 4))
    share = [251, 250, 250, 250]  # the batch split as evenly as possible
    for i, width in enumerate(dims):
        flows[i, :] = np.asarray(share) * width * 4  # bytes device i sends device j
    topo = CommTopology(world_size=4)
    a2a = GLOO.models["all_to_all"]
    planner = all_to_all_ms(topo, GLOO, range(4), flows) + all_to_all_ms(
        topo, GLOO, range(4), flows.T
    )
    assert list(planner) == pytest.approx(a2a.device_comm_ms(dims, batch), rel=1e-12)
    assert planner[1] > 0  # an empty device still receives its batch's slice
