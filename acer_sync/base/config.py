"""All of a run's settings in one dataclass, the per-env presets, and their validation.

Every field carries its help text in ``metadata["help"]``; ``train.py`` builds its flags from
these fields, so the flags, ``--help``, ``config.json`` and the checkpoints cannot drift apart.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Iterable

#: The values of ``--network``: the torsos.
NETWORKS = ("auto", "mlp", "cnn", "lstm", "cnn_lstm")
#: The values of ``--precision`` (:mod:`acer_sync.nets.precision`).
PRECISIONS = ("fp32", "bf16")


def _f(default, help: str, **metadata):
    return field(default=default, metadata={"help": help, **metadata})


#: ``--pipeline``'s modes (:meth:`acer_sync.training.trainer.Trainer.iterate`; ``auto``: :func:`pipeline_mode`).
PIPELINES = ("auto", "serial", "overlap")
#: ``--compile``'s modes (:class:`acer_sync.training.acer.ACER`; ``auto``: :func:`compile_mode`).
COMPILE_MODES = ("auto", "off", "network", "update", "graph")
#: ``--compile auto`` compiles the update for a run of at least this many steps: there the compile
#: (20–35 s on a CPU) is under 1% of the run, which the compiled update speeds up 1.4–1.9× end to
#: end on the CPU (docs/performance.md).
AUTO_COMPILE_STEPS = 1_000_000
#: ``--replay-device``'s choices (:func:`acer_sync.training.setup.replay_device`).
REPLAY_DEVICES = ("auto", "cpu", "cuda")
#: The settings a resume may change (``--resume RUN_DIR`` with these flags, or ``acer_sync.train(resume=...)``):
#: how long, on what and how the run computes, and where it reports. ``--help`` marks them.
RESUMABLE_CHANGES = (
    "total_timesteps", "device", "threads", "precision", "env_timeout", "compile", "pipeline", "replay_device",
    "env_groups", "track", "wandb_project", "wandb_entity", "save_buffer",
    # what the run reports and keeps, not what it learns: how often it evaluates, writes rows and checkpoints (not
    # --eval-greedy: a run's evaluations would mix greedy and sampled scores, which plot.py tells apart by config.json)
    "eval_every", "eval_episodes", "capture_video", "log_interval", "log_seconds", "checkpoint_every", "keep_checkpoints",
)
#: What the values of a setting's earlier type mean now: ``compile`` was a bool (true: the network's passes).
LEGACY_VALUES = {"compile": {True: "network", False: "off"}}


@dataclass
class Config:
    """Hyperparameters and run settings. Defaults are OpenAI Baselines' ``acer.learn()``."""

    env: str = _f("PongNoFrameskip-v4", "gymnasium env id, or module:EnvId to import the module that registers it first (Atari ids get DeepMind preprocessing)", required=True)
    env_kwargs: dict = field(default_factory=dict, metadata={"help": "keyword arguments for gym.make, in every env of the run: KEY=VALUE pairs, each value read as YAML (a number, true/false or a string); a config file gives a mapping"})
    seed: int = _f(0, "seed for the envs, torch, and replay sampling")
    total_timesteps: int = _f(10_000_000, "agent steps to train for (frames = 4x steps on Atari)")
    num_envs: int = _f(16, "number of parallel envs N")
    nsteps: int = _f(20, "steps per env per segment T (the Retrace horizon k)")
    env_groups: int = _f(
        1, "ale only: step the envs in this many groups of equal size, each group's step sent and received apart, "
        "so that one group's actions are chosen while the others step (a fixed order: a seed still gives one run, "
        "another than with one group; each group takes at least one of the ALE threads; docs/performance.md)",
    )
    vec_env: str = _f("", "vector backend: ale (Atari default), subproc (gymnasium AsyncVectorEnv; the default of continuous control and of non-Atari runs without a preset's choice) or sync (the classic-control preset's)", choices=("", "ale", "subproc", "sync"))
    device: str = _f("auto", "where the networks run: auto (cuda if available), cpu or cuda (one GPU of several: CUDA_VISIBLE_DEVICES)",
                     choices=("auto", "cpu", "cuda"))
    lr: float = _f(7e-4, "initial learning rate")
    lr_schedule: str = _f("linear", "learning-rate schedule: linear (to 0 at total_timesteps) or constant", choices=("linear", "constant"))
    rms_alpha: float = _f(0.99, "RMSProp decay of the squared-gradient average")
    rms_eps: float = _f(1e-5, "RMSProp epsilon, added inside the square root as TF1/Baselines do")
    gamma: float = _f(0.99, "discount factor, in (0, 1]")
    q_coef: float = _f(0.5, "weight of the Q (critic) loss")
    ent_coef: float = _f(0.01, "weight of the entropy bonus")
    max_grad_norm: float = _f(10.0, "clip the global gradient norm to this")
    c: float = _f(10.0, "importance-weight truncation c of the policy gradient (inf: no truncation)")
    trust_region: bool = _f(True, "use the efficient trust region against the average policy")
    delta: float = _f(1.0, "trust-region radius delta")
    alpha: float = _f(0.99, "Polyak coefficient of the average policy network")
    buffer_size: int = _f(50_000, "replay capacity in steps per env")
    replay_ratio: float = _f(4.0, "mean of the Poisson number of off-policy updates per on-policy one")
    replay_start: int = _f(10_000, "steps per env stored before replay begins")
    threads: int = _f(0, "torch threads and ALE env threads of this run (0: torch's default, and one ALE thread per env up to the core count); a sweep sets it to the trial's CPUs")
    compile: str = _f(
        "auto", "torch.compile: auto (update for a run of 1M steps or more, except a net in bf16 on a CPU; else off); off; network "
        "(the network's passes; a bare --compile); update (the whole ACER update, one graph, with no host read in it); "
        "graph (the update as a CUDA graph, and each acting step as one of its own; CUDA only)",
        choices=COMPILE_MODES, metavar="MODE", const="network",
    )
    replay_device: str = _f(
        "auto", "where the replay buffer lives: auto (on the GPU the run trains on, where it takes at most half of its "
        "free memory; else in host memory), cpu, or cuda", choices=REPLAY_DEVICES,
    )
    pipeline: str = _f(
        "auto", "auto (overlap for Atari's envs on CUDA, where it was measured faster; else serial); serial: collect a "
        "segment, then learn from it; overlap: learn from segment k while the envs collect k+1 in a thread, with the "
        "weights of the last finished update (μ is stored, so ACER's importance weights correct the lag)", choices=PIPELINES,
    )
    precision: str = _f(
        "fp32", "what the networks' passes compute in: fp32, or bf16 (bfloat16 autocast for every net but the "
        "built-in MLPs, mlp and lstm; the ACER math, the weights and the checkpoints stay fp32)",
        choices=PRECISIONS,
    )
    hidden: str = _f(
        "64,64", "sizes of the MLP layers for vector observations, one MLP before each head (with --network lstm, one "
        "before the LSTM); also the Gaussian advantage's MLP. --hidden is its older name", flag="--net-arch",
        metavar="SIZES",
    )
    network: str = _f(
        "auto", "the network's torso: auto (cnn for Atari frames, mlp for vectors), mlp, cnn, lstm (MLP then an LSTM) "
        "or cnn_lstm (Nature CNN then an LSTM)", choices=NETWORKS,
    )
    lstm_size: int = _f(128, "units of the LSTM (lstm and cnn_lstm networks)")
    lstm_norm: str = _f(
        "none", "the LSTM's normalization: none, or layer (Baselines' lnlstm: its gates' sums and its cell state "
        "layer-normalized, so that large inputs and a cell state grown over a long episode do not saturate it)",
        choices=("none", "layer"),
    )
    activation: str = _f("tanh", "activation of the MLP layers (vector observations)", choices=("tanh", "relu", "elu"))
    torso: str = _f(
        "", "a torso class of your own, MODULE:CLASS (Stable-Baselines3's features-extractor contract: built as "
        "CLASS(observation_space, **torso_kwargs), an nn.Module with an int features_dim whose forward maps a float "
        "batch [B, *observation_space.shape] to [B, features_dim]); --network auto puts the heads on it, lstm an LSTM first",
        metavar="MODULE:CLASS",
    )
    torso_kwargs: dict = field(default_factory=dict, metadata={"help": "keyword arguments for the --torso class: KEY=VALUE pairs, each value read as YAML"})
    # stored is the default because it won on a POPGym task against burn_in and zero (docs/recurrent.md).
    replay_state: str = _f(
        "stored", "where a recurrent network's replay starts: stored (the state the acting network carried into the "
        "segment), burn_in (off-policy only: the previous segment's stored state, unrolled through that segment "
        "with the current weights) or zero (Baselines' way: the zero state)", choices=("stored", "burn_in", "zero"),
    )
    normalize_obs: bool = _f(False, "normalize vector observations with running mean and std (saved in checkpoints)")
    reward_scale: float = _f(1.0, "multiply training rewards by this (logged returns stay raw)")
    policy_std: float = _f(0.3, "continuous actions: initial sigma of the Gaussian policy, as a fraction of the Box's half-width")
    action_scale: str = _f(
        "none", "continuous actions: box (the policy's mean starts at the Box's centre, the SDN's A takes the action "
        "from that centre, and sigma is kept within 0.0067 to 7.4 half-widths of the Box) or none (mean from 0, "
        "sigma within 0.0067 to 7.4, as runs before box existed); the same on a Box centred on 0", choices=("box", "none"),
    )
    sdn_samples: int = _f(5, "continuous actions: samples u_i ~ pi in the stochastic dueling network's baseline (n of eq. 13)")
    log_interval: int = _f(100, "iterations (N*T steps each) between progress rows")
    log_seconds: float = _f(30.0, "also write a progress row once this many wall-clock seconds passed since the last one, so a slow run shows progress early (0: by --log-interval only)")
    checkpoint_every: int = _f(1_000_000, "agent steps between periodic checkpoints")
    keep_checkpoints: int = _f(5, "periodic checkpoints to keep besides latest.pt (older ones are deleted)")
    save_buffer: bool = _f(False, "also save the replay buffer with each checkpoint (checkpoints/buffer.npz), so a resume replays it")
    max_nonfinite: int = _f(10, "stop after this many non-finite updates in a row (each is skipped)")
    env_timeout: float = _f(
        120.0, "seconds an env step or reset may take before the run stops with a checkpoint of its last completed "
        "iteration (exit code 6; 0: no limit)",
    )
    eval_every: int = _f(250_000, "agent steps between evaluations on full games in separate envs (0: never)")
    eval_episodes: int = _f(10, "full games per evaluation")
    eval_greedy: bool = _f(False, "evaluate with argmax actions instead of sampling from the policy")
    capture_video: bool = _f(
        False, "at each evaluation, also play one game in an env of its own and record it to videos/step_<N>.mp4 "
        "(with --track, sent to Weights & Biases too)",
    )
    track: bool = _f(
        False, "log the progress rows, the config and the videos to Weights & Biases (pip install wandb; "
        "WANDB_MODE=offline writes the run under the run directory's wandb/ for a later wandb sync)",
    )
    wandb_project: str = _f("acer_sync", "the W&B project of --track", metavar="NAME")
    wandb_entity: str = _f("", "the W&B entity (user or team) of --track (default: your W&B default)", metavar="NAME")

    def __post_init__(self):
        for name in LEGACY_VALUES:  # a run or a file written before the setting changed type
            setattr(self, name, current_value(name, getattr(self, name)))


