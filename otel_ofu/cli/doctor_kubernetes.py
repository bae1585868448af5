"""``otel-ofu doctor --kubernetes``: can the attribution's Kubernetes API source work from here.

Run in the agent's pod (or with a kubeconfig), it checks what the ``kubernetes_api`` source and
DRA need, each with a fix: the client configuration and the node's name, every permission the
source uses (one SelfSubjectAccessReview per rule, which any authenticated user may ask), whether
the API server serves ``resource.k8s.io/v1`` (Kubernetes 1.34+), and whether the node's
ResourceSlices of the DRA drivers name GPUs (no slice: the DRA driver is not running there).
docs/kubernetes-attribution.md#dra says what each answer means for attribution.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass, field
from typing import Any

from otel_ofu.attribution.config import KubernetesApiSourceConfig
from otel_ofu.attribution.k8s_dra import GROUP_VERSION, device_gpu
from otel_ofu.attribution.k8s_watch import DOCS, ApiSession, KubernetesApiError, describe, reason_of
from otel_ofu.attribution.kubelet import DEFAULT_DRA_DRIVERS
from otel_ofu.cli.checks import FAIL, OK, WARN, Check
from otel_ofu.pipeline.config import build_config

# (what for, verb, API group, resource): every request the source makes.
PERMISSIONS = (
    ("the node's pods", "list", "", "pods"),
    ("the node's pods", "watch", "", "pods"),
    ("DRA: the node's ResourceSlices", "list", "resource.k8s.io", "resourceslices"),
    ("DRA: the node's ResourceSlices", "watch", "resource.k8s.io", "resourceslices"),
    ("DRA: the node's pods' ResourceClaims", "get", "resource.k8s.io", "resourceclaims"),
)


@dataclass
class KubernetesReport:
    node: str
    checks: list[Check] = field(default_factory=list)

    def add(self, name: str, status: str, detail: str, fix: str = "") -> None:
        self.checks.append(Check(name, status, detail, fix))

    @property
    def ok(self) -> bool:
        return all(c.status != FAIL for c in self.checks)

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "usable": self.ok, "checks": [asdict(c) for c in self.checks]}

    def render(self) -> str:
        lines = [f"otel-ofu doctor: the Kubernetes API source for node {self.node or '?'}", ""]
        for check in self.checks:
            lines.append(f"  [{check.status.upper():4}] {check.name}: {check.detail}")
            if check.fix:
                lines.append(f"         fix: {check.fix}")
        return "\n".join(lines)


def _allowed(session: ApiSession, verb: str, group: str, resource: str) -> tuple[bool, str]:
    review = session.post("/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", {
        "apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
        "spec": {"resourceAttributes": {"verb": verb, "group": group, "resource": resource}}})
    status = review.get("status") or {}
    return bool(status.get("allowed")), str(status.get("reason") or "")


def diagnose(config: KubernetesApiSourceConfig, drivers: tuple[str, ...] = DEFAULT_DRA_DRIVERS) -> KubernetesReport:
    session = ApiSession(config, "doctor")
    report = KubernetesReport(session.node)
    try:
        session.open()
    except KubernetesApiError as exc:
        report.add("client", FAIL, str(exc).split(": ", 1)[-1],
                   "run this in the agent's pod, or give --kubeconfig and --node")
        return report
    report.add("client", OK, f"{config.kubeconfig or 'in-cluster config'} -> {session.client.configuration.host}, "
                             f"node {session.node}")
    try:
        for what, verb, group, resource in PERMISSIONS:
            allowed, reason = _allowed(session, verb, group, resource)
            qualified = f"{resource}.{group}" if group else resource
            if allowed:
                report.add(f"may {verb} {qualified}", OK, what)
            else:
                report.add(f"may {verb} {qualified}", FAIL, f"{what}: not allowed{f' ({reason})' if reason else ''}",
                           f"grant {verb} on {qualified} to this service account ({DOCS}#rbac; the chart's "
                           "ClusterRole has it)")
        _check_dra(report, session, drivers)
    except Exception as exc:  # noqa: BLE001 - a doctor reports, it does not crash
        report.add("API server", FAIL, describe(exc), "check the API server is reachable from here")
    finally:
        session.close()
    return report


def _check_dra(report: KubernetesReport, session: ApiSession, drivers: tuple[str, ...]) -> None:
    try:
        served = {r.get("name") for r in session.get(f"/apis/{GROUP_VERSION}").get("resources") or ()}
    except Exception as exc:  # noqa: BLE001
        if reason_of(exc) != "http_404":
            raise
        served = set()
    if "resourceslices" not in served:
        report.add("DRA", WARN, f"the API server does not serve {GROUP_VERSION} ResourceSlices (Kubernetes 1.34 or "
                                "later does): GPUs allocated by DRA cannot be named; device-plugin GPUs are unaffected")
        return
    for driver in drivers:
        try:
            items = session.get(f"/apis/{GROUP_VERSION}/resourceslices?fieldSelector=spec.nodeName%3D{session.node}"
                                f"%2Cspec.driver%3D{driver}").get("items") or ()
        except Exception as exc:  # noqa: BLE001
            if reason_of(exc) not in ("forbidden", "unauthorized"):
                raise
            continue  # said by the permission checks
        gpus = [d for s in items for d in (s.get("spec") or {}).get("devices") or ()
                if device_gpu(driver, d) is not None]
        if gpus:
            report.add(f"DRA {driver}", OK, f"{len(items)} ResourceSlice(s) of node {session.node} name "
                                            f"{len(gpus)} GPU(s) or MIG device(s)")
        else:
            report.add(f"DRA {driver}", WARN, f"no ResourceSlice of {driver} on node {session.node} names a GPU",
                       "GPUs are not allocated by DRA here, or NVIDIA's DRA driver for GPUs is not installed or "
                       "not running on this node (its kubelet plugin publishes the slices); device-plugin GPUs "
                       "are unaffected")


def cmd(args: argparse.Namespace) -> int:
    config = build_config(KubernetesApiSourceConfig, {
        "enabled": True, "node_name": args.node or "", "kubeconfig": args.kubeconfig or "", "request_timeout": "10s"})
    report = diagnose(config, tuple(args.dra_driver or DEFAULT_DRA_DRIVERS))
    print(json.dumps(report.to_dict(), indent=2) if args.json else report.render())
    return 0 if report.ok else 1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kubernetes", action="store_true", help="check the attribution's Kubernetes API source "
                        "and DRA (client, node, RBAC, resource.k8s.io/v1, the node's ResourceSlices) instead")
    parser.add_argument("--kubeconfig", default="", help="with --kubernetes: a kubeconfig (default: in-cluster)")
    parser.add_argument("--node", default="", help="with --kubernetes: the node (default: $K8S_NODE_NAME)")
    parser.add_argument("--dra-driver", action="append", help="with --kubernetes: a DRA driver whose devices are "
                        "GPUs (repeatable; default gpu.nvidia.com)")
