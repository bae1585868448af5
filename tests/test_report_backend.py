"""``otel-ofu report --prometheus URL``: the report from the jobs processor's series in a backend.

End to end: the demo's hour (collector-config/demo.yaml) goes at once into a real Prometheus 3 (its
OTLP receiver with deploy/backends/prometheus-otlp.yml, and another with
UnderscoreEscapingWithoutSuffixes), a real VictoriaMetrics (OTLP, Prometheus naming), a
VictoriaMetrics with its defaults (OTLP names, dots kept) and a real Prometheus 2 (the prometheus
exporter's exposition, as scraped, backfilled with promtool); the file exporter records the same
run. ``report --prometheus`` on each must give every job's GPU hours within 1 %, mean OFU within
0.005 and wasted GPU hours within 2 % of the file report on that recording.

Unit tests read the answers of the real servers captured in tests/data/backend/ (their ``source``
says which server and how; :func:`capture_answers` remakes them).
"""

from __future__ import annotations

import contextlib
import csv
import json
import math
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from otel_ofu.cli.backend_check import NAMINGS, OTLP_NAMING, PROMETHEUS_NAMING, Backend, BackendError
from otel_ofu.cli.main import main
from otel_ofu.core.loss import USEFUL
from otel_ofu.jobs.config import JobsConfig
from otel_ofu.pipeline import registry
from otel_ofu.report import backend as rb
from otel_ofu.report.build import (
    REPORT_FIELDS,
    ReportError,
    build_report,
    cost_record,
    json_field_paths,
    render_table,
    report_json,
)
from otel_ofu.report.series import loss_from_counters
from tests import certs
from tests.e2e_util import GetServer, prometheus3_binary, prometheus_binary, victoriametrics_binary, wait_for
from tools.ports import free_ports

CAPTURES = Path(__file__).parent / "data" / "backend"
CAPTURE_FILES = sorted(CAPTURES.glob("*.json"))
MONTH_S = 30 * 86400.0

registry.factories()  # the metric registry the namings read


def captured(path: Path) -> dict:
    return json.loads(path.read_text())


def captured_results(doc: dict) -> dict[str, list[dict]]:
    return {key: answer["response"]["data"]["result"] for key, answer in doc["answers"].items()}


def capture_answers(url: str, start: float, end: float, source: str) -> dict:
    """What tests/data/backend/*.json hold: a real server's raw answers to the report's queries (and to one
    malformed query), for the unit tests to read without the server."""
    def raw(path: str, params: dict[str, str]) -> dict:
        try:
            with urllib.request.urlopen(f"{url}{path}?{urllib.parse.urlencode(params)}", timeout=30) as response:
                return json.load(response)
        except urllib.error.HTTPError as exc:
            return json.load(exc)

    backend = Backend(url)
    naming = rb.detect_naming(backend, start, end)
    names = "|".join(rb.re.escape(n.metric(rb.PRESENCE_METRIC)) for n in NAMINGS)
    label_values = raw("/api/v1/label/__name__/values", {"match[]": "{__name__=~" + json.dumps(names) + "}",
                                                          "start": f"{start:.3f}", "end": f"{end:.3f}"})
    return {"source": source, "start": start, "end": end, "naming": naming.key, "label_values": label_values,
            "answers": {q.key: {"query": q.expr, "response": raw("/api/v1/query", {"query": q.expr,
                                                                                  "time": f"{end:.3f}"})}
                        for q in rb.queries(naming, end - start, JobsConfig())}}


# --- query building ---------------------------------------------------------------------------

@pytest.mark.parametrize("naming", NAMINGS, ids=lambda n: n.key)
def test_each_naming_queries_the_names_its_road_gives(naming):
    """Every query reads the series under the naming found (docs/backends.md's table), never another's."""
    plan = {q.key: q.expr for q in rb.queries(naming, 3600.0, JobsConfig())}
    expected = {"gpu_seconds": "job.gpu_seconds", "wasted": "job.wasted_gpu_hours", "loss": "job.ofu.loss.gpu_hours",
                "gain": "job.ofu.gain.gpu_hours", "flops": "job.flops", "gpus": "job.gpus",
                "unallocated": "fleet.gpu_hours", "finding_max": "job.finding", "ofu_p50": "job.ofu"}
    for key, otel_name in expected.items():
        name = naming.metric(otel_name)
        assert (f'"{name}"' if not naming.escaped else f"{name}") in plan[key], (key, plan[key])
        for other in NAMINGS:
            if other.metric(otel_name) != name:
                assert f"({other.metric(otel_name)}[" not in plan[key] and f'"{other.metric(otel_name)}"' \
                    not in plan[key]
    job_label = naming.quoted(naming.label("ofu.job.id"))
    assert all(f"by ({job_label}" in expr for key, expr in plan.items()
               if key not in ("unallocated", "cost_unallocated", "opencost_price", "fleet_gpus"))