def current_value(name: str, value):
    """``value`` of setting ``name`` as it is named now: a value of the setting's earlier type
    (:data:`LEGACY_VALUES`, ``compile: false``) as its mode; any other as it is."""
    return LEGACY_VALUES[name][value] if isinstance(value, bool) and value in LEGACY_VALUES.get(name, {}) else value


#: Presets by kind of env. A flag the user gives overrides its preset value.
PRESETS: dict[str, dict] = {
    # Baselines' Atari setup: ``acer.learn()``'s defaults (the dataclass defaults) with the
    # constant learning rate of ``baselines/acer/defaults.py:atari()``, which its Atari10M
    # benchmark curves were run with. A recurrent net (cnn_lstm) gets the layer-normalized LSTM:
    # the plain one saturated on Pong and did not learn (docs/recurrent.md, Pong with cnn_lstm).
    "atari": dict(lr_schedule="constant", lstm_norm="layer"),
    # Classic control (CartPole-v1, Acrobot-v1, LunarLander-v3, ...): small MLP, small buffer,
    # replay from early on, and a run length that solves CartPole-v1. One torch thread and the
    # envs in the trainer's process, measured faster (docs/performance.md, the presets' threads).
    "classic": dict(
        vec_env="sync",
        threads=1,
        total_timesteps=200_000,
        num_envs=8,
        lr=1e-3,
        ent_coef=0.0,
        buffer_size=5_000,
        replay_start=500,
        log_interval=10,
        checkpoint_every=100_000,
        eval_every=50_000,
    ),
    # Continuous control (MuJoCo, Pendulum-v1): the paper's §5 setup where it fits one process
    # (c = 5, α = 0.995, replay of 5,000 steps per env; δ = 0.25 from its [0.1, 2] range), with
    # observation normalization and a reward scale. k = 20 and replay ratio 8 instead of the
    # paper's k = 50 with its 16 threads, δ = 0.25, and one torch thread: each measured
    # (docs/results.md, Continuous control, How the preset was chosen; docs/performance.md for the threads).
    "continuous": dict(
        action_scale="box",
        threads=1,
        total_timesteps=1_000_000,
        num_envs=4,
        nsteps=20,
        lr=5e-4,
        lr_schedule="constant",
        ent_coef=0.0,
        c=5.0,
        delta=0.25,
        alpha=0.995,
        buffer_size=5_000,
        replay_start=500,
        replay_ratio=8.0,
        hidden="64,64",
        normalize_obs=True,
        reward_scale=0.1,
        log_interval=10,
        checkpoint_every=100_000,
        eval_every=50_000,
    ),
}


