"""What the storage tests share: a call made on this library's storages and on torchrl's,
and the error each raised."""
import pytest
import torchrl.data.replay_buffers.storages as T

import torchrl_compat.storages as O

# this library's storages first, then torchrl's
FAMILIES = (O, T)


def refusals(error, build):
    """The messages of the ``error`` that ``build(family)`` raises, for each of ``FAMILIES``
    (both must raise it)."""
    messages = []
    for family in FAMILIES:
        with pytest.raises(error) as info:
            build(family)
        messages.append(str(info.value))
    return messages
