"""Gradient bucketing for data-parallel training, as PyTorch DDP and Horovod do it.

Small gradients are fused into buckets of at most `bucket_bytes`, filled from the
last array to the first (the order a backward pass produces them). Each bucket's
allreduce starts as soon as all of its arrays are marked ready, so communication
overlaps the rest of the backward pass; `wait()` then writes the reduced values
back into the arrays.

    bucketer = GradientBucketer(grads, bucket_bytes=25 * 2**20)
    for i in reversed(range(len(grads))):   # backward
        compute(grads[i])
        bucketer.mark_ready(i)
    bucketer.wait()                         # grads now hold the average over ranks

Buckets start in bucket order, never out of it, so every rank issues the same
collectives in the same order even if arrays are marked ready in another order.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from mpi4py import MPI

from ..runtime.transports.backend import backend_for
from .allreduce import Request, iallreduce

DEFAULT_BUCKET_BYTES = 25 * 2**20  # PyTorch DDP's default bucket_cap_mb


@dataclass
class _Bucket:
    members: list[int]  # indices into the arrays, in the order they are packed
    offsets: dict[int, int]  # element offset in `flat` of each member
    flat: object  # fused buffer, or None for a bucket of one array reduced in place
    ready: set[int] = field(default_factory=set)
    request: Request | None = None


class GradientBucketer:
    """Allreduce a fixed list of arrays every step, fused into buckets and overlapped with compute.

    `arrays`: C-contiguous arrays (a bucket holds arrays of one dtype).
    `bucket_bytes`: fusion limit; 0 reduces each array on its own, in place.
    `op`, `comm`, `algorithm`: as for `ringtree.allreduce.allreduce` (`op` "avg" by default).
    """

    def __init__(self, arrays, *, bucket_bytes: int = DEFAULT_BUCKET_BYTES, op="avg", comm=None,
                 algorithm: str = "auto") -> None:
        self.arrays = list(arrays)
        for i, array in enumerate(self.arrays):
            if backend_for(array) is None:
                cls = type(array)
                raise TypeError(f"array {i} is a {cls.__module__}.{cls.__qualname__}; ringtree reduces numpy and CuPy arrays")
            if not array.flags.c_contiguous:
                raise ValueError(f"array {i} is not C-contiguous")
        self.op, self.algorithm = op, algorithm
        self.comm = MPI.COMM_WORLD if comm is None else comm
        self.buckets = self._plan(bucket_bytes)
        self.bucket_of = {i: b for b, bucket in enumerate(self.buckets) for i in bucket.members}
        self.launched = 0  # buckets whose allreduce has started, this step
        # Time spent inside mark_ready() and wait(): packing, starting and waiting for allreduces.
        self.communication_seconds = 0.0

    def _plan(self, bucket_bytes: int) -> list[_Bucket]:
        groups: list[list[int]] = []
        size = 0
        for i in reversed(range(len(self.arrays))):
            array = self.arrays[i]
            fits = groups and size + array.nbytes <= bucket_bytes and array.dtype == self.arrays[groups[-1][0]].dtype
            if fits:
                groups[-1].append(i)
                size += array.nbytes
            else:
                groups.append([i])
                size = array.nbytes
        buckets = []
        for members in groups:
            if len(members) == 1:
                buckets.append(_Bucket(members, {members[0]: 0}, None))
                continue
            offsets, total = {}, 0
            for i in members:
                offsets[i] = total
                total += self.arrays[i].size
            first = self.arrays[members[0]]
            buckets.append(_Bucket(members, offsets, backend_for(first).empty(total, first.dtype)))
        return buckets

    @property
    def sizes(self) -> list[int]:
        """Bytes per bucket, in the order they are reduced."""
        return [sum(self.arrays[i].nbytes for i in b.members) for b in self.buckets]

    def mark_ready(self, index: int) -> None:
        """Array `index` holds this step's value: pack it, and start every bucket that is complete."""
        start = time.perf_counter()
        bucket = self.buckets[self.bucket_of[index]]
        if index in bucket.ready:
            raise ValueError(f"array {index} was marked ready twice in one step")
        if bucket.flat is not None:
            offset = bucket.offsets[index]
            bucket.flat[offset:offset + self.arrays[index].size] = self.arrays[index].reshape(-1)
        bucket.ready.add(index)
        while self.launched < len(self.buckets) and \
                len(self.buckets[self.launched].ready) == len(self.buckets[self.launched].members):
            self._launch(self.buckets[self.launched])
            self.launched += 1
        if self.launched:
            self.buckets[self.launched - 1].request.test()  # moves every transfer along while the caller computes
        self.communication_seconds += time.perf_counter() - start

    def _launch(self, bucket: _Bucket) -> None:
        buffer = bucket.flat if bucket.flat is not None else self.arrays[bucket.members[0]]
        bucket.request = iallreduce(MPI.IN_PLACE, buffer, self.op, comm=self.comm, algorithm=self.algorithm)

    def wait(self) -> None:
        """Finish every bucket, write the results into the arrays, and get ready for the next step."""
        missing = [i for b in self.buckets for i in b.members if i not in b.ready]
        if missing:
            raise RuntimeError(f"arrays {sorted(missing)} were not marked ready this step")
        start = time.perf_counter()
        for bucket in self.buckets:
            bucket.request.wait()
        for bucket in self.buckets:
            if bucket.flat is not None:
                for i, offset in bucket.offsets.items():
                    self.arrays[i].reshape(-1)[:] = bucket.flat[offset:offset + self.arrays[i].size]
            bucket.ready.clear()
            bucket.request = None
        self.launched = 0
        self.communication_seconds += time.perf_counter() - start