#: What a network with memory (``--network lstm``, with or without ``--torso``) changes in the classic
#: preset, before the env's own file: segments of 10 steps, replay ratio 8, lr 2e-3, measured against
#: the classic preset's 20, 4 and 1e-3 (docs/recurrent.md, The LSTM preset). Atari's ``cnn_lstm`` keeps the Atari
#: preset, and the continuous preset (replay ratio 8 already) is unchanged.
RECURRENT_CLASSIC = dict(nsteps=10, replay_ratio=8.0, lr=2e-3)


def preset_name(atari: bool, continuous: bool = False) -> str:
    if continuous:
        return "continuous"
    return "atari" if atari else "classic"


def fields() -> tuple[dataclasses.Field, ...]:
    return dataclasses.fields(Config)


def field_default(f: dataclasses.Field):
    """A Config field's default value (a new one for fields with a default factory, such as env_kwargs)."""
    return f.default_factory() if f.default is dataclasses.MISSING else f.default


#: The settings whose default became ``auto``, at the default they had before: what a run or a
#: sweep recorded then ran with, and what one recorded before the setting existed ran as (the
#: update eager; collection and learning in turn). A run keeps its recorded value on a resume.
FORMER_DEFAULTS = {"compile": "off", "pipeline": "serial"}


def present_defaults() -> dict:
    """The settings of :data:`FORMER_DEFAULTS` at their defaults now (``auto``)."""
    return {f.name: field_default(f) for f in fields() if f.name in FORMER_DEFAULTS}


