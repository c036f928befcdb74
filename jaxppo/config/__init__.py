"""Configuration: typed frozen dataclasses loaded from YAML with dotted overrides."""

from jaxppo.config.core import ConfigError, apply_overrides, dump, from_dict, load, parse_override, read_yaml, to_dict
from jaxppo.config.schema import Config


def load_config(path=None, overrides=()) -> Config:
    """Load the jaxppo :class:`Config` from a YAML file plus ``dotted.key=value`` overrides."""
    return load(Config, path, overrides)


__all__ = ["Config", "ConfigError", "apply_overrides", "dump", "from_dict", "load", "load_config",
           "parse_override", "read_yaml", "to_dict"]
