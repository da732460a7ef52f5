"""The replay buffer: a per-env ring of ``nsteps`` segments that stores every frame once.

What is stored is described once, by a table of :class:`Field` rows (:func:`buffer_fields`): a
name, whether it is kept per frame, per step or per segment, its shape and its dtype. The Runner's
:class:`Segment`, the buffer's arrays, :meth:`ReplayBuffer.bytes_needed`, ``state``/``load_state``,
the :class:`Sample` and the device :class:`Batch` are all derived from that table. Layout
(time-major, the env on the second axis):

* Per frame (``frames``, ``firsts``): one row per agent step (the newest frame of that step's
  observation, and whether it is the first of a training episode), in a ring of
  ``nsegments·nsteps + stack`` slots indexed by global step ``g % frame_capacity``. The ``stack``
  spare slots keep the bootstrap frame of the newest segment and the ``stack − 1`` frames before
  the oldest one, so every stored segment can be rebuilt in full.
* Per step (``actions``, ``mu``, ``rewards``, ``dones``, ``timeout_values``): one row per step in a
  ring of ``nsegments·nsteps`` slots; segment ``j`` holds slots ``j·nsteps … (j+1)·nsteps − 1``.
  Actions and μ are shaped by the policy's distribution (:mod:`acer_sync.nets.distributions`): an action
  index and a probability vector for a categorical policy, an action vector and [mean, log σ] for a
  Gaussian one. ``timeout_values[t]`` is V(final observation) where step t was cut by a time
  limit, else 0.
* Per segment (``state_h``, ``state_c`` for an LSTM): one row per stored segment, the recurrent
  state the acting network carried into the segment's first step, so replay starts from it.

A multi-part observation (an image and a vector: :mod:`atari.parts`) stores each part as a
per-frame field of its own, ``frames/<key>``, in its own dtype (an image uint8, a vector float32);
its :class:`Segment`'s ``frames`` and its :class:`Batch`'s ``obs`` are then dicts by part key.

Stacks are rebuilt when sampling (:func:`rebuild_stacks`), with frames from before an episode's
first frame zeroed, exactly as :class:`atari.stacking.FrameStacker` builds them when acting. The
cost per stored transition is one frame (each of its parts) and its first flag plus ``4·A + 10``
bytes (categorical, feed-forward).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Iterable, NamedTuple

import numpy as np
import torch

from acer_sync.base.transfer import numpy_dtype, torch_dtype, upload
from acer_sync.nets.distributions import Distribution
from acer_sync.replay.frozen import Freeze, FrozenArray
from atari import parts

FRAME, STEP, SEGMENT = "frame", "step", "segment"
#: A multi-part observation's part ``key`` is stored as the per-frame field ``frames/<key>``.
PART_PREFIX = "frames/"


@dataclass(frozen=True)
class Field:
    """One stored array: ``per`` is ``FRAME``, ``STEP`` or ``SEGMENT``; ``shape`` is one env's row.

    ``device_dtype`` is what the update receives (None: as stored).
    """

    name: str
    per: str
    shape: tuple[int, ...]
    dtype: np.dtype
    device_dtype: torch.dtype | None = None


#: The saved buffer's format (``buffer.npz``'s ``format`` array); files without one are format 1.
BUFFER_FORMAT = 2


#: How much of a saved array is read at a time into the buffer (:meth:`SavedArrays.copy_into`).
READ_CHUNK_BYTES = 8 << 20


class SavedArrays(Mapping):
    """A saved buffer's arrays by name, read one at a time, when asked: from an ``np.load`` of an
    npz file (read straight into the buffer's arrays in chunks, so a resume needs the buffer's
    memory once, not twice), or from a dict of arrays."""

    def __init__(self, source):
        self.source = source
        self.extra: dict[str, np.ndarray] = {}  # arrays a migration adds

    def __getitem__(self, name: str) -> np.ndarray:
        if name in self.extra:
            return self.extra[name]
        value = self.source[name]  # a dict's may be a tensor of a buffer's state(), on the GPU too
        return value.cpu().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)

    def __contains__(self, name) -> bool:  # Mapping's would read the array
        return name in self.extra or name in self.source

    def __iter__(self):
        return iter([*self.source, *(name for name in self.extra if name not in self.source)])

    def __len__(self) -> int:
        return len(list(iter(self)))

    def _member(self, name: str):
        """The npz member of ``name``, open, past its header, with ``(shape, dtype)``; None where the
        source is not an npz file, or the member is a layout read whole (Fortran order, format 3)."""
        archive = getattr(self.source, "zip", None)
        if archive is None or name in self.extra:
            return None
        member = archive.open(f"{name}.npy")
        version = np.lib.format.read_magic(member)
        if version not in ((1, 0), (2, 0)):
            member.close()
            return None
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran_order, dtype = read_header(member)
        if fortran_order or dtype.hasobject:
            member.close()
            return None
        return member, tuple(shape), dtype

    def meta(self, name: str) -> tuple[tuple[int, ...], np.dtype]:
        """``name``'s shape and dtype, from its header where it has one (nothing else is read)."""
        opened = self._member(name)
        if opened is None:
            array = self[name]
            return tuple(array.shape), array.dtype
        member, shape, dtype = opened
        member.close()
        return shape, dtype

    def copy_into(self, name: str, target: np.ndarray | torch.Tensor) -> None:
        """``target[...] = self[name]``, of a matching shape and dtype, without holding the whole
        array twice in memory where the source is an npz file and ``target`` is contiguous: read a
        chunk at a time into a numpy array, or into a buffer of tensors (on the GPU with
        ``--replay-device cuda``, where the host then holds one chunk, not the array)."""
        tensor = isinstance(target, torch.Tensor)
        opened = self._member(name) if (target.is_contiguous() if tensor else target.flags.c_contiguous) else None
        if opened is None:
            if tensor:
                target.copy_(torch.from_numpy(self[name]))
            else:
                target[...] = self[name]
            return
        member, _, _ = opened
        with member:
            if tensor:
                view = target.view(-1).view(torch.uint8)
                size = view.numel()
            else:
                view = memoryview(target.reshape(-1).view(np.uint8))
                size = len(view)
            done = 0
            while done < size:
                chunk = member.read(min(READ_CHUNK_BYTES, size - done))
                if not chunk:
                    raise ValueError(f"{name} ends after {done} of its {size} bytes")
                if tensor:
                    view[done:done + len(chunk)].copy_(torch.frombuffer(bytearray(chunk), dtype=torch.uint8))
                else:
                    view[done:done + len(chunk)] = chunk
                done += len(chunk)
            member.read(1)  # at its end: the zip's CRC check runs here