def setting_defaults() -> dict:
    """Every setting at what a saved config that lacks it ran with: a run (or a sweep) recorded
    before the setting existed behaved as its default does, or, for a default that became ``auto``
    since, as its former default (:data:`FORMER_DEFAULTS`)."""
    return {**{f.name: field_default(f) for f in fields()}, **FORMER_DEFAULTS}


def saved_config(settings: dict) -> Config:
    """The Config of a run's saved ``settings`` (a checkpoint's, a sweep trial's), a setting they
    lack at what the run ran with (:func:`setting_defaults`)."""
    return Config(**{**setting_defaults(), **settings})


#: Other names a setting goes by (in train.py's flags, config files, sweeps and the API).
SETTING_ALIASES = {"net_arch": "hidden"}


def setting_name(name: str) -> str:
    """The Config field ``name`` stands for (itself, or the field an alias names)."""
    return SETTING_ALIASES.get(name, name)


def given_twice(names: Iterable[str]) -> tuple[str, str, str] | None:
    """The first setting that ``names`` give under two names (``hidden`` and its alias
    ``net_arch``: one of them would win, in silence), as ``(field, first name, second name)``."""
    seen: dict[str, str] = {}
    for name in map(str, names):
        field = setting_name(name)
        if field in seen:
            return field, seen[field], name
        seen[field] = name
    return None


