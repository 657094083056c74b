import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reamer.config.scenario import JobList, Openb, load_scenario
from reamer.errors import InputError
from reamer.models.profiles import shipped_profiles
from reamer.workloads.build import (
    build_jobs,
    build_nodes,
    read_joblist,
    read_openb_nodes,
)

CAL = shipped_profiles().calibration
NODE_HEADER = "sn,cpu_milli,memory_mib,gpu,model\n"


def test_openb_nodes_real(shared_data):
    nodes = read_openb_nodes(shared_data / "openb_node_list_all_node.csv", 10.0)
    assert len(nodes) == 1523
    assert sum(n.gpus for n in nodes) > 0 and min(n.cores for n in nodes) > 0


def test_openb_pods_real_become_seeded_arrivals(shared_data):
    sc = load_scenario(None).model_copy(update={
        "cluster": load_scenario(None).cluster.model_copy(
            update={"node_pools": [], "node_list": shared_data / "openb_node_list_all_node.csv"}),
        "workload": Openb(pod_list=shared_data / "openb_pod_list_default.csv"),
    })
    nodes = build_nodes(sc)
    a = build_jobs(sc, nodes, CAL, np.random.default_rng(3))
    b = build_jobs(sc, nodes, CAL, np.random.default_rng(3))
    c = build_jobs(sc, nodes, CAL, np.random.default_rng(4))
    assert len(a) == 8152 and a == b and a != c
    arr = [j.arrival_s for j in a]
    assert arr == sorted(arr) and all(j.samples > 0 for j in a)
    assert sum(j.worker_res.gpu * j.workers for j in a) > 0


def test_missing_column(tmp_path):
    p = tmp_path / "n.csv"
    p.write_text("sn,memory_mib,gpu,model\nx,1024,0,\n")
    with pytest.raises(InputError, match=r"n\.csv: header: expected columns .*missing cpu_milli"):
        read_openb_nodes(p, 10.0)


@settings(max_examples=25)
@given(cpu=st.one_of(st.integers(max_value=0), st.floats(max_value=0), st.just("abc"), st.just("nan")))
def test_bad_cpu_names_row_and_field(tmp_path_factory, cpu):
    p = tmp_path_factory.mktemp("d") / "n.csv"
    p.write_text(NODE_HEADER + "a,1000,1024,0,\n" + f"b,{cpu},1024,0,\n")
    with pytest.raises(InputError) as e:
        read_openb_nodes(p, 10.0)
    msg = str(e.value)
    assert "row 3, field cpu_milli" in msg and "expected a number > 0" in msg and "\n" not in msg


def test_ragged_row(tmp_path):
    p = tmp_path / "n.csv"
    p.write_text(NODE_HEADER + "a,1000\n")
    with pytest.raises(InputError, match="row 2"):
        read_openb_nodes(p, 10.0)


JOBS = "id,model,arrival_s,ps,workers,ps_cpu,worker_cpu,duration_s\n"


def test_joblist_csv_and_jsonl_agree(tmp_path):
    c = tmp_path / "j.csv"
    c.write_text(JOBS + "a,resnet50,0,1,2,1,2,600\nb,bilstm,30,1,1,1,1,60\n")
    j = tmp_path / "j.jsonl"
    rows = [dict(id="a", model="resnet50", arrival_s=0, ps=1, workers=2, ps_cpu=1, worker_cpu=2, duration_s=600),
            dict(id="b", model="bilstm", arrival_s=30, ps=1, workers=1, ps_cpu=1, worker_cpu=1, duration_s=60)]
    j.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert read_joblist(c, CAL, 10) == read_joblist(j, CAL, 10)


@pytest.mark.parametrize("row, where", [
    ("a,nosuchmodel,0,1,1,1,1,60", "row 2, field model"),
    ("a,resnet50,0,0,1,1,1,60", "row 2, field ps"),
    ("a,resnet50,0,1,1,1,-2,60", "row 2, field worker_cpu"),
    ("a,resnet50,0,1,1,1,1,", "row 2, field samples"),
])
def test_joblist_errors(tmp_path, row, where):
    p = tmp_path / "j.csv"
    p.write_text(JOBS + row + "\n")
    with pytest.raises(InputError, match=where):
        read_joblist(p, CAL, 10)


