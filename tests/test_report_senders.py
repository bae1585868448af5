"""A training job's report is taken only from the pod it names (issue 31, item 7).

Real pieces: the ``otlp`` receiver's gRPC and HTTP servers, the OpenTelemetry SDK's exporters
(through ``otel_ofu.training``) as the clients, a kube-apiserver whose pods carry
``status.podIPs`` as the kubelet writes them (tests/kube_apiserver.py), and the attribution
processor's Kubernetes API source watching them. Each pod's address is a loopback address of its
own (tests/pod_network.py): a report "from pod X" leaves from X's address, as in a cluster.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from otel_ofu.attribution.config import ReportSenderConfig
from otel_ofu.core.model import Batch, MetricPoint, job_id_of
from otel_ofu.pipeline.component import Context
from otel_ofu.pipeline.config import FieldError, build_config
from otel_ofu.pipeline.telemetry import Telemetry
from otel_ofu.processors.attribution import AttributionProcessor, AttributionProcessorConfig
from otel_ofu.receivers.otlp import OtlpReceiver, OtlpReceiverConfig
from otel_ofu.training import start_mfu_reporter
from tests.e2e_util import wait_for
from tests.kube_apiserver import WATCHER_TOKEN, WATCHER_USER, KubeApiServer
from tests.pod_network import PodAddress

NODE = "gpu-node-1"
PODS_ONLY = [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]
TOKEN = "s3cret-token-for-reports"
LLAMA, BERT, HOSTNET = "k8s:llm/PyTorchJob/llama", "k8s:llm/Job/bert", "k8s:llm/Job/nccl-hostnet"
# Each pod's own address (status.podIPs); OUTSIDER is no pod's.
ADDRESSES = {"llama-worker-0": "127.0.0.2", "llama-worker-1": "127.0.0.3", "bert-0-x7k2p": "127.0.0.4"}
OUTSIDER = "127.0.0.9"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[KubeApiServer]:
    server = KubeApiServer(tmp_path_factory.mktemp("kube")).start()
    server.grant(WATCHER_USER, "otel-ofu-pods", PODS_ONLY)
    server.namespace("llm")
    for pod in ("llama-worker-0", "llama-worker-1"):
        server.create_pod("llm", pod, NODE, labels={"training.kubeflow.org/job-name": "llama"},
                          owners=[{"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "llama",
                                   "uid": "uid-llama", "controller": True}])
    server.create_pod("llm", "bert-0-x7k2p", NODE, labels={"batch.kubernetes.io/job-name": "bert"},
                      owners=[{"apiVersion": "batch/v1", "kind": "Job", "name": "bert", "uid": "uid-bert",
                               "controller": True}])
    # A pod on the host network (NCCL over the host's interfaces): the node's addresses, shared.
    server.create_pod("llm", "nccl-hostnet-0", NODE, labels={"batch.kubernetes.io/job-name": "nccl-hostnet"},
                      owners=[{"apiVersion": "batch/v1", "kind": "Job", "name": "nccl-hostnet", "uid": "uid-hn",
                               "controller": True}], host_network=True)
    for pod, ip in ADDRESSES.items():
        server.set_pod_ips("llm", pod, [ip])
    server.set_pod_ips("llm", "nccl-hostnet-0", ["127.0.0.1"])
    yield server
    server.stop()


class Agent:
    """The node agent's intake: the otlp receiver (token required) feeding the attribution processor."""

    def __init__(self, cluster: KubeApiServer, tmp_path: Path, report_sender: dict | None = None):
        token = tmp_path / "token"
        token.write_text(TOKEN + "\n")
        self.received: list[MetricPoint] = []
        self.attribution = AttributionProcessor(build_config(AttributionProcessorConfig, {
            "kubernetes_api": {"enabled": True, "node_name": NODE,
                               "kubeconfig": str(cluster.kubeconfig(WATCHER_TOKEN, WATCHER_USER))},
            "dra": {"drivers": []}, "report_sender": report_sender or {}}), Context("attribution", Telemetry()))
        self.receiver = OtlpReceiver(build_config(OtlpReceiverConfig, {
            "protocols": {"grpc": {"endpoint": "127.0.0.1:0"}, "http": {"endpoint": "127.0.0.1:0"}},
            "auth": {"bearer_token_file": str(token)}, "passthrough": False}),
            Context("otlp", Telemetry()), self._consume)
        self.proxies: list[PodAddress] = []

    def _consume(self, batch: Batch) -> None:
        self.received += self.attribution.process(batch).points

    def __enter__(self) -> Agent:
        self.attribution.start()
        self.receiver.start()
        assert self.attribution.pods is not None and self.attribution.pods.synced.wait(60)
        wait_for("the pods' addresses", lambda: len(self.attribution.pods.pods_at("127.0.0.2")) == 1, timeout=30)
        return self

    def __exit__(self, *exc: object) -> None:
        for proxy in self.proxies:
            proxy.close()
        self.receiver.shutdown()
        self.attribution.shutdown()

    def send(self, source_ip: str, resource: dict[str, str], *, http: bool = False,
             **report: float) -> list[MetricPoint]:
        """One report from ``source_ip``, as training code sends it; what attribution handed on."""
        port = self.receiver.http_port if http else self.receiver.grpc_port
        proxy = PodAddress(source_ip, ("127.0.0.1", port))
        self.proxies.append(proxy)
        before = len(self.received)
        reporter = start_mfu_reporter(endpoint=f"http://127.0.0.1:{proxy.port}", environ={},
                                      protocol="http/protobuf" if http else "grpc", insecure=True,
                                      headers={"authorization": f"Bearer {TOKEN}"}, export_interval_s=3600,
                                      resource={"service.name": "train", **resource})
        reporter.report(**report)
        assert reporter.flush(), "the export failed"
        reporter.shutdown()
        return self.received[before:]

    def refused(self, reason: str) -> float:
        return self.attribution.context.telemetry.counter("otel_ofu.attribution.reports.refused", reason=reason)


