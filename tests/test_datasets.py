"""Tier 1-2: `looprl.datasets` reads JSONL, CSV, Parquet and saved `datasets` into tasks; envs take them."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from helpers import run_episode

from looprl import load_environment, split_of
from looprl.datasets import DatasetError, iter_tasks, load_tasks, train_eval_tasks


def write_jsonl(path: Path, rows: list[object], blank_after: int | None = None) -> Path:
    lines = [json.dumps(r) if not isinstance(r, str) else r for r in rows]
    if blank_after is not None:
        lines.insert(blank_after, "")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def arithmetic_rows(n: int) -> list[dict[str, object]]:
    return [{"question": f"What is {i} + {i}?", "answer": 2 * i} for i in range(n)]


def test_jsonl_defaults_question_answer_info_and_id(tmp_path):
    path = write_jsonl(
        tmp_path / "math.jsonl",
        [
            {"question": "What is 2+2?", "answer": 4, "level": 1},
            {"question": "What is 3+3?", "answer": "6", "info": {"source": "book"}, "id": "q7"},
        ],
        blank_after=1,  # blank lines are skipped, line numbers still count them
    )
    first, second = load_tasks(path, env="calculator")
    assert first.id == "math-1" and second.id == "q7"
    assert [(m.role, m.content) for m in first.prompt] == [("user", "What is 2+2?")]
    assert first.answer == "4" and second.answer == "6"  # answers become strings
    assert first.info == {} and second.info == {"source": "book"}  # the row's info object
    assert first.env == second.env == "calculator"


def test_prompt_messages_system_and_info_columns(tmp_path):
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    path = write_jsonl(
        tmp_path / "chat.jsonl",
        [
            {"prompt": chat, "answer": "x", "level": 2},
            {"prompt": "plain", "answer": "y", "level": 3},
        ],
    )
    with_chat, plain = load_tasks(path, info=["level"], system="Think.")
    assert [(m.role, m.content) for m in with_chat.prompt] == [
        ("system", "Be brief."),  # the row's own system message is kept, not doubled
        ("user", "hi"),
    ]
    assert [(m.role, m.content) for m in plain.prompt] == [("system", "Think."), ("user", "plain")]
    assert with_chat.info == {"level": 2} and plain.info == {"level": 3}
    no_answers = load_tasks(path, answer=None)
    assert [t.answer for t in no_answers] == [None, None]


def test_csv_with_mapped_columns_and_quoted_commas(tmp_path):
    path = tmp_path / "sums.csv"
    path.write_text('q,a,lvl\n"What is 1, plus 1?",2,easy\nWhat is 5*5?,25,hard\n', "utf-8")
    tasks = load_tasks(path, prompt="q", answer="a", info=["lvl"])
    assert [t.prompt[-1].content for t in tasks] == ["What is 1, plus 1?", "What is 5*5?"]
    assert [t.answer for t in tasks] == ["2", "25"]
    assert [t.info for t in tasks] == [{"lvl": "easy"}, {"lvl": "hard"}]
    assert [t.id for t in tasks] == ["sums-1", "sums-2"]


def test_jsonl_and_csv_stream_and_stop_at_limit(tmp_path):
    """A bad row after the limit is never read: rows are read one at a time."""
    jsonl = write_jsonl(tmp_path / "big.jsonl", [*arithmetic_rows(3), "{not json"])
    assert [t.answer for t in load_tasks(jsonl, limit=3)] == ["0", "2", "4"]
    with pytest.raises(DatasetError, match=r"big.jsonl:4: not valid JSON .*one task"):
        load_tasks(jsonl)
    csv_path = tmp_path / "big.csv"
    csv_path.write_text("question,answer\nWhat is 1?,1\nWhat is 2?,2,extra\n", "utf-8")
    assert len(load_tasks(csv_path, limit=1)) == 1
    with pytest.raises(DatasetError, match=r"row 2 \(line 3\) has more fields than the header"):
        load_tasks(csv_path)
    stream = iter_tasks(jsonl)
    assert next(stream).answer == "0"  # a generator: the first task before the bad line


@pytest.mark.parametrize(
    ("row", "kwargs", "message"),
    [
        ({"text": "hi", "answer": 1}, {}, r"line 2: no prompt or question column .*prompt=COLUMN"),
        ({"question": "hi"}, {}, r"line 2: column 'answer' is missing .*answer=COLUMN"),
        ({"question": "hi", "answer": None}, {}, r"line 2: column 'answer' is null"),
        ({"question": "", "answer": 1}, {}, r"line 2: the prompt is empty"),
        (
            {"prompt": [{"role": "robot", "content": "x"}], "answer": 1},
            {},
            r"message 0 needs a role",
        ),
        ({"prompt": 5, "answer": 1}, {}, r"prompt must be a string or a list of messages, got int"),
        ({"question": "hi", "answer": 1, "info": [1]}, {}, r"info column must be an object"),
        (
            {"question": "hi", "answer": 1},
            {"info": ["lvl"]},
            r"info column\(s\) \['lvl'\] are missing",
        ),
        ([1, 2], {}, r"bad.jsonl:2: a JSON array, not an object; .*an object of columns"),
    ],
)
def test_a_bad_row_is_one_error_naming_the_row_and_the_fix(tmp_path, row, kwargs, message):
    path = write_jsonl(tmp_path / "bad.jsonl", [{"question": "ok", "answer": 1}, row])
    with pytest.raises(DatasetError, match=message):
        load_tasks(path, **kwargs)


def test_bad_sources_and_arguments_say_what_to_give(tmp_path):
    with pytest.raises(DatasetError, match=r"does not exist"):
        load_tasks(tmp_path / "missing.jsonl")
    (tmp_path / "data.txt").write_text("x", "utf-8")
    with pytest.raises(DatasetError, match=r"unknown format '.txt'; use .jsonl, .csv, .parquet"):
        load_tasks(tmp_path / "data.txt")
    (tmp_path / "folder").mkdir()
    with pytest.raises(DatasetError, match=r"not a dataset written by datasets' save_to_disk"):
        load_tasks(tmp_path / "folder")
    path = write_jsonl(tmp_path / "a.jsonl", arithmetic_rows(2))
    with pytest.raises(DatasetError, match=r"no named splits; use split='train' or 'eval'"):
        load_tasks(path, split="test")
    with pytest.raises(DatasetError, match=r"info must be a list of column names"):
        load_tasks(path, info="level")  # type: ignore[arg-type]


def test_hash_split_is_disjoint_complete_and_follows_split_of(tmp_path):
    rows = arithmetic_rows(60)
    path = write_jsonl(tmp_path / "all.jsonl", rows)
    train = load_tasks(path, split="train")
    evals = load_tasks(path, split="eval")
    assert train and evals
    assert {t.id for t in train}.isdisjoint({t.id for t in evals})
    assert len(train) + len(evals) == len(rows)
    assert all(split_of(t.prompt[-1].content) == "eval" for t in evals)
    # a system prompt does not move a row to the other split
    assert [t.id for t in load_tasks(path, split="eval", system="S")] == [t.id for t in evals]


def test_parquet_by_row_groups_with_only_the_mapped_columns(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    n = 50
    table = pa.table(
        {
            "problem": [f"What is {i} * 3?" for i in range(n)],
            "solution": [None if i == n - 1 else 3 * i for i in range(n)],
            "tag": ["t"] * n,
            "blob": [b"\x00\x01"] * n,  # bytes are not JSON: read only if it were mapped
        }
    )
    path = tmp_path / "train.parquet"
    pq.write_table(table, path, row_group_size=10)
    assert pq.ParquetFile(path).num_row_groups == 5
    first = load_tasks(path, prompt="problem", answer="solution", info=["tag"], limit=3)
    assert [(t.prompt[-1].content, t.answer, t.info) for t in first] == [
        (f"What is {i} * 3?", str(3 * i), {"tag": "t"}) for i in range(3)
    ]
    with pytest.raises(DatasetError, match=rf"train.parquet: row {n}: column 'solution' is null"):
        load_tasks(path, prompt="problem", answer="solution")
    with pytest.raises(DatasetError, match=r"info must be JSON"):
        load_tasks(path, prompt="problem", answer="solution", info=["blob"], limit=1)
    with pytest.raises(DatasetError, match=r"no prompt or question column \(columns: \['problem'"):
        load_tasks(path)


def test_datasets_saved_on_disk_and_their_splits(tmp_path):
    datasets = pytest.importorskip("datasets")
    rows = arithmetic_rows(30)
    single = tmp_path / "single"
    datasets.Dataset.from_list(rows).save_to_disk(str(single))
    assert [t.answer for t in load_tasks(single)] == [str(r["answer"]) for r in rows]
    assert len(load_tasks(single, split="train")) + len(load_tasks(single, split="eval")) == 30

    both = tmp_path / "both"
    held = [{"question": "held out?", "answer": 1}]
    datasets.DatasetDict(
        {"train": datasets.Dataset.from_list(rows), "test": datasets.Dataset.from_list(held)}
    ).save_to_disk(str(both))
    assert len(load_tasks(both, split="train")) == 30  # the dataset's own splits, no hashing
    assert [t.prompt[-1].content for t in load_tasks(both, split="eval")] == ["held out?"]
    with pytest.raises(DatasetError, match=r"has splits \['train', 'test'\]; choose one"):
        load_tasks(both)

    only_train = tmp_path / "only_train"
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows)}).save_to_disk(str(only_train))
    train, evals = train_eval_tasks(only_train, env="calculator") or ([], [])
    assert len(train) + len(evals) == 30 and train and evals  # hashed: no held-out split

    in_memory = load_tasks(datasets.Dataset.from_list(rows[:2]))
    assert [t.id for t in in_memory] == ["dataset-1", "dataset-2"]


def test_a_saved_dataset_without_the_data_extra_names_it(tmp_path, monkeypatch):
    saved = tmp_path / "saved"
    saved.mkdir()
    (saved / "dataset_info.json").write_text("{}", "utf-8")
    monkeypatch.setitem(sys.modules, "datasets", None)  # import datasets now fails
    with pytest.raises(ImportError, match=r"pip install -e '\.\[data\]'"):
        load_tasks(saved)


def test_calculator_takes_a_dataset_with_mapped_columns(tmp_path):
    rows = [{"expr": f"What is {i} * 7?", "result": 7 * i} for i in range(40)]
    path = write_jsonl(tmp_path / "times.jsonl", rows)
    env = load_environment(
        "calculator", dataset=str(path), columns={"prompt": "expr", "answer": "result"}
    )
    train, evals = env.get_tasks("train"), env.get_tasks("eval")
    assert len(train) + len(evals) == 40 and train and evals
    assert train[0].prompt[0].role == "system" and train[0].env == "calculator"
    asked = {t.prompt[-1].content for t in train + evals}
    assert asked == {r["expr"] for r in rows}
    stream = env.iter_train_tasks(seed=0)
    assert {next(stream).id for _ in range(len(train))} == {t.id for t in train}

    held = write_jsonl(tmp_path / "held.jsonl", [{"expr": "What is 2 * 9?", "result": 18}])
    env = load_environment(
        "calculator",
        dataset=str(path),
        eval_dataset=str(held),
        columns={"prompt": "expr", "answer": "result"},
    )
    assert len(env.get_tasks("train")) == 40
    assert [t.answer for t in env.get_tasks("eval")] == ["18"]


def test_dataset_arguments_are_checked(tmp_path):
    path = write_jsonl(tmp_path / "a.jsonl", arithmetic_rows(10))
    with pytest.raises(DatasetError, match=r"unknown column mapping key\(s\) \['question'\]"):
        load_environment("calculator", dataset=str(path), columns={"question": "q"})
    with pytest.raises(DatasetError, match=r"eval_dataset= and columns= need dataset= too"):
        load_environment("python_math", eval_dataset=str(path))
    one = write_jsonl(tmp_path / "one.jsonl", arithmetic_rows(1))
    with pytest.raises(DatasetError, match=r"gave no (train|eval) tasks; it needs more rows"):
        load_environment("calculator", dataset=str(one))


async def test_a_dataset_task_scores_through_the_calculator_rubric(tmp_path, tiny_tokenizer):
    path = write_jsonl(tmp_path / "q.jsonl", [{"question": "What is 12 * 12?", "answer": 144}])
    env = load_environment("calculator", dataset=str(path), eval_dataset=str(path))
    (task,) = env.get_tasks("eval")
    call = '<tool_call>{"name": "calculate", "arguments": {"expression": "12 * 12"}}</tool_call>'
    right = await run_episode(env, task, [call, "The answer is 144."], tiny_tokenizer)
    wrong = await run_episode(env, task, ["The answer is 140."], tiny_tokenizer)
    assert right.reward == 1.0 and right.rewards["used_tool"] == 1.0
    assert wrong.reward == 0.0


def test_python_math_reads_question_answer_files(tmp_path):
    rows = [{"question": f"What is {i}^2?", "answer": i * i, "id": f"sq{i}"} for i in range(30)]
    path = write_jsonl(tmp_path / "squares.jsonl", rows)
    env = load_environment("python_math", dataset=str(path))
    ids = {t.id for t in env.get_tasks("train")} | {t.id for t in env.get_tasks("eval")}
    assert ids == {r["id"] for r in rows}
    assert {t.env for t in env.get_tasks("eval")} == {"python_math"}


SUMS = [(17, 23, 5), (48, 31, 9), (112, 7, 44), (63, 59, 1), (250, 4, 13)]
SUMS += [(91, 88, 76), (14, 14, 14), (305, 12, 8), (77, 66, 55), (123, 45, 67)]


def test_the_datasets_example_in_the_docs_runs_as_written(tmp_path, monkeypatch):
    import doctest
    import re

    doc = (Path(__file__).resolve().parents[1] / "docs" / "environments.md").read_text("utf-8")
    (example,) = re.findall(
        r"```pycon\n(>>> from looprl import load_tasks.*?)```", doc, flags=re.DOTALL
    )
    lines = ["problem,solution,source"] + [
        f"What is {a} * {b} + {c}?,{a * b + c},handmade" for a, b, c in SUMS
    ]
    (tmp_path / "sums.csv").write_text("\n".join(lines) + "\n", "utf-8")
    monkeypatch.chdir(tmp_path)
    test = doctest.DocTestParser().get_doctest(example, {}, "environments.md", None, 0)
    result = doctest.DocTestRunner().run(test)
    assert result.failed == 0 and result.attempted == 3


def _good_lines(n: int) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in arithmetic_rows(n))


def test_bytes_that_are_not_utf8_name_the_file_and_the_row(tmp_path):
    jsonl = tmp_path / "latin.jsonl"
    jsonl.write_bytes(_good_lines(2) + b'{"question": "caf\xe9?", "answer": 1}\n')
    with pytest.raises(DatasetError, match=r"latin.jsonl:3: not UTF-8 .*save the file as UTF-8"):
        load_tasks(jsonl)
    csv_file = tmp_path / "latin.csv"
    csv_file.write_bytes(b"question,answer\nWhat is 1?,1\nWhat is 2?,2\ncaf\xe9?,3\n")
    with pytest.raises(DatasetError, match=r"latin.csv: row 3 \(line 4\): not UTF-8 .*as UTF-8"):
        load_tasks(csv_file)
    csv_file.write_bytes(b"questi\xf3n,answer\nWhat is 1?,1\n")
    with pytest.raises(DatasetError, match=r"latin.csv: the header \(line 1\): not UTF-8"):
        load_tasks(csv_file)


@pytest.mark.parametrize(
    ("line", "where"),
    [
        ('{"question": "a\\ud800b", "answer": 1}', "the prompt message 0"),
        ('{"question": "ok", "answer": "\\udfff"}', "the answer"),
        ('{"question": "ok", "answer": 1, "info": {"k": "\\ud83d"}}', "the info"),
        ('{"question": "ok", "answer": 1, "id": "x\\ud800"}', "the id"),
    ],
)
def test_a_lone_surrogate_escape_is_refused_at_its_row(tmp_path, line, where):
    path = tmp_path / "escapes.jsonl"
    path.write_bytes(_good_lines(1) + line.encode() + b"\n")
    with pytest.raises(DatasetError, match=rf"escapes.jsonl: line 2: {where} holds a lone surr"):
        load_tasks(path)
    paired = tmp_path / "paired.jsonl"  # a full pair of escapes is a character: accepted
    paired.write_text('{"question": "smile \\ud83d\\ude00", "answer": 1}\n')
    assert load_tasks(paired)[0].prompt[0].content == "smile \U0001f600"
    with pytest.raises(DatasetError, match=r"rows: row 1: the prompt message 0 holds a lone"):
        load_tasks([{"question": "a\ud800", "answer": 1}])  # rows given in Python too


def test_a_damaged_parquet_file_names_the_file_and_the_rows(tmp_path):
    pa = pytest.importorskip("pyarrow", reason="reading Parquet needs pyarrow (the data extra)")
    pq = pytest.importorskip("pyarrow.parquet")
    not_parquet = tmp_path / "noise.parquet"
    not_parquet.write_bytes(b"PAR1" + bytes(range(256)) * 4)
    with pytest.raises(DatasetError, match=r"noise.parquet: not a readable Parquet file .*again"):
        load_tasks(not_parquet)
    rows = arithmetic_rows(50)
    table = pa.table({"question": [r["question"] for r in rows], "answer": [1] * 50})
    path = tmp_path / "damaged.parquet"
    pq.write_table(table, path, row_group_size=10)
    offset = pq.ParquetFile(path).metadata.row_group(2).column(0).data_page_offset
    data = bytearray(path.read_bytes())
    data[offset : offset + 16] = b"\xff" * 16  # the third row group's first page header
    path.write_bytes(bytes(data))
    assert len(load_tasks(path, limit=20)) == 20  # the rows before it still read
    with pytest.raises(DatasetError, match=r"damaged.parquet: rows 21-30 \(row group 2\) cannot"):
        load_tasks(path)


def test_a_line_over_the_row_limit_is_refused_without_reading_it_whole(tmp_path):
    import resource

    files = {
        "long.jsonl": _good_lines(2) + json.dumps({"question": "x" * 5000, "answer": 1}).encode(),
        "long.csv": b"question,answer\nWhat is 1?,1\nWhat is 2?,2\n" + b"x" * 5000 + b",1\n",
    }
    where = {"long.jsonl": "long.jsonl:3: ", "long.csv": r"long.csv: row 3 \(line 4\): "}
    for name, data in files.items():
        (tmp_path / name).write_bytes(data + b"\n")
        with pytest.raises(DatasetError, match=rf"{where[name]}longer than 4 KiB.*max_row_bytes"):
            load_tasks(tmp_path / name, max_row_bytes=4096)
        assert len(load_tasks(tmp_path / name, max_row_bytes=8192)) == 3  # a higher limit reads it
    # A 512 MiB line with no newline (a sparse file: no disk used) under a 1 MiB limit: refused
    # after reading 1 MiB of it; reading it whole would add 512 MiB to the peak RSS.
    huge = tmp_path / "one_line.jsonl"
    with huge.open("wb") as f:
        f.write(b'{"question": "')
        f.truncate(512 * 2**20)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    with pytest.raises(DatasetError, match=r"one_line.jsonl:1: longer than 1 MiB"):
        load_tasks(huge, max_row_bytes=2**20)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 64 * 1024
