"""Config files: a YAML mapping of Config settings, by their field names.

``train.py --config FILE.yaml`` reads one, and a sweep's ``settings`` use the same keys and the
same checks (:func:`check_setting`). ``acer_sync/data/envs/<EnvId>.yaml`` holds an env's tuned settings,
applied automatically (:func:`load_env_settings`). Precedence: preset < env file < ``--config``
< flags. Every mistake is a one-line :class:`UserError` naming the file and the key.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import yaml

from acer_sync.base.config import current_value, fields, given_twice, setting_name
from acer_sync.base.errors import UserError

#: The per-env settings files, one per env id, as rl-zoo keeps its tuned hyperparameters; package
#: data, so that an installed acer_sync (``pip install .``) applies them as a clone does.
ENV_SETTINGS_DIR = Path(__file__).resolve().parents[1] / "data" / "envs"

class SettingsLoader(yaml.SafeLoader):
    """YAML's safe loader with two fixes for settings files and ``--env-kwargs`` values: ``1e-3``
    is a number (YAML 1.1 reads a float only with a dot, ``1.0e-3``, and took ``1e-3`` for a
    string, so ``lr: 1e-3`` was refused as "not a number"), and a key given twice in a mapping is
    an error (the last one won, in silence)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # <<: keys merged in, which the mapping's own may override
                continue
            key = self.construct_object(key_node, deep=deep)
            try:
                repeated = key in seen
                seen.add(key)
            except TypeError:  # an unhashable key: the base class says what is wrong with it
                break
            if repeated:
                raise yaml.constructor.ConstructorError(
                    None, None, f"{key!r} is given twice", key_node.start_mark)
        return super().construct_mapping(node, deep)


SettingsLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"), list("-+0123456789"),
)


def load_yaml(text: str):
    """``text`` read as YAML by :class:`SettingsLoader`."""
    return yaml.load(text, Loader=SettingsLoader)  # noqa: S506 - a SafeLoader: plain data only


#: The YAML type each kind of Config field accepts (a float field also takes an integer).
ACCEPTED_TYPES = {"int": (int,), "float": (int, float), "bool": (bool,), "str": (str,), "dict": (dict,)}
TYPE_NAMES = {
    "int": "an integer", "float": "a number", "bool": "true or false", "str": "a string",
    "dict": "a mapping of names to values, such as {max_episode_steps: 200}",
}
#: What a value in ``env_kwargs`` may hold: what config.json and the checkpoints can store.
PLAIN_VALUES = (type(None), bool, int, float, str)


def field_types() -> dict[str, str]:
    """Each Config field's type name (``"int"``, ``"float"``, ``"bool"`` or ``"str"``)."""
    return {f.name: f.type if isinstance(f.type, str) else f.type.__name__ for f in fields()}


#: train.py's flags of the run itself, which are not settings: what takes their place in Python.
COMMAND_LINE_ONLY = {
    "run_dir": "acer_sync.train's run_dir argument",
    "resume": "acer_sync.train's resume argument",
    "config": "the settings themselves",
    "no_progress": "acer_sync.train(progress_bar=False)",
    "stop_at_reward": "acer_sync.train(callbacks=[acer_sync.StopTrainingOnReward(x)])",
}


def check_setting(name: str, value, source: str):
    """``value`` as Config field ``name`` (or an alias of it) holds it, or a UserError saying what
    is wrong in ``source``."""
    name = setting_name(name)
    types = field_types()
    if name in COMMAND_LINE_ONLY:
        raise UserError(f"{source}: {name} is train.py's flag --{name.replace('_', '-')}, not a setting "
                        f"(from Python: {COMMAND_LINE_ONLY[name]})")
    if name not in types:
        raise UserError(f"{source}: unknown setting {name!r}; settings are train.py's config names, such as replay_ratio")
    kind = types[name]
    value = current_value(name, value)
    # bool is a subclass of int in Python, but `total_timesteps: true` is a mistake.
    if isinstance(value, bool) != (kind == "bool") or not isinstance(value, ACCEPTED_TYPES[kind]):
        raise UserError(f"{source}: {name} must be {TYPE_NAMES[kind]}, got {value!r}")
    if kind == "float":
        try:
            value = float(value)
        except OverflowError:
            raise UserError(f"{source}: {name} must be a finite number, got an integer too large for one") from None
        if math.isnan(value) or (math.isinf(value) and name != "c"):
            raise UserError(f"{source}: {name} must be a finite number, got {value!r}")
    if kind == "dict":
        return check_env_kwargs(value, f"{source}: {name}")
    choices = next(f.metadata.get("choices") for f in fields() if f.name == name)
    if choices and value not in choices:
        raise UserError(f"{source}: {name} must be one of {', '.join(c for c in choices if c)}, got {value!r}")
    return value


