"""The rounds as Prometheus series, and the Grafana dashboard in deploy/ that reads them."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client import CollectorRegistry

from reamer.runtime.k8s import Health, RoundMetrics
from reamer.runtime.prom import RoundCollector
from reamer.runtime.rounds import RoundRecord, RoundStream

GRAFANA = Path(__file__).resolve().parents[2] / "deploy" / "components" / "monitoring" / "grafana-dashboard.json"


def _families(registry: CollectorRegistry) -> set[str]:
    names = set()
    for fam in registry.collect():
        names.add(fam.name)
        names.update(s.name for s in fam.samples)  # counters' _total, histograms' _bucket
        if fam.type == "counter":
            names.add(fam.name + "_total")
        if fam.type == "histogram":
            names.update(fam.name + sfx for sfx in ("_bucket", "_sum", "_count"))
    return names


def _record(t: float, job: str | None, service: str | None) -> RoundRecord:
    rec = RoundRecord(t=t, speeds={}, bottlenecks={}, shapes={}, decisions=[], halves=["training", "harvest"])
    if job:
        rec.shapes[job], rec.speeds[job], rec.bottlenecks[job] = (1, 2, 3.0), 50.0, "network"
        rec.decisions.append(f"Resize container={job}-w0")
    if service:
        rec.inference[service] = {"p99_ms": 120.0, "slo_ms": 250.0, "error_rate": 0.01, "rate": 10.0,
                                  "replicas": [("n1", 0.5), ("n2", 1.0)]}
    rec.nodes["n1"] = {"cores": 4.0, "system": 0.5, "training_need": 2.0, "training_unused": 0.5, "inference": 0.5,
                       "idle": 0.5}
    return rec


def test_the_series_follow_the_latest_rounds_and_drop_what_left():
    stream = RoundStream({"backend": "local"})
    reg = CollectorRegistry()
    reg.register(RoundCollector(stream))
    stream.publish(_record(3.0, "j1", "vgg"))
    assert reg.get_sample_value("reamer_job_cpu_cores", {"job": "j1"}) == 3.0
    assert reg.get_sample_value("reamer_job_diagnosis", {"job": "j1", "bottleneck": "network"}) == 1.0
    assert reg.get_sample_value("reamer_service_slo_met", {"service": "vgg"}) == 1.0
    assert reg.get_sample_value("reamer_service_cpu_cores", {"service": "vgg"}) == 1.5
    assert reg.get_sample_value("reamer_node_cpu_cores", {"node": "n1", "use": "inference"}) == 0.5
    assert reg.get_sample_value("reamer_decisions_total", {"component": "local", "kind": "Resize"}) == 1.0
    stream.publish(_record(6.0, None, None))  # the job finished, the service was removed
    assert reg.get_sample_value("reamer_job_cpu_cores", {"job": "j1"}) is None
    assert reg.get_sample_value("reamer_job_speed_samples_per_second", {"job": "j1"}) is None
    assert reg.get_sample_value("reamer_service_p99_seconds", {"service": "vgg"}) is None
    assert reg.get_sample_value("reamer_decisions_total", {"component": "local", "kind": "Resize"}) == 1.0
    assert reg.get_sample_value("reamer_last_round_time_seconds") == 6.0


def test_every_series_the_grafana_dashboard_queries_is_exported():
    dash = json.loads(GRAFANA.read_text())
    health = Health(10.0)
    RoundMetrics(health.registry, "controller")
    stream = RoundStream({"backend": "kubernetes", "component": "controller"})
    health.registry.register(RoundCollector(stream, decisions=False))
    stream.publish(_record(1.0, "j1", "vgg"))
    exported = _families(health.registry)
    used: set[str] = set()
    for panel in dash["panels"]:
        assert panel["title"] and panel["targets"], panel
        for target in panel["targets"]:
            used.update(re.findall(r"\breamer_[a-z0-9_]+", target["expr"]))
    used.update(re.findall(r"\breamer_[a-z0-9_]+", json.dumps(dash["templating"])))
    assert used and used <= exported, sorted(used - exported)
    assert len({p["id"] for p in dash["panels"]}) == len(dash["panels"])
