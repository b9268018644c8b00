"""Tasks from your data: JSONL, CSV or Parquet files and `datasets` datasets, columns mapped to Task.

`load_tasks(source, prompt=..., answer=..., info=[...])` reads one source into `Task`s:

- a `.jsonl` file (one JSON object a line), a `.csv` file (a header row, then one row a task) or
  a `.parquet` file (read by row groups with `pyarrow`, only the mapped columns);
- a directory written by `datasets`' `save_to_disk` (a `Dataset` or a `DatasetDict`), or a
  `datasets.Dataset` / `DatasetDict` object; needs the `data` extra (`pip install -e '.[data]'`);
- any iterable of row mappings (a list of dicts).

Columns map to the task: `prompt` (a string becomes one user message; a list of
`{"role", "content"}` messages is kept as the conversation; default: the `prompt` column, else
`question`, as in verifiers datasets), `answer` (the reference, turned into a string; `None` for
data without one), `info` (columns copied into `task.info`; default: the row's `info` object
when it has one) and `id` (default: the `id` column, else `FILE-ROW`).

`split="train"` / `"eval"` keeps the rows whose prompt text hashes to that split (one in five to
eval, the rule of the bundled generators, so a dataset's held-out tasks never leak into training);
a `DatasetDict` uses its own `train` / `validation` / `test` splits where it has them.

Files are streamed: rows are read one at a time (Parquet one batch of a row group at a time),
only the mapped columns are kept, and reading stops once `limit` tasks are found. A line of a
JSONL or CSV file longer than `max_row_bytes` (16 MiB) is refused after reading that much of
it, never read whole. A bad row stops the load with one `DatasetError` that names the file,
the row and the fix: bytes that are not UTF-8, a string holding a lone surrogate (`"\\ud800"`, a
half of a UTF-16 pair that no tokenizer or writer can encode), a damaged Parquet file.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any, get_args

from looprl.files import LineError, byte_size, iter_jsonl, text_lines
from looprl.kit import split_of
from looprl.types import Message, Role, Task

DATA_EXTRA = "data"
FILE_FORMATS = (".jsonl", ".csv", ".parquet")
PROMPT_COLUMNS = ("prompt", "question")  # looked for in this order when `prompt` is not given
HELD_OUT_SPLITS = ("eval", "validation", "test")  # a DatasetDict's split that serves `split="eval"`
_PARQUET_BATCH = 1024  # rows decoded at a time
MAX_ROW_BYTES = 16 * 2**20  # one line of a JSONL or CSV file; a task prompt is far smaller


class DatasetError(ValueError):
    """A source that cannot become tasks; the message names the file, the row and the fix."""


@dataclass(frozen=True)
class Columns:
    """Which column fills which part of a task (see the module docstring for the defaults)."""

    prompt: str | None = None
    """The prompt column; None: `prompt`, else `question`."""
    answer: str | None = "answer"
    """The reference answer column; None: tasks without an answer."""
    info: tuple[str, ...] | None = None
    """Columns copied into `task.info`; None: the row's `info` object, when it has one."""
    id: str = "id"
    """The id column; rows without it get `NAME-ROW`."""
    system: str | None = None
    """A system prompt put before each prompt that has none (not a column)."""


@dataclass(frozen=True)
class _Rows:
    """Rows of one source: (number, where, row) triples (`where` names the file and the row for
    errors), the source's name (ids are `NAME-NUMBER`) and its columns when known."""

    rows: Iterator[tuple[int, str, Mapping[str, Any]]]
    name: str
    columns: list[str] | None = None
    hash_split: str | None = None  # a split still to be taken by hashing each prompt


def load_tasks(
    source: str | Path | Iterable[Mapping[str, Any]],
    *,
    prompt: str | None = None,
    answer: str | None = "answer",
    info: Sequence[str] | None = None,
    id: str = "id",
    system: str | None = None,
    split: str | None = None,
    limit: int | None = None,
    env: str = "",
    max_row_bytes: int = MAX_ROW_BYTES,
) -> list[Task]:
    """The tasks of `source` (a file, a saved `datasets` directory or rows), columns mapped.

    `split`: None for every row, `train` or `eval` for a hash split (or a `DatasetDict`'s own
    split); `limit`: at most this many tasks, reading no further; `env`: set on every task (the
    environment that runs it); `max_row_bytes`: the longest line of a JSONL or CSV file.
    Raises `DatasetError` naming the row and the fix.
    """
    return list(
        iter_tasks(
            source, prompt=prompt, answer=answer, info=info, id=id, system=system,
            split=split, limit=limit, env=env, max_row_bytes=max_row_bytes,
        )
    )  # fmt: skip


