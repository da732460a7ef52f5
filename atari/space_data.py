"""gymnasium observation spaces as plain data, for checkpoints read with ``weights_only=True``.

A checkpoint keeps the env's own observation space (:attr:`atari.envs.EnvInfo.observation_space`)
so that ``acer_sync.load`` can take the env's observations as it returns them where the env
cannot be made (an env a Python callable made in another process). Pickling the space would need
an unpickler that runs code; these are dicts of strings, numbers and tensors instead, for the
spaces training takes: Box, Discrete, MultiDiscrete, MultiBinary, and Tuple and Dict of them.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch


def space_to_data(space: gym.Space | None) -> dict | None:
    """``space`` as plain data; None for None, or for a space of another kind."""
    if isinstance(space, gym.spaces.Box):
        return {"kind": "Box", "low": torch.from_numpy(np.array(space.low)), "high": torch.from_numpy(np.array(space.high)),
                "dtype": space.dtype.name}
    if isinstance(space, gym.spaces.Discrete):
        return {"kind": "Discrete", "n": int(space.n), "start": int(space.start)}
    if isinstance(space, gym.spaces.MultiDiscrete):
        return {"kind": "MultiDiscrete", "nvec": torch.from_numpy(np.array(space.nvec, dtype=np.int64)),
                "start": torch.from_numpy(np.array(space.start, dtype=np.int64)), "dtype": space.dtype.name}
    if isinstance(space, gym.spaces.MultiBinary):
        return {"kind": "MultiBinary", "n": [int(n) for n in np.atleast_1d(space.n)]}
    if isinstance(space, (gym.spaces.Tuple, gym.spaces.Dict)):
        parts = space.spaces if isinstance(space, gym.spaces.Tuple) else space.spaces.values()
        data = [space_to_data(part) for part in parts]
        if any(part is None for part in data):
            return None
        if isinstance(space, gym.spaces.Tuple):
            return {"kind": "Tuple", "spaces": data}
        return {"kind": "Dict", "keys": list(space.spaces), "spaces": data}
    return None


def space_from_data(data) -> gym.Space | None:
    """The space :func:`space_to_data` described (None for None); ValueError for data it did not write."""
    if data is None:
        return None
    try:
        kind = data["kind"]
        if kind == "Box":
            return gym.spaces.Box(data["low"].numpy(), data["high"].numpy(), dtype=np.dtype(data["dtype"]))
        if kind == "Discrete":
            return gym.spaces.Discrete(int(data["n"]), start=int(data["start"]))
        if kind == "MultiDiscrete":
            return gym.spaces.MultiDiscrete(data["nvec"].numpy(), dtype=np.dtype(data["dtype"]), start=data["start"].numpy())
        if kind == "MultiBinary":
            n = [int(size) for size in data["n"]]
            return gym.spaces.MultiBinary(n[0] if len(n) == 1 else n)
        if kind == "Tuple":
            return gym.spaces.Tuple([space_from_data(part) for part in data["spaces"]])
        if kind == "Dict":
            # pairs, not a dict: gymnasium sorts a dict's keys, and an env's own order (an OrderedDict) is the frames' order
            return gym.spaces.Dict(list(zip(data["keys"], (space_from_data(part) for part in data["spaces"]), strict=True)))
    except (KeyError, TypeError, AttributeError, ValueError) as error:
        raise ValueError(f"not an observation space's data ({type(error).__name__}: {error})") from None
    raise ValueError(f"not an observation space's data (kind {data.get('kind')!r})" if isinstance(data, dict) else
                     f"not an observation space's data ({type(data).__name__})")
