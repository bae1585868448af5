"""A GPU model missing from the spec table, or a sample without a model: one log line per model
saying what to set, and `reference_clocks` (also "*") making the OFU appear."""

import subprocess
import sys
from pathlib import Path

from tests.e2e_util import read_points

CSV = """timestamp,gpu,uuid,model,host,1004,100
2026-03-02T10:00:00Z,0,GPU-aaaa,NVIDIA RTX PRO 6000 Blackwell Server Edition,ws-1,0.5,2100
2026-03-02T10:00:00Z,1,GPU-bbbb,NVIDIA RTX PRO 6000 Blackwell Server Edition,ws-1,0.6,2100
2026-03-02T10:00:10Z,0,GPU-aaaa,NVIDIA RTX PRO 6000 Blackwell Server Edition,ws-1,0.5,2100
2026-03-02T10:00:10Z,1,GPU-bbbb,NVIDIA RTX PRO 6000 Blackwell Server Edition,ws-1,0.6,2100
"""
DMON = Path(__file__).parent / "data" / "replay" / "h100-dmon.txt"


def run(tmp_path: Path, recording: Path, ofu: str = "{}") -> tuple[str, list]:
    config = tmp_path / "c.yaml"
    out = tmp_path / "out.jsonl"
    config.write_text(f"""
receivers: {{replay: {{path: {recording}, speed: max}}}}
processors: {{ofu: {ofu}}}
exporters: {{file: {{path: {out}}}}}
service: {{exit_when_done: true, pipelines: {{metrics: {{receivers: [replay], processors: [ofu], exporters: [file]}}}}}}
""")
    done = subprocess.run([sys.executable, "-m", "otel_ofu", "run", "--config", str(config)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stderr, read_points(out)


def test_an_unknown_model_is_logged_once_with_what_to_set(tmp_path):
    recording = tmp_path / "ws.csv"
    recording.write_text(CSV)
    log, points = run(tmp_path, recording)
    assert log.count("is not in the spec table and reports no max SM clock") == 1  # 4 windows, 2 GPUs, 1 line
    assert "reference_clocks: {'NVIDIA RTX PRO 6000 Blackwell Server Edition': <MHz" in log
    assert not [p for p in points if p.name == "gpu.ofu"]
    assert {dict(p.attributes)["ofu.drop.reason"] for p in points if p.name == "gpu.ofu.dropped"} == \
        {"no_reference_clock"}
    log, points = run(tmp_path, recording, '{reference_clocks: {"NVIDIA RTX PRO 6000 Blackwell Server Edition": 2100}}')
    ofu = [p for p in points if p.name == "gpu.ofu"]
    assert len(ofu) == 4 and "not in the spec table" not in log
    assert {dict(p.attributes)["ofu.fref.source"] for p in ofu} == {"config"}


def test_samples_without_a_model_say_where_to_name_it_and_star_covers_them(tmp_path):
    log, points = run(tmp_path, DMON)  # dmon names no model and the config gives none
    assert log.count("GPU samples without a model name") == 1 and "replay receiver's model setting" in log
    log, points = run(tmp_path, DMON, '{reference_clocks: {"*": 1830}}')
    assert len([p for p in points if p.name == "gpu.ofu"]) > 0 and "without a model name" not in log