def migrate_buffer(arrays) -> SavedArrays:
    """A saved buffer's arrays of any earlier format, in the current one (read lazily:
    :class:`SavedArrays`): format 1's first files, written before time limits were bootstrapped,
    lack ``timeout_values`` (zeros, as they behaved). Format 2 adds ``format``. A ValueError for a
    format newer than this version's."""
    arrays = SavedArrays(arrays)
    version = int(arrays["format"]) if "format" in arrays else 1
    if version > BUFFER_FORMAT:
        raise ValueError(f"it has buffer format {version}, newer than this version's ({BUFFER_FORMAT})")
    if "timeout_values" not in arrays and "dones" in arrays:
        arrays.extra["timeout_values"] = np.zeros(arrays.meta("dones")[0], dtype=np.float32)
    return arrays


def _stored_action_dtype(distribution: Distribution) -> np.dtype:
    """uint8 indices for up to 256 discrete actions, else int64; float32 action vectors."""
    if distribution.kind == "gaussian":
        return np.dtype(np.float32)
    return np.dtype(np.uint8) if distribution.n <= 256 else np.dtype(np.int64)


def buffer_fields(
    frame_shape: tuple[int, ...], frame_dtype: np.dtype, distribution: Distribution,
    state_shapes: dict[str, tuple[int, ...]] | None = None, frame_parts: dict | None = None,
) -> tuple[Field, ...]:
    """The table of what a run stores: frames, the step data, and the recurrent state if any.

    :param state_shapes: the network's recurrent state, name → one env's shape (``{}`` for a
        feed-forward network); each becomes a per-segment field ``state_<name>``.
    :param frame_parts: a multi-part observation's layout, ``{key: (shape, dtype)}``
        (``EnvInfo.frame_layout``): one per-frame field ``frames/<key>`` each, in place of
        ``frames`` (``frame_shape`` and ``frame_dtype`` are then unused).
    """
    gaussian = distribution.kind == "gaussian"
    if frame_parts:
        frames = [Field(PART_PREFIX + key, FRAME, tuple(shape), np.dtype(dtype)) for key, (shape, dtype) in frame_parts.items()]
    else:
        frames = [Field("frames", FRAME, tuple(frame_shape), np.dtype(frame_dtype))]
    fields = [
        *frames,
        Field("firsts", FRAME, (), np.dtype(bool)),
        Field("actions", STEP, tuple(distribution.action_shape), _stored_action_dtype(distribution),
              torch.float32 if gaussian else torch.int64),
        Field("mu", STEP, (distribution.stat_size,), np.dtype(np.float32)),
        Field("rewards", STEP, (), np.dtype(np.float32)),
        Field("dones", STEP, (), np.dtype(bool), torch.float32),
        Field("timeout_values", STEP, (), np.dtype(np.float32)),
    ]
    for name, shape in (state_shapes or {}).items():
        fields.append(Field(f"state_{name}", SEGMENT, tuple(shape), np.dtype(np.float32)))
    return tuple(fields)