def test_joblist_rejects_an_unknown_column(tmp_path):
    p = tmp_path / "j.csv"
    p.write_text(JOBS.replace("duration_s", "worker_gpus,duration_s") + "a,resnet50,0,1,1,1,1,1,60\n")
    with pytest.raises(InputError, match="header: expected columns among .*got 'worker_gpus'"):
        read_joblist(p, CAL, 10)


def test_joblist_accepts_a_spreadsheet_s_trailing_comma(tmp_path):
    p, q = tmp_path / "trailing.csv", tmp_path / "plain.csv"
    p.write_text(JOBS.rstrip("\n") + ",\na,resnet50,0,1,2,1,2,600,\n")
    q.write_text(JOBS + "a,resnet50,0,1,2,1,2,600\n")
    assert read_joblist(p, CAL, 10) == read_joblist(q, CAL, 10)
    p.write_text(JOBS.rstrip("\n") + ",\na,resnet50,0,1,2,1,2,600,7\n")  # a value under no name
    with pytest.raises(InputError, match="a column without a name"):
        read_joblist(p, CAL, 10)


def test_joblist_encoding(tmp_path):
    """A spreadsheet's byte-order mark is dropped; a file that is not UTF-8 is one line naming it."""
    bom, plain = tmp_path / "bom.csv", tmp_path / "plain.csv"
    rows = JOBS + "a,resnet50,0,1,2,1,2,600\n"
    bom.write_bytes(rows.encode("utf-8-sig"))
    plain.write_text(rows)
    assert read_joblist(bom, CAL, 10) == read_joblist(plain, CAL, 10)
    utf16 = tmp_path / "utf16.csv"
    utf16.write_bytes(rows.encode("utf-16"))
    with pytest.raises(InputError, match="utf16.csv: encoding: expected UTF-8 text"):
        read_joblist(utf16, CAL, 10)


def test_jsonl_bad_line(tmp_path):
    p = tmp_path / "j.jsonl"
    p.write_text("{not json}\n")
    with pytest.raises(InputError, match="line 1"):
        read_joblist(p, CAL, 10)


POD_HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"
PODS = ("p0,8000,1024,1,1000,,LS,Running,0,600,0\n"
        "p1,4000,1024,1,500,,BE,Failed,10,400,20\n"
        "p2,4000,1024,2,1000,,LS,Pending,30,900,\n")


def _openb(tmp_path, text, **kw):
    p = tmp_path / "pods.csv"
    p.write_text(text)
    sc = load_scenario(None).model_copy(update={
        "cluster": load_scenario(None).cluster.model_copy(update={"node_pools": [
            load_scenario(None).cluster.node_pools[0].model_copy(update={"gpus": 8})]}),
        "workload": Openb(pod_list=p, **kw)})
    return build_jobs(sc, build_nodes(sc), CAL, np.random.default_rng(0))


def test_openb_filters_by_qos_and_phase_and_keeps_recorded_durations(tmp_path):
    all_ = _openb(tmp_path, POD_HEADER + PODS)
    assert [j.id for j in all_] == ["p0", "p1", "p2"]
    assert [j.id for j in _openb(tmp_path, POD_HEADER + PODS, qos=["LS"])] == ["p0", "p2"]
    assert [j.id for j in _openb(tmp_path, POD_HEADER + PODS, pod_phases=["Running", "Failed"])] == ["p0", "p1"]
    with pytest.raises(InputError, match="expected at least one pod"):
        _openb(tmp_path, POD_HEADER + PODS, pod_phases=["Succeeded"])