def check_env_kwargs(value: dict, source: str) -> dict:
    """``value`` as keyword arguments for ``gym.make``: names to numbers, booleans, strings, null,
    or lists and mappings of these; a UserError naming ``source`` otherwise."""

    def plain(item) -> bool:
        if isinstance(item, list):
            return all(map(plain, item))
        if isinstance(item, dict):
            return all(isinstance(key, str) and plain(inner) for key, inner in item.items())
        return isinstance(item, PLAIN_VALUES)

    for key, item in value.items():
        if not isinstance(key, str) or not key.isidentifier():
            raise UserError(f"{source}: {key!r} is not a keyword argument name")
        if not plain(item):
            raise UserError(f"{source}: {key} must be a number, true/false, a string, or a list or mapping of these, got {item!r}")
    return dict(value)


def read_yaml_mapping(path: Path) -> dict:
    """The top-level mapping of the YAML file at ``path``; a one-line UserError otherwise."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as error:
        raise UserError(f"cannot read {path}: {getattr(error, 'strerror', None) or error}") from None
    try:
        payload = load_yaml(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(error, "problem", None) or type(error).__name__
        raise UserError(f"{path}: not valid YAML{where}: {problem}") from None
    if payload is None:
        return {}
    if not isinstance(payload, dict):
        raise UserError(f"{path}: expected a mapping of settings (key: value lines), got {type(payload).__name__}")
    return payload


def load_config_file(path: Path) -> dict:
    """The settings of a ``--config`` file, checked: ``{field name: value}`` (an alias such as
    ``net_arch`` under the field it names); a setting given under two names (``hidden`` and
    ``net_arch``) is a UserError (one of them won, in silence)."""
    given = read_yaml_mapping(path)
    twice = given_twice(given)
    if twice:
        raise UserError(f"{path}: gives the setting {twice[0]} twice, as {twice[1]} and {twice[2]}")
    # by their fields' names: a flag overrides them
    return {setting_name(str(name)): check_setting(str(name), value, str(path)) for name, value in given.items()}


def env_settings_file(env_id: str, directory: Path = ENV_SETTINGS_DIR) -> Path:
    """Where the tuned settings of ``env_id`` live: ``acer_sync/data/envs/<EnvId>.yaml``, the id without
    its ``module:`` part (``ALE/Pong-v5`` is ``acer_sync/data/envs/ALE/Pong-v5.yaml``)."""
    return directory / f"{env_id.rpartition(':')[2]}.yaml"


def load_env_settings(env_id: str, directory: Path = ENV_SETTINGS_DIR) -> tuple[Path | None, dict]:
    """The env's tuned settings file and its checked settings; ``(None, {})`` when it has none.

    They go between the preset and the user's settings (``--config``, flags, a sweep's settings)."""
    path = env_settings_file(env_id, directory)
    if not path.is_file():
        return None, {}
    settings = load_config_file(path)
    if "env" in settings:
        raise UserError(f"{path}: sets env, which the file's name already gives")
    return path, settings


def env_settings_line(env_id: str, path: Path, settings: dict, overrides: dict) -> str:
    """One line saying which of the env file's settings a run takes, and which the user overrode."""
    applied = [f"{name}={value}" for name, value in settings.items() if overrides.get(name) is None]
    overridden = [name for name in settings if overrides.get(name) is not None]
    shown = path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path
    line = f"tuned settings for {env_id} from {shown}: {', '.join(applied) or 'none applied'}"
    return line + (f" (overridden by your settings: {', '.join(overridden)})" if overridden else "")
