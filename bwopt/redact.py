"""Secrets out of everything bwopt writes or prints: URI passwords and values of secret-looking keys.

A tracking URI such as `http://user:secret@host:5000`, or a key such as `tracking.tags.api_token`
filled from `${oc.env:TOKEN}`, would otherwise reach MLflow params, the config artifacts, the run
folder and the terminal. This module imports nothing of bwopt's, so the schema can use it too.
"""

import re
from pathlib import Path
from typing import Any

MASK = "***"
# scheme://user:password@host -> scheme://user:***@host (user-info without a password is kept)
URI_PASSWORD = re.compile(r"(?P<head>[A-Za-z][\w+.-]*://[^/@:\s]*):(?P<password>[^/@\s]+)@")
SECRET_WORDS = r"pass(?:word|wd)?|secret|token|api[_-]?key|credential|private[_-]?key|auth"
SECRET_KEY = re.compile(SECRET_WORDS, re.IGNORECASE)
# key=value (a command-line override) whose key looks secret
SECRET_ASSIGNMENT = re.compile(rf"(?P<key>[\w.+~/-]*(?:{SECRET_WORDS})[\w.-]*)=(?P<value>\S+)", re.IGNORECASE)


def redact_text(text: str) -> str:
    """`text` with every URI password and the value of every secret-looking `key=value` masked."""
    text = URI_PASSWORD.sub(lambda match: f"{match['head']}:{MASK}@", text)
    return SECRET_ASSIGNMENT.sub(lambda match: f"{match['key']}={MASK}", text)


def redact(node: Any, key: str = "") -> Any:
    """A copy of a config tree (dicts, lists, scalars) with secrets masked, by key name and in URIs."""
    if isinstance(node, dict):
        return {name: redact(value, str(name)) for name, value in node.items()}
    if isinstance(node, list):
        return [redact(value, key) for value in node]
    if SECRET_KEY.search(key) and node not in (None, "", False):
        return MASK
    return redact_text(node) if isinstance(node, str) else node


def redacted_copy(folder: Path, into: Path) -> Path:
    """The YAML files of `folder` (Hydra's .hydra/) with secrets masked, written into `into`.

    `redact` masks the overrides' lists too: each `key=value` string goes through `redact_text`.
    """
    import yaml

    for path in folder.glob("*.yaml"):
        (into / path.name).write_text(yaml.safe_dump(redact(yaml.safe_load(path.read_text())), sort_keys=False))
    return into


def redact_in_place(folder: Path) -> None:
    """The YAML files Hydra wrote into `folder` (a run's .hydra/, a sweep's multirun.yaml) with
    secrets masked: Hydra writes them before bwopt runs."""
    if folder.is_dir():
        redacted_copy(folder, folder)
