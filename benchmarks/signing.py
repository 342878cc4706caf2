"""The cost of signing and verifying a 100 MB artifact, against the cost of hashing it, side by side in one process.

Run from the repository root:

    .venv/bin/python benchmarks/signing.py [--megabytes 100] [--repeats 21] [--results docs/results]

``--results DIR`` writes ``DIR/signing.json`` (the results file docs/artifacts.md renders).

The artifact is a real one (a tiny w4a4 MLP, trained, exported, saved and given
its regression set here, about 130 KB) padded to the requested size with one
file of random bytes in its ``regression/`` folder: the signature covers every
file and its cost is per byte, so where the bytes sit does not change it.
Timed, in interleaved rounds after one warm-up round (one call of each per
round, the order rotating; the files stay in the page cache throughout):

* ``sha256``: hashlib over every file in 1 MiB chunks: the hashing floor;
* ``sign_artifact``: :func:`stejax.artifacts.load_artifact` (which re-hashes
  the files the manifest lists, about 130 KB here, not the padding), then
  model-signing's hashing of every file, the ECDSA P-256 signature and the
  atomic write of ``model.sig``;
* ``verify_signature``: read the bundle, verify the ECDSA signature, re-hash
  every file and compare with the signed digests.

Medians are reported with their ratio to ``sha256``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path


def _sha256_tree(root: Path) -> str:
    total = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        total.update(h.digest())
    return total.hexdigest()


def _artifact(work: Path, megabytes: int) -> Path:
    from stejax.artifacts import save_artifact
    from stejax.export import export_run
    from stejax.regress import record
    from stejax.train import TrainConfig, train

    config = TrainConfig(
        model="mlp", preset="w4a4", hidden=(32, 32), dropout=0.0, batch_size=64, epochs=2, schedule="constant"
    )
    train(config, out_dir=work / "run")
    root = work / "artifact"
    save_artifact(export_run(work / "run"), root)
    record(root)
    size = sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
    padding = megabytes * 1_000_000 - size
    if padding > 0:
        (root / "regression" / "padding.bin").write_bytes(os.urandom(padding))
    return root


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=int, default=100, help="the artifact's size in MB (10^6 bytes)")
    parser.add_argument("--repeats", type=int, default=7, help="timed rounds after one warm-up round")
    parser.add_argument("--out", type=Path, default=None, help="also write the figures as JSON")
    parser.add_argument("--results", type=Path, default=None, metavar="DIR", help="write DIR/signing.json")
    args = parser.parse_args()

    from stejax.bench.results import Figure, Recorder

    recorder = Recorder(
        "signing",
        command=(
            f"python benchmarks/signing.py --megabytes {args.megabytes} --repeats {args.repeats} --results docs/results"
        ),
    )

    from stejax.artifacts import keygen, sign_artifact, verify_signature

    with tempfile.TemporaryDirectory(prefix="stejax-signing-bench-") as tmp:
        work = Path(tmp)
        root = _artifact(work, args.megabytes)
        private, public = keygen(work / "keys")
        size = sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
        sign_artifact(root, private)
        check = verify_signature(root, [public])
        assert check.fingerprint and "regression/padding.bin" in check.files
        operations = {
            "sha256": lambda: _sha256_tree(root),
            "sign_artifact": lambda: sign_artifact(root, private, replace=True),
            "verify_signature": lambda: verify_signature(root, [public]),
        }
        names = list(operations)
        times: dict[str, list[float]] = {name: [] for name in names}
        for round_ in range(args.repeats + 1):
            order = names[round_ % len(names) :] + names[: round_ % len(names)]
            for name in order:
                start = time.perf_counter()
                operations[name]()
                elapsed = time.perf_counter() - start
                if round_ > 0:
                    times[name].append(elapsed)
        verify_signature(root, [public])  # the last signature written still verifies

    medians = {name: statistics.median(t) for name, t in times.items()}
    base = medians["sha256"]
    print(f"artifact: {size:,} bytes ({size / 1e6:.1f} MB), {args.repeats} interleaved rounds after one warm-up")
    print(f"{'operation':<18} {'median s':>9} {'MB/s':>8} {'x sha256':>9}")
    for name in names:
        m = medians[name]
        print(f"{name:<18} {m:>9.3f} {size / 1e6 / m:>8.0f} {m / base:>9.2f}")
    if args.results is not None:
        labels = {
            "sha256": "sha256 of every file (hashlib)",
            "sign_artifact": "`sign_artifact` (verify, hash, ECDSA P-256, write)",
            "verify_signature": "`verify_signature` (ECDSA, re-hash, compare)",
        }
        recorder.write(
            args.results / "signing.json",
            rows=[
                {
                    "operation": labels[n],
                    "median_s": medians[n],
                    "mb_per_s": size / 1e6 / medians[n],
                    "vs_sha256": medians[n] / base,
                    "quartiles_s": [round(q, 4) for q in statistics.quantiles(times[n], n=4)[::2]],
                }
                for n in names
            ],
            columns=[
                ("operation", "operation"),
                ("median_s", "median s", "{:.3f}"),
                ("mb_per_s", "MB/s", "{:.0f}"),
                ("vs_sha256", "vs hashing", "{:.2f}×"),
                ("quartiles_s", "quartiles s"),
            ],
            figures={
                "sign_vs_sha256": Figure(medians["sign_artifact"] / base, f"{medians['sign_artifact'] / base:.2f}×"),
                "verify_vs_sha256": Figure(
                    medians["verify_signature"] / base, f"{medians['verify_signature'] / base:.2f}×"
                ),
            },
            notes=f"A {size / 1e6:.0f} MB artifact, files in the page cache; medians of {args.repeats} rounds.",
        )
    if args.out is not None:
        record = {
            "bytes": size,
            "repeats": args.repeats,
            "median_s": medians,
            "ratio_to_sha256": {n: medians[n] / base for n in names},
            "times_s": times,
            "machine": {"platform": platform.platform(), "python": sys.version.split()[0], "cpus": os.cpu_count()},
            "load_average": os.getloadavg(),
        }
        args.out.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
