"""The write journal records what was written, not the caller's index object.

Slice samplers on our storages follow the writes through the journal and read only the rows
written since their last call. A caller that edits its index tensor in place after a write
(``index += n``, a reused buffer) must not change which rows they read: here torchrl 0.11's
SliceSampler, which reads the whole storage at every call, is the reference.
"""
import numpy as np
import pytest
import torch
from tensordict import TensorDict

import torchrl.data.replay_buffers.samplers as trl_samplers
import torchrl.data.replay_buffers.storages as trl_storages

import torchrl_compat.samplers as our_samplers
import torchrl_compat.storages as our_storages
from torchrl_compat.storages._journal import ALL_ITEMS, JOURNAL_LENGTH, WriteJournal

CAPACITY = 40


def make_td(done, traj):
    n = done.shape[0]
    return TensorDict(
        {
            "obs": torch.arange(n, dtype=torch.float32),
            "traj": traj,
            ("next", "done"): done.reshape(n, 1),
        },
        batch_size=[n],
    )


def bounds(sampler, storage):
    start, stop, lengths = sampler._get_stop_and_length(storage)
    return start.tolist(), stop.tolist(), lengths.tolist()


@pytest.mark.parametrize("key", ["end_key", "traj_key"])
@pytest.mark.parametrize("reuse", ["add in place", "copy in place", "numpy view"])
def test_index_edited_after_a_write_keeps_the_bounds(key, reuse):
    kwargs = {"end_key": ("next", "done")} if key == "end_key" else {"traj_key": "traj"}
    ours = our_storages.LazyTensorStorage(CAPACITY)
    reference = trl_storages.LazyTensorStorage(CAPACITY)
    our_sampler = our_samplers.SliceSampler(slice_len=2, **kwargs)
    ref_sampler = trl_samplers.SliceSampler(slice_len=2, **kwargs)
    generator = torch.Generator().manual_seed(0)
    index = torch.arange(4)  # one buffer, reused by the caller for every write
    for step in range(12):
        done = torch.rand(4, generator=generator) < 0.4
        done[-1] = step % 3 == 2
        traj = torch.full((4,), step // 3) if key == "traj_key" else torch.zeros(4, dtype=torch.long)
        data = make_td(done, traj)
        for storage in (ours, reference):
            # (both storages keep the caller's object as their _last_cursor, torchrl's way:
            # at capacity, where the last write ends a trajectory, both read it as it is now)
            storage.set(index, data)
        # the caller moves its buffer on before the sampler reads the write
        if reuse == "add in place":
            index += 4
        elif reuse == "copy in place":
            index.copy_(torch.arange(4) + 4 * (step + 1))
        else:
            index.numpy()[:] = np.arange(4) + 4 * (step + 1)
        index %= CAPACITY
        if step % 2:  # some writes are read one at a time, some two at a time
            assert bounds(our_sampler, ours) == bounds(ref_sampler, reference), step
            seed = int(torch.randint(0, 2**31, (), generator=generator))
            for storage, sampler in ((ours, our_sampler), (reference, ref_sampler)):
                sampler._rng = torch.Generator().manual_seed(seed)
            ours_index, ours_info = our_sampler.sample(ours, 8)
            ref_index, ref_info = ref_sampler.sample(reference, 8)
            assert torch.equal(torch.stack(ours_index) if isinstance(ours_index, tuple) else ours_index,
                               torch.stack(ref_index) if isinstance(ref_index, tuple) else ref_index)


def test_journal_keeps_copies_of_the_indices():
    journal = WriteJournal(max_rows=100)
    journal.append(1, torch.arange(3))  # not followed yet: nothing recorded
    journal.follow()
    tensor, array, rows = torch.arange(3), np.arange(2, 4), [5, 6]
    for count, cursor in enumerate((tensor, array, rows, slice(1, 3), range(2), 9), start=2):
        journal.append(count, cursor)
    tensor += 10
    array += 10
    rows.append(7)
    cursors = journal.since(1, 7)
    assert cursors[0].tolist() == [0, 1, 2]
    assert cursors[1].tolist() == [2, 3] and cursors[2].tolist() == [5, 6]
    assert cursors[3:] == [slice(1, 3), range(2), 9]
    assert journal.since(0, 7) is None  # write 1 was made before anyone followed
    two_d = torch.arange(4).reshape(2, 2)
    journal.append(8, two_d)
    two_d += 1
    assert journal.since(7, 8)[0].tolist() == [[0, 1], [2, 3]]
    journal.append(9, ALL_ITEMS)
    assert journal.since(9, 9) == [] and journal.since(10, 9) is None
    journal.append(10, [[1, 2], [3]])  # ragged: no rows to keep, readers read everything
    assert journal.since(9, 10) is None
    journal.append(11, 4)
    assert journal.since(10, 11) == [4]
    journal.append(12, ALL_ITEMS)
    assert journal.since(11, 12) is None


def test_journal_is_bounded_by_rows_and_length():
    journal = WriteJournal(max_rows=10)
    journal.follow()
    for count in range(1, 4):
        journal.append(count, torch.arange(6))
    assert journal.rows == 6 and journal.since(2, 3)[0].tolist() == list(range(6))
    assert journal.since(1, 3) is None
    journal = WriteJournal(max_rows=1000)
    journal.follow()
    for count in range(4, 4 + 2 * JOURNAL_LENGTH):
        journal.append(count, count)
    now = 3 + 2 * JOURNAL_LENGTH
    assert len(journal.since(now - JOURNAL_LENGTH, now)) == JOURNAL_LENGTH
    assert journal.since(now - JOURNAL_LENGTH - 1, now) is None


def test_storage_journals_only_once_followed():
    storage = our_storages.LazyTensorStorage(10)
    data = make_td(torch.zeros(2, dtype=torch.bool), torch.zeros(2, dtype=torch.long))
    storage.set(torch.arange(2), data)
    assert "_journal" not in storage.__dict__  # nobody reads: writes record nothing
    now, _ = storage._writes_since(None)
    index = torch.arange(2, 4)
    storage.set(index, data)
    index += 5
    assert [c.tolist() for c in storage._writes_since(now)[1]] == [[2, 3]]
