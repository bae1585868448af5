"""The loss account from every source: the parts each source's counters allow, computed by hand.

Inputs are the dcgm-exporter pages and dmon/CSV recordings in tests/data (and the real captures
of tests/data/real when present); the expected parts are the page's own ratios subtracted by
hand, with f_ref from the spec table (docs/gpus.md) and c_tile from the tile table.
"""

import json
import re
from pathlib import Path

import pytest

from otel_ofu.core import tiles
from otel_ofu.core.model import Batch
from otel_ofu.pipeline.component import Context
from otel_ofu.processors.ofu import OfuProcessor, OfuProcessorConfig
from otel_ofu.receivers import replay
from otel_ofu.receivers.dcgm_exporter import parse_metrics

DATA = Path(__file__).parent / "data"
C = tiles.DEFAULT_CORRECTIONS


def account(samples) -> dict[tuple, dict[str, tuple[float, str | None]]]:
    """Per GPU (index, MIG instance): part -> (share, cause), and gpu.ofu, as the ofu processor emits them."""
    out: dict[tuple, dict[str, tuple[float, str | None]]] = {}
    for p in OfuProcessor(OfuProcessorConfig(), Context("ofu")).process(Batch(samples=list(samples))).points:
        r, a = dict(p.resource), dict(p.attributes)
        key = (r["gpu.index"], r.get("gpu.mig.instance_id"))
        if p.name == "gpu.ofu.loss":
            out.setdefault(key, {})[a["ofu.loss.part"]] = (p.value, a.get("ofu.loss.cause"))
        elif p.name == "gpu.ofu":
            out.setdefault(key, {})["ofu"] = (p.value, None)
    return out


def shares(parts: dict[str, tuple[float, str | None]]) -> dict[str, float]:
    return {k: v for k, (v, _) in parts.items()}


def page(name: str):
    return parse_metrics((DATA / "dcgm-exporter" / name).read_text(), time_unix_nano=1_772_445_600_000_000_000,
                         window_s=30)


def test_h100_page_with_every_ratio_gives_every_part():
    # GPU 0: GR 0.991104, SM 0.972451, TPA 0.929260 at 1410 MHz (f_ref 1830), DRAM 0.412337.
    gpus = account(page("h100.prom"))
    raw = 0.929260 * 1410 / 1830
    ofu = raw * C["hopper"]["bf16"]  # no precision declared: the BF16 factor
    assert shares(gpus[("0", None)]) == pytest.approx({
        "engine_idle": 1 - 0.991104, "sm_idle": 0.991104 - 0.972451, "non_tensor": 0.972451 - 0.929260,
        "clock": 0.929260 - raw, "padding": raw - ofu, "ofu": ofu})
    assert sum(shares(gpus[("0", None)]).values()) == pytest.approx(1.0, abs=1e-9)
    # dcgm-exporter exports no clock event reasons; DRAM 0.41 is below the memory-bound line
    assert gpus[("0", None)]["clock"][1] == "unknown"
    assert gpus[("0", None)]["non_tensor"][1] == "not_memory_bound"
    # GPU 1's TPA is an int64 blank: no OFU, so no account (never a zero one)
    assert ("1", None) not in gpus


def test_a100_page_with_old_labels():
    # GR 0.998541, SM 0.981022, TPA 0.929 at 1215 MHz (f_ref 1410), DRAM 0.530118: memory-bound
    gpus = account(page("a100-old-labels.prom"))
    raw = 0.929 * 1215 / 1410
    ofu = raw * C["ampere"]["bf16"]
    parts = gpus[("0", None)]
    assert shares(parts) == pytest.approx({
        "engine_idle": 1 - 0.998541, "sm_idle": 0.998541 - 0.981022, "non_tensor": 0.981022 - 0.929,
        "clock": 0.929 - raw, "padding": raw - ofu, "ofu": ofu})
    assert parts["non_tensor"][1] == "memory_bound"
    assert max((v for k, (v, _) in parts.items() if k != "ofu")) == pytest.approx(0.929 - raw)  # the clock


