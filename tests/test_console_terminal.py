"""The console as a person sees it: the demo and `otel-ofu top --scrape` in a real terminal (tmux), and piped.

tmux (Debian package ``tmux``, installed by .ci/run) runs the command in a pseudo-terminal of
a fixed size; ``capture-pane`` reads back the screen and its scrollback as characters.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml

from otel_ofu.pipeline.component import Context
from otel_ofu.pipeline.config import build_config
from otel_ofu.pipeline.telemetry import Telemetry
from otel_ofu.processors.ofu import OfuProcessor, OfuProcessorConfig
from otel_ofu.receivers.dcgm_exporter import DcgmExporterReceiver, DcgmExporterReceiverConfig
from tests.e2e_util import PageServer, wait_for
from tools.ports import free_ports

ROOT = Path(__file__).parent.parent
DATA = ROOT / "tests" / "data" / "dcgm-exporter"
ANSI = re.compile(r"\x1b\[")
HEADER = re.compile(r"╭─ otel-ofu · data time \d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ ─")
MOE_LOG = re.compile(r"WARNING\s+otel_ofu\.jobs@metrics: finding \(mfu_gap\): job moe-236b: reported MFU "
                     r"\d+\.\d% vs OFU \d+\.\d% over 5m \(gap \+\d+\.\d pp\): likely flop_formula_overcount$")
RUNNING_LOG = re.compile(r"INFO\s+otel_ofu\.service: otel-ofu running: 2 pipeline\(s\), receivers sim, selftelemetry$")

needs_tmux = pytest.mark.skipif(shutil.which("tmux") is None and not os.environ.get("CI"),
                                reason="tmux not installed (apt-get install tmux; .ci/run installs it)")


class Tmux:
    """One command in a detached tmux session on a private server; the pane stays after it exits."""

    def __init__(self, command: str, width: int = 200, height: int = 60):
        self.socket = f"otel-ofu-test-{uuid.uuid4().hex[:8]}"
        self._tmux("-f", "/dev/null", "new-session", "-d", "-s", "t", "-x", str(width), "-y", str(height),
                   "sleep 3600")
        # A fixed size: with no client attached, tmux may otherwise fall back to 80x24.
        self._tmux("set-option", "-g", "window-size", "manual")
        self._tmux("resize-window", "-t", "t", "-x", str(width), "-y", str(height))
        self._tmux("set-option", "-t", "t", "remain-on-exit", "on")
        # COLUMNS/LINES in the environment would override the terminal's real size.
        self._tmux("respawn-pane", "-k", "-t", "t", f"unset COLUMNS LINES; {command}")

    def _tmux(self, *args: str) -> str:
        return subprocess.run(["tmux", "-L", self.socket, *args], check=True, capture_output=True, text=True,
                              timeout=30).stdout

    def screen(self) -> list[str]:
        """The scrollback and the visible screen, wrapped lines joined, trailing spaces removed."""
        text = self._tmux("capture-pane", "-p", "-J", "-S", "-", "-t", "t")
        return [line.rstrip() for line in text.splitlines()]

    def exit_status(self) -> int | None:
        """None while the command runs; its exit status, or minus the signal that ended it."""
        dead, status, signal = (self._tmux("display-message", "-p", "-t", "t",
                                           "#{pane_dead}:#{pane_dead_status}:#{pane_dead_signal}").strip()
                                .split(":"))
        if dead != "1":
            return None
        return int(status) if status else -int(signal or 0)

    def wait_for(self, done, timeout: float = 90.0) -> list[str]:
        deadline = time.monotonic() + timeout
        while True:
            lines = self.screen()
            if done(lines) or time.monotonic() > deadline:
                return lines
            time.sleep(0.3)

    def interrupt(self) -> None:
        """Ctrl-C, as a person stops it."""
        self._tmux("send-keys", "-t", "t", "C-c")

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True, timeout=30)


def run_piped_until(args: list[str], tmp_path: Path, shown, timeout: float = 120.0) -> subprocess.CompletedProcess:
    """Run an otel-ofu command with its output piped until ``shown(stdout so far)``, then stop it as
    asked (SIGTERM) and return how it ended. Not a fixed --duration: how soon the demo reaches its
    findings, or a scrape its first frame, depends on the CPU the command gets (tests run in parallel)."""
    out, err = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    with open(out, "w") as stdout, open(err, "w") as stderr:
        proc = subprocess.Popen(args, cwd=ROOT, stdout=stdout, stderr=stderr, text=True,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        wait_for(f"{args[3:5]} to show what the test reads", lambda: shown(out.read_text()) or proc.poll() is not None,
                 timeout, diagnostics=lambda: out.read_text()[-3000:] + err.read_text()[-3000:])
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    finally:
        proc.kill()
        proc.wait()
    return subprocess.CompletedProcess(args, proc.returncode, out.read_text(), err.read_text())


def fast_demo(tmp_path: Path, acceleration: float = 300, refresh: str = "500ms") -> Path:
    """The demo config, faster: both findings open within seconds of wall time."""
    doc = yaml.safe_load((ROOT / "collector-config" / "demo.yaml").read_text())
    doc["receivers"]["sim"]["time_acceleration"] = acceleration
    doc["exporters"]["console"]["refresh_interval"] = refresh
    doc["exporters"]["file"]["path"] = str(tmp_path / "demo.jsonl")
    path = tmp_path / "demo-fast.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def index_of(lines: list[str], pattern: re.Pattern | str) -> list[int]:
    match = pattern.search if isinstance(pattern, re.Pattern) else (lambda line: pattern in line)
    return [i for i, line in enumerate(lines) if match(line)]


def job_row(lines: list[str], job: str) -> str:
    rows = [line for line in lines if re.match(rf"^ ⚠ {re.escape(job)}\s+\d+\s", line)]
    return rows[-1] if rows else ""


@needs_tmux
def test_demo_in_a_terminal_shows_the_fleet_the_findings_and_keeps_log_lines_intact(tmp_path):
    config = fast_demo(tmp_path)
    command = f"cd {shlex.quote(str(ROOT))} && exec {shlex.quote(sys.executable)} -m otel_ofu run --config " \
              f"{shlex.quote(str(config))}"
    tmux = Tmux(command)
    try:
        def both_open(lines: list[str]) -> bool:
            return ("regression: OFU" in job_row(lines, "sft-debug-flag")
                    and "mfu_gap: reported MFU" in job_row(lines, "moe-236b"))

        lines = tmux.wait_for(both_open)
        assert both_open(lines), "\n".join(lines)
        # The header: one live region (no smeared copies), the fleet in numbers.
        headers = index_of(lines, HEADER)
        assert len(headers) == 1, "\n".join(lines)
        header = headers[0]
        # demo.yaml profiles one GPU from 25 to 40 minutes in: blank TPA, shown as such, never as 0.
        assert re.match(r"^│ GPUs 32 on 4 hosts, (32 with OFU|31 with OFU, — 1 without \(1 blank\))", lines[header + 1])
        assert re.match(r"^│ OFU now \d+\.\d%, mean OFU \d+\.\d% over \d+\.\d\d GPU h, wasted \d+\.\d\d GPU h"
                        r"( \(clock boost: \+\d+\.\d\d GPU h gained\))?, "
                        r"jobs losing \d+\.\d\d USD/h, "  # the demo's prices: what its jobs' losses cost
                        r"⚠ findings open: 2", lines[header + 2])
        # The jobs panel: the two findings with both numbers; jobs with findings first.
        jobs = index_of(lines, re.compile(r"^Jobs$"))[-1]
        assert re.search(r"⚠ mfu_gap: reported MFU 5\d\.\d% vs OFU 2\d\.\d% \(5m\), likely flop formula",
                         job_row(lines, "moe-236b"))
        assert re.search(r"⚠ regression: OFU 1\d\.\d% vs baseline 4\d\.\d% \(2\.\d\dx slower\), since \d\d:\d\dZ",
                         job_row(lines, "sft-debug-flag"))
        first_rows = [line.split()[1] for line in lines[jobs + 3:jobs + 5]]
        assert sorted(first_rows) == ["moe-236b", "sft-debug-flag"]
        # The GPU table below it, every GPU a row.
        gpus = index_of(lines, re.compile(r"^GPUs$"))[-1]
        assert jobs < gpus and len([ln for ln in lines[gpus:] if re.match(r"^ sim-node-[01]\s+\d ", ln)]) == 16
        # Log lines print above the live region, whole and once: never drawn over.
        for pattern in (RUNNING_LOG, MOE_LOG):
            at = index_of(lines, pattern)
            assert len(at) == 1 and at[0] < header, (pattern.pattern, "\n".join(lines))
        # Stopped with Ctrl-C once both findings show (not after a fixed time: how fast the demo runs
        # depends on the CPU it gets): exit 0, the last frame stays, the job summaries were logged above it.
        tmux.interrupt()
        lines = tmux.wait_for(lambda _: tmux.exit_status() is not None, timeout=90)
        assert tmux.exit_status() == 0, "\n".join(lines)
        last_header = index_of(lines, HEADER)[-1]
        ended = index_of(lines, "job llama-70b-pretrain ended (shutdown)")
        assert len(ended) == 1 and ended[0] < last_header
    finally:
        tmux.close()


def test_demo_piped_prints_plain_lines_with_the_findings(tmp_path):
    config = fast_demo(tmp_path, refresh="1s")
    proc = run_piped_until([sys.executable, "-m", "otel_ofu", "run", "--config", str(config)], tmp_path,
                           lambda out: "FINDING regression" in out and "FINDING mfu_gap" in out)
    assert proc.returncode == 0, proc.stderr
    assert not ANSI.search(proc.stdout) and not ANSI.search(proc.stderr)
    frames = proc.stdout.strip().split("\n\n")
    assert len(frames) >= 3
    for frame in frames:
        # demo.yaml profiles one GPU from 25 to 40 minutes in: blank TPA, counted as such, never as 0.
        assert re.match(r"otel-ofu \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ  GPUs 32 on 4 hosts, "
                        r"(32 with OFU|31 with OFU, 1 without \(1 blank\)); "
                        r"OFU now \d+\.\d%, mean OFU \d+\.\d% over", frame)
    text = proc.stdout
    assert re.search(r"^  job moe-236b: 2 GPUs, OFU 2\d\.\d% now, 2\d\.\d% over the job, reported MFU 5\d\.\d%, "
                     r"largest loss [a-z -]+ \d+%.*\n"
                     r"    FINDING mfu_gap: reported MFU 5\d\.\d% vs OFU 2\d\.\d% \(5m\)", text, re.M)
    assert re.search(r"^    FINDING regression: OFU 1\d\.\d% vs baseline 4\d\.\d% \(2\.\d\dx slower\)", text, re.M)
    # The per-GPU table: first and last frame (plain_gpu_table is 60 s), one row per GPU.
    last = frames[-1].splitlines()
    assert last[-33].split() == ["host", "gpu", "model", "job", "precision", "tpa", "sm/ref_mhz", "ofu_raw", "ofu"]
    assert len([line for line in last if line.startswith("  sim-node-")]) == 32
    # each job's largest loss: the jobs with one built in name theirs
    # (its GPUs boost a little above f_ref: a gain, said as one)
    # (and with the demo's prices, what its losses cost per hour once it has two job.cost stamps)
    assert re.search(r"^  job input-starved-vit: 4 GPUs, .*largest loss engine idle \d+%"
                     r"(; clock boost: \+\d+% gained)?(, energy \d+\.\d\d kWh( \([\d,]+ J/useful PFLOP\))?)?"
                     r"(, losing \d+\.\d\d USD/h)?$", text, re.M)
    assert re.search(r"^  job hot-node-gemm: 4 GPUs, .*largest loss clock \d+% \(hw thermal\)"
                     r"(, energy \d+\.\d\d kWh( \([\d,]+ J/useful PFLOP\))?)?(, losing \d+\.\d\d USD/h)?$", text, re.M)
    assert re.search(r"^  job .*, losing \d+\.\d\d USD/h$", text, re.M)  # the demo's prices
    assert "sim-node-" not in frames[1]
    # The findings were logged on stderr too, once each.
    assert proc.stderr.count("finding (mfu_gap): job moe-236b") == 1


# --- otel-ofu top --scrape against a served dcgm-exporter page ---------------------------------


@pytest.fixture
def exporter_pages():
    with PageServer({"/h100/metrics": (DATA / "h100.prom").read_bytes(),
                     "/b200/metrics": (DATA / "b200-mig.prom").read_bytes()}) as server:
        yield server.url


def expected_ofu(url: str) -> dict[str, str]:
    """GPU index -> OFU as the console prints it, from the same page through the receiver and the ofu processor."""
    cfg = build_config(DcgmExporterReceiverConfig, {"endpoint": url})
    receiver = DcgmExporterReceiver(cfg, Context("dcgm_exporter", Telemetry()), lambda batch: None)
    batch = receiver.poll()
    assert batch is not None
    points = OfuProcessor(OfuProcessorConfig(), Context("ofu")).process(batch).points
    return {dict(p.resource)["gpu.index"]: f"{p.value:.1%}" for p in points if p.name == "gpu.ofu"}


def test_top_scrape_piped_shows_every_gpu_and_mig_instance(exporter_pages, tmp_path):
    h100, b200 = f"{exporter_pages}/h100/metrics", f"{exporter_pages}/b200/metrics"
    proc = run_piped_until([sys.executable, "-m", "otel_ofu", "top", "--scrape", h100, "--scrape", b200, "--refresh",
                            "1"], tmp_path, lambda out: "(1 missing, 1 unsupported)" in out)
    assert proc.returncode == 0, proc.stderr
    assert not ANSI.search(proc.stdout)
    last = proc.stdout.strip().split("\n\n")[-1].splitlines()
    assert last[0].startswith(f"otel-ofu top · {h100}, {b200} ")
    assert "GPUs 4 on 2 hosts, 2 with OFU, 2 without (1 missing, 1 unsupported)" in last[0]
    rows = {tuple(line.split()[:3]): line for line in last if line.startswith("  gpu-node-") or
            line.startswith("  hgx-")}
    assert set(rows) == {("gpu-node-h100-01", "0", "H100"), ("gpu-node-h100-01", "1", "H100"),
                         ("hgx-b200-03", "0", "mig1"), ("hgx-b200-03", "0", "mig2")}
    assert rows[("gpu-node-h100-01", "0", "H100")].endswith(expected_ofu(h100)["0"])
    assert rows[("gpu-node-h100-01", "1", "H100")].endswith("- (unsupported)")  # a leaked blank sentinel
    assert rows[("hgx-b200-03", "0", "mig2")].endswith("- (missing)")  # no tensor activity for this instance
    # The pod label names the job (attribution's sample labels): a bare pod, as the page alone can say.
    assert "  job k8s:ml-research/Pod/llama-70b-pretrain-0: 1 GPUs, OFU " in proc.stdout


@needs_tmux
def test_top_scrape_in_a_terminal(exporter_pages):
    url = f"{exporter_pages}/h100/metrics"
    command = f"cd {shlex.quote(str(ROOT))} && exec {shlex.quote(sys.executable)} -m otel_ofu top --scrape {url} " \
              "--duration 30 --refresh 0.5"
    tmux = Tmux(command, width=180, height=40)
    try:
        lines = tmux.wait_for(lambda ls: any(re.match(r"^ gpu-node-h100-01\s+1 ", ln) for ln in ls), timeout=30)
        assert len(index_of(lines, f"╭─ otel-ofu top · {url} · data time ")) == 1, "\n".join(lines)
        assert any(re.match(r"^│ GPUs 2 on 1 host, 1 with OFU, — 1 without \(1 unsupported\)", ln) for ln in lines)
        gpu0 = next(ln for ln in lines if re.match(r"^ gpu-node-h100-01\s+0 ", ln))
        gpu1 = next(ln for ln in lines if re.match(r"^ gpu-node-h100-01\s+1 ", ln))
        assert gpu0.endswith(expected_ofu(url)["0"]) and "1410 / 1830" in gpu0
        assert gpu1.endswith("— unsupported")
    finally:
        tmux.close()



def test_top_with_its_source_down_says_so_piped_with_plain(tmp_path):
    """Issue 31 item 14: a dcgm-exporter that does not answer, and a Collector that sends nothing. Once
    nothing at all (--plain) and "no data yet" (a terminal); now the source's state, as it changes."""
    (port,) = free_ports(1)
    url = f"http://127.0.0.1:{port}/metrics"
    proc = run_piped_until([sys.executable, "-m", "otel_ofu", "top", "--scrape", url, "--interval", "1", "--refresh",
                            "0.5", "--plain"], tmp_path, lambda out: "cannot scrape" in out)
    assert proc.returncode == 0, proc.stderr
    assert f"  source dcgm_exporter: cannot scrape {url}: connection refused; retrying every 1s" in proc.stdout
    grpc, http = free_ports(2)
    proc = run_piped_until([sys.executable, "-m", "otel_ofu", "top", "--otlp", f"127.0.0.1:{grpc}", "--otlp-http",
                            f"127.0.0.1:{http}", "--refresh", "0.5", "--plain"], tmp_path, lambda out: "source " in out)
    assert proc.returncode == 0, proc.stderr
    assert "  source otlp: nothing received yet" in proc.stdout


