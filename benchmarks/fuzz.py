"""The long fuzz run: at least 100,000 inputs per parser of outside input (BENCHMARKS.md, Fuzzing).

Each parser of benchmarks/fuzz_targets.py runs in its own process (so its peak memory is its
own) on seeded, valid-then-mutated inputs, each under a time bound (an alarm: a parser still
running after ``--hang-ms`` counts as a hang and the run goes on). Prints per parser:
``inputs``, ``crashes``, ``hangs``, ``max_ms``, ``max_rss_mb`` (and ``accepted``, ``rejected``,
the first distinct crashes).

Every run takes a new seed unless ``--seed`` gives one, and prints it first: "0 crashes" is then
a claim about many seeds, not one, and any run can be repeated exactly (a parser's inputs
depend only on the seed and the parser's name, not on which other parsers run). Crashing and
hanging inputs are kept as files (``--save DIR``, by default ``<tmp>/otel-ofu-fuzz/<seed>``),
to turn into a regression test (tests/test_fuzz.py); ``--input FILE --parsers NAME`` runs one
of them again and shows its traceback.

    .venv/bin/python benchmarks/fuzz.py --json --jobs 2           # 100,000 per parser, a new seed
    .venv/bin/python benchmarks/fuzz.py --seed 1234 --parsers config_yaml --inputs 20000   # repeat one
    .venv/bin/python benchmarks/fuzz.py --parsers config_yaml --input /tmp/otel-ofu-fuzz/1234/config_yaml-crash-17.bin
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import zlib
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


class Hang(Exception):
    pass


def _alarm(_signum, _frame):
    raise Hang


def parser_seed(seed: int, name: str) -> int:
    """The seed of one parser's inputs: the run's seed and the parser's name, nothing else."""
    return (seed + zlib.crc32(name.encode())) % 2**63


def run_input(name: str, path: Path) -> int:
    """Run one saved input through one parser, as the fuzz run did; its traceback if it crashes."""
    from fuzz_targets import TARGETS

    target = TARGETS[name]
    target.start()
    try:
        print(f"{name} {path}: {target.run(path.read_bytes())}")
    except Exception:
        traceback.print_exc()
        return 1
    finally:
        target.stop()
    return 0


def fuzz_one(name: str, inputs: int, seed: int, hang_ms: float, save: Path | None) -> dict:
    import logging

    from fuzz_targets import TARGETS

    logging.disable(logging.CRITICAL)  # rejections are logged by the components; not the point here
    target = TARGETS[name]
    rng = random.Random(parser_seed(seed, name))
    target.start()
    signal.signal(signal.SIGALRM, _alarm)
    seeds = target.seeds()
    if seeds:  # once, untimed and uncounted: the imports a first input pulls in are not the parser's time
        try:
            target.run(seeds[0])
        except Exception:  # noqa: S110 (counted when it comes round as input 0)
            pass
    corpus = list(seeds)
    counts = {"accepted": 0, "rejected": 0}
    crashes = hangs = 0
    distinct: dict[str, dict] = {}
    max_ms = 0.0
    started = time.monotonic()
    try:
        for i in range(inputs):
            data = seeds[i] if i < len(seeds) else target.generate(rng, corpus)
            signal.setitimer(signal.ITIMER_REAL, hang_ms / 1000.0)
            t0 = time.perf_counter()
            try:
                outcome = target.run(data)
                counts[outcome] += 1
                if outcome == "accepted" and len(corpus) < 500 and rng.random() < 0.05:
                    corpus.append(data)
            except Hang:
                hangs += 1
                _keep(save, name, "hang", i, data)
            except Exception as exc:
                crashes += 1
                frame = traceback.extract_tb(exc.__traceback__)[-1]
                key = f"{type(exc).__name__} at {Path(frame.filename).name}:{frame.lineno}"
                if key not in distinct:
                    distinct[key] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}", "where": key,
                                     "input_file": _keep(save, name, "crash", i, data)}
                elif save is not None and crashes < 200:
                    _keep(save, name, "crash", i, data)
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            max_ms = max(max_ms, (time.perf_counter() - t0) * 1000.0)
    finally:
        target.stop()
    return {"parser": name, "description": target.description, "inputs": inputs, "crashes": crashes,
            "hangs": hangs, "max_ms": round(max_ms, 2),
            "max_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, 1),
            **counts, "seconds": round(time.monotonic() - started, 1), "distinct_crashes": list(distinct.values())}


