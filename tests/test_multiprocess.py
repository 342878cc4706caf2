"""Two processes on loopback, joined by jax.distributed over CPU (gloo) collectives, against one process.

Two subprocesses run this file as a script (:func:`main`) while the test process
itself runs the one-process reference:

* ``single``: ``stejax train --config tiny.json --out single`` on one device, in the
  test process (one process, one device: no interpreter of its own needed);
* ``pair`` 0 and 1: ``stejax train --config tiny.json --coordinator 127.0.0.1:PORT
  --num-processes 2 --process-id I --out pair``, each process with 2 CPU devices,
  so the batch is split over a 4-device mesh spanning both processes; then, still
  joined, 8 QAT (w4a4) steps on that mesh with the parameters split across the
  processes (``"sharded"``), each from the same state as a one-device step
  computed locally (teacher forcing).

Each writes a JSON file; the tests compare. Stated tolerances, as in
``test_sharding.py`` and for the same reason (the gradient's batch sum is done
as partial sums plus an all-reduce, here over gloo): per-epoch losses of the float
run to rtol 1e-5, its parameters to atol 1e-5 (they are O(1)) and the same test
accuracy; each teacher-forced QAT step's loss to rtol 1e-6 and parameters to
atol 1e-6. The float recipe keeps dropout on, so the key stream is exercised too.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

LOCAL_DEVICES = 2
STEPS = 8
TINY = {"preset": "float", "model": "mlp", "hidden": [32], "dropout": 0.1, "batch_size": 64, "epochs": 1}
TINY["patience"] = None
LOSS_RTOL, PARAM_ATOL = 1e-5, 1e-5
STEP_LOSS_RTOL, STEP_PARAM_ATOL = 1e-6, 1e-6


# ----------------------------------------------------------------------------- the subprocesses


def _teacher_forced(out: dict) -> None:
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    from stejax.data import Normalizer
    from stejax.model import init_params
    from stejax.train import (
        Batch,
        TrainConfig,
        compiled_parallel_update,
        compiled_update,
        data_mesh,
        gather,
        load_splits,
        make_optimizer,
        param_shardings,
        place,
        shard_batch,
    )

    config = TrainConfig.from_dict({**TINY, "preset": "w4a4"})
    splits = load_splits(config)
    x = Normalizer.fit(splits.train.x).apply(splits.train.x)
    y = np.asarray(splits.train.y)
    mc, qc = config.model_config(splits.train), config.qat_config()
    optimizer = make_optimizer(config, 19)
    mesh = data_mesh()
    one = compiled_update(mc, qc, optimizer)
    # Parameters split over the processes' devices, so gather() must all-gather across processes.
    many = compiled_parallel_update(mc, qc, optimizer, mesh, "sharded")
    # The one-device reference runs on this process's first device.
    local = jax.local_devices()[0]
    params = jax.device_put(init_params(jax.random.key(0), mc, qc, calibration_batch=x[:256]), local)
    state = jax.device_put(optimizer.init(params), local)
    loss_rel, param_abs = 0.0, 0.0
    for i in range(STEPS):
        batch = Batch(x[64 * i : 64 * (i + 1)], y[64 * i : 64 * (i + 1)])
        key = jax.random.fold_in(jax.random.key(1), i)
        p_many, _, m_many = many(
            place(params, param_shardings(params, mesh, "sharded")),
            place(state, param_shardings(state, mesh, "sharded")),
            shard_batch(batch, mesh),
            place(key, NamedSharding(mesh, PartitionSpec())),
        )
        params, state, m_one = one(params, state, jax.device_put(batch, local), jax.device_put(key, local))
        loss_rel = max(loss_rel, abs(float(m_many.loss) / float(m_one.loss) - 1))
        diffs = jax.tree.map(lambda a, b: float(np.max(np.abs(np.asarray(a) - b))), params, gather(p_many))
        param_abs = max(param_abs, *jax.tree.leaves(diffs))
    split = [not leaf.is_fully_addressable for leaf in jax.tree.leaves(p_many)]
    out["forced"] = {"loss_rel": loss_rel, "param_abs": param_abs, "devices": mesh.size, "split_leaves": sum(split)}


def main(argv: list[str]) -> None:
    import jax

    role, tmp = argv[0], Path(argv[1])
    jax.config.update("jax_numpy_dtype_promotion", "strict")
    jax.config.update("jax_numpy_rank_promotion", "raise")
    from stejax.cli import main as cli

    args = ["train", "--config", str(tmp / "tiny.json")]
    if role == "single":
        args += ["--out", str(tmp / "single")]
    else:
        process_id, port = int(argv[2]), int(argv[3])
        jax.config.update("jax_num_cpu_devices", LOCAL_DEVICES)
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        args += ["--out", str(tmp / "pair"), "--coordinator", f"127.0.0.1:{port}"]
        args += ["--num-processes", "2", "--process-id", str(process_id)]
    cli.main(args, standalone_mode=False)
    out = {"process_count": jax.process_count(), "device_count": jax.device_count()}
    if role != "single":
        _teacher_forced(out)
        out["process_index"] = jax.process_index()
    (tmp / f"{role}{argv[2] if role != 'single' else ''}.json").write_text(json.dumps(out))


# ----------------------------------------------------------------------------- the tests


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("multiprocess")
    (tmp / "tiny.json").write_text(json.dumps(TINY))
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    port = str(_free_port())
    commands = {"pair0": ["pair", "0", port], "pair1": ["pair", "1", port]}
    procs = {
        name: subprocess.Popen(
            [sys.executable, __file__, args[0], str(tmp), *args[1:]],
            env=env,
            cwd=Path(__file__).parent,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name, args in commands.items()
    }
    try:
        # The one-process reference runs here while the pair trains, on the CPU as the pair does.
        import jax

        with jax.default_device(jax.devices("cpu")[0]):
            main(["single", str(tmp)])
        outputs = {name: p.communicate(timeout=300) for name, p in procs.items()}
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
    for name, p in procs.items():
        assert p.returncode == 0, f"{name}: {outputs[name][1][-4000:]}"
    result = {name: json.loads((tmp / f"{name}.json").read_text()) for name in ("single", *commands)}
    result["tmp"] = tmp
    return result


def _run(path: Path):
    from safetensors.numpy import load_file

    metrics = [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]
    return metrics, load_file(str(path / "params.safetensors")), json.loads((path / "report.json").read_text())


def test_the_two_processes_form_one_four_device_mesh(runs):
    for name in ("pair0", "pair1"):
        assert runs[name]["process_count"] == 2 and runs[name]["device_count"] == 2 * LOCAL_DEVICES
        assert runs[name]["forced"]["devices"] == 2 * LOCAL_DEVICES
        assert runs[name]["forced"]["split_leaves"] > 0, "no parameter was split across the processes"
    assert {runs["pair0"]["process_index"], runs["pair1"]["process_index"]} == {0, 1}
    assert runs["single"]["process_count"] == 1


def test_the_two_process_run_matches_the_single_process_run(runs):
    single_metrics, single_params, single_report = _run(runs["tmp"] / "single")
    pair_metrics, pair_params, pair_report = _run(runs["tmp"] / "pair")
    for field in ("train_loss", "val_loss"):
        np.testing.assert_allclose(
            [m[field] for m in pair_metrics], [m[field] for m in single_metrics], rtol=LOSS_RTOL, err_msg=field
        )
    assert sorted(pair_params) == sorted(single_params)
    for name, value in single_params.items():
        np.testing.assert_allclose(pair_params[name], value, rtol=0, atol=PARAM_ATOL, err_msg=name)
    assert pair_report["test_accuracy"] == single_report["test_accuracy"]
    assert (pair_report["devices"], pair_report["processes"]) == (2 * LOCAL_DEVICES, 2)
    assert (single_report["devices"], single_report["processes"]) == (1, 1)


def test_each_qat_step_across_processes_equals_the_one_device_step(runs):
    for name in ("pair0", "pair1"):
        forced = runs[name]["forced"]
        assert forced["loss_rel"] <= STEP_LOSS_RTOL and forced["param_abs"] <= STEP_PARAM_ATOL, forced


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    main(sys.argv[1:])