@needs_tmux
def test_top_with_its_source_down_says_so_in_a_terminal():
    (port,) = free_ports(1)
    url = f"http://127.0.0.1:{port}/metrics"
    command = f"cd {shlex.quote(str(ROOT))} && exec {shlex.quote(sys.executable)} -m otel_ofu top --scrape {url} " \
              "--interval 1 --duration 30 --refresh 0.5"
    tmux = Tmux(command, width=180, height=40)
    try:
        said = re.compile(rf"^│ source dcgm_exporter: cannot scrape {re.escape(url)}: connection refused; "
                          r"retrying every 1s\s*│$")
        lines = tmux.wait_for(lambda ls: any(said.match(ln) for ln in ls), timeout=30)
        assert any(said.match(ln) for ln in lines), "\n".join(lines)
        assert len(index_of(lines, f"╭─ otel-ofu top · {url} · data time no data yet")) == 1
    finally:
        tmux.close()

def test_top_without_a_gpu_says_what_to_do_instead():
    proc = subprocess.run([sys.executable, "-m", "otel_ofu", "top"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 1
    assert "no real GPU source is usable" in proc.stderr and "otel-ofu top --scrape" in proc.stderr
    assert "collector-config/demo.yaml" in proc.stderr


def test_top_help_says_what_each_source_needs():
    proc = subprocess.run([sys.executable, "-m", "otel_ofu", "top", "--help"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0
    text = " ".join(proc.stdout.split())
    for needed in ("DCGM profiling", "profiling permission", "NVML GPM (Hopper or newer", "--scrape URL",
                   "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE and DCGM_FI_DEV_SM_CLOCK", "--otlp [ENDPOINT] OTLP from an "
                   "OpenTelemetry Collector"):
        assert needed in text


def test_top_rejects_a_bad_url_naming_it():
    proc = subprocess.run([sys.executable, "-m", "otel_ofu", "top", "--scrape", "ftp://x/metrics"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "endpoints[0]" in proc.stderr


def test_the_screenshot_tool_draws_the_demo_with_both_findings_open(tmp_path):
    out = tmp_path / "console.svg"
    proc = subprocess.run([sys.executable, "tools/console_screenshot.py", "--out", str(out), "--minutes", "30"],
                          cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    svg = out.read_text().replace("&#160;", " ")
    assert "⚠ findings open: 2" in svg and "regression: OFU" in svg and "mfu_gap: reported MFU" in svg
    assert "WARNING" in svg and "ended (shutdown)" not in svg  # the findings' log lines, not the shutdown's
    assert "cdnjs" not in svg  # no web font to fetch: rendered with a local one


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_top_otlp_shows_what_a_collector_sends():
    import urllib.request

    from otlp_shapes import H100_FREF_MHZ, Gpu, dcgm_exporter_request

    grpc, http = _free_port(), _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "otel_ofu", "top", "--otlp", f"127.0.0.1:{grpc}", "--otlp-http",
                             f"127.0.0.1:{http}", "--duration", "8", "--refresh", "0.5"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        gpus = [Gpu(0, "GPU-aaaa-0", 0.62, 1755.0), Gpu(1, "GPU-aaaa-1", 0.31, 1980.0)]
        body = dcgm_exporter_request(gpus, time.time_ns()).SerializeToString()
        deadline = time.monotonic() + 30
        while True:  # until the receiver listens
            try:
                request = urllib.request.Request(f"http://127.0.0.1:{http}/v1/metrics", data=body, method="POST",
                                                 headers={"Content-Type": "application/x-protobuf"})
                with urllib.request.urlopen(request, timeout=5) as reply:
                    assert reply.status == 200
                break
            except OSError:
                assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read() if proc.stderr else ""
                time.sleep(0.2)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, stderr
    last = stdout.strip().split("\n\n")[-1].splitlines()
    assert last[0].startswith(f"otel-ofu top · OTLP on gRPC 127.0.0.1:{grpc}, HTTP 127.0.0.1:{http} ")
    assert "GPUs 2 on 1 host, 2 with OFU" in last[0]
    for gpu in gpus:  # raw OFU is TPA x f_SM / f_ref, by definition
        row = next(line for line in last if line.startswith("  node-1") and line.split()[1] == str(gpu.index))
        assert row.split()[-2] == f"{gpu.tpa * gpu.clock_mhz / H100_FREF_MHZ:.1%}", row