def test_a_month_of_a_fleet_is_the_same_handful_of_instant_queries():
    """The number of queries does not grow with the range; the subqueries' steps stay bounded."""
    config = JobsConfig()
    hour, month = rb.queries(PROMETHEUS_NAMING, 3600.0, config), rb.queries(PROMETHEUS_NAMING, MONTH_S, config)
    assert [q.key for q in hour] == [q.key for q in month] and len(month) <= 25
    step = rb.subquery_step(MONTH_S, float(config.resolution))
    assert MONTH_S / step <= rb.MAX_STEPS and "[720h:44m]" in dict((q.key, q.expr) for q in month)["first"]
    assert rb.subquery_step(3600.0, float(config.resolution)) == float(config.resolution)


@pytest.mark.parametrize(("text", "expected"), [
    ("now", 1_800_000_000.0), ("-24h", 1_800_000_000.0 - 86400), ("now-30d", 1_800_000_000.0 - 30 * 86400),
    ("-90m", 1_800_000_000.0 - 5400), ("2027-01-15T08:00:00Z", 1800000000.0), ("2027-01-15T09:00:00+01:00",
                                                                                1800000000.0),
    ("1800000000", 1_800_000_000.0)])
def test_times_are_rfc3339_unix_seconds_or_before_now(text, expected):
    assert rb.parse_time(text, 1_800_000_000.0) == pytest.approx(expected)


@pytest.mark.parametrize("text", ["yesterday", "-3y", "2027-01-15T08:00:00"])
def test_a_time_that_is_none_of_those_is_refused_saying_what_is_taken(text):
    with pytest.raises(ReportError, match="RFC 3339"):
        rb.parse_time(text, 1_800_000_000.0)


# --- the answers of real servers --------------------------------------------------------------

@pytest.mark.parametrize("path", CAPTURE_FILES, ids=lambda p: p.stem)
def test_captured_answers_make_the_report(path):
    """Each job's GPU time is its counter's increase; its loss split adds up to its GPU time; the findings and
    the fleet's account come from their series."""
    doc = captured(path)
    naming = {n.key: n for n in NAMINGS}[doc["naming"]]
    results = captured_results(doc)
    report = rb.report_from_results(results, naming, "http://backend", doc["start"], doc["end"], JobsConfig())
    job_label = naming.label("ofu.job.id")
    increases = {s["metric"][job_label]: float(s["value"][1]) for s in results["gpu_seconds"]}
    assert {j.summary.job_id: j.summary.totals.gpu_seconds for j in report.jobs} == pytest.approx(increases)
    for job in report.jobs:
        shares = job.summary.loss.shares()
        assert math.fsum(shares.values()) == pytest.approx(1.0, abs=1e-9)
        t = job.summary.totals
        assert t.ofu_mean == pytest.approx(shares[USEFUL], abs=1e-9)
        assert t.wasted_gpu_hours == pytest.approx(sum(h for p, h in job.summary.loss.gpu_hours().items()
                                                       if p != USEFUL), rel=1e-12)
    data = report_json(report)
    assert json_field_paths(data) <= set(REPORT_FIELDS)
    assert data["findings_source"] == "backend" and data["inputs"][0]["format"] == "prometheus"
    assert any(f"naming: {naming.key}" in note for note in data["inputs"][0]["notes"])
    kinds = {(j["job_id"], f["kind"]) for j in data["jobs"] for f in j["findings"]}
    assert kinds == {("moe-236b", "mfu_gap"), ("sft-debug-flag", "regression")}  # the demo's two (its config says)
    # The demo prices its GPUs (job.cost): each job's money per part is its captured increase.
    part_label, currency_label = naming.label("ofu.loss.part"), naming.label("ofu.cost.currency")
    money: dict[str, dict[str, float]] = {}
    for sample in results["cost"]:
        assert sample["metric"][currency_label] == "USD"
        money.setdefault(sample["metric"][job_label], {})[sample["metric"][part_label]] = float(sample["value"][1])
    assert money and data["fleet"]["currency"] == "USD"
    for job in data["jobs"]:
        assert job["cost_by_part"] == pytest.approx(money[job["job_id"]], rel=1e-9)
    fleet = data["fleet"]
    assert fleet["gpus"] > 0 and fleet["unattributed_gpu_hours"] > 0
    assert math.fsum(fleet["loss_gpu_hours"].values()) - math.fsum(fleet["gain_gpu_hours"].values()) == \
        pytest.approx(fleet["gpu_hours"], rel=1e-9)


@pytest.mark.parametrize("path", CAPTURE_FILES, ids=lambda p: p.stem)
def test_the_naming_is_told_from_the_captured_label_values(path):
    doc = captured(path)
    names = set(doc["label_values"]["data"])
    found = [n.key for n in NAMINGS if n.metric(rb.PRESENCE_METRIC) in names]
    assert found == [doc["naming"]]


