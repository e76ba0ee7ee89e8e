"""The machinery behind :class:`~torchrl_compat.RayReplayBuffer` (the public module is
:mod:`torchrl_compat.ray_buffer`): the shard actors (:mod:`.shard`), how writes, draws and
updates are routed to them (:mod:`.routing`), the reservations of write ranges
(:mod:`.writes`) and how batches travel through Ray's object store (:mod:`.wire`).
"""