class Segment(NamedTuple):
    """``nsteps`` steps of every env, numpy, time-major, one attribute per row of the field table
    (:func:`buffer_fields`), the per-segment fields gathered in ``state``.

    ``frames`` is a dict by part key for a multi-part observation (fields ``frames/<key>``).
    As the Runner records it: per-frame fields ``[T+1, N, ...]`` (row t belongs to observation t;
    row T is the bootstrap observation), per-step fields ``[T, N, ...]`` (row t: the step taken
    from observation t), ``state`` the recurrent state carried into observation 0, ``[N, ...]``
    each (empty for a feed-forward network). As :meth:`ReplayBuffer.gather` returns it (a
    :class:`Sample`), the per-frame fields cover observations ``-(stack−1) … T``.
    """

    frames: np.ndarray
    firsts: np.ndarray
    actions: np.ndarray
    mu: np.ndarray
    rewards: np.ndarray
    dones: np.ndarray
    timeout_values: np.ndarray
    state: tuple[np.ndarray, ...] = ()


class Sample(Segment):
    """A :class:`Segment` gathered from the buffer: per-frame fields ``[T+stack, N, ...]``, over
    observations ``-(stack−1) … T``, which :func:`rebuild_stacks` turns into ``[T+1, N, stack, ...]``."""

    __slots__ = ()


class Batch(NamedTuple):
    """One update's data on the device (:func:`to_batch`): ``obs`` ``[T+1, N, stack, ...]`` (uint8
    for frames; a dict of them by part key for a multi-part observation) and ``firsts`` ``[T+1, N]`` go with observation t = 0..T, every per-step field
    ``[T, N, ...]`` with the step from observation t, in its ``device_dtype``, and ``state``, the
    per-segment state tensors ``[N, ...]`` in table order (empty for a feed-forward network)."""

    obs: torch.Tensor | dict[str, torch.Tensor]
    firsts: torch.Tensor
    actions: torch.Tensor
    mu: torch.Tensor
    rewards: torch.Tensor
    dones: torch.Tensor
    timeout_values: torch.Tensor
    state: tuple[torch.Tensor, ...] = ()


#: The per-frame and per-step fields every table has, in :class:`Segment`'s order.
FIXED_FIELDS = Segment._fields[:-1]


def field_array(record: Segment, field: Field, state_index: dict[str, int]) -> np.ndarray:
    """``record``'s array of ``field``: an attribute, a part of its ``frames``, or for a
    per-segment field its place in ``state``."""
    if field.per == SEGMENT:
        return record.state[state_index[field.name]]
    if field.name.startswith(PART_PREFIX):
        return record.frames[field.name[len(PART_PREFIX):]]
    return getattr(record, field.name)


def make_record(cls, arrays: dict, fields: Iterable[Field]):
    """A :class:`Segment` or :class:`Sample` of the arrays of ``fields`` (by field name)."""
    fields = tuple(fields)
    frame_parts = {f.name[len(PART_PREFIX):]: arrays[f.name] for f in fields if f.name.startswith(PART_PREFIX)}
    frames = frame_parts or arrays["frames"]
    state = tuple(arrays[f.name] for f in fields if f.per == SEGMENT)
    return cls(frames, **{name: arrays[name] for name in FIXED_FIELDS[1:]}, state=state)


