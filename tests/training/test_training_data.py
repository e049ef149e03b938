"""Training data readers: folders of text files, JSON lines, Arrow datasets, and their errors."""

import json

import pytest

from kvpop_compile.training.data import read_texts

pa = pytest.importorskip("pyarrow", reason="the Arrow reader needs pyarrow (the arrow extra)")


def write_arrow(path, texts, *, stream=True, column="text"):
    table = pa.table({column: texts})
    with pa.OSFile(str(path), "wb") as sink:
        writer = pa.ipc.new_stream if stream else pa.ipc.new_file
        with writer(sink, table.schema) as out:
            out.write_table(table)


def test_folder_and_jsonl_are_read_in_order(tmp_path):
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "two.py").write_text("x = 2\n")
    (tmp_path / "a.txt").write_text("one")
    (tmp_path / "skip.md").write_text("not text data")
    assert read_texts(tmp_path) == ["one", "x = 2\n"]
    records = tmp_path / "data.jsonl"
    records.write_text(json.dumps({"text": "first"}) + "\n\n" + json.dumps({"text": "second"}))
    assert read_texts(records) == ["first", "second"]


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "file"])
def test_arrow_file_and_dataset_folder(tmp_path, stream):
    write_arrow(tmp_path / "data-00000-of-00002.arrow", ["alpha", None, "beta"], stream=stream)
    write_arrow(tmp_path / "data-00001-of-00002.arrow", ["gamma"], stream=stream)
    (tmp_path / "state.json").write_text("{}")  # as datasets.save_to_disk leaves it
    assert read_texts(tmp_path / "data-00000-of-00002.arrow") == ["alpha", "beta"]
    assert read_texts(tmp_path) == ["alpha", "beta", "gamma"]


def test_bad_data_is_refused_with_its_reason(tmp_path):
    write_arrow(tmp_path / "wrong.arrow", ["a"], column="content")
    with pytest.raises(ValueError, match="no 'text' column; its columns: \\['content'\\]"):
        read_texts(tmp_path / "wrong.arrow")
    (tmp_path / "broken.arrow").write_bytes(b"not arrow at all")
    with pytest.raises(ValueError, match="is not an Arrow IPC file"):
        read_texts(tmp_path / "broken.arrow")
    numbers = pa.table({"text": [1, 2]})
    with pa.OSFile(str(tmp_path / "numbers.arrow"), "wb") as sink:
        with pa.ipc.new_stream(sink, numbers.schema) as out:
            out.write_table(numbers)
    with pytest.raises(ValueError, match="holds int64, not strings"):
        read_texts(tmp_path / "numbers.arrow")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="no .txt or .py files"):
        read_texts(empty)
    bad_line = tmp_path / "bad.jsonl"
    bad_line.write_text('{"text": "ok"}\n[1, 2]\n')
    with pytest.raises(ValueError, match="bad.jsonl:2 is not a JSON object"):
        read_texts(bad_line)
    with pytest.raises(ValueError, match="an Arrow dataset"):
        read_texts(tmp_path / "missing.parquet")
