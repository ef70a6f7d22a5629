import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tag.graph import OpGraph


def make_graph(edges, *, n=None, flops=None, split=None, role=None, param_bytes=None, batch_scaled=None, edge_bytes=None):
    """A small OpGraph from an edge list; unspecified columns get simple defaults."""
    n = n if n is not None else (max(max(e) for e in edges) + 1 if edges else 1)
    src = [a for a, _ in edges]
    dst = [b for _, b in edges]
    return OpGraph(
        names=[f"op{i}" for i in range(n)],
        kinds=["aten.test"] * n,
        role=role if role is not None else [1] * n,
        flops=flops if flops is not None else [float(10 * (i + 1)) for i in range(n)],
        bytes_accessed=[8.0] * n,
        output_bytes=[4.0] * n,
        param_bytes=param_bytes if param_bytes is not None else [0.0] * n,
        batch_scaled=batch_scaled if batch_scaled is not None else [True] * n,
        split=split if split is not None else [0] * n,
        edge_src=src,
        edge_dst=dst,
        edge_bytes=edge_bytes if edge_bytes is not None else [4.0] * len(edges),
        batch_size=4,
    )


def random_dag(rng: np.random.Generator, n: int, p: float = 0.3):
    edges = [(i, j) for i in range(n) for j in range(i + 1, n) if rng.random() < p]
    perm = rng.permutation(n)  # relabel so index order is not a topological order
    return [(int(perm[a]), int(perm[b])) for a, b in edges]


@pytest.fixture
def diamond():
    #   0 -> 1 -> 3
    #   0 -> 2 -> 3
    return make_graph([(0, 1), (0, 2), (1, 3), (2, 3)])


def run(capsys, *argv):
    """`tag ARGV` in-process: (exit code, stdout, stderr)."""
    from tag.cli import main

    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def run_json(capsys, *argv):
    """`tag ARGV --json`, which must succeed; its JSON."""
    code, out, err = run(capsys, *argv, "--json")
    assert code == 0, err
    return json.loads(out)


@pytest.fixture
def without_numba():
    """A runner of Python scripts in a fresh interpreter with numba off (``TAG_NO_NUMBA``): the kernels run
    as plain Python. A script that fails fails the test, with its stderr."""
    def run(script: str, timeout: float = 300) -> None:
        done = subprocess.run([sys.executable, "-c", script], env=dict(os.environ, TAG_NO_NUMBA="1"),
                              capture_output=True, text=True, timeout=timeout)
        assert done.returncode == 0, done.stderr

    return run


@pytest.fixture(scope="module")
def pool():
    """Four rank processes kept alive for a test module's runs (tag.execute): start-up paid once."""
    from tag.execute import WorkerPool

    with WorkerPool(4) as workers:
        yield workers