def state_indices(fields: Iterable[Field]) -> dict[str, int]:
    """Each per-segment field's place in a record's ``state`` (the table's order)."""
    return {f.name: i for i, f in enumerate(f for f in fields if f.per == SEGMENT)}


def empty_segment(fields: Iterable[Field], nsteps: int, num_envs: int) -> Segment:
    """Uninitialised arrays for one segment, shaped by ``fields``."""
    rows = {FRAME: (nsteps + 1, num_envs), STEP: (nsteps, num_envs), SEGMENT: (num_envs,)}
    fields = tuple(fields)
    arrays = {f.name: np.empty((*rows[f.per], *f.shape), dtype=f.dtype) for f in fields}
    return make_record(Segment, arrays, fields)


def rebuild_stacks(frames: torch.Tensor, firsts: torch.Tensor, stack: int) -> torch.Tensor:
    """Frame stacks ``[T+1, N, stack, ...]`` from a window of single frames ``[T+stack, N, ...]``.

    Observation t (t = 0..T) stacks window rows ``t … t+stack−1`` (oldest first). A frame is
    zeroed when an episode starts after it and at or before the stack's newest frame, which is
    what :class:`atari.stacking.FrameStacker` does when acting. With ``stack`` 1 the result is a
    view of ``frames``.

    Whole frames are copied by index (one ``index_select``), from the window with a zero frame
    after it, which an earlier episode's frame points to instead: indexing ``[T+1, stack, N, ...]``
    and masking it went element by element (a Pong batch on the 2-core CPU: 17 ms, against 0.9 ms). The
    result is contiguous, so the networks' reshape to ``[(T+1)·N, ...]`` is a view.
    """
    if frames.shape[:2] != firsts.shape:
        raise ValueError(f"frames {tuple(frames.shape)} and firsts {tuple(firsts.shape)} disagree on [T+stack, N]")
    n_obs = frames.shape[0] - stack + 1
    if n_obs < 1:
        raise ValueError(f"a window of {frames.shape[0]} frames is too short for stacks of {stack}")
    if stack == 1:  # nothing older to clear
        return frames.unsqueeze(2)
    device, num_envs, frame_shape = frames.device, frames.shape[1], frames.shape[2:]
    episode_id = torch.cumsum(firsts.to(torch.int32), dim=0)  # [T+stack, N]
    rows = torch.arange(n_obs, device=device)[:, None, None] + torch.arange(stack, device=device)  # [T+1, 1, stack]
    envs = torch.arange(num_envs, device=device)[:, None]  # [N, 1]
    ids = episode_id[rows, envs]  # [T+1, N, stack]
    zero_frame = frames.shape[0] * num_envs
    source = torch.where(ids == ids[..., -1:], rows * num_envs + envs, zero_frame)  # [T+1, N, stack]
    window = torch.cat([frames.reshape(-1, *frame_shape), frames.new_zeros((1, *frame_shape))])
    return window.index_select(0, source.reshape(-1)).reshape(n_obs, num_envs, stack, *frame_shape)


