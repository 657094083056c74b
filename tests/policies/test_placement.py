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
from reamer.policies.static import request_of


def _free(*cores):
    nodes = tuple(Node(f"n{i}", 8, 8192) for i in range(len(cores)))
    return FreeMap(ClusterSnapshot(0.0, nodes, {n.name: Resources(c, 8192) for n, c in zip(nodes, cores)}, (), ()))


def _running(one_node):
    spec = TrainingJob("p", "resnet50", 0.0, 1e4, 1, 1, Resources(1, 512), Resources(2, 512), one_node=one_node)
    return JobView(spec, JobState.RUNNING, (Container("p/ps0", "p", Role.PS, "n1", spec.ps_res),
                                            Container("p/worker1", "p", Role.WORKER, "n1", spec.worker_res)))


def test_a_container_added_to_a_one_pod_job_goes_to_its_node_only():
    free = _free(8, 4, 8)
    w = Role.WORKER
    assert free.home(_running(False), w) is None
    assert free.home(_running(False), w, np.array([True, False, True])).tolist() == [True, False, True]
    assert free.home(_running(True), w).tolist() == [False, True, False]
    assert free.home(_running(True), w, np.array([True, False, True])).tolist() == [False, False, False]
    p = free.place_one(Role.WORKER, Resources(2, 512), "spread", allowed=free.home(_running(True), w))
    assert p.node == "n1"  # spread alone would take an emptier node


def _pinned(ps_nodes, worker_nodes, one_node=False, workers=2):
    return TrainingJob("q", "resnet50", 0.0, 1e4, 1, workers, Resources(1, 512), Resources(2, 512),
                       one_node=one_node, ps_nodes=ps_nodes, worker_nodes=worker_nodes)


def test_a_gang_goes_only_to_the_nodes_each_role_allows():
    free = _free(8, 1, 8, 8)
    spec = _pinned(frozenset({"n1"}), frozenset({"n2", "n3"}))
    placed = free.place_gang(request_of(spec), "spread", spec=spec)
    assert sorted((p.role.value, p.node) for p in placed) == [("ps", "n1"), ("worker", "n2"), ("worker", "n3")]
    # the PS's only node is now full: the gang waits, and keeps nothing
    before = free.free.copy()
    assert free.place_gang(request_of(spec), "spread", spec=spec) is None
    assert (free.free == before).all()
    # unpinned, the same request fits (n0 is empty)
    assert free.place_gang(request_of(spec), "spread") is not None


def test_a_one_pod_gang_goes_to_a_node_both_roles_allow():
    free = _free(8, 8, 8)
    spec = _pinned(frozenset({"n0", "n2"}), frozenset({"n1", "n2"}), one_node=True)
    assert {p.node for p in free.place_gang(request_of(spec), "spread", one_node=True, spec=spec)} == {"n2"}
    spec = _pinned(frozenset({"n0"}), frozenset({"n1"}), one_node=True)
    assert free.place_gang(request_of(spec), "spread", one_node=True, spec=spec) is None


def test_an_added_container_goes_only_where_its_role_is_allowed():
    free = _free(8, 8, 8)
    spec = _pinned(None, frozenset({"n2"}))
    job = JobView(spec, JobState.RUNNING, (Container("q/ps0", "q", Role.PS, "n0", spec.ps_res),
                                            Container("q/worker1", "q", Role.WORKER, "n2", spec.worker_res)))
    assert free.home(job, Role.PS) is None
    assert free.home(job, Role.WORKER).tolist() == [False, False, True]
    assert free.home(job, Role.WORKER, np.array([True, True, False])).tolist() == [False, False, False]
    p = free.place_one(Role.WORKER, spec.worker_res, "pack", allowed=free.home(job, Role.WORKER))
    assert p.node == "n2"


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