def test_b200_mig_page_without_sm_active_merges_sm_idle_and_non_tensor():
    # MIG instance 1: GR 0.87, TPA 0.6125 at 1860 MHz (B200 f_ref 1856), no SM_ACTIVE; instance 2 has no TPA.
    gpus = account(page("b200-mig.prom"))
    raw = 0.6125 * 1860 / 1856
    ofu = raw * C["blackwell"]["bf16"]
    parts = gpus[("0", "1")]
    assert shares(parts) == pytest.approx({
        "engine_idle": 1 - 0.87, "sm_idle+non_tensor": 0.87 - 0.6125, "clock": 0.6125 - raw, "padding": raw - ofu,
        "ofu": ofu})
    assert parts["clock"][0] < 0  # 1860 MHz is above B200's tensor reference clock: a gain
    assert parts["sm_idle+non_tensor"][1] == "not_memory_bound"
    assert ("0", "2") not in gpus


def test_dmon_recording_with_sm_active_but_no_gr():
    # dcgmi dmon -e 1004,100,155,1002: GPU 0 TPA 0.912 at 1755 MHz, SMACT 0.981
    with open(DATA / "replay" / "h100-dmon.txt") as lines:
        frame = next(replay.parse_dmon(lines, "h100-dmon.txt", start_unix_nano=1, interval_s=1,
                                       model="NVIDIA H100 80GB HBM3", host="n"))
    gpus = account(frame.batch.samples)
    raw = 0.912 * 1755 / 1830
    ofu = raw * C["hopper"]["bf16"]
    assert shares(gpus[("0", None)]) == pytest.approx({
        "engine_idle+sm_idle": 1 - 0.981, "non_tensor": 0.981 - 0.912, "clock": 0.912 - raw, "padding": raw - ofu,
        "ofu": ofu})
    assert gpus[("0", None)]["non_tensor"][1] == "unknown"  # no DRAM column


def test_csv_recording_blank_sm_active_merges_for_that_row_only():
    with open(DATA / "replay" / "a100.csv") as lines:
        frames = list(replay.parse_csv(lines, "a100.csv"))
    first, second = account(frames[0].batch.samples), account(frames[1].batch.samples)
    assert "engine_idle+sm_idle" in first[("0", None)] and "non_tensor" in first[("0", None)]
    assert first[("0", None)]["non_tensor"][0] == pytest.approx(0.981 - 0.929)
    # GPU 1's second row: TPA N/A -> no account; its SM N/A does not turn into a zero anywhere
    assert ("1", None) not in second


# --- the conformance corpus (tests/data/real): every page gives the parts its counters allow ------

REAL = DATA / "real" / "dcgm-exporter"
_SERIES = re.compile(r'^(\w+)\{(.*)\}\s+(\S+)$')
_LABEL = re.compile(r'(\w+)="([^"]*)"')
# Every name each ratio has had, lowercased (DCGM up to 4.5 and dcgm-exporter's 1.x names; DCGM 4.6's).
_RATIOS = {"gr": ("dcgm_fi_prof_gr_engine_active", "dcgm_fi_prof_gr_engine_util_ratio"),
           "sm": ("dcgm_fi_prof_sm_active", "dcgm_fi_prof_sm_util_ratio"),
           "dram": ("dcgm_fi_prof_dram_active", "dcgm_fi_prof_dram_util_ratio")}


def page_ratios(text: str) -> dict[tuple[str, str | None], dict[str, float]]:
    """GR/SM/DRAM per GPU entity (gpu index, MIG instance), read off the page with a regular expression."""
    out: dict[tuple[str, str | None], dict[str, float]] = {}
    for line in text.splitlines():
        found = _SERIES.match(line)
        if not found:
            continue
        name, labels, value = found.group(1).lower(), dict(_LABEL.findall(found.group(2))), found.group(3)
        for ratio, names in _RATIOS.items():
            if name in names:
                out.setdefault((labels["gpu"], labels.get("GPU_I_ID") or None), {})[ratio] = float(value)
    return out