class ReplayBuffer:
    """Ring buffer of segments; see the module docstring for the layout.

    The arrays live in host memory as numpy arrays, or, with ``device`` a GPU (``--replay-device``),
    as torch tensors there: a segment is uploaded once when it is stored, and replay gathers and
    rebuilds its batches on the device, with no copy from the host. Either way :meth:`gather` on
    the same indices gives the same values, and :meth:`state` gives numpy arrays.

    :param fields: what is stored (:func:`buffer_fields`); must include ``frames`` and ``firsts``.
    :param num_envs: N.
    :param nsteps: T, the segment length.
    :param size_per_env: capacity in steps per env; rounded down to whole segments.
    :param stack: frames per observation.
    :param device: where the arrays live (the host: ``cpu``).
    :param tensors: keep them as torch tensors even on the host (set for any other device; the
        parity tests set it on the CPU).
    """

    def __init__(self, fields: Iterable[Field], num_envs: int, nsteps: int, size_per_env: int, stack: int,
                 device: torch.device | str = "cpu", tensors: bool = False):
        self.fields = tuple(fields)
        self.device = torch.device(device)
        self.tensors = tensors or self.device.type != "cpu"
        self.num_envs = num_envs
        self.nsteps = nsteps
        self.stack = stack
        self.nsegments = size_per_env // nsteps
        if self.nsegments < 1:
            raise ValueError(f"a buffer of {size_per_env} steps per env holds no segment of {nsteps} steps")
        self.step_capacity = self.nsegments * nsteps
        self.frame_capacity = self.step_capacity + stack
        rows = self._rows()
        self.arrays = {f.name: self._zeros((rows[f.per], num_envs, *f.shape), f.dtype) for f in self.fields}
        self.segment_start = np.zeros(self.nsegments, dtype=np.int64)  # global step of each segment
        self.steps_written = 0
        self.segments_stored = 0
        #: The envs whose episode a restart cut at the newest segment's end (:meth:`load_state`).
        self.restart_cut = np.zeros(num_envs, dtype=bool)
        self._state_index = state_indices(self.fields)
        env = np.arange(num_envs)
        #: The env index of each kind of row, as ``gather`` indexes with it (on the device, uploaded once).
        self._env_rows = {FRAME: self._index(env[None, :]), STEP: self._index(env[None, :]), SEGMENT: self._index(env)}
        #: While a save reads the arrays as they were at its step (:meth:`freeze`).
        self._freeze: Freeze | None = None

    def _zeros(self, shape: tuple[int, ...], dtype: np.dtype):
        if not self.tensors:
            return np.zeros(shape, dtype=dtype)
        return torch.zeros(shape, dtype=torch_dtype(dtype), device=self.device)

    def _index(self, index):
        """An index for the arrays: as it is for numpy, a tensor on the device for tensors (uploaded
        through pinned memory: a copy from pageable memory would wait for the queued updates)."""
        if not self.tensors or isinstance(index, (int, slice, np.integer)):
            return index
        return upload(index, self.device)

    def _rows(self) -> dict[str, int]:
        return {FRAME: self.frame_capacity, STEP: self.step_capacity, SEGMENT: self.nsegments}

    def __getattr__(self, name: str) -> np.ndarray:
        """A stored array by its field name (``buffer.frames``)."""
        arrays = self.__dict__.get("arrays", {})
        if name in arrays:
            return arrays[name]
        raise AttributeError(name)

    @staticmethod
    def bytes_needed(fields: Iterable[Field], num_envs: int, nsteps: int, size_per_env: int, stack: int) -> int:
        """Memory the arrays will take, computed before allocating anything."""
        step_capacity = (size_per_env // nsteps) * nsteps
        rows = {FRAME: step_capacity + stack, STEP: step_capacity, SEGMENT: size_per_env // nsteps}
        return num_envs * sum(rows[f.per] * int(np.prod(f.shape)) * f.dtype.itemsize for f in fields)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes if isinstance(a, np.ndarray) else a.numel() * a.element_size() for a in self.arrays.values())

    @property
    def num_steps_stored(self) -> int:
        """Steps per env currently stored."""
        return self.segments_stored * self.nsteps

    def put(self, segment: Segment) -> None:
        """Store one segment of all envs, overwriting the oldest when full."""
        T, N = self.nsteps, self.num_envs
        expected = {FRAME: (T + 1, N), STEP: (T, N), SEGMENT: (N,)}
        for f in self.fields:
            leading = field_array(segment, f, self._state_index).shape[: len(expected[f.per])]
            if leading != expected[f.per]:
                raise ValueError(f"segment {f.name} is {list(leading)}, the buffer expects {list(expected[f.per])}")
        start = self.steps_written
        index = (start // T) % self.nsegments
        slots = {
            FRAME: (start + np.arange(T + 1)) % self.frame_capacity,
            STEP: slice(index * T, (index + 1) * T),
            SEGMENT: index,
        }
        freeze = self._freeze
        if freeze is not None:  # a save reads the arrays: the rows about to change are kept for it first
            freeze.keep({**{f.name: slots[f.per] for f in self.fields}, "segment_start": index})
        for f in self.fields:
            value = field_array(segment, f, self._state_index)
            if self.tensors:
                value = upload(value, self.device)
            self.arrays[f.name][self._index(slots[f.per])] = value
        self.segment_start[index] = start
        self.steps_written += T
        self.segments_stored = min(self.segments_stored + 1, self.nsegments)

    def gather(self, segment_index: np.ndarray) -> Sample:
        """The window and step data of segment ``segment_index[n]`` (a ring index) for each env n."""
        T = self.nsteps
        start = self.segment_start[segment_index]  # [N]
        window = start[None, :] + np.arange(-(self.stack - 1), T + 1)[:, None]  # [T+stack, N]
        slots = {
            FRAME: window % self.frame_capacity,
            STEP: segment_index[None, :] * T + np.arange(T)[:, None],  # [T, N]
            SEGMENT: segment_index,
        }
        slots = {per: self._index(index) for per, index in slots.items()}
        arrays = {f.name: self.arrays[f.name][slots[f.per], self._env_rows[f.per]] for f in self.fields}
        # Global steps before 0 were never written; the first frame (a reset) masks them anyway. An
        # OR, not a masked assignment, which on the device would read the mask's count back.
        arrays["firsts"] = arrays["firsts"] | self._index(window == 0)
        return make_record(Sample, arrays, self.fields)

    def latest(self) -> Sample:
        """The segment stored last, for every env (the on-policy batch)."""
        if self.segments_stored == 0:
            raise RuntimeError("the buffer is empty")
        index = ((self.steps_written - self.nsteps) // self.nsteps) % self.nsegments
        return self.gather(np.full(self.num_envs, index))

    def state(self) -> dict[str, np.ndarray | torch.Tensor]:
        """Everything needed to restore the buffer, with its format: numpy arrays, and the buffer's
        tensors as they are (on the GPU with ``--replay-device cuda``:
        :func:`acer_sync.training.checkpoint.write_arrays` brings them to the host a chunk at a time)."""
        arrays = dict(self.arrays)
        arrays["segment_start"] = self.segment_start
        arrays["counters"] = np.array([self.steps_written, self.segments_stored], dtype=np.int64)
        arrays["format"] = np.array(BUFFER_FORMAT, dtype=np.int64)
        return arrays

    def freeze(self) -> dict[str, FrozenArray | np.ndarray]:
        """:meth:`state` for a save in a thread while training stores on (:mod:`acer_sync.replay.frozen`):
        the arrays as :class:`FrozenArray` views that read them as they are now, until :meth:`thaw`."""
        if self.tensors and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # the segments stored so far, written before the reads
        state = self.state()
        self._freeze = Freeze({name: array for name, array in state.items() if name in self.arrays or name == "segment_start"})
        return {**state, **self._freeze.views}

    def cancel_save(self, seconds: float) -> None:
        """Give up the write of the frozen arrays under way, if any (:meth:`Freeze.cancel`)."""
        freeze = self._freeze
        if freeze is not None:
            freeze.cancel(seconds)

    def thaw(self) -> None:
        """The save is done (or gave up): ``put`` keeps no more rows for it."""
        freeze, self._freeze = self._freeze, None
        if freeze is not None:
            freeze.thaw()

    def load_state(self, arrays) -> None:
        """Restore from :meth:`state`'s arrays of any format (:func:`migrate_buffer`), after a restart
        of the envs.

        The newest stored segment's last step is marked done: the restart cut its episode, and
        the next segment's first frame (a fresh reset) takes the slot of its bootstrap frame. The
        envs whose episode the restart cut (not already done there) are :attr:`restart_cut`; until
        the next :meth:`put`, :meth:`bootstrap_restart` gives them V of that frame, as a time limit's
        cut has (a terminal's zero before).
        Raises ValueError when the arrays do not fit this buffer's shapes, lack a field, or hold
        counters that no run of this buffer could have written.
        """
        arrays = migrate_buffer(arrays)
        targets = {f.name: self.arrays[f.name] for f in self.fields}
        targets["segment_start"] = self.segment_start
        for name, target in targets.items():
            if name not in arrays:
                raise ValueError(f"the saved buffer has no {name}")
            expected = numpy_dtype(target.dtype) if isinstance(target, torch.Tensor) else target.dtype
            shape, dtype = arrays.meta(name)
            if shape != tuple(target.shape) or dtype != expected:
                raise ValueError(f"{name} is {shape} {dtype}, expected {tuple(target.shape)} {expected}")
        counters = np.asarray(arrays["counters"])
        if counters.shape != (2,):
            raise ValueError(f"counters is {counters.shape}, expected (2,)")
        steps_written, segments_stored = (int(v) for v in counters)
        if not (
            0 <= segments_stored <= self.nsegments and steps_written >= 0 and steps_written % self.nsteps == 0
            and segments_stored == min(steps_written // self.nsteps, self.nsegments)
        ):
            raise ValueError(
                f"its counters ({steps_written} steps written, {segments_stored} segments stored) do not fit a buffer "
                f"of {self.nsegments} segments of {self.nsteps} steps"
            )
        expected_starts = np.zeros(self.nsegments, dtype=np.int64)  # put() writes them from the counters
        starts = steps_written - self.nsteps * np.arange(segments_stored, 0, -1)
        expected_starts[(starts // self.nsteps) % self.nsegments] = starts
        if not np.array_equal(np.asarray(arrays["segment_start"]), expected_starts):
            raise ValueError(f"its segment_start does not fit its counters ({steps_written} steps written, "
                             f"{segments_stored} segments stored)")
        for name, target in targets.items():  # one array at a time
            arrays.copy_into(name, target)
        self.steps_written, self.segments_stored = steps_written, segments_stored
        if self.segments_stored:
            last_step = (self.steps_written - 1) % self.step_capacity
            done = self.arrays["dones"][last_step]
            self.restart_cut = ~(done.cpu().numpy() if isinstance(done, torch.Tensor) else done.copy())
            self.arrays["dones"][last_step] = True

    def bootstrap_restart(self, values: np.ndarray) -> None:
        """The restart's cut bootstrapped: ``timeout_values`` of the newest segment's last step is
        ``values [N]`` (V of its bootstrap frame) in the envs of :attr:`restart_cut`. Call it
        after :meth:`load_state` and before the next :meth:`put`, which takes that frame's slot."""
        last_step = (self.steps_written - 1) % self.step_capacity
        stored = self.arrays["timeout_values"]
        cut = self._index(self.restart_cut)
        row = stored[last_step]
        new = self._index(np.asarray(values, dtype=np.float32))  # on the buffer's device, for tensors
        stored[last_step] = torch.where(cut, new, row) if self.tensors else np.where(cut, new, row)
        self.restart_cut = np.zeros(self.num_envs, dtype=bool)

    def sample_indices(self, rng: np.random.Generator) -> np.ndarray:
        """One uniformly chosen stored segment per env, as Baselines samples: ring indices ``[N]``."""
        if self.segments_stored == 0:
            raise RuntimeError("the buffer is empty")
        return rng.integers(0, self.segments_stored, size=self.num_envs)

    def sample(self, rng: np.random.Generator) -> Sample:
        """The segments of :meth:`sample_indices`."""
        return self.gather(self.sample_indices(rng))

    def previous(self, segment_index: np.ndarray) -> tuple[Sample, np.ndarray]:
        """The segment stored just before each of ``segment_index`` (same env), and ``[N]`` flags
        saying where it is still stored in full (not where the segment is the oldest, or the first)."""
        T = self.nsteps
        previous_index = (segment_index - 1) % self.nsegments
        starts = self.segment_start[segment_index]
        available = (
            (starts >= T)
            & (self.segment_start[previous_index] == starts - T)
            & (starts - T >= self.steps_written - self.num_steps_stored)
        )
        return self.gather(previous_index), available


def to_batch(sample: Sample, fields: Iterable[Field], stack: int, device: torch.device) -> Batch:
    """Move a buffer sample to ``device`` (frames stay uint8 in transit; from the host through
    pinned memory; nothing to move for a buffer on the device) and rebuild its stacks.

    Each field arrives as its ``device_dtype``; per-segment fields form ``state`` in table order.
    """
    non_blocking = device.type == "cuda"

    def move(array):
        if isinstance(array, torch.Tensor):  # a buffer on the device: already there
            return array.to(device, non_blocking=non_blocking)
        return upload(array, device)

    fields = tuple(fields)
    index = state_indices(fields)
    firsts = move(sample.firsts)
    moved = {}
    for f in fields:
        if f.per == FRAME:
            continue
        tensor = move(field_array(sample, f, index))
        moved[f.name] = tensor if f.device_dtype is None else tensor.to(f.device_dtype)
    return Batch(
        obs=parts.map_parts(lambda frames: rebuild_stacks(move(frames), firsts, stack), sample.frames), firsts=firsts[stack - 1 :],
        **{name: moved[name] for name in FIXED_FIELDS[2:]}, state=tuple(moved[name] for name in index),
    )
