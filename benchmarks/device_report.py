"""Turn a hardware run's output folder into the tables BENCHMARKS.md records, with a verdict.

    python benchmarks/device_report.py device-out            # Markdown on stdout
    python benchmarks/device_report.py device-out --json     # the verdicts as one JSON object

Reads what ``benchmarks/device_run.sh`` writes (device_run.json, doctor.json, gpu_check.json,
gemm_validation.json) and prints, per precision and GEMM shape, MFU, raw and corrected OFU
and the gaps in pp; the fitted tile factor per precision with its 95 % interval next to the
factor in ``otel_ofu/core/tiles.py``, and whether they differ by more than that interval; the
point-sampled against the averaged clock; and the long GEMM's clocks against the spec
table's entry for the GPU. A folder from a run without a GPU gives "no GPU" and exit 0.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from otel_ofu.core import tiles


def load(folder: Path, name: str) -> dict[str, Any] | None:
    """A step's JSON, or None when the step left none (not run, timed out, or not JSON)."""
    path = folder / name
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def factor_verdicts(gemm: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per "arch/precision": fitted factor, its 95 % half-width, the tiles.py factor, and the verdict."""
    out = {}
    for key, fit in (gemm.get("fit") or {}).items():
        arch, _, precision = key.partition("/")
        table = tiles.correction_factor(arch, precision)
        diff = fit["factor"] - table
        ci95 = fit.get("ci95")
        if ci95 is None:
            verdict = "cannot tell: one shape, no uncertainty"
        elif abs(diff) > ci95:
            verdict = "differs: outside the fit's 95 % interval"
        else:
            verdict = "agrees: within the fit's 95 % interval"
        out[key] = {"fitted": fit["factor"], "ci95": ci95, "se": fit.get("se"), "n": fit["n"], "table": table,
                    "difference": diff, "differs": ci95 is not None and abs(diff) > ci95, "verdict": verdict}
    return out


def _pct(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{100 * value:.{digits}f}"


def _pp(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:+.{digits}f}"


def _num(value: Any, digits: int = 0) -> str:
    return "-" if not isinstance(value, (int, float)) else f"{value:.{digits}f}"


def gemm_tables(gemm: dict[str, Any]) -> list[str]:
    rows = gemm.get("rows") or []
    primary = gemm.get("fitted_from")
    lines = []
    if gemm.get("notes"):
        lines += ["Notes from the run:", ""] + [f"- {note}" for note in gemm["notes"]] + [""]
    if not rows:
        lines += ["No OFU rows (no OFU source produced windows inside the GEMM runs)."]
        if gemm.get("gemms"):
            lines += ["", "| precision | M x N x K | kind | MFU % |", "|---|---|---|---|"]
            lines += [f"| {g['precision']} | {'x'.join(map(str, g['shape']))} | "
                      f"{'ragged' if g['ragged'] else 'aligned'} | {_pct(g['mfu'])} |" for g in gemm["gemms"]]
        return lines
    lines += [f"OFU against MFU, source `{primary}` (the fit's source):", "",
              "| precision | M x N x K | kind | MFU % | raw OFU % | corrected OFU % | raw - MFU, pp "
              "| corrected - MFU, pp | windows |",
              "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["source"] != primary:
            continue
        kind = "ragged" if r["ragged"] else "aligned"
        lines.append(f"| {r['precision']} | {'x'.join(map(str, r['shape']))} | {kind} | {_pct(r['mfu'])} | "
                     f"{_pct(r['raw'])} | {_pct(r['corrected'])} | {_pp(100 * (r['raw'] - r['mfu']))} | "
                     f"{_pp(100 * (r['corrected'] - r['mfu']))} | {r['windows']} |")
    verdicts = factor_verdicts(gemm)
    if verdicts:
        lines += ["", "Fitted tile factor per precision (MFU ~ c x raw OFU through the origin, over the shapes above):",
                  "", "| precision | fitted c | 95 % interval | n | tiles.py | fitted - tiles.py | verdict |",
                  "|---|---|---|---|---|---|---|"]
        for key, v in verdicts.items():
            ci = "-" if v["ci95"] is None else f"+-{v['ci95']:.4f}"
            lines.append(f"| {key} | {v['fitted']:.4f} | {ci} | {v['n']} | {v['table']:.3f} | {v['difference']:+.4f} "
                         f"| {v['verdict']} |")
    points = [r for r in rows if r.get("raw_point") is not None]
    if points:
        lines += ["", f"Point-sampled against averaged clock (source `{points[0]['source']}`, clock every 100 ms; "
                  "point = the last sample of each window):", "",
                  "| precision | M x N x K | raw OFU %, averaged clock | raw OFU %, point clock "
                  "| point - averaged, pp |",
                  "|---|---|---|---|---|"]
        lines += [f"| {r['precision']} | {'x'.join(map(str, r['shape']))} | {_pct(r['raw'])} | {_pct(r['raw_point'])} "
                  f"| {_pp(100 * (r['raw_point'] - r['raw']), 3)} |" for r in points]
    return lines


def gpu_check_tables(check: dict[str, Any]) -> list[str]:
    summary = check.get("summary") or {}
    lines = [f"{check.get('size')}^3 {check.get('dtype')} GEMMs for {check.get('seconds'):g} s, "
             f"{check.get('window_s'):g} s windows (receiver clock every {check.get('clock_interval_s'):g} s, "
             f"point clock every {check.get('point_interval_s'):g} s)" + (": **interrupted**" if check.get(
                 "interrupted") else "") + ".", ""]
    if check.get("error"):
        lines += [f"Error: {check['error']}", ""]
    windows = check.get("windows") or []
    t0 = windows[0]["end_unix_s"] - windows[0]["window_s"] if windows else 0.0
    lines += ["| window end, s | TPA | clock, receiver | clock, point | min | max | raw OFU % | raw OFU %, point "
              "| corrected OFU % | MFU % | corrected - MFU, pp |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for w in windows:
        lines.append(f"| {w['end_unix_s'] - t0:.1f} | {_num(w['tpa'], 4)} | {_num(w['clock_receiver_mhz'])} | "
                     f"{_num(w['clock_point_mhz'])} | {_num(w['clock_min_mhz'])} | {_num(w['clock_max_mhz'])} | "
                     f"{_pct(w['ofu_raw'])} | {_pct(w['ofu_raw_point'])} | {_pct(w['ofu_corrected'])} | "
                     f"{_pct(w['mfu'])} | {_pp(w['gap_corrected_pp'])} |")
    if "gap_corrected_pp_mean" in summary:
        lines += ["", f"Steady windows ({summary['windows_with_ofu']}): MFU {_pct(summary['mfu_mean'])} %, raw OFU "
                  f"{_pct(summary['ofu_raw_mean'])} %, corrected {_pct(summary['ofu_corrected_mean'])} %, gap raw "
                  f"{_pp(summary['gap_raw_pp_mean'])} pp, corrected {_pp(summary['gap_corrected_pp_mean'])} pp; "
                  f"implied factor {summary['implied_factor']:.4f}."]
    pva = summary.get("point_vs_averaged")
    if pva and pva.get("windows"):
        lines += [f"Point - averaged clock, raw OFU: mean {_pp(pva['point_minus_averaged_pp_mean'], 3)} pp, std "
                  f"{_num(pva['point_minus_averaged_pp_std'], 3)} pp, max |.| "
                  f"{_num(pva['point_minus_averaged_pp_max_abs'], 3)} pp over {pva['windows']} windows."]
    clocks = summary.get("clocks_under_gemm")
    if clocks:
        lines += [f"SM clock under the GEMM ({clocks['samples']} samples): min {clocks['min_mhz']:.0f}, mean "
                  f"{clocks['mean_mhz']:.0f}, median {clocks['median_mhz']:.0f}, max {clocks['max_mhz']:.0f} MHz; "
                  "most seen: " + ", ".join(f"{mhz:.0f} MHz x{n}" for mhz, n in clocks["most_seen"]) + "."]
    spec = summary.get("spec_check")
    device = check.get("device") or {}
    if spec:
        lines += ["", f"Spec table entry `{spec['spec']}` against the GPU:", "", "| figure | spec table | measured |",
                  "|---|---|---|",
                  f"| max SM clock, MHz | {_num(spec['spec_max_sm_clock_mhz'])} | "
                  f"{_num(spec['nvml_max_sm_clock_mhz'])} (NVML max); boost "
                  f"{_num(device.get('max_customer_boost_mhz'))}, default application "
                  f"{_num(device.get('default_application_sm_clock_mhz'))} |",
                  f"| tensor reference clock f_ref, MHz | {_num(spec['spec_tensor_ref_clock_mhz'])} | "
                  f"clock under GEMM: mean {_num((clocks or {}).get('mean_mhz'))} |",
                  f"| SMs | {spec['spec_sm_count']} | {spec['torch_sm_count']} (torch) |",
                  f"| dense {check.get('dtype')} peak, TFLOP/s | {_num(spec['spec_peak_tflops'], 1)} | achieved "
                  f"{_num(summary.get('achieved_tflops_mean'), 1)} (MFU at the run's clock "
                  f"{_pct(spec['mfu_at_run_clock'])} %) |",
                  f"| dense FLOP per SM per clock | {_num(spec['spec_flop_per_sm_clock'])} | implied by TPA "
                  f"{_num(summary.get('implied_flop_per_sm_clock'))} |"]
    return lines


def report(folder: Path) -> tuple[str, dict[str, Any]]:
    """Markdown and the verdicts for one output folder."""
    run = load(folder, "device_run.json") or {}
    gemm = load(folder, "gemm_validation.json")
    check = load(folder, "gpu_check.json")
    doctor = load(folder, "doctor.json")
    gpu = bool(run.get("gpu")) if run else bool(check and check.get("gpu"))
    verdict: dict[str, Any] = {"gpu": gpu, "factors": {}, "steps": {s["name"]: s["status"] for s in
                                                                   run.get("steps", [])}}
    lines = ["## Hardware run" + (f": {run.get('gpu_name')}" if run.get("gpu_name") else "")]
    if not gpu:
        reason = run.get("gpu_reason") or (check or {}).get("reason") or "no GPU"
        lines += ["", f"No GPU measurement: {reason}."]
        for step in run.get("steps", []):
            if step["status"] != "pending":
                lines.append(f"- {step['name']}: {step['status']}: {step['message']}")
        return "\n".join(lines) + "\n", verdict
    device = (check or {}).get("device") or (gemm or {}).get("device") or {}
    lines += ["", f"Date (UTC): {run.get('started_utc', '?')}; GPU: {device.get('name', '?')} "
              f"({device.get('sm_count')} SMs), driver {device.get('driver', '?')}, CUDA {device.get('cuda', '?')}, "
              f"torch {device.get('torch', '?')}; command: `{run.get('command', 'benchmarks/device_run.sh')}`."]
    if doctor is not None:
        lines += [f"Doctor: best source {doctor.get('best_source')}; " + "; ".join(
            f"{c['name']}: {c['status']}" for c in doctor.get("checks", []))]
    lines += ["", "Steps: " + ", ".join(f"{s['name']} {s['status']} ({s['seconds']:.0f} s)"
                                        for s in run.get("steps", []) if s["status"] != "pending")]
    lines += ["", "### GEMM validation (`gemm_validation.py --quick`)", ""]
    if gemm is None or gemm.get("dry_run"):
        lines.append("No GEMM validation output.")
    else:
        lines += gemm_tables(gemm)
        verdict["factors"] = factor_verdicts(gemm)
    lines += ["", "### Long GEMM (`gpu_check.py`)", ""]
    if check is None or not check.get("gpu"):
        lines.append("No gpu_check output.")
    else:
        lines += gpu_check_tables(check)
        verdict["gpu_check"] = check.get("summary", {})
    differs = [k for k, v in verdict["factors"].items() if v["differs"]]
    verdict["update_tiles"] = bool(differs)
    tiles = "otel_ofu/core/tiles.py"
    lines += ["", "**Tile factors**: " + (f"{', '.join(differs)} differ(s) from {tiles} by more than the "
                                          "fit's 95 % interval: update the Hopper factors." if differs else
                                          f"no fitted factor differs from {tiles} by more than the fit's "
                                          "95 % interval." if verdict["factors"] else "no fit.")]
    return "\n".join(lines) + "\n", verdict


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="the run's output folder ($OUT of benchmarks/device_run.sh)")
    parser.add_argument("--json", action="store_true", help="the verdicts as JSON instead of Markdown")
    args = parser.parse_args(argv)
    if not args.folder.is_dir():
        print(f"device_report: {args.folder} is not a folder", file=sys.stderr)
        return 2
    markdown, verdict = report(args.folder)
    print(json.dumps({**verdict, "markdown": markdown}) if args.json else markdown, end="" if not args.json else "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
