"""The transform chain of a replay buffer: torchrl's classes, or a stand-in without torchrl.

A buffer applies its transform (a ``Compose``) to every sampled batch and its inverse to
every batch written. With torchrl installed these are torchrl's own ``Compose``,
``Transform``, ``_CallableTransform`` and ``_InvertTransform``, so that any torchrl
transform behaves in our buffers as in torchrl's. Without it, the classes below give the
same behaviour to what can then be passed: callables on tensordicts (or pytrees), and
the transforms ``append_transform(..., invert=True)`` builds from them. They are
``nn.Module`` chains stored under ``transforms``, so their ``state_dict`` keys are
torchrl's.
"""
from __future__ import annotations

from torch import nn
from torch.utils._pytree import tree_map

from torchrl_compat._torchrl_lookup import torchrl_module

__all__ = ["CallableTransform", "check_transform_arguments", "Compose", "InvertTransform", "make_transform", "Transform"]


def _shallow_clone(data):
    """A new container holding the same leaves, as torchrl's ``Transform.inv`` makes."""
    try:
        return data.clone(recurse=False)
    except (AttributeError, TypeError):
        return tree_map(lambda leaf: leaf, data)


class _Transform(nn.Module):
    """A transform of buffer data: ``forward`` on samples, ``inv`` on written batches."""

    def forward(self, tensordict):
        return self._call(tensordict)

    def _call(self, tensordict):
        return tensordict

    def _inv_call(self, tensordict):
        return tensordict

    def inv(self, tensordict):
        return self._inv_call(_shallow_clone(tensordict))


class _CallableTransform(_Transform):
    """Wraps a callable: applied to samples, not inverted on writes."""

    def __init__(self, func):
        super().__init__()
        self.func = func

    def forward(self, *args, **kwargs):
        return self.func(*args, **kwargs)

    def _call(self, tensordict):
        return self.func(tensordict)


class _InvertTransform(_Transform):
    """Swaps a transform's two directions: applied on writes, inverted on samples."""

    def __init__(self, transform):
        super().__init__()
        self.transform = transform

    def forward(self, tensordict):
        return self.transform.inv(tensordict)

    def inv(self, tensordict):
        return self.transform.forward(tensordict)

    def _call(self, tensordict):
        return self.transform._inv_call(tensordict)

    def _inv_call(self, tensordict):
        return self.transform._call(tensordict)


class _Compose(_Transform):
    """A chain of transforms, applied in order to samples and in reverse on writes."""

    def __init__(self, *transforms):
        super().__init__()
        self.transforms = nn.ModuleList([self._as_transform(t) for t in transforms])

    @staticmethod
    def _as_transform(transform):
        if isinstance(transform, _Transform):
            return transform
        if callable(transform):
            return _CallableTransform(transform)
        raise ValueError(
            "Compose expected a transform or a callable, "
            f"but received an object of type {type(transform)} instead."
        )

    def forward(self, tensordict):
        for transform in self.transforms:
            tensordict = transform(tensordict)
        return tensordict

    def _call(self, tensordict):
        for transform in self.transforms:
            tensordict = transform._call(tensordict)
        return tensordict

    def _inv_call(self, tensordict):
        for transform in reversed(self.transforms):
            tensordict = transform._inv_call(tensordict)
        return tensordict

    def append(self, transform) -> None:
        transform = self._as_transform(transform)
        transform.eval()
        self.transforms.append(transform)

    def insert(self, index: int, transform) -> None:
        transform = self._as_transform(transform)
        if abs(index) > len(self.transforms):
            raise ValueError(
                f"Index expected to be between [-{len(self.transforms)}, {len(self.transforms)}] got index={index}"
            )
        if index < 0:
            index = index + len(self.transforms)
        self.transforms.insert(index, transform)

    def __getitem__(self, item):
        return self.transforms[item]

    def __iter__(self):
        yield from self.transforms

    def __len__(self) -> int:
        return len(self.transforms)

    def __repr__(self) -> str:
        inner = ",\n".join(f"    {transform}" for transform in self.transforms)
        return f"Compose(\n{inner})" if inner else "Compose()"


def _classes():
    if torchrl_module("replay_buffers") is not None:
        try:
            from torchrl.envs.transforms.transforms import (
                _CallableTransform as CallableTransform,
                _InvertTransform as InvertTransform,
                Compose,
                Transform,
            )
        except ImportError:  # pragma: no cover - a torchrl without its transforms
            pass
        else:
            return Compose, Transform, CallableTransform, InvertTransform
    return _Compose, _Transform, _CallableTransform, _InvertTransform


Compose, Transform, CallableTransform, InvertTransform = _classes()


def check_transform_arguments(transform, transform_factory) -> None:
    """Refuses a buffer's ``transform`` given together with its ``transform_factory``."""
    if transform is not None and transform_factory is not None:
        raise TypeError(
            f"transform and transform_factory are mutually exclusive. "
            f"Got transform={transform} and transform_factory={transform_factory}."
        )


def make_transform(transform, transform_factory):
    """A buffer's transform chain from its ``transform`` / ``transform_factory`` arguments:
    a ``Compose`` (empty without either), in eval mode, as torchrl's buffers make it."""
    if transform_factory is not None:
        if transform is not None:
            raise TypeError("transform and transform_factory cannot be used simultaneously")
        transform = transform_factory()
    if transform is None:
        transform = Compose()
    elif not isinstance(transform, Compose):
        if not isinstance(transform, Transform) and callable(transform):
            transform = CallableTransform(transform)
        elif not isinstance(transform, Transform):
            raise RuntimeError("transform must be either a Transform instance or a callable.")
        transform = Compose(transform)
    transform.eval()
    return transform