def test_without_the_fleet_series_the_fleet_is_the_jobs_and_says_so():
    doc = captured(CAPTURES / "prometheus3-otlp.json")
    results = captured_results(doc) | {"unallocated": []}
    report = rb.report_from_results(results, PROMETHEUS_NAMING, "http://backend", doc["start"], doc["end"],
                                    JobsConfig())
    data = report_json(report)
    assert data["fleet"]["unattributed_gpu_hours"] == 0
    assert data["fleet"]["gpu_hours"] == pytest.approx(data["fleet"]["job_gpu_hours"])
    assert any("fleet_gpu_hours_total" in note for note in data["inputs"][0]["notes"])


def test_job_cost_in_two_currencies_shows_the_one_with_most_money_and_notes_the_other():
    doc = captured(CAPTURES / "prometheus3-otlp.json")
    results = captured_results(doc)
    other = min(s["metric"]["ofu_job_id"] for s in results["cost"])
    for key in ("cost", "cost_gained"):
        results[key] = [{**s, "metric": {**s["metric"], "ofu_cost_currency": "EUR"}}
                        if s["metric"]["ofu_job_id"] == other else s for s in results[key]]
    report = rb.report_from_results(results, PROMETHEUS_NAMING, "http://backend", doc["start"], doc["end"],
                                    JobsConfig())
    data = report_json(report)
    assert data["fleet"]["currency"] == "USD"
    assert {j["job_id"] for j in data["jobs"] if j["cost"] is None} == {other}
    assert any(note.startswith("job.cost in EUR") for note in data["inputs"][0]["notes"])


def test_no_job_time_in_the_range_is_an_error_naming_the_counter():
    doc = captured(CAPTURES / "victoriametrics-otlp-defaults.json")
    results = captured_results(doc) | {"gpu_seconds": []}
    with pytest.raises(ReportError, match=r"increase of job\.gpu_seconds is empty"):
        rb.report_from_results(results, OTLP_NAMING, "http://backend", doc["start"], doc["end"], JobsConfig())


@settings(max_examples=200, deadline=None)
@given(gpu_s=st.floats(1.0, 1e9), lost=st.dictionaries(st.sampled_from(["engine_idle", "sm_idle", "non_tensor",
                                                                          "clock", "padding", "unknown"]),
                                                         st.floats(0.0, 1.0)),
       gained=st.floats(0.0, 0.2))
def test_the_loss_split_adds_up_exactly(gpu_s, lost, gained):
    """Whatever the increases, the parts (useful the rest) add up to the job's GPU time to the last unit."""
    hours = gpu_s / 3600.0
    loss = loss_from_counters(gpu_s, {p: share * hours / max(1, len(lost)) for p, share in lost.items()},
                              {"clock": gained * hours}, {}, None)
    assert sum(loss.exact_parts.values()) - sum(loss.exact_gains.values()) == loss.exact_seconds


# --- real servers -----------------------------------------------------------------------------

@dataclass
class DemoBackends:
    urls: dict[str, str]  # road -> query API
    start: float
    end: float
    recording: Path
    auth_url: str  # VictoriaMetrics with -httpAuth.*: user ofu, password s3cret-pw