@pytest.mark.parametrize("page_path", sorted(REAL.glob("*.prom")), ids=lambda p: p.name)
def test_every_corpus_page_gives_the_parts_its_counters_allow(page_path):
    expected = json.loads(page_path.with_name(page_path.stem + ".expected.json").read_text())
    ratios = page_ratios(page_path.read_text())
    gpus = account(parse_metrics(page_path.read_text(), time_unix_nano=1_772_445_600_000_000_000, window_s=30))
    checked = 0
    for gpu in expected["gpus"]:
        key = (gpu["identity"]["gpu.index"], gpu["identity"].get("gpu.mig.instance_id"))
        if "dropped" in gpu:
            assert key not in gpus  # no OFU, no account
            continue
        parts, on_page = gpus[key], ratios.get(key, {})
        tpa = gpu["tpa"]
        want = {"clock": tpa - gpu["ofu_raw"], "padding": gpu["ofu_raw"] - gpu["ofu"], "ofu": gpu["ofu"]}
        if "gr" in on_page and "sm" in on_page:
            want |= {"engine_idle": 1 - on_page["gr"], "sm_idle": on_page["gr"] - on_page["sm"],
                     "non_tensor": on_page["sm"] - tpa}
        elif "gr" in on_page:  # dcgm-exporter's default counters: no SM_ACTIVE
            want |= {"engine_idle": 1 - on_page["gr"], "sm_idle+non_tensor": on_page["gr"] - tpa}
        else:
            want |= {"engine_idle+sm_idle+non_tensor": 1 - tpa}
        assert shares(parts) == pytest.approx(want, abs=2e-6), (page_path.name, key)
        assert sum(shares(parts).values()) == pytest.approx(1.0, abs=1e-9)
        memory = parts.get("non_tensor", parts.get("sm_idle+non_tensor", parts.get("engine_idle+sm_idle+non_tensor")))
        assert memory[1] == ("unknown" if "dram" not in on_page else
                             "memory_bound" if on_page["dram"] >= 0.5 else "not_memory_bound")
        assert parts["clock"][1] == "unknown"  # dcgm-exporter does not export clock event reasons
        checked += 1
    assert checked or all("dropped" in g for g in expected["gpus"])


COLLECTOR_CAPTURE = DATA / "real" / "otlp" / "collector-prometheus-receiver.json"


@pytest.mark.parametrize("page_path", sorted(REAL.glob("*.prom")), ids=lambda p: p.name)
def test_the_collectors_otlp_of_every_page_gives_the_pages_parts(page_path):
    """The real Collector's prometheus receiver scraped each corpus page (tests/data/real/README.md, "made"):
    its OTLP, joined (from protobuf objects, from the bytes, and by the node's learned shape on a second
    request), gives each GPU the parts the page gives when scraped directly; GR, SM and DRAM pass on as
    they came."""
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

    from otel_ofu.otlp import join as otlp_join
    from tests.test_corpus import collector_requests

    direct = account(parse_metrics(page_path.read_text(), time_unix_nano=1_772_445_600_000_000_000, window_s=30))
    request = collector_requests(COLLECTOR_CAPTURE.read_text().splitlines())[page_path.stem]
    body = request.SerializeToString()
    ratios = {"DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_DRAM_ACTIVE",
              "dcgm_fi_prof_gr_engine_active", "dcgm_fi_prof_dram_active", "DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO",
              "DCGM_FI_PROF_SM_UTIL_RATIO", "DCGM_FI_PROF_DRAM_UTIL_RATIO"}
    sent = sum(len(m.gauge.data_points) for rm in request.resource_metrics for sm in rm.scope_metrics
               for m in sm.metrics if m.name in ratios)
    for found in (otlp_join.split(ExportMetricsServiceRequest.FromString(body)),
                  otlp_join.split(ExportMetricsServiceRequest.FromString(body), wire=body),
                  otlp_join.split_wire(body), otlp_join.split_wire(body)):  # the last by the learned shape
        joined = account(found.samples)
        assert set(joined) == set(direct), page_path.name
        for gpu, parts in direct.items():
            assert shares(joined[gpu]) == pytest.approx(shares(parts), abs=1e-9), (page_path.name, gpu)
            assert joined[gpu] == parts  # and the causes
        forwarded = [m for rm in otlp_join.codec.passthrough_messages(found.passthrough)
                     for sm in rm.scope_metrics for m in sm.metrics if m.name in ratios]
        assert sum(len(m.gauge.data_points) for m in forwarded) == sent  # left as they came