def iter_tasks(
    source: str | Path | Iterable[Mapping[str, Any]],
    *,
    prompt: str | None = None,
    answer: str | None = "answer",
    info: Sequence[str] | None = None,
    id: str = "id",
    system: str | None = None,
    split: str | None = None,
    limit: int | None = None,
    env: str = "",
    max_row_bytes: int = MAX_ROW_BYTES,
) -> Iterator[Task]:
    """`load_tasks` one task at a time: a large file is never held in memory."""
    if limit is not None and limit < 0:
        raise DatasetError(f"limit must be >= 0 or None, got {limit}")
    if isinstance(info, str):
        raise DatasetError(f"info must be a list of column names, got the string {info!r}")
    columns = Columns(prompt, answer, None if info is None else tuple(info), id, system)
    if max_row_bytes < 1:
        raise DatasetError(f"max_row_bytes must be >= 1, got {max_row_bytes}")
    rows = _open(source, columns, split, max_row_bytes)
    columns = _resolve_prompt(columns, rows)
    tasks = (_task(where, row, columns, f"{rows.name}-{n}", env) for n, where, row in rows.rows)
    if rows.hash_split is not None:
        tasks = (t for t in tasks if split_of(_prompt_key(t)) == rows.hash_split)
    return islice(tasks, limit)


def train_eval_tasks(
    dataset: str | Path | None,
    eval_dataset: str | Path | None = None,
    *,
    env: str,
    columns: Mapping[str, Any] | None = None,
) -> tuple[list[Task], list[Task]] | None:
    """The train and eval tasks of an environment given `dataset=` (and `eval_dataset=`).

    None when neither is given (the environment keeps its own tasks). Without `eval_dataset`, `dataset` is split by a hash of each prompt (one in five to eval; a
    `DatasetDict` uses its train and validation/test splits); with it, `dataset` is all train and
    `eval_dataset` all eval. `columns` maps the task's parts to columns (`{"prompt": "question",
    "answer": "solution", "info": ["level"]}`; keys: prompt, answer, info, id).
    """
    if dataset is None:
        if eval_dataset is not None or columns:
            raise DatasetError(
                "eval_dataset= and columns= need dataset= too (the training tasks), e.g. "
                "--env.dataset train.jsonl --env.eval_dataset eval.jsonl"
            )
        return None
    mapping = dict(columns or {})
    unknown = sorted(set(mapping) - {"prompt", "answer", "info", "id"})
    if unknown:
        raise DatasetError(
            f"unknown column mapping key(s) {unknown}; map prompt, answer, info or id, e.g. "
            '--env.columns \'{"prompt": "question", "answer": "solution"}\''
        )
    if eval_dataset is None:
        train = load_tasks(dataset, split="train", env=env, **mapping)
        evals = load_tasks(dataset, split="eval", env=env, **mapping)
    else:
        train = load_tasks(dataset, env=env, **mapping)
        evals = load_tasks(eval_dataset, env=env, **mapping)
    for kind, tasks, src in (("train", train, dataset), ("eval", evals, eval_dataset or dataset)):
        if not tasks:
            raise DatasetError(f"{src} gave no {kind} tasks; it needs more rows")
    return train, evals


# ------------------------------------------------------------------ sources