AUTH = ("ofu", "s3cret-pw")


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> Iterator[DemoBackends]:
    from tools.backends import (
        PROMETHEUS_OTLP_CONFIG,
        PROMETHEUS_OTLP_FLAGS,
        VICTORIAMETRICS_FLAGS,
        VictoriaMetrics,
        prometheus_config,
    )
    from tools.demo_prometheus import PrometheusServer, _promtool, run_demo

    prometheus3, victoria, prometheus2 = prometheus3_binary(), victoriametrics_binary(), prometheus_binary()
    workdir = tmp_path_factory.mktemp("backend-report")
    with contextlib.ExitStack() as stack:
        def running(server):
            stack.callback(server.stop)
            return server.start()

        otlp = running(PrometheusServer(prometheus3, workdir / "prometheus3", config=prometheus_config(
            PROMETHEUS_OTLP_CONFIG), flags=PROMETHEUS_OTLP_FLAGS))
        suffixless = yaml.safe_load(prometheus_config(PROMETHEUS_OTLP_CONFIG))
        suffixless["otlp"]["translation_strategy"] = "UnderscoreEscapingWithoutSuffixes"
        otlp_suffixless = running(PrometheusServer(prometheus3, workdir / "prometheus3-without-suffixes",
                                                   config=yaml.safe_dump(suffixless), flags=PROMETHEUS_OTLP_FLAGS))
        vm = running(VictoriaMetrics(victoria, workdir / "victoriametrics"))
        vm_defaults = running(VictoriaMetrics(victoria, workdir / "victoriametrics-defaults", flags=()))
        vm_auth = running(VictoriaMetrics(victoria, workdir / "victoriametrics-auth", flags=(
            *VICTORIAMETRICS_FLAGS, f"-httpAuth.username={AUTH[0]}", f"-httpAuth.password={AUTH[1]}")))
        delivery = {"retry_on_failure": {"max_elapsed_time": "120s"}, "sending_queue": {"queue_size": 100000},
                    "logs_endpoint": "none"}
        user = f"{AUTH[0]}:{AUTH[1]}@"
        exporters = {
            "otlphttp/prometheus3": {"endpoint": f"{otlp.api.url}/api/v1/otlp", **delivery},
            "otlphttp/prometheus3_suffixless": {"endpoint": f"{otlp_suffixless.api.url}/api/v1/otlp", **delivery},
            "otlphttp/victoriametrics": {"endpoint": f"{vm.url}/opentelemetry", **delivery},
            "otlphttp/victoriametrics_defaults": {"endpoint": f"{vm_defaults.url}/opentelemetry", **delivery},
            "otlphttp/victoriametrics_auth": {"endpoint": f"{vm_auth.url.replace('://', '://' + user)}/opentelemetry",
                                              **delivery},
        }
        # The span ends half a second after a whole minute: the jobs processor's counters stop at its last
        # whole bin (resolution 1m) before the job ends, while the file report counts the last partial bin too
        # (docs/report.md#from-the-backend); ending on a bin keeps that out of the 1 % comparison.
        aligned = math.floor((time.time() - 3600.0 - 60.0) / 60.0) * 60.0 + 0.5
        openmetrics, start, end, _, _ = run_demo(workdir / "demo", exporters=exporters, start_time=aligned)
        for server in (vm, vm_defaults):
            server.flush()
        urllib.request.urlopen(urllib.request.Request(f"{vm_auth.url}/internal/force_flush", headers={
            "Authorization": "Basic " + __import__("base64").b64encode(":".join(AUTH).encode()).decode()}),
            timeout=30).close()
        # The scrape road in Prometheus 2: the prometheus exporter's exposition after each export, as TSDB blocks.
        scraped = PrometheusServer(prometheus2, workdir / "prometheus2")
        _promtool(str(Path(prometheus2).with_name("promtool")), "tsdb", "create-blocks-from", "openmetrics",
                  str(openmetrics), str(scraped.data))
        running(scraped)
        yield DemoBackends({"prometheus3_otlp": otlp.api.url, "prometheus3_otlp_without_suffixes":
                            otlp_suffixless.api.url, "victoriametrics_otlp": vm.url,
                            "victoriametrics_otlp_defaults": vm_defaults.url, "prometheus2_scrape": scraped.api.url},
                           start, end, workdir / "demo" / "demo.jsonl", vm_auth.url)


@pytest.fixture(scope="module")
def file_report(demo) -> dict:
    return report_json(build_report(str(demo.recording)))


def _range(demo: DemoBackends) -> list[str]:
    """The demo's hour and ten minutes on either side: as a range is usually asked, its edges more than a sample
    interval from the jobs' first and last samples (within 1.1 intervals Prometheus' increase() extrapolates to the
    edge: docs/report.md#what-the-tsdb-must-hold)."""
    return ["--start", f"{demo.start - 600:.3f}", "--end", f"{demo.end + 600:.3f}"]


ROADS = ("prometheus3_otlp", "prometheus3_otlp_without_suffixes", "victoriametrics_otlp",
         "victoriametrics_otlp_defaults", "prometheus2_scrape")
NAMING_OF = {"prometheus3_otlp": "prometheus", "prometheus3_otlp_without_suffixes": "without_suffixes",
             "victoriametrics_otlp": "prometheus",
             "victoriametrics_otlp_defaults": "otlp", "prometheus2_scrape": "prometheus"}