def build_config(atari: bool, overrides: dict, continuous: bool = False, env_settings: dict | None = None) -> Config:
    """The preset for this kind of env (with :data:`RECURRENT_CLASSIC` on the classic one where the
    network has memory), then the env's own tuned settings (``acer_sync/data/envs/``), then the user's
    ``overrides`` (non-None values) on top."""
    name = preset_name(atari, continuous)
    env_values = {setting_name(k): v for k, v in (env_settings or {}).items()}
    user_values = {setting_name(k): v for k, v in overrides.items() if v is not None}
    values = dict(PRESETS[name])
    if name == "classic" and {**values, **env_values, **user_values}.get("network") == "lstm":
        values.update(RECURRENT_CLASSIC)
    values.update(env_values)
    values.update(user_values)
    return Config(**values)


def hidden_sizes(config: Config) -> tuple[int, ...]:
    return tuple(int(size) for size in config.hidden.split(",") if size.strip())


#: The largest seed: numpy's global generator takes seeds below 2**32.
MAX_SEED = 2**32 - 1
#: The most off-policy updates per on-policy one that ``--replay-ratio`` takes (a mean: Poisson draws).
MAX_REPLAY_RATIO = 100.0
#: Far below the largest mean numpy's Poisson draw takes (about 9e18): a resumed run keeps a ratio
#: it was started with above :data:`MAX_REPLAY_RATIO`, but never one the draw refuses.
POISSON_MEAN_LIMIT = 1e9
#: The most threads a run may ask for: OpenMP crashed the process at 100,000, without a message.
MAX_THREADS = 1024
#: The widest layer: torch's shapes overflow past 2**63 with a C++ traceback; below this a size
#: that does not fit is a one-line out-of-memory error.
MAX_LAYER_SIZE = 2**31 - 1
#: The longest --env-timeout: setitimer overflowed at about 9.3e9 seconds (a traceback).
MAX_ENV_TIMEOUT = 1e9
#: The most samples of the stochastic dueling network's estimate: each is one more pass of the
#: advantage head over every step of a batch (the paper takes 5).
MAX_SDN_SAMPLES = 1000