def _open(
    source: str | Path | Iterable[Mapping[str, Any]],
    columns: Columns,
    split: str | None,
    max_row_bytes: int,
) -> _Rows:
    """The rows of a source, with the split resolved (a hash split is left to `iter_tasks`)."""
    if not isinstance(source, str | Path):
        if _is_hf(source) or isinstance(source, Mapping):
            return _hf_rows(source, "dataset", columns, split)
        return _Rows(_numbered(source, "rows"), "rows", None, _hash_split(split, "rows"))
    path = Path(source)
    if path.is_dir():
        return _hf_rows(_load_from_disk(path), path.name, columns, split)
    if not path.is_file():
        raise DatasetError(
            f"dataset {path} does not exist; give a file {FILE_FORMATS} or a directory saved by datasets"
        )
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        return _Rows(_jsonl_rows(path, max_row_bytes), path.stem, None, _hash_split(split, path))
    if suffix == ".csv":
        return _Rows(_csv_rows(path, max_row_bytes), path.stem, None, _hash_split(split, path))
    if suffix == ".parquet":
        return _parquet_rows(path, columns, _hash_split(split, path))
    raise DatasetError(
        f"{path}: unknown format {suffix or '(no suffix)'!r}; use {', '.join(FILE_FORMATS)} or a "
        "directory written by datasets' save_to_disk"
    )


def _hash_split(split: str | None, name: str | Path) -> str | None:
    if split not in (None, "train", "eval"):
        raise DatasetError(
            f"{name} has no named splits; use split='train' or 'eval' (a hash split) or None"
        )
    return split


def _numbered(
    rows: Iterable[Mapping[str, Any]], name: str
) -> Iterator[tuple[int, str, Mapping[str, Any]]]:
    for i, row in enumerate(rows, 1):
        yield i, f"{name}: row {i}", row


def _jsonl_rows(path: Path, max_row_bytes: int) -> Iterator[tuple[int, str, Mapping[str, Any]]]:
    fix = f"each line must be one task, an object of columns, within {_row_limit(max_row_bytes)}"
    try:
        for i, row in iter_jsonl(path, fix=fix, max_line_bytes=max_row_bytes):
            yield i, f"{path}: line {i}", row
    except ValueError as exc:  # iter_jsonl's, naming the line: the dataset error type
        raise DatasetError(str(exc)) from None


def _row_limit(max_row_bytes: int) -> str:
    return f"{byte_size(max_row_bytes)} (load_tasks(max_row_bytes=...) sets the limit)"


def _csv_rows(path: Path, max_row_bytes: int) -> Iterator[tuple[int, str, Mapping[str, Any]]]:
    with path.open("rb") as f:
        reader = csv.DictReader(text_lines(f, max_row_bytes))
        i = 0
        try:
            for i, row in enumerate(reader, 1):
                where = f"{path}: row {i} (line {reader.line_num})"
                if None in row:
                    raise DatasetError(
                        f"{where} has more fields than the header; quote commas in values"
                    )
                yield i, where, {k: v for k, v in row.items() if v is not None}  # short: missing
        except LineError as exc:
            row_name = "the header" if exc.line == 1 else f"row {i + 1}"
            fix = exc.fix or f"each row must fit within {_row_limit(max_row_bytes)}"
            raise DatasetError(f"{path}: {row_name} (line {exc.line}): {exc}; {fix}") from None
        except csv.Error as exc:
            raise DatasetError(
                f"{path}: row {i + 1} (line {reader.line_num}): {exc}; check the row's quoting, "
                "or write long fields as JSONL"
            ) from None


def _parquet_rows(path: Path, columns: Columns, hash_split: str | None) -> _Rows:
    try:
        import pyarrow
        import pyarrow.parquet as pq
    except ImportError:
        raise ImportError(
            f"reading {path} needs pyarrow: pip install -e '.[{DATA_EXTRA}]'"
        ) from None
    damaged = (pyarrow.ArrowException, OSError)
    fix = "write it again (e.g. pandas' DataFrame.to_parquet), or give the rows as JSONL"
    try:
        parquet = pq.ParquetFile(path)
    except damaged as exc:
        raise DatasetError(f"{path}: not a readable Parquet file ({exc}); {fix}") from None
    names = list(parquet.schema_arrow.names)
    wanted = _wanted(_resolve_prompt(columns, _Rows(iter(()), path.stem, names)), names)

    def rows() -> Iterator[tuple[int, str, Mapping[str, Any]]]:
        i = 0
        for group in range(parquet.num_row_groups):
            size = parquet.metadata.row_group(group).num_rows
            try:
                batches = list(_group_batches(parquet, group, wanted))
            except damaged as exc:
                problem = " ".join(str(exc).split())
                raise DatasetError(
                    f"{path}: rows {i + 1}-{i + size} (row group {group}) cannot be read, the "
                    f"file is damaged ({problem}); {fix}"
                ) from None
            for batch in batches:
                for row in batch.to_pylist():
                    i += 1
                    yield i, f"{path}: row {i}", row

    return _Rows(rows(), path.stem, names, hash_split)