@pytest.mark.parametrize("road", ROADS)
def test_the_backend_report_agrees_with_the_file_report(demo, file_report, road, capsys):
    """Each job's GPU hours within 1 %, mean OFU within 0.005, wasted GPU hours within 2 % of the report of the
    same run's recording; the same jobs, the same findings; the naming named."""
    assert main(["report", "--prometheus", demo.urls[road], *_range(demo), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    files = {j["job_id"]: j for j in file_report["jobs"]}
    assert {j["job_id"] for j in data["jobs"]} == set(files)
    worst = {"gpu_hours": 0.0, "ofu_mean": 0.0, "wasted_gpu_hours": 0.0}
    for job in data["jobs"]:
        want = files[job["job_id"]]
        assert job["gpu_hours"] == pytest.approx(want["gpu_hours"], rel=0.01), job["job_id"]
        assert job["ofu_mean"] == pytest.approx(want["ofu_mean"], abs=0.005), job["job_id"]
        assert job["wasted_gpu_hours"] == pytest.approx(want["wasted_gpu_hours"], rel=0.02), job["job_id"]
        worst["gpu_hours"] = max(worst["gpu_hours"], abs(job["gpu_hours"] / want["gpu_hours"] - 1))
        worst["ofu_mean"] = max(worst["ofu_mean"], abs(job["ofu_mean"] - want["ofu_mean"]))
        worst["wasted_gpu_hours"] = max(worst["wasted_gpu_hours"],
                                        abs(job["wasted_gpu_hours"] / want["wasted_gpu_hours"] - 1))
        assert [f["kind"] for f in job["findings"]] == [f["kind"] for f in want["findings"]]
        assert job["largest_loss"]["part"] == want["largest_loss"]["part"]
    assert data["fleet"]["gpus"] == file_report["fleet"]["gpus"]
    assert any(f"naming: {NAMING_OF[road]}" in note for note in data["inputs"][0]["notes"])
    print(f"{road}: worst relative GPU hours {worst['gpu_hours']:.4%}, OFU {worst['ofu_mean']:.4f}, "
          f"wasted {worst['wasted_gpu_hours']:.4%}")



def test_the_jobs_processors_cost_is_read_from_the_backend(demo, capsys):
    """The demo prices its GPUs (collector-config/demo.yaml's cost): each job's cost from its job.cost series is
    what the file report with the same settings gives the recording, within the last partial bin (1 %)."""
    config = str(Path(__file__).parent.parent / "collector-config" / "demo.yaml")
    assert main(["report", str(demo.recording), "--config", config, "--json"]) == 0
    files = {j["job_id"]: j for j in json.loads(capsys.readouterr().out)["jobs"]}
    assert main(["report", "--prometheus", demo.urls["victoriametrics_otlp"], *_range(demo), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["fleet"]["currency"] == "USD" and data["fleet"]["cost"] > 0
    for job in data["jobs"]:
        want = files[job["job_id"]]
        assert job["cost"] == pytest.approx(want["cost"], rel=0.01), job["job_id"]
        assert job["wasted_cost"] == pytest.approx(want["wasted_cost"], rel=0.02), job["job_id"]

def test_the_table_and_csv_come_from_the_backend(demo, tmp_path, capsys):
    out_csv = tmp_path / "jobs.csv"
    assert main(["report", "--prometheus", demo.urls["victoriametrics_otlp"], *_range(demo), "--csv",
                 str(out_csv)]) == 0
    text = capsys.readouterr().out
    assert "naming: prometheus" in text and "What to fix first" in text and "job_finding series" in text
    rows = list(csv.DictReader(out_csv.open()))
    assert {r["job_id"] for r in rows} >= {"moe-236b", "sft-debug-flag"}
    assert all(float(r["gpu_hours"]) > 0 for r in rows)


def test_a_range_without_otel_ofu_series_names_what_was_looked_for(demo, capsys):
    assert main(["report", "--prometheus", demo.urls["prometheus3_otlp"], "--start", f"{demo.start - 7200:.0f}",
                 "--end", f"{demo.start - 3700:.0f}"]) == 1
    err = capsys.readouterr().err
    assert "no otel-ofu job series" in err
    assert all(n.metric("job.gpu_seconds") in err for n in NAMINGS)


@pytest.mark.parametrize("road", ["prometheus3_otlp", "victoriametrics_otlp"])
def test_a_query_the_backend_refuses_is_a_clear_error(demo, road):
    with pytest.raises(BackendError, match=r"bad_data|400: error when executing query") as refused:
        Backend(demo.urls[road]).get("/api/v1/query", {"query": "sum(increase(job_gpu_seconds_total[1h]"})
    assert "parse error" in str(refused.value) or "unexpected token" in str(refused.value)


def test_an_unreachable_backend_is_named_with_its_credentials_masked(capsys):
    (port,) = free_ports(1)
    assert main(["report", "--prometheus", f"http://ofu:hunter2@127.0.0.1:{port}"]) == 1
    err = capsys.readouterr().err
    assert f"http://127.0.0.1:{port}" in err and "cannot query" in err and "refused" in err
    assert "hunter2" not in err


def test_refused_credentials_say_so_and_good_ones_work(demo, capsys):
    assert main(["report", "--prometheus", f"http://{AUTH[0]}:wrong@{demo.auth_url.removeprefix('http://')}",
                 *_range(demo)]) == 1
    err = capsys.readouterr().err
    assert "HTTP 401" in err and "refused the credentials" in err and "wrong" not in err
    good = f"http://{AUTH[0]}:{AUTH[1]}@{demo.auth_url.removeprefix('http://')}"
    assert main(["report", "--prometheus", good, *_range(demo), "--json"]) == 0
    out = capsys.readouterr().out
    assert json.loads(out)["jobs"] and AUTH[1] not in out


class BearerProxy(GetServer):
    """A real HTTP reverse proxy that takes only ``Authorization: Bearer <token>``, as vmauth's ``bearer_token``
    user or an ingress in front of Prometheus does (vmauth is not built here)."""

    def __init__(self, upstream: str, token: str):
        def forward(path: str, headers) -> tuple[int, str, bytes]:
            if headers.get("Authorization") != f"Bearer {token}":
                return 401, "text/plain", b"Unauthorized\n"
            with urllib.request.urlopen(f"{upstream}{path}", timeout=60) as response:
                return 200, "application/json", response.read()

        super().__init__(forward)


def test_a_bearer_token_file_is_sent(demo, tmp_path, capsys):
    proxy = BearerProxy(demo.urls["victoriametrics_otlp"], "t0ken-abc")
    try:
        token = tmp_path / "token"
        token.write_text("t0ken-abc\n")
        assert main(["report", "--prometheus", proxy.url, *_range(demo)]) == 1
        assert "HTTP 401" in capsys.readouterr().err
        assert main(["report", "--prometheus", proxy.url, *_range(demo), "--bearer-token-file", str(token)]) == 0
        assert "t0ken-abc" not in capsys.readouterr().out
    finally:
        proxy.close()


def test_the_captures_are_what_the_servers_answer(demo):
    """The captured answers' queries are the ones the report runs now (a changed query needs a new capture:
    ``capture_answers``), and a real server still answers them in the captured shape."""
    for path in CAPTURE_FILES:
        doc = captured(path)
        naming = {n.key: n for n in NAMINGS}[doc["naming"]]
        plan = {q.key: q.expr for q in rb.queries(naming, doc["end"] - doc["start"], JobsConfig())}
        assert plan == {key: answer["query"] for key, answer in doc["answers"].items()}, path.name
    road = "victoriametrics_otlp_defaults"
    fresh = capture_answers(demo.urls[road], demo.start, demo.end, "live")
    assert fresh["naming"] == "otlp"
    assert {k: a["response"]["data"]["resultType"] for k, a in fresh["answers"].items()} == \
        {k: a["response"]["data"]["resultType"] for k, a in captured(
            CAPTURES / "victoriametrics-otlp-defaults.json")["answers"].items()}



def _counter_fleet(t0: float) -> dict[str, list[tuple[float, float]]]:
    """Three one-GPU jobs' job.gpu_seconds, a sample a minute for an hour after ``t0``: ``whole`` starts in the
    range; ``reset`` restarts from 0 half way (a jobs instance restarted without its storage); ``before``
    ran before the range's start too (see the test)."""
    minutes = range(1, 61)
    return {"whole": [(t0 + 60 * k, 60.0 * k) for k in minutes],
            "reset": [(t0 + 60 * k, 60.0 * (k if k <= 30 else k - 30)) for k in minutes],
            "before": [(t0 + 60 * k, 60.0 * k) for k in minutes]}


Series = dict[tuple[str, tuple[tuple[str, str], ...]], list[tuple[float, float]]]  # (name, labels) -> samples


@contextlib.contextmanager
def serving(server: str, tmp_path: Path, series: Series, families: dict[str, str]) -> Iterator[str]:
    """A real VictoriaMetrics (its /api/v1/import) or Prometheus 3 (promtool's OpenMetrics backfill) holding
    ``series``; ``families``: each series name's OpenMetrics family and type (``job_cost_total`` -> ``job_cost
    counter``). Yields the query API's URL."""
    from tools.backends import VictoriaMetrics
    from tools.demo_prometheus import PrometheusServer, _promtool

    if server == "victoriametrics":
        running = VictoriaMetrics(victoriametrics_binary(), tmp_path / "vm", flags=()).start()
        url = running.url
        body = "".join(json.dumps({"metric": {"__name__": name, **dict(labels)}, "values": [v for _, v in samples],
                                   "timestamps": [int(t * 1000) for t, _ in samples]}) + "\n"
                       for (name, labels), samples in series.items())
        urllib.request.urlopen(urllib.request.Request(f"{url}/api/v1/import", data=body.encode(), method="POST"),
                               timeout=30).close()
        running.flush()
    else:
        binary = prometheus3_binary()
        running = PrometheusServer(binary, tmp_path / "prometheus")
        lines = []
        for family in dict.fromkeys(families[name] for name, _ in series):
            lines.append(f"# TYPE {family}")
            for (name, labels), samples in series.items():
                if families[name] == family:
                    text = ",".join(f'{k}="{v}"' for k, v in labels)
                    lines += [f"{name}{{{text}}} {v!r} {t:.3f}" for t, v in samples]
        exposition = tmp_path / "series.om"
        exposition.write_text("\n".join(lines) + "\n# EOF\n")
        _promtool(str(Path(binary).with_name("promtool")), "tsdb", "create-blocks-from", "openmetrics",
                  str(exposition), str(running.data))
        running.start()
        url = running.api.url
    try:
        yield url
    finally:
        running.stop()


@pytest.mark.parametrize("server", ["victoriametrics", "prometheus3"])
def test_a_counters_increase_is_its_value_at_the_end_less_at_the_start(server, tmp_path):
    """No extrapolation at the range's edges (Prometheus' increase() would add up to half a sample interval at
    each); a job that ran before the start counts from its value then; a reset is the TSDB's increase()."""
    t0 = math.floor(time.time() / 60.0) * 60.0 - 7200.0
    series = {("job_gpu_seconds_total", (("ofu_job_id", job),)): samples
              for job, samples in _counter_fleet(t0).items()}
    with serving(server, tmp_path, series, {"job_gpu_seconds_total": "job_gpu_seconds counter"}) as url:
        config = JobsConfig()
        end = t0 + 3600 + 600
        whole = rb.build_backend_report(Backend(url), t0 - 600, end, config)
        half = rb.build_backend_report(Backend(url), t0 + 1800.5, end, config)
    hours = {j.summary.job_id: j.summary.totals.gpu_seconds for j in whole.jobs}
    assert hours["whole"] == pytest.approx(3600.0, rel=1e-12) and hours["before"] == pytest.approx(3600.0, rel=1e-12)
    # Across the reset: what both counters counted, as the TSDB's increase() makes it (Prometheus extrapolates).
    assert hours["reset"] == pytest.approx(3600.0, rel=0.05)
    assert {j.summary.job_id: j.summary.totals.gpu_seconds for j in half.jobs}["before"] == \
        pytest.approx(3600.0 - 1800.0, rel=1e-12)



COST_FAMILIES = {"job_gpu_seconds_total": "job_gpu_seconds counter",
                 "job_ofu_loss_gpu_hours_total": "job_ofu_loss_gpu_hours counter",
                 "job_cost_total": "job_cost counter", "job_cost_gained_total": "job_cost_gained counter",
                 "fleet_gpu_hours_total": "fleet_gpu_hours counter", "fleet_cost_total": "fleet_cost counter",
                 "node_gpu_hourly_cost": "node_gpu_hourly_cost gauge"}
# What the jobs processor writes with cost: {currency: EUR, default: 2.37}: a job's money by part is its GPU-hours
# by part x 2.37 (docs/jobs.md#cost); labels as its series carry them (Prometheus naming).
PRICE_EUR = 2.37
# OpenCost's node_gpu_hourly_cost of two nodes (labels as OpenCost writes them: node, instance_type, ...).
OPENCOST_NODES = {("gpu-node-1", "p5.48xlarge"): 3.1, ("gpu-node-2", "p4d.24xlarge"): 1.7}


def _cost_fleet(t0: float) -> tuple[Series, dict[str, dict[str, float]]]:
    """Hour 1 after ``t0``: jobs ``train`` (2 GPUs) and ``serve`` (1 GPU) with the jobs processor's job.cost
    (and the clock's gain, and the no-job part's fleet.cost); hour 3: job ``eval`` with no cost series. OpenCost's
    price of both nodes over all three hours. Returns the series and each job's money by part at its end."""
    minutes = range(1, 61)
    series: Series = {}
    expected: dict[str, dict[str, float]] = {}
    for job, gpus, idle, start in (("train", 2, 0.25, t0), ("serve", 1, 0.6, t0), ("eval", 1, 0.4, t0 + 7200)):
        job_label = (("ofu_job_id", job),)
        series[("job_gpu_seconds_total", job_label)] = [(start + 60 * k, 60.0 * gpus * k) for k in minutes]
        series[("job_ofu_loss_gpu_hours_total", (*job_label, ("ofu_loss_part", "engine_idle")))] = \
            [(start + 60 * k, idle * gpus * k / 60.0) for k in minutes]
        if job == "eval":
            continue
        for part, share in (("useful", 1.0 - idle), ("engine_idle", idle)):
            labels = (("ofu_cost_currency", "EUR"), *job_label, ("ofu_loss_part", part))
            series[("job_cost_total", labels)] = [(start + 60 * k, PRICE_EUR * share * gpus * k / 60.0)
                                                  for k in minutes]
        series[("job_cost_gained_total", (("ofu_cost_currency", "EUR"), *job_label, ("ofu_loss_part", "clock")))] = \
            [(start + 60 * k, 0.01 * k) for k in minutes]
        expected[job] = {"useful": PRICE_EUR * (1.0 - idle) * gpus, "engine_idle": PRICE_EUR * idle * gpus,
                         "gained": 0.6}
    series[("fleet_gpu_hours_total", (("ofu_loss_part", "unallocated"),))] = \
        [(t0 + 60 * k, k / 60.0) for k in range(1, 181)]
    series[("fleet_cost_total", (("ofu_cost_currency", "EUR"), ("ofu_loss_part", "unallocated")))] = \
        [(t0 + 60 * k, PRICE_EUR * k / 60.0) for k in range(1, 181)]
    for (node, instance_type), price in OPENCOST_NODES.items():
        series[("node_gpu_hourly_cost", (("instance", "opencost:9003"), ("instance_type", instance_type),
                                         ("job", "opencost"), ("node", node)))] = \
            [(t0 + 60 * k, price) for k in range(0, 200)]
    return series, expected


@pytest.mark.parametrize("server", ["victoriametrics", "prometheus3"])
def test_the_backend_report_costs_jobs_by_job_cost_else_by_opencost(server, tmp_path):
    """Where the jobs processor's job.cost is in the backend, each job's money by part is its increase (the
    clock's gain from job.cost.gained, the no-job part from fleet.cost, the currency from the label), ahead of
    OpenCost; where it is not, OpenCost's node_gpu_hourly_cost (its mean over the nodes and the range) prices
    each job's GPU-hours part by part, and the inputs say so."""
    t0 = math.floor(time.time() / 60.0) * 60.0 - 4 * 3600.0
    series, expected = _cost_fleet(t0)
    with serving(server, tmp_path, series, COST_FAMILIES) as url:
        priced = report_json(rb.build_backend_report(Backend(url), t0, t0 + 3600 + 600, JobsConfig()))
        opencost = rb.build_backend_report(Backend(url), t0 + 7200, t0 + 7200 + 3600 + 600, JobsConfig())

    assert priced["fleet"]["currency"] == "EUR"
    jobs = {j["job_id"]: j for j in priced["jobs"]}
    assert set(jobs) == {"train", "serve"}
    for job, money in expected.items():
        record = jobs[job]
        assert record["cost_by_part"] == pytest.approx({"useful": money["useful"],
                                                        "engine_idle": money["engine_idle"]}, rel=1e-6)
        assert record["gained_cost"] == pytest.approx(money["gained"], rel=1e-6)
        assert record["cost"] == pytest.approx(money["useful"] + money["engine_idle"] - money["gained"], rel=1e-6)
        assert record["wasted_cost"] == pytest.approx(money["engine_idle"], rel=1e-6)
    fleet = priced["fleet"]
    idle_money = PRICE_EUR * 70 / 60  # fleet.cost's no-job part from t0 (no sample: from 0) to the range's end
    assert fleet["cost_by_part"]["unallocated"] == pytest.approx(idle_money, rel=1e-6)
    assert fleet["cost"] == pytest.approx(sum(j["cost"] for j in jobs.values()) + idle_money, rel=1e-9)
    assert any("job_cost_total increases, in EUR" in note for note in priced["inputs"][0]["notes"])

    mean_price = sum(OPENCOST_NODES.values()) / len(OPENCOST_NODES)
    (job,) = opencost.jobs
    assert job.summary.job_id == "eval"
    money = cost_record(job.summary.cost)
    assert money["cost_by_part"] == pytest.approx({"useful": 0.6 * mean_price, "engine_idle": 0.4 * mean_price},
                                                  rel=1e-6)
    assert money["cost"] == pytest.approx(job.summary.totals.gpu_hours * mean_price, rel=1e-9)
    data = report_json(opencost)
    assert data["fleet"]["currency"] == "USD"  # the jobs settings' cost.currency: OpenCost's series carry none
    assert data["fleet"]["cost_by_part"]["unallocated"] == pytest.approx(mean_price, rel=1e-6)
    notes = " ".join(data["inputs"][0]["notes"])
    assert "node_gpu_hourly_cost" in notes and "mean over its nodes" in notes
    assert "no fleet_gpu_hours_total" not in notes  # the no-job GPU time is known
    table = render_table(opencost)
    assert "cost USD" in table and "Cost " in table

@pytest.mark.skipif(not certs.available(), reason="needs the cryptography package or openssl")
def test_tls_options_reach_a_prometheus_that_requires_a_client_certificate(tmp_path, capsys):
    """A real Prometheus 3 serving HTTPS and requiring a client certificate (its --web.config.file): the report
    connects with --ca-file, --cert-file and --key-file; without the CA, or without the certificate, it says
    what failed."""
    (tmp_path / "certs").mkdir()
    made = certs.make(tmp_path / "certs")
    (port,) = free_ports(1)
    web = tmp_path / "web.yml"
    web.write_text(json.dumps({"tls_server_config": {"cert_file": str(made.server_cert), "key_file": str(
        made.server_key), "client_auth_type": "RequireAndVerifyClientCert", "client_ca_file": str(made.ca)}}))
    (tmp_path / "prometheus.yml").write_text("global: {}\n")
    log_file = tmp_path / "prometheus.log"
    with open(log_file, "wb") as log:
        process = subprocess.Popen([prometheus3_binary(), f"--config.file={tmp_path / 'prometheus.yml'}",
                                    f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.config.file={web}",
                                    f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT)
    url = f"https://127.0.0.1:{port}"
    tls = ["--ca-file", str(made.ca), "--cert-file", str(made.client_cert), "--key-file", str(made.client_key)]
    try:
        wait_for("prometheus to serve https", lambda: "Server is ready" in log_file.read_text()
                 or process.poll() is not None, timeout=60)
        assert process.poll() is None, log_file.read_text()[-2000:]
        assert main(["report", "--prometheus", url, *tls]) == 1
        assert "no otel-ofu job series" in capsys.readouterr().err  # connected, queried, found nothing
        assert main(["report", "--prometheus", url, "--cert-file", str(made.client_cert), "--key-file",
                     str(made.client_key)]) == 1
        assert "CERTIFICATE_VERIFY_FAILED" in capsys.readouterr().err
        assert main(["report", "--prometheus", url, "--ca-file", str(made.ca)]) == 1
        err = capsys.readouterr().err
        assert "cannot query" in err and "certificate" in err.lower()
    finally:
        process.terminate()
        process.wait(timeout=30)