def validate(config: Config, resumed: bool = False) -> list[str]:
    """Every problem with ``config``, as one-line messages naming the flag (empty if none);
    ``resumed``: the config of a run being resumed, which the checks added since it may have been
    started (the caps on --replay-ratio and --sdn-samples, --replay-start in whole segments) leave
    as it is."""
    problems = []

    def need(ok: bool, message: str) -> None:
        if not ok:
            problems.append(message)

    for f in fields():
        value = getattr(config, f.name)
        if isinstance(value, float) and math.isnan(value):
            problems.append(f"--{f.name.replace('_', '-')} is NaN")
    need(
        isinstance(config.env_kwargs, dict) and all(isinstance(key, str) for key in config.env_kwargs),
        "--env-kwargs must map names to values, such as --env-kwargs max_episode_steps=200",
    )
    need(config.total_timesteps >= 1, "--total-timesteps must be >= 1")
    need(config.num_envs >= 1, "--num-envs must be >= 1")
    need(config.env_groups >= 1 and config.num_envs % config.env_groups == 0,
         f"--env-groups must be >= 1 and divide --num-envs ({config.num_envs}) into groups of equal size")
    need(config.nsteps >= 1, "--nsteps must be >= 1")
    need(math.isfinite(config.lr) and config.lr > 0, "--lr must be finite and > 0")
    need(0 < config.gamma <= 1, "--gamma must be in (0, 1]")
    need(0 <= config.rms_alpha < 1, "--rms-alpha must be in [0, 1)")
    need(math.isfinite(config.rms_eps) and config.rms_eps > 0, "--rms-eps must be finite and > 0")
    need(math.isfinite(config.q_coef) and config.q_coef >= 0, "--q-coef must be finite and >= 0")
    need(math.isfinite(config.ent_coef) and config.ent_coef >= 0, "--ent-coef must be finite and >= 0")
    need(config.max_grad_norm > 0, "--max-grad-norm must be > 0")
    need(config.c >= 0, "--c must be >= 0")
    need(math.isfinite(config.delta) and config.delta > 0, "--delta must be finite and > 0")
    need(0 <= config.alpha < 1, "--alpha must be in [0, 1)")
    # each iteration's off-policy updates run before a stop is looked at: 1e6 of them kept a Ctrl-C
    # waiting for hours, and numpy's Poisson draw refuses a mean of 1e20 (at the first replay)
    need(math.isfinite(config.replay_ratio) and config.replay_ratio >= 0, "--replay-ratio must be finite and >= 0")
    need(config.replay_ratio <= (POISSON_MEAN_LIMIT if resumed else MAX_REPLAY_RATIO),
         f"--replay-ratio must be from 0 to {MAX_REPLAY_RATIO:g} (the paper's is 4)")
    need(config.replay_start >= 0, "--replay-start must be >= 0")
    need(
        config.buffer_size >= config.nsteps,
        f"--buffer-size ({config.buffer_size}) must hold at least one segment of --nsteps ({config.nsteps}) steps",
    )
    held = config.buffer_size // config.nsteps * config.nsteps if config.nsteps >= 1 else config.buffer_size  # whole segments
    need(
        config.replay_ratio == 0 or config.replay_start <= (config.buffer_size if resumed else held),
        f"--replay-start ({config.replay_start}) exceeds what --buffer-size ({config.buffer_size}) holds"
        + (f" in whole segments of --nsteps ({held})" if held != config.buffer_size else "") + ", so replay would never start",
    )
    need(config.log_interval >= 1, "--log-interval must be >= 1")
    need(math.isfinite(config.log_seconds) and config.log_seconds >= 0, "--log-seconds must be finite and >= 0 (0: by --log-interval only)")
    need(config.checkpoint_every >= 1, "--checkpoint-every must be >= 1")
    need(config.keep_checkpoints >= 0, "--keep-checkpoints must be >= 0")
    need(config.max_nonfinite >= 1, "--max-nonfinite must be >= 1")
    need(config.seed >= 0, "--seed must be >= 0")
    need(config.seed <= MAX_SEED, f"--seed must be <= {MAX_SEED} (2**32 - 1, numpy's limit)")
    need(config.threads >= 0, "--threads must be >= 0 (0: torch's default)")
    need(config.threads <= MAX_THREADS, f"--threads must be <= {MAX_THREADS}")
    need(math.isfinite(config.env_timeout) and config.env_timeout >= 0, "--env-timeout must be finite and >= 0 (0: no limit)")
    need(config.env_timeout <= MAX_ENV_TIMEOUT, f"--env-timeout must be <= {MAX_ENV_TIMEOUT:g} seconds (0: no limit)")
    need(config.eval_every >= 0, "--eval-every must be >= 0 (0 turns evaluation off)")
    need(config.eval_episodes >= 1, "--eval-episodes must be >= 1")
    need(not config.capture_video or config.eval_every > 0, "--capture-video records a game at each evaluation: give --eval-every > 0")
    need(math.isfinite(config.reward_scale) and config.reward_scale > 0, "--reward-scale must be finite and > 0")
    need(math.isfinite(config.policy_std) and config.policy_std > 0, "--policy-std must be finite and > 0")
    need(config.sdn_samples >= 1, "--sdn-samples must be >= 1")
    need(resumed or config.sdn_samples <= MAX_SDN_SAMPLES, f"--sdn-samples must be <= {MAX_SDN_SAMPLES}")
    need(config.lstm_size >= 1, "--lstm-size must be >= 1")
    need(config.lstm_size <= MAX_LAYER_SIZE, f"--lstm-size must be <= {MAX_LAYER_SIZE}")
    try:
        sizes = hidden_sizes(config)
        need(len(sizes) > 0 and all(s >= 1 for s in sizes), "--hidden must list positive layer sizes, e.g. 64,64")
        need(all(s <= MAX_LAYER_SIZE for s in sizes), f"--hidden's layer sizes must be <= {MAX_LAYER_SIZE}")
    except ValueError:
        problems.append(f"--hidden must be comma-separated integers, got {config.hidden!r}")
    return problems