def test_openb_pods_pinned_to_gpu_models_go_only_to_nodes_of_those_models(tmp_path):
    p = tmp_path / "pods.csv"
    p.write_text(POD_HEADER + PODS.replace("p1,4000,1024,1,500,,", "p1,4000,1024,1,500,V100M32|T4,"))
    base = load_scenario(None)
    pool = base.cluster.node_pools[0]
    pools = [pool.model_copy(update={"name": m.lower(), "count": 2, "gpus": 8, "gpu_model": m})
             for m in ("V100M32", "T4", "P100")]
    sc = base.model_copy(update={"cluster": base.cluster.model_copy(update={"node_pools": pools}),
                                 "workload": Openb(pod_list=p)})
    jobs = {j.id: j for j in build_jobs(sc, build_nodes(sc), CAL, np.random.default_rng(0))}
    assert jobs["p1"].worker_nodes == {"v100m32-0000", "v100m32-0001", "t4-0000", "t4-0001"}
    assert jobs["p1"].ps_nodes is None  # the PS Reamer adds is a CPU container: any node
    assert jobs["p0"].worker_nodes is None and jobs["p2"].worker_nodes is None
    p.write_text(POD_HEADER + PODS.replace("p1,4000,1024,1,500,,", "p1,4000,1024,1,500,A100,"))
    with pytest.raises(InputError, match=r"pods\.csv: row 3, field gpu_spec: expected GPU models separated by '\|', "
                                         r"at least one of this cluster's \(P100, T4, V100M32\), got 'A100'"):
        build_jobs(sc, build_nodes(sc), CAL, np.random.default_rng(0))


def test_a_job_list_may_pin_workers_to_gpu_models(tmp_path):
    base = load_scenario(None)
    pool = base.cluster.node_pools[0]
    pools = [pool.model_copy(update={"name": m.lower(), "count": 1, "gpus": 4, "gpu_model": m}) for m in ("T4", "P100")]
    pools.append(pool.model_copy(update={"name": "cpu", "count": 1, "gpus": 0, "gpu_model": ""}))
    p = tmp_path / "jobs.csv"
    p.write_text("id,model,arrival_s,ps,workers,ps_cpu,worker_cpu,worker_gpu,gpu_models,duration_s\n"
                 "a,resnet50,0,1,2,1,4,1,T4,600\nb,resnet50,0,1,2,1,4,1,,600\n")
    sc = base.model_copy(update={"cluster": base.cluster.model_copy(update={"node_pools": pools}),
                                 "workload": JobList(path=p)})
    jobs = {j.id: j for j in build_jobs(sc, build_nodes(sc), CAL, np.random.default_rng(0))}
    assert (jobs["a"].worker_nodes, jobs["a"].ps_nodes, jobs["b"].worker_nodes) == ({"t4-0000"}, None, None)
    p.write_text(p.read_text().replace(",T4,", ",T4|,"))  # an empty entry names no model (nor GPU-less nodes)
    assert build_jobs(sc, build_nodes(sc), CAL, np.random.default_rng(0))[0].worker_nodes == {"t4-0000"}
    p.write_text(p.read_text().replace(",T4|,", ",|,"))
    with pytest.raises(InputError, match=r"field gpu_models: expected GPU models .*got '\|'"):
        build_jobs(sc, build_nodes(sc), CAL, np.random.default_rng(0))
    p.write_text(p.read_text().replace(",|,", ",A100|H100,"))
    with pytest.raises(InputError, match=r"jobs\.csv: row 2, field gpu_models: expected GPU models separated by "
                                         r"'\|', at least one of this cluster's \(P100, T4\), got 'A100\|H100'"):
        build_jobs(sc, build_nodes(sc), CAL, np.random.default_rng(0))


def test_a_packing_only_pod_list_needs_a_duration(tmp_path):
    packing = "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,8000,1024,1,1000\np1,4000,1024,0,0\n"
    with pytest.raises(InputError, match=r"row 2, field deletion_time: expected a pod's recorded times .*duration_s"):
        _openb(tmp_path, packing)
    jobs = _openb(tmp_path, packing, duration_s=3600.0)
    assert len(jobs) == 2 and all(j.samples > 0 for j in jobs)