def pod(name: str) -> dict[str, str]:
    return {"k8s.pod.name": name, "k8s.namespace.name": "llm"}


def test_a_report_is_taken_only_from_the_pod_it_names(cluster, tmp_path, caplog):
    with Agent(cluster, tmp_path) as agent, caplog.at_level(logging.WARNING):
        # Each pod for itself, over gRPC and HTTP: its job, as its GPUs get it.
        (own,) = agent.send(ADDRESSES["llama-worker-0"], pod("llama-worker-0"), mfu=0.52)
        assert job_id_of(own) == LLAMA and own.value == pytest.approx(0.52)
        (own_http,) = agent.send(ADDRESSES["bert-0-x7k2p"], pod("bert-0-x7k2p"), http=True, mfu=0.3)
        assert job_id_of(own_http) == BERT
        # A pod that names no pod is the pod it came from.
        (unnamed,) = agent.send(ADDRESSES["bert-0-x7k2p"], {}, tflops_per_gpu=300.0)
        assert job_id_of(unnamed) == BERT and dict(unnamed.resource)["k8s.pod.name"] == "bert-0-x7k2p"

        # Forgeries: another pod's name, from another pod or from no pod's address; another job's id.
        assert agent.send(ADDRESSES["bert-0-x7k2p"], pod("llama-worker-1"), mfu=0.99) == []
        assert agent.send(OUTSIDER, pod("llama-worker-0"), http=True, mfu=0.99) == []
        assert agent.send(OUTSIDER, {"ofu.job.id": LLAMA}, mfu=0.99) == []
        assert agent.refused("other_address") == 3
        assert agent.send(ADDRESSES["bert-0-x7k2p"], {"ofu.job.id": LLAMA}, mfu=0.99) == []
        assert agent.refused("other_job") == 1
        # A pod this node does not run: its report belongs to the agent of its own node.
        assert agent.send(OUTSIDER, pod("llama-worker-7"), mfu=0.99) == []
        assert agent.refused("unknown_pod") == 1
        assert agent.attribution.context.telemetry.counter("otel_ofu.attribution.reports", outcome="refused") == 5

        # What cannot be checked is taken as it names itself: a pod on the host network (it shares
        # the node's addresses), a Slurm job's process.
        (hostnet,) = agent.send(OUTSIDER, pod("nccl-hostnet-0"), mfu=0.4)
        assert job_id_of(hostnet) == HOSTNET
        (slurm,) = agent.send(OUTSIDER, {"slurm.job.id": "4242"}, mfu=0.4)
        assert job_id_of(slurm) == "slurm:4242"
        # The pod's own report after the forgeries: still its own.
        (again,) = agent.send(ADDRESSES["llama-worker-1"], pod("llama-worker-1"), mfu=0.5)
        assert job_id_of(again) == LLAMA

    refusals = [r.getMessage() for r in caplog.records if "refused a training." in r.getMessage()]
    assert len(refusals) == 5, refusals
    assert any("names pod llm/llama-worker-1 (address 127.0.0.3) but came from 127.0.0.4, the address of pod "
               "llm/bert-0-x7k2p" in m for m in refusals), refusals
    assert any(f"carries ofu.job.id {LLAMA} but came from pod llm/bert-0-x7k2p, of job {BERT}" in m
               for m in refusals), refusals
    assert any(f"names pod llm/llama-worker-7, which is not a pod of node {NODE}" in m for m in refusals), refusals


