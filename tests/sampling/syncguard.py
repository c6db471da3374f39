"""``no_host_sync()``: fail on every op that makes the host wait for the device.

On an accelerator, an op whose output shape depends on the data (``nonzero``, boolean-mask
indexing, ``unique``, ...) or that reads a value on the host (``item``, ``bool(t)``, ``tolist``,
a copy to the CPU) blocks the host until the device has caught up. On a CPU-only machine nothing
blocks, so the guard refuses the ops themselves: a ``TorchDispatchMode`` sees every ATen op,
including those reached through tensor methods and indexing (``x[mask]`` is ``aten.index`` with a
bool index), and a ``TorchFunctionMode`` catches the host reads that never reach the dispatcher
for a CPU tensor (``tolist``, ``numpy``, ``cpu``). Shape-static variants are fine
(``nonzero_static``, ``repeat_interleave`` with ``output_size``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten


class HostSyncError(AssertionError):
    """An op that synchronises the host with the device ran under ``no_host_sync()``."""


#: ATen ops whose output shape depends on the data, or that hand a value to the host.
_ALWAYS: frozenset[Any] = frozenset(
    {
        aten._local_scalar_dense.default,  # item(), bool(t), int(t), float(t), t.__index__()
        aten.nonzero.default,
        aten.nonzero.out,
        aten.nonzero_numpy.default,  # torch.where(cond) with one argument
        aten.argwhere.default,
        aten.masked_select.default,
        aten._unique.default,
        aten._unique2.default,
        aten.unique_dim.default,
        aten.unique_consecutive.default,
        aten.unique_dim_consecutive.default,
        aten.bincount.default,
        aten.equal.default,  # returns a Python bool
        aten.is_nonzero.default,
        aten.allclose.default,
    }
)

#: Host reads by name: on a CPU tensor they never reach the dispatcher.
_HOST_METHODS: frozenset[Callable[..., Any]] = frozenset(
    {
        torch.Tensor.tolist,
        torch.Tensor.numpy,
        torch.Tensor.cpu,
        torch.Tensor.item,
        torch.Tensor.__bool__,
        torch.Tensor.__int__,
        torch.Tensor.__float__,
        torch.Tensor.__index__,
    }
)


def _has_mask(indices: Any) -> bool:
    """A bool (or legacy uint8) index tensor: indexing with it is a ``nonzero`` in disguise."""
    return any(
        isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices or ()
    )


def _to_host(source: torch.Tensor, device: torch.device | None) -> bool:
    return device is not None and device.type == "cpu" and source.device.type != "cpu"


def _dispatch_reason(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    if func in _ALWAYS:
        return str(func)
    packet = func.overloadpacket
    indexing = packet in (aten.index, aten.index_put, aten.index_put_, aten._index_put_impl_)
    if indexing and _has_mask(args[1] if len(args) > 1 else kwargs.get("indices")):
        return f"{func} with a boolean mask"
    repeats = func in (aten.repeat_interleave.Tensor, aten.repeat_interleave.self_Tensor)
    if repeats and kwargs.get("output_size") is None:
        return f"{func} with tensor repeats and no output_size"
    if func is aten._to_copy.default and _to_host(args[0], kwargs.get("device")):
        return f"{func} to the host"
    if packet is aten.copy_ and args[0].device.type == "cpu" and args[1].device.type != "cpu":
        return f"{func} to the host"
    return None


class _Dispatch(TorchDispatchMode):
    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        reason = _dispatch_reason(func, args, kwargs)
        if reason is not None:
            raise HostSyncError(f"host sync: {reason}")
        return func(*args, **kwargs)


class _Function(TorchFunctionMode):
    def __torch_function__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if func in _HOST_METHODS:
            raise HostSyncError(f"host sync: Tensor.{func.__name__}")
        if func is torch.Tensor.to and isinstance(args[0], torch.Tensor):
            device = torch._C._nn._parse_to(*args[1:], **kwargs)[0]
            if _to_host(args[0], device):
                raise HostSyncError("host sync: Tensor.to the host")
        return func(*args, **kwargs)


@contextmanager
def no_host_sync() -> Iterator[None]:
    """Raise ``HostSyncError`` on any host-synchronising op run inside the block."""
    with _Function(), _Dispatch():
        yield
