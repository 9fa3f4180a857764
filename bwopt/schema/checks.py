"""Value checks shared by the schemas, and the constants they check against."""

import dataclasses
import math
from typing import Any

AUTOTUNE = "autotune"
PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16")
TRANSFER_DTYPES = ("uint8", "bfloat16", "float16", "float32")
# How TFRecord files are compressed (bwopt.data.records reads each).
TFRECORD_COMPRESSIONS = ("NONE", "GZIP", "ZLIB")


class ConfigError(ValueError):
    """A config value is out of range or inconsistent with another one."""


def check_choice(key: str, value: Any, allowed) -> None:
    if value not in allowed:
        raise ConfigError(f"{key}={value!r} is not allowed; expected one of: {', '.join(map(str, allowed))}")


def check_at_least(key: str, value, minimum, expected: str = "") -> None:
    """`expected`: what the key takes, where more than a number (default 'a value >= minimum')."""
    if value < minimum:
        raise ConfigError(f"{key}={value!r} is out of range; expected {expected or f'a value >= {minimum}'}")


def check_fraction(key: str, value: float, low_open: bool = True) -> None:
    if not (0.0 < value < 1.0 if low_open else 0.0 <= value < 1.0):
        raise ConfigError(f"{key}={value!r} is out of range; expected a fraction in (0, 1)")


def check_int_or_autotune(key: str, value: Any, minimum: int) -> None:
    if value == AUTOTUNE:
        return
    expected = f"an integer >= {minimum} or '{AUTOTUNE}'"
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{key}={value!r} has the wrong type; expected {expected}")
    check_at_least(key, value, minimum, expected)


def check_known_and_finite(node: Any, path: str = "") -> None:
    """Walk a validated config: no key outside the schema (a `+key=value` typo), no NaN or infinity.

    OmegaConf lets `+` add keys to a struct config and `to_object` keeps them as attributes, so a
    misspelt `+pipline.prefetch=2` would run with the setting ignored; float('nan') passes every
    range check, since every comparison with it is false.
    """
    if dataclasses.is_dataclass(node):
        fields = {field.name for field in dataclasses.fields(node)}
        unknown = sorted(set(vars(node)) - fields)
        if unknown:
            section = path or "the config"
            raise ConfigError(
                f"{path + '.' if path else ''}{unknown[0]} is not a key of {section!r}; "
                f"its keys are: {', '.join(sorted(fields))}"
            )
        for name in fields:
            check_known_and_finite(getattr(node, name), f"{path + '.' if path else ''}{name}")
    elif isinstance(node, dict):
        for key, value in node.items():
            check_known_and_finite(value, f"{path}.{key}")
    elif isinstance(node, (list, tuple)):
        for value in node:
            check_known_and_finite(value, path)
    elif isinstance(node, float) and not math.isfinite(node):
        raise ConfigError(f"{path}={node!r} is not a finite number; expected a real value")