def test_a_report_of_an_ended_pod_from_its_old_address_is_refused(cluster, tmp_path):
    """A pod that has ended gives its address back (a new pod may get it): it no longer speaks from it."""
    cluster.create_pod("llm", "eval-0", NODE, labels={"batch.kubernetes.io/job-name": "eval"})
    cluster.set_pod_ips("llm", "eval-0", ["127.0.0.5"])
    with Agent(cluster, tmp_path) as agent:
        (point,) = agent.send("127.0.0.5", pod("eval-0"), mfu=0.3)
        assert job_id_of(point) == "k8s:llm/Job/eval"
        cluster.set_pod_ips("llm", "eval-0", ["127.0.0.5"], phase="Succeeded")
        wait_for("the pod's end", lambda: not agent.attribution.pods.pods_at("127.0.0.5"), timeout=30)
        (point,) = agent.send("127.0.0.5", pod("eval-0"), mfu=0.3)  # its address is no longer known: unchecked
        assert job_id_of(point) == "k8s:llm/Job/eval"
        assert agent.send("127.0.0.5", pod("llama-worker-0"), mfu=0.3) == []  # but it is not llama's


def test_trusted_senders_and_the_switch(cluster, tmp_path):
    """A Collector that forwards its node's reports sends from its own address: trusted, it is taken."""
    with Agent(cluster, tmp_path, {"trusted": [f"{OUTSIDER}/32"]}) as agent:
        (point,) = agent.send(OUTSIDER, pod("llama-worker-0"), mfu=0.5)
        assert job_id_of(point) == LLAMA
        assert agent.send("127.0.0.10", pod("llama-worker-0"), mfu=0.5) == []
    with Agent(cluster, tmp_path, {"verify": False}) as agent:
        (point,) = agent.send("127.0.0.10", pod("llama-worker-0"), mfu=0.5)
        assert job_id_of(point) == LLAMA


def test_a_trusted_entry_that_is_no_address_is_a_config_error():
    with pytest.raises(FieldError, match=r"trusted\[1\].*10\.0\.0\.0/8"):
        build_config(ReportSenderConfig, {"trusted": ["10.1.2.3", "collector.local"]})
