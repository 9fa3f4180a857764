"""Which of the user's files a TensorFlow read error comes from.

TensorFlow's reader says "corrupted record at 19964" without the file; reading the files one by
one again, only after a failure, finds it.
"""

import re
from typing import Optional

from bwopt.data.records import DataError


def tensorflow_reason(error: Exception) -> str:
    """The one line of a TensorFlow error that says what is wrong: a bwopt check's own message
    ("bad record: ..."), else TensorFlow's first line without its function-node prefix."""
    text = str(getattr(error, "message", error))
    own = re.search(r"bad record: (.*?)\] \[", text) or re.search(r"bad record: (.*?)\]", text)
    if own:
        return own.group(1).replace("\\'", "'")
    first = text.strip().splitlines()[0] if text.strip() else type(error).__name__
    return re.sub(r"\{\{function_node [^}]*\}\}\s*", "", first)


def diagnose(source, data_name: str, error: Exception) -> Optional[DataError]:
    """A DataError naming the first file (and record) of data=tfrecord that fails to read, or None
    when `error` is not TensorFlow's or the files read well one by one."""
    if data_name != "tfrecord" or type(error).__module__.split(".")[0] != "tensorflow":
        return None
    for path in [*source.train_files, *source.validation_files]:
        index = 0
        try:
            for index, _ in enumerate(source.open_file(path), start=1):
                pass
        except Exception as file_error:  # the same TensorFlow error, now from one known file
            return DataError(
                f"{path}: record {index}: {tensorflow_reason(file_error)}; fix or remove the file, check the "
                "data.* keys named, "
                "or set data.skip_bad_records=true to skip bad records"
            )
    return None