def _keep(save: Path | None, name: str, kind: str, index: int, data: bytes) -> str | None:
    if save is None:
        return None
    save.mkdir(parents=True, exist_ok=True)
    path = save / f"{name}-{kind}-{index}.bin"
    path.write_bytes(data)
    return str(path)


def main() -> None:
    from fuzz_targets import TARGETS

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--inputs", type=int, default=100_000, help="inputs per parser (default 100,000)")
    parser.add_argument("--parsers", default=",".join(TARGETS), help="comma-separated; default: all")
    parser.add_argument("--seed", type=int, help="repeat the run of this seed (default: a new one, printed)")
    parser.add_argument("--hang-ms", type=float, default=2000.0, help="an input taking longer is a hang")
    parser.add_argument("--jobs", type=int, default=1, help="parsers fuzzed at once")
    parser.add_argument("--save", type=Path, help="keep crashing and hanging inputs in this directory (default: "
                        "<tmp>/otel-ofu-fuzz/<seed>)")
    parser.add_argument("--input", type=Path, help="run this one saved input through --parsers (one name) and exit")
    parser.add_argument("--json", action="store_true", help="print the JSON object only")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # the child: fuzz one parser, print its JSON
    args = parser.parse_args()
    if args.one:
        print(json.dumps(fuzz_one(args.one, args.inputs, args.seed, args.hang_ms, args.save)))
        return
    names = [n for n in args.parsers.split(",") if n]
    unknown = [n for n in names if n not in TARGETS]
    if unknown:
        parser.error(f"unknown parser(s) {unknown}; known: {', '.join(TARGETS)}")
    if args.input:
        if len(names) != 1:
            parser.error("--input needs one parser: --parsers NAME (the name the saved file starts with)")
        sys.exit(run_input(names[0], args.input))
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(2**32)
    save = args.save or Path(tempfile.gettempdir()) / "otel-ofu-fuzz" / str(args.seed)
    print(f"fuzz seed {args.seed} (repeat: --seed {args.seed}); crashing inputs go to {save}", file=sys.stderr,
          flush=True)
    results: dict[str, dict] = {}
    pending = list(names)
    running: list[tuple[str, subprocess.Popen]] = []
    started = time.monotonic()
    while pending or running:
        while pending and len(running) < args.jobs:
            name = pending.pop(0)
            cmd = [sys.executable, __file__, "--one", name, "--inputs", str(args.inputs),
                   "--seed", str(args.seed), "--hang-ms", str(args.hang_ms), "--save", str(save)]
            # A fixed hash seed: set and dict orders are part of what the generators draw from.
            env = {**os.environ, "PYTHONHASHSEED": "0"}
            running.append((name, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                                   env=env)))
        for name, proc in list(running):
            if proc.poll() is None:
                continue
            out, err = proc.communicate()
            running.remove((name, proc))
            try:
                results[name] = json.loads(out.strip().splitlines()[-1])
            except (ValueError, IndexError):  # the child itself died: a crash of the harness or a hard crash
                results[name] = {"parser": name, "inputs": 0, "crashes": 1, "hangs": 0, "max_ms": None,
                                 "max_rss_mb": None, "died": proc.returncode, "stderr": err[-2000:]}
            if not args.json:
                r = results[name]
                print(f"{name:24} inputs {r['inputs']:>7}  crashes {r['crashes']:>4}  hangs {r['hangs']:>3}  "
                      f"max {r['max_ms']} ms  rss {r['max_rss_mb']} MB  ({r.get('seconds', '?')} s)", flush=True)
        time.sleep(0.2)
    summary = {"inputs_per_parser": args.inputs, "seed": args.seed, "saved_to": str(save), "hang_ms": args.hang_ms,
               "seconds": round(time.monotonic() - started, 1), "cpu": os.cpu_count(),
               "parsers": {n: results[n] for n in names}}
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        total = sum(r["crashes"] + r["hangs"] for r in results.values())
        print(f"{len(names)} parsers, {total} crashes or hangs in {summary['seconds']} s (seed {args.seed}"
              + (f"; inputs kept in {save}" if total else "") + ")")
    sys.exit(1 if any(r["crashes"] or r["hangs"] for r in results.values()) else 0)


if __name__ == "__main__":
    main()
