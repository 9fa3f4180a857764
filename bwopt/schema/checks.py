"""Value checks shared by the schemas, and the constants they check against."""

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


def check_at_least(key: str, value, minimum) -> None:
    if value < minimum:
        raise ConfigError(f"{key}={value!r} is out of range; expected a value >= {minimum}")


def check_fraction(key: str, value: float, low_open: bool = True) -> None:
    if not (0.0 < value < 1.0 if low_open else 0.0 <= value < 1.0):
        raise ConfigError(f"{key}={value!r} is out of range; expected a fraction in (0, 1)")


def check_int_or_autotune(key: str, value: Any, minimum: int) -> None:
    if value == AUTOTUNE:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{key}={value!r} has the wrong type; expected an integer >= {minimum} or '{AUTOTUNE}'")
    check_at_least(key, value, minimum)
