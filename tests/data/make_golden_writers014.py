"""Writes the golden writer checkpoints of tests/test_writers_generations.py with torchrl 0.14.1.

Run once, from the repository root, with torchrl 0.14.1 (tensordict 0.14.3):

    /work/venvs/trl014/bin/python tests/data/make_golden_writers014.py

The writes are fixed (``torch.arange``, a fixed order of extends and ``write_at`` calls, no
random numbers), so the tests know the expected cursor, write count and slot generations
without these files; ``golden_trl014_writers.json`` records them all the same. Keep the
output small (it is committed).
"""
import json
import pathlib
import shutil

import torch
import torchrl
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, RoundRobinWriter, TensorDictMaxValueWriter

assert torchrl.__version__.startswith("0.14."), torchrl.__version__
HERE = pathlib.Path(__file__).parent


def tracking_writer():
    """A tracking round-robin writer of 5 slots after 7 extended items, a ``write_at`` of
    slots 1 and 3, and 2 more items: cursor 4, write count 11, generations [1, 2, 1, 2, 0]."""
    writer = RoundRobinWriter(track_generations=True)
    writer.register_storage(LazyTensorStorage(5))
    writer.extend(torch.arange(7.0))
    writer.write_at(torch.tensor([1, 3]), torch.tensor([10.0, 30.0]))
    writer.extend(torch.arange(7.0, 9.0))
    return writer


def max_value_writer():
    """A max-value writer of 3 slots after 5 ranked items: write count 4."""
    writer = TensorDictMaxValueWriter(rank_key="key")
    writer.register_storage(LazyTensorStorage(3))
    writer.extend(TensorDict({"key": torch.tensor([3.0, 1.0, 5.0, 0.0, 4.0])}, [5]))
    return writer


def main():
    record = {}
    for name, make in (("golden_trl014_round_robin_writer", tracking_writer), ("golden_trl014_max_value_writer", max_value_writer)):
        writer = make()
        target = HERE / name
        shutil.rmtree(target, ignore_errors=True)
        writer.dumps(target)
        record[name] = {"cursor": int(writer._cursor), "write_count": int(writer._write_count)}
    writer = tracking_writer()
    torch.save(writer.state_dict(), HERE / "golden_trl014_round_robin_writer_state_dict.pt")
    record["golden_trl014_round_robin_writer"]["generation"] = writer.generations_of(torch.arange(5)).tolist()
    (HERE / "golden_trl014_writers.json").write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