def _group_batches(parquet: Any, group: int, wanted: list[str]) -> Iterator[Any]:
    """The record batches of one row group, only the `wanted` columns."""
    return parquet.iter_batches(batch_size=_PARQUET_BATCH, row_groups=[group], columns=wanted)


def _wanted(columns: Columns, names: list[str]) -> list[str]:
    """The columns to read: the mapped ones the source has (a missing one fails on its row)."""
    wanted = [columns.prompt, columns.answer, columns.id, *(columns.info or ("info",))]
    return [c for c in dict.fromkeys(wanted) if c is not None and c in names]


def _load_from_disk(path: Path) -> Any:
    if not any(
        (path / f).is_file() for f in ("dataset_info.json", "dataset_dict.json", "state.json")
    ):
        raise DatasetError(
            f"{path} is a directory but not a dataset written by datasets' save_to_disk; give "
            f"that directory or a file {FILE_FORMATS}"
        )
    try:
        import datasets
    except ImportError:
        raise ImportError(
            f"reading {path} (saved by datasets) needs the datasets package: "
            f"pip install -e '.[{DATA_EXTRA}]'"
        ) from None
    return datasets.load_from_disk(str(path))


def _is_hf(obj: Any) -> bool:
    return hasattr(obj, "column_names") and hasattr(obj, "select_columns")


def _hf_rows(data: Any, name: str, columns: Columns, split: str | None) -> _Rows:
    """Rows of a `datasets.Dataset` or of the chosen split of a `DatasetDict`."""
    if isinstance(data, Mapping):  # a DatasetDict (it has column_names too)
        data, hash_split, name = _pick_split(data, split, name)
    else:
        hash_split = _hash_split(split, name)
    names = list(data.column_names)
    data = data.select_columns(
        _wanted(_resolve_prompt(columns, _Rows(iter(()), name, names)), names)
    )
    return _Rows(_numbered(data, name), name, names, hash_split)


def _pick_split(
    data: Mapping[str, Any], split: str | None, name: str
) -> tuple[Any, str | None, str]:
    """(dataset, hash split still to take, name) of a `DatasetDict` for `split`."""
    splits = list(data)
    held = [s for s in HELD_OUT_SPLITS if s in data]
    if split is None:
        if len(splits) == 1:
            return data[splits[0]], None, f"{name}/{splits[0]}"
        raise DatasetError(f"{name} has splits {splits}; choose one with split=")
    if split in ("train", "eval") and not held:  # no held-out split: hash the train rows
        base = "train" if "train" in data else splits[0] if len(splits) == 1 else None
        if base is not None:
            return data[base], split, f"{name}/{base}"
    if split in data:
        return data[split], None, f"{name}/{split}"
    if split == "eval" and held:
        return data[held[0]], None, f"{name}/{held[0]}"
    raise DatasetError(f"{name} has no split {split!r}; its splits are {splits}")


# ------------------------------------------------------------------ rows to tasks


def _resolve_prompt(columns: Columns, rows: _Rows) -> Columns:
    """`columns` with the prompt column chosen (`prompt`, else `question`) when not given."""
    if columns.prompt is not None or rows.columns is None:
        return columns
    found = next((c for c in PROMPT_COLUMNS if c in rows.columns), None)
    if found is None:
        raise DatasetError(
            f"{rows.name} has no prompt or question column (columns: {rows.columns}); "
            "name yours with prompt=COLUMN"
        )
    return Columns(found, columns.answer, columns.info, columns.id, columns.system)


