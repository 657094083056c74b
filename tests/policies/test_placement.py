import numpy as np

from reamer.domain import (
    ClusterSnapshot,
    Container,
    JobState,
    JobView,
    Node,
    Resources,
    Role,
    TrainingJob,
)
from reamer.policies.placement import FreeMap, gang_order


def _free(*cores):
    nodes = tuple(Node(f"n{i}", 8, 8192) for i in range(len(cores)))
    return FreeMap(ClusterSnapshot(0.0, nodes, {n.name: Resources(c, 8192) for n, c in zip(nodes, cores)}, (), ()))


def _running(one_node):
    spec = TrainingJob("p", "resnet50", 0.0, 1e4, 1, 1, Resources(1, 512), Resources(2, 512), one_node=one_node)
    return JobView(spec, JobState.RUNNING, (Container("p/ps0", "p", Role.PS, "n1", spec.ps_res),
                                            Container("p/worker1", "p", Role.WORKER, "n1", spec.worker_res)))


def test_a_container_added_to_a_one_pod_job_goes_to_its_node_only():
    free = _free(8, 4, 8)
    assert free.home(_running(False)) is None
    assert free.home(_running(False), np.array([True, False, True])).tolist() == [True, False, True]
    assert free.home(_running(True)).tolist() == [False, True, False]
    assert free.home(_running(True), np.array([True, False, True])).tolist() == [False, False, False]
    p = free.place_one(Role.WORKER, Resources(2, 512), "spread", allowed=free.home(_running(True)))
    assert p.node == "n1"  # spread alone would take an emptier node


def test_a_one_node_gang_goes_where_the_whole_fits_or_nowhere():
    free = _free(3, 3, 6)
    gang = [(Role.PS, Resources(1, 512)), (Role.WORKER, Resources(2, 512)), (Role.WORKER, Resources(2, 512))]
    placed = free.place_gang(gang, "pack", one_node=True)
    assert {p.node for p in placed} == {"n2"}
    assert free.place_gang(gang, "pack", one_node=True) is None  # 3 + 3 + 1 free: no node holds 5
    assert free.free[:, 0].tolist() == [3, 3, 1]  # and nothing was kept


def test_free_capacity_is_summed_node_after_node():
    """The Σ-free bound static screens requests with adds the nodes in order (a running sum, as
    numpy's sum over the rows of a row-major array does); its pairwise sum of a contiguous
    column rounds differently, and a bound one ulp off may change a decision at its edge."""
    cores = [0.1 * (i % 7) + 1e3 * (i % 3) for i in range(300)]
    free = _free(*cores)
    running = 0.0
    for c in cores:
        running += c
    assert free.sums()[0] == running
    assert free.total_free().cpu == running
    assert np.add.reduce(np.asarray(cores)) != running  # pairwise: a different float here


def test_a_gang_given_in_placement_order_is_placed_as_one_sorted_for_it():
    gang = [(Role.PS, Resources(1, 512)), (Role.WORKER, Resources(3, 512)), (Role.WORKER, Resources(2, 512))]
    a, b = _free(4, 3, 5), _free(4, 3, 5)
    assert a.place_gang(gang, "pack") == b.place_gang(gang_order(gang), "pack", ordered=True)
    assert a.free.tolist() == b.free.tolist()
