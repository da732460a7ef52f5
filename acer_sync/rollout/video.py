"""Games recorded to mp4, for ``play.py --video`` and the evaluation's ``capture_video``.

A video is written beside its name and renamed over it once it holds every frame: a full disk or
a stopped run leaves no broken mp4 under the name (and whatever was there before stays).
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
from pathlib import Path

import gymnasium as gym
import numpy as np

from acer_sync.base.errors import UserError, WriteFailed
from acer_sync.rollout.evaluation import EnvStep
from atari.envs import EnvInfo, VecEnv
from atari.errors import EnvFailed, EnvTimedOut

#: A video's frame rate where its env declares none (``metadata["render_fps"]``); gymnasium's
#: RecordVideo takes the same default.
VIDEO_FPS = 30
#: MuJoCo's headless OpenGL backend, unless MUJOCO_GL is already set: EGL (a GPU driver, or Mesa's),
#: or OSMesa (software, Debian's libosmesa6) with MUJOCO_GL=osmesa.
HEADLESS_GL = "egl"


#: What lets an env render frames off-screen, where the user has not set it: MuJoCo's OpenGL
#: backend, and SDL's (pygame, for classic control) drivers without a window or sound, which would
#: otherwise print "XDG_RUNTIME_DIR is invalid" and ALSA's errors on a machine without a desktop.
OFF_SCREEN = {
    "MUJOCO_GL": HEADLESS_GL, "SDL_VIDEODRIVER": "dummy", "SDL_AUDIODRIVER": "dummy", "PYGAME_HIDE_SUPPORT_PROMPT": "1",
}


def render_headless() -> None:
    """Let envs render frames without a display (:data:`OFF_SCREEN`). Read when MuJoCo or pygame is
    first imported (when such an env is first built), so call it before."""
    for name, value in OFF_SCREEN.items():
        os.environ.setdefault(name, value)


def video_env(info: EnvInfo, timeout: float = 0.0) -> VecEnv:
    """One env of ``info`` that renders RGB frames, filmed as :func:`follow_the_agent` says; its
    steps, resets and renders each under ``timeout`` seconds (a run's ``--env-timeout``; 0: none)."""
    try:
        env = VecEnv(info, 1, "sync", render_mode="rgb_array", timeout=timeout)
    except gym.error.DependencyNotInstalled as error:
        raise UserError(f"rendering {info.env_id} needs a missing package: {_first_line(error)}") from None
    follow_the_agent(env)
    return env


def check_renders(info: EnvInfo, timeout: float = 0.0) -> None:
    """A one-line UserError where ``info``'s env cannot render frames here (a missing package, no
    headless OpenGL), its render under ``timeout`` seconds (a run's ``--env-timeout``; 0: none);
    nothing is left open. An env that fails before it renders fails as it would in the run."""
    render_headless()
    env = video_env(info, timeout)
    try:
        env.reset(seed=0)
        try:
            render(env)
        except EnvTimedOut:
            raise
        except EnvFailed as failure:
            if mujoco_renderer(env) is not None:
                # each GL backend fails in its own way (EGLError, FatalError, ...)
                raise UserError(
                    f"cannot render {info.env_id} headless with MUJOCO_GL={os.environ.get('MUJOCO_GL', '')} "
                    f"({failure}); install an EGL driver, or Debian's libosmesa6 and set MUJOCO_GL=osmesa"
                ) from None
            raise UserError(f"cannot render {info.env_id} ({failure}); a video needs an env that renders frames "
                            "with render_mode='rgb_array'") from None
    finally:
        env.close()


def render(env: VecEnv) -> np.ndarray:
    """The RGB frame of env 0 (:func:`rgb_frame`). A missing package, or a render that is not a
    frame, is a one-line UserError; any other failure, or a render past the env's timeout, is the
    env's (:class:`~atari.errors.EnvFailed`), as a step's: a run stops with the checkpoint of its
    last iteration (:func:`check_renders` tried it first)."""
    try:
        frame = env.render()
    except EnvFailed as failure:
        if isinstance(failure.__cause__, gym.error.DependencyNotInstalled):
            raise UserError(f"rendering {env.info.env_id} needs a missing package: {_first_line(failure.__cause__)}") from None
        raise
    return rgb_frame(frame, env.info.env_id)


def rgb_frame(frame, env_id: str) -> np.ndarray:
    """A render as the RGB frame a video is made of (uint8, height x width x 3): a grayscale one
    ``(H, W)`` repeated into the three channels, one with an alpha channel ``(H, W, 4)`` without
    it; a one-line UserError for anything else (None, floats), said before a video starts."""
    array = None if frame is None else np.asarray(frame)
    if array is not None and array.dtype == np.uint8 and array.size:
        if array.ndim == 2:
            return np.repeat(array[..., None], 3, axis=-1)
        if array.ndim == 3 and array.shape[-1] in (3, 4):
            return array[..., :3]
    what = "None" if array is None else f"{array.dtype} of shape {array.shape}"
    raise UserError(f"{env_id}'s render() gives {what}; a video is made of RGB frames, uint8 of shape (height, width, 3), "
                    "which an env renders with render_mode='rgb_array'")


def follow_the_agent(env: VecEnv) -> None:
    """Film a MuJoCo task from its model's ``track`` camera, which follows the body.

    gymnasium's default is a camera fixed in the world (unless a camera is named), from which
    HalfCheetah-v5 runs out of the picture within seconds. Other envs are left as they are.
    """
    renderer = mujoco_renderer(env)
    if renderer is None:
        return
    import mujoco

    track = mujoco.mj_name2id(renderer.model, mujoco.mjtObj.mjOBJ_CAMERA, "track")
    if track >= 0:
        renderer.camera_id = track


def video_fps(env: VecEnv) -> float:
    """The frame rate env 0 declares (``metadata["render_fps"]``: 50 for CartPole, 1/dt for MuJoCo,
    so a video plays at the env's own speed), as gymnasium's RecordVideo reads it; :data:`VIDEO_FPS`
    where it declares none, or no positive finite number."""
    fps = (getattr(env.first_env(), "metadata", None) or {}).get("render_fps")
    return float(fps) if isinstance(fps, (int, float)) and math.isfinite(fps) and fps > 0 else float(VIDEO_FPS)


def mujoco_renderer(env: VecEnv):
    """Env 0's MuJoCo renderer; None for an env that is not MuJoCo's."""
    return getattr(env.first_env().unwrapped, "mujoco_renderer", None)


class VideoRecorder:
    """Records env 0 of ``env`` to ``path``: an ``on_step`` of
    :func:`~acer_sync.rollout.evaluation.evaluate` (a frame after the reset and after each step);
    :meth:`finish` puts the whole video under its name, :meth:`discard` drops what was written."""

    def __init__(self, env: VecEnv, path: Path):
        self.env, self.path = env, Path(path)
        self.part = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp{self.path.suffix}")
        self.writer = None
        self.frames = 0
        self.size: tuple[int, int] = (0, 0)
        #: Frames per second of the video (:func:`video_fps`).
        self.fps = video_fps(env)

    def __call__(self, step: EnvStep | None) -> None:
        frame = render(self.env)
        if self.writer is None:
            import cv2
            import cv2.utils.logging

            # A failed write is reported once, by finish, not as OpenCV's and FFmpeg's warnings for
            # each frame and for the unreadable file.
            cv2.utils.logging.setLogLevel(cv2.utils.logging.LOG_LEVEL_SILENT)
            os.environ["OPENCV_FFMPEG_LOGLEVEL"] = "-8"
            height, width = self.size = frame.shape[:2]
            self.writer = cv2.VideoWriter(str(self.part), cv2.VideoWriter_fourcc(*"mp4v"), self.fps, (width, height))
            if not self.writer.isOpened():  # a folder that refuses it, a full or read-only disk
                free = shutil.disk_usage(self.part.parent).free if self.part.parent.is_dir() else 0
                raise WriteFailed(self.path, f"opencv cannot open an mp4 there ({free / 1e6:.1f} MB free on its disk)")
        if frame.shape[:2] != self.size:  # an env whose frames change size: the video keeps its first
            import cv2

            frame = cv2.resize(frame, self.size[::-1], interpolation=cv2.INTER_NEAREST)
        self.writer.write(frame[..., ::-1].copy())  # RGB to BGR
        self.frames += 1

    def finish(self) -> Path:
        """Close the video and rename it over :attr:`path` once it holds every frame written; opencv
        reports no failed write (a full disk), so the frames are counted back."""
        import cv2

        self._release()
        capture = cv2.VideoCapture(str(self.part))
        frames = int(capture.get(cv2.CAP_PROP_FRAME_COUNT)) if capture.isOpened() else 0
        capture.release()
        if frames < self.frames:
            free = shutil.disk_usage(self.part.parent).free
            self.discard()
            raise WriteFailed(self.path, f"only {frames} of its {self.frames} frames reached the file ({free / 1e6:.1f} MB free on its disk)")
        os.replace(self.part, self.path)
        return self.path

    def discard(self) -> None:
        """Drop the partial file; one that cannot be removed stays (its error would hide the one being reported)."""
        self._release()
        with contextlib.suppress(OSError):
            self.part.unlink(missing_ok=True)

    def _release(self) -> None:
        if self.writer is not None:
            self.writer.release()
            self.writer = None


def _first_line(error: BaseException) -> str:
    return str(error).strip().splitlines()[0]