def _task(where: str, row: Mapping[str, Any], columns: Columns, default_id: str, env: str) -> Task:
    """One row as a task; a bad row raises `DatasetError` naming it (`where`)."""

    def fail(problem: str) -> DatasetError:
        return DatasetError(f"{where}: {problem}")

    if not isinstance(row, Mapping):
        raise fail(f"expected an object of columns, got {type(row).__name__}")
    prompt_column = columns.prompt or next((c for c in PROMPT_COLUMNS if c in row), None)
    if prompt_column is None or prompt_column not in row:
        raise fail(_missing(prompt_column, row, "prompt"))
    messages = _messages(row[prompt_column], fail)
    if columns.system and messages[0].role != "system":
        messages.insert(0, Message(role="system", content=columns.system))
    answer = None
    if columns.answer is not None:
        if row.get(columns.answer) is None:
            raise fail(
                _missing(columns.answer, row, "answer") + " (answer=None for data without one)"
            )
        answer = str(row[columns.answer])
    row_id = row.get(columns.id)
    task_id = str(row_id) if row_id is not None else default_id
    task = Task(task_id, messages, answer, _info(row, columns, fail), env)
    problem = _not_unicode(task)
    if problem:
        raise fail(problem)
    return task


def _not_unicode(task: Task) -> str | None:
    """Where a task holds a lone surrogate (text no UTF-8 writer or tokenizer can encode)."""
    parts = [
        ("id", task.id),
        ("answer", task.answer or ""),
        ("info", json.dumps(task.info, ensure_ascii=False)),
    ]
    parts += [
        (f"prompt message {i}", json.dumps(m.to_dict(), ensure_ascii=False))
        for i, m in enumerate(task.prompt)
    ]
    for what, text in parts:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            return (
                f"the {what} holds a lone surrogate {text[exc.start]!r} (an unpaired \\ud800-"
                "\\udfff escape: half of a UTF-16 pair, not text); write the character itself, or "
                "both escapes of its pair"
            )
    return None


def _missing(column: str | None, row: Mapping[str, Any], part: str) -> str:
    """Why a mapped column gives no value (None: no `prompt` or `question` column)."""
    state = "is null" if column in row else "is missing"
    what = f"column {column!r} {state}" if column else "no prompt or question column"
    return f"{what} (columns: {sorted(row)}); map yours with {part}=COLUMN"


def _messages(value: Any, fail: Any) -> list[Message]:
    """A prompt value as messages: a string is one user message, a list is the conversation."""
    if isinstance(value, str):
        if not value.strip():
            raise fail("the prompt is empty")
        return [Message(role="user", content=value)]
    if not isinstance(value, list) or not value:
        raise fail(f"the prompt must be a string or a list of messages, got {type(value).__name__}")
    messages = []
    for i, m in enumerate(value):
        if (
            not isinstance(m, Mapping)
            or m.get("role") not in get_args(Role)
            or not isinstance(m.get("content") or "", str)
        ):
            raise fail(f"prompt message {i} needs a role among {get_args(Role)} and a text content")
        try:
            messages.append(Message.from_dict(dict(m)))
        except (KeyError, TypeError, ValueError) as exc:
            raise fail(f"prompt message {i} is not a chat message ({exc})") from None
    return messages


def _info(row: Mapping[str, Any], columns: Columns, fail: Any) -> dict[str, Any]:
    """`task.info` of a row: the mapped columns, or the row's own `info` object."""
    if columns.info is not None:
        absent = [c for c in columns.info if c not in row]
        if absent:
            raise fail(f"info column(s) {absent} are missing (columns: {sorted(row)})")
        info = {c: row[c] for c in columns.info}
    else:
        info = row.get("info") or {}
        if isinstance(info, str):
            try:
                info = json.loads(info)
            except json.JSONDecodeError:
                raise fail("the info column is a string but not JSON") from None
        if not isinstance(info, dict):
            raise fail(f"the info column must be an object, got {type(info).__name__}")
    try:
        json.dumps(info)
    except (TypeError, ValueError) as exc:
        raise fail(
            f"info must be JSON ({exc}); map only JSON-ready columns with info=[...]"
        ) from None
    return info


def _prompt_key(task: Task) -> str:
    """The text a hash split is decided by: the prompt without its system message."""
    return "\n".join(m.content for m in task.prompt if m.role != "system")