def pipeline_mode(config: Config, device_type: str, backend: str) -> str:
    """The ``--pipeline`` mode a run on ``device_type`` with the vector env ``backend`` uses.
    ``auto`` is ``overlap`` for Atari's envs (``ale``, whose steps run outside Python's lock) on
    CUDA, where it was measured faster than serial (an H200: 3,365 against 2,375 steps/s at the
    Pong defaults, both eager; docs/performance.md), and ``serial`` elsewhere: on a CPU, where the
    learner and the envs share the cores (Pong 1.06x, CartPole 0.69x), and for the other backends,
    not measured overlapped on a GPU (``sync`` envs step in the trainer's Python, which the two
    threads would share). Every other mode is itself."""
    if config.pipeline != "auto":
        return config.pipeline
    return "overlap" if device_type == "cuda" and backend == "ale" else "serial"


def compile_mode(config: Config, device_type: str, net_in_bf16: bool | None = None) -> str:
    """The ``--compile`` mode a run on ``device_type`` uses. ``auto`` is ``update`` for a run of at
    least :data:`AUTO_COMPILE_STEPS` steps, else ``off``; and ``off`` for a net that runs in bf16
    on a CPU, where eager bf16 beats the compiled fp32 update on ``cnn_lstm`` (docs/performance.md).
    Every other mode is itself.

    :param net_in_bf16: whether the run's net runs in bf16 (:func:`acer_sync.nets.precision.runs_in_bf16`:
        a built-in MLP stays fp32 under ``--precision bf16``); None: whether ``--precision`` is bf16."""
    if config.compile != "auto":
        return config.compile
    in_bf16 = config.precision == "bf16" if net_in_bf16 is None else net_in_bf16
    if config.total_timesteps < AUTO_COMPILE_STEPS or (in_bf16 and device_type == "cpu"):
        return "off"
    return "update"
