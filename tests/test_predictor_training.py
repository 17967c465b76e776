"""The predictor model, its metrics, training with Trainer, save/load, the protocol and the CLI."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from scipy import stats

from lengthsched.cli import main
from lengthsched.errors import InvalidArgument
from lengthsched.plan import plan_group
from lengthsched.predictor import LengthPrediction, LengthPredictor
from predictor_training.data import write_jsonl
from predictor_training.encoders import tiny_encoder_config
from predictor_training.evaluate import (
    ConstantBaseline,
    LinearBaseline,
    Predictions,
    TfidfBaseline,
    noise_ceiling,
    score,
    score_by_source,
)
from predictor_training.model import LengthPredictorConfig, LengthPredictorModel, bucket_edges, distribution_quantiles
from predictor_training.options import TrainOptions
from predictor_training.predictor import BertLengthPredictor
from predictor_training.training import train

TOPICS = ["rivers", "stars", "bread", "trains", "music", "chess", "rain", "glass", "salt", "wolves", "maps", "clocks",
          "bees", "ice", "paper", "ships", "moss", "iron", "kites", "owls"]


def synthetic_rows(n: int, seed: int) -> list[dict]:
    """Prompts whose wording decides the length (short ~ 24, long ~ 400 tokens), prompt length random."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        long = i % 2 == 0
        topic = TOPICS[rng.integers(len(TOPICS))]
        prompt = (f"write a detailed essay about {topic}" if long else f"answer briefly about {topic}")
        scale = 400 if long else 24
        rows.append({"id": f"{seed}-{i}", "prompt": prompt, "prompt_tokens": int(rng.integers(5, 60)),
                     "response_length": [int(max(2, scale * np.exp(0.15 * rng.standard_normal()))) for _ in range(3)]})
    return rows


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One tiny end-to-end training run (CLI), shared by the tests below."""
    d = tmp_path_factory.mktemp("pred")
    write_jsonl(d / "train.jsonl", synthetic_rows(160, 1))
    write_jsonl(d / "test.jsonl", synthetic_rows(40, 2))
    out = d / "model"
    rc = main(["train", "--data", str(d / "train.jsonl"), "--eval-data", str(d / "test.jsonl"), "--out", str(out),
               "--encoder", "tiny", "--epochs", "6", "--learning-rate", "2e-3", "--batch-size", "16",
               "--max-length", "32", "--prefix-max-tokens", "8", "--l-max", "1024", "--tiny-hidden", "32"])
    assert rc == 0
    return d, out


def test_training_beats_the_constant_baseline_on_held_out_prompts(trained):
    _, out = trained
    summary = json.loads((out / "training_summary.json").read_text())
    ev = summary["evaluation"]
    model, const = ev["model"]["plain"], ev["constant"]["plain"]
    assert summary["test_rows"] == 40 and summary["steps"] > 0
    assert model["mae"] < 0.5 * const["mae"]
    assert model["kendall_tau_b"] > 0.5 > const["kendall_tau_b"]
    assert (out / "checkpoints").is_dir() and (out / "config.json").is_file()
    assert not list(out.glob(".staging-*"))


def test_save_load_round_trip_gives_identical_predictions(trained, tmp_path):
    d, out = trained
    a = BertLengthPredictor.from_pretrained(out, device="cpu")
    prompts = ["answer briefly about owls", "write a detailed essay about ships", "something else entirely"]
    first = a.predict(prompts, quantiles=[0.1, 0.9], prompt_tokens=[10, 10, 10])
    a.save(tmp_path / "copy")
    b = BertLengthPredictor.from_pretrained(tmp_path / "copy", device="cpu", batch_size=1)
    second = b.predict(prompts, quantiles=[0.1, 0.9], prompt_tokens=[10, 10, 10])
    assert np.array_equal(first.lengths, second.lengths)
    for q in (0.1, 0.9):
        assert np.array_equal(first.quantiles[q], second.quantiles[q])
    raw_a, _ = a.raw_outputs(prompts, prompt_tokens=[10, 10, 10])
    raw_b, _ = b.raw_outputs(prompts, prompt_tokens=[10, 10, 10])
    assert np.allclose(raw_a, raw_b, rtol=0, atol=1e-5)  # batch size 64 vs 1: the same numbers


def test_predictor_follows_the_lengthsched_protocol_and_feeds_the_planner(trained):
    _, out = trained
    pred = BertLengthPredictor.from_pretrained(out, device="cpu")
    assert isinstance(pred, LengthPredictor)
    res = pred.predict(["answer briefly about owls"] * 4 + ["write a detailed essay about ships"] * 4,
                       quantiles=[0.9])
    assert isinstance(res, LengthPrediction)
    assert res.lengths[:4].max() < res.lengths[4:].min()
    assert np.all(res.quantile(0.9) >= res.lengths) and np.all(res.lengths >= 1)
    plan = plan_group(res.lengths, max_new_tokens=1024, slots=2)
    assert sorted(j for unit in plan.units for j in unit) == list(range(8))
    # prefixes as text, token ids of the policy tokenizer, or counts; a wrong count of them is an error
    pred.predict(["answer briefly about owls"] * 3, ["It is", [101, 102], 5])
    with pytest.raises(InvalidArgument, match="prefixes"):
        pred.predict(["a", "b"], ["x"])
    with pytest.raises(InvalidArgument, match="quantiles"):
        pred.predict(["a"], quantiles=[1.5])


def test_resume_continues_from_the_last_checkpoint(tmp_path):
    write_jsonl(tmp_path / "d.jsonl", synthetic_rows(64, 5))
    base = dict(data=str(tmp_path / "d.jsonl"), out=str(tmp_path / "m"), encoder="tiny", tiny_hidden=16,
                max_length=24, prefix_max_tokens=4, l_max=1024, test_fraction=0.25, validation_fraction=0.0,
                batch_size=8, eval_steps=3)
    bar = io.StringIO()
    first = train(TrainOptions(**base, max_steps=3), progress=False, bar=bar)
    assert first["steps"] == 3
    assert "training" in bar.getvalue() and "3/3" in bar.getvalue()  # one bar of optimizer steps
    second = train(TrainOptions(**base, max_steps=6, resume=True), progress=False)
    assert second["steps"] == 6
    with pytest.raises(InvalidArgument, match="resume"):
        train(TrainOptions(**{**base, "out": str(tmp_path / "fresh")}, max_steps=3, resume=True), progress=False)


def test_init_from_continues_a_trained_predictor(trained, tmp_path):
    d, model_dir = trained
    before = BertLengthPredictor.from_pretrained(model_dir)
    prompts = ["write a detailed essay about rivers", "answer briefly about rivers"]
    # A learning rate of ~0 keeps the weights: the continued predictor starts where the old one was.
    base = dict(data=str(d / "train.jsonl"), eval_data=str(d / "test.jsonl"), init_from=str(model_dir),
                max_length=32, prefix_max_tokens=8, l_max=1024, batch_size=16)
    train(TrainOptions(**base, out=str(tmp_path / "same"), max_steps=1, learning_rate=1e-30), progress=False)
    same = BertLengthPredictor.from_pretrained(tmp_path / "same")
    np.testing.assert_allclose(same.predict(prompts).lengths, before.predict(prompts).lengths, rtol=1e-6)
    # Real continued training moves it, and it still separates long from short prompts.
    summary = train(TrainOptions(**base, out=str(tmp_path / "more"), max_steps=6, learning_rate=2e-3),
                    progress=False)
    assert summary["steps"] == 6
    longer, shorter = BertLengthPredictor.from_pretrained(tmp_path / "more").predict(prompts).lengths
    assert longer > 4 * shorter
    for name, value in (("head", "quantile"), ("l_max", 2048)):
        with pytest.raises(InvalidArgument, match=f"argument '{name}'.*init-from"):
            train(TrainOptions(**{**base, name: value}, out=str(tmp_path / "bad")), progress=False)
    with pytest.raises(InvalidArgument, match="argument 'init_from'.*written by `lengthsched train`"):
        train(TrainOptions(**{**base, "init_from": str(tmp_path)}, out=str(tmp_path / "bad")), progress=False)


@pytest.mark.parametrize("head", ["regression", "quantile", "buckets-exact", "buckets-log"])
def test_every_head_trains_and_gives_ordered_quantiles(head):
    torch.manual_seed(0)
    cfg = LengthPredictorConfig(encoder=tiny_encoder_config(50, 16, hidden=16, layers=1), head=head, l_max=2048,
                                input_tokens=16, prefix_max_tokens=4)
    model = LengthPredictorModel(cfg)
    y = torch.tensor([[10.0, 12.0], [900.0, 1500.0]])
    model.init_head_from_targets(y.int().tolist())
    batch = dict(input_ids=torch.randint(5, 50, (2, 8)), attention_mask=torch.ones(2, 8, dtype=torch.long),
                 features=torch.zeros(2, 2), labels=y, label_mask=torch.ones(2, 2))
    out = model(**batch)
    out["loss"].backward()
    assert torch.isfinite(out["loss"]) and model.head[-1].weight.grad.abs().sum() > 0
    qs = distribution_quantiles(cfg, out["logits"].detach().double().numpy(), [0.1, 0.5, 0.9])
    assert np.all(np.diff(qs, axis=1) >= 0) and np.all(qs >= 1)


def test_head_quantiles_match_their_distributions():
    cfg = LengthPredictorConfig(encoder={"model_type": "bert"}, head="regression")
    out = np.array([[np.log(200.0), 0.5]])
    got = distribution_quantiles(cfg, out, [0.1, 0.5, 0.9])[0]
    assert np.allclose(got, stats.lognorm(s=0.5, scale=200.0).ppf([0.1, 0.5, 0.9]), rtol=1e-12)
    qcfg = LengthPredictorConfig(encoder={"model_type": "bert"}, head="quantile", quantile_levels=(0.1, 0.5, 0.9))
    logq = np.log([[50.0, 100.0, 400.0]])
    got = distribution_quantiles(qcfg, logq, [0.1, 0.3, 0.5, 0.95])[0]
    assert np.allclose(got, [50.0, np.exp(np.log(50) + 0.5 * np.log(2)), 100.0, 400.0])
    bcfg = LengthPredictorConfig(encoder={"model_type": "bert"}, head="buckets-exact", l_max=8, exact_buckets=4)
    assert list(bucket_edges(bcfg)) == [1, 2, 3, 4, 9]
    all_in_class_2 = np.array([[-50.0, -50.0, 50.0, -50.0]])  # remaining length 3 with certainty
    assert np.all(np.floor(distribution_quantiles(bcfg, all_in_class_2, [0.1, 0.5, 0.9])) == 3)
    lcfg = LengthPredictorConfig(encoder={"model_type": "bert"}, head="buckets-log", l_max=4096, log_buckets=12)
    edges = bucket_edges(lcfg)
    assert edges[0] == 1 and edges[-1] == 4097 and np.all(np.diff(edges) > 0)
    with pytest.raises(InvalidArgument, match="head"):
        LengthPredictorConfig(head="softmax")


def test_buckets_exact_loss_puts_long_tails_in_the_last_class():
    cfg = LengthPredictorConfig(encoder=tiny_encoder_config(20, 16, hidden=16, layers=1), head="buckets-exact",
                                l_max=4096, exact_buckets=1024, input_tokens=16, prefix_max_tokens=4)
    model = LengthPredictorModel(cfg)
    logits = torch.full((1, 1024), -30.0)
    logits[0, -1] = 30.0
    assert model._loss(logits, torch.tensor([[3000.0]]), torch.ones(1, 1)) < 1e-6
    logits = torch.full((1, 1024), -30.0)
    logits[0, 0] = 30.0
    assert model._loss(logits, torch.tensor([[1.0]]), torch.ones(1, 1)) < 1e-6


def test_metrics_match_scipy_and_hand_values():
    p = np.array([10.0, 20.0, 30.0, 40.0])
    truth = [[12], [18, 25], [60], [40]]
    m = score(Predictions(p, {0.5: p}), truth, l_max=4096)
    pairs_p, pairs_y = np.array([10, 20, 20, 30, 40.0]), np.array([12, 18, 25, 60, 40.0])
    assert m["n"] == 5
    assert m["mae"] == pytest.approx(np.mean(np.abs(pairs_p - pairs_y)))
    assert m["rmse"] == pytest.approx(np.sqrt(np.mean((pairs_p - pairs_y) ** 2)))
    assert m["smape"] == pytest.approx(100 * np.mean(2 * np.abs(pairs_p - pairs_y) / (pairs_p + pairs_y)))
    assert m["kendall_tau_b"] == pytest.approx(stats.kendalltau(pairs_p, pairs_y, variant="b").statistic)
    assert m["spearman"] == pytest.approx(stats.spearmanr(pairs_p, pairs_y).statistic)
    assert m["within_10"] == pytest.approx(4 / 5)
    assert m["coverage@0.5"] == pytest.approx(2 / 5)  # covered: 18 <= 20 and 40 <= 40
    ceiling = noise_ceiling([[1, 2, 3], [5]], ["a", "a"], 4096)
    assert ceiling["a"]["n"] == 3 and ceiling["a"]["mae"] == pytest.approx((1 + 1 + 2) / 3)
    by = score_by_source(Predictions(p), truth, ["x", "x", "y", "y"], 4096)
    assert set(by) == {"x", "y", "all"} and by["x"]["n"] == 3


def test_baselines_fit_what_they_can_see():
    rows = {"prompt": ["short q"] * 20 + ["long essay topic"] * 20, "prefix": [""] * 40, "prefix_tokens": [0] * 40,
            "prompt_tokens": [5] * 20 + [50] * 20, "remaining": [[20]] * 20 + [[400]] * 20}
    const = ConstantBaseline().fit(rows).predict(rows, (0.5,), 4096)
    assert len(set(const.point)) == 1
    for cls in (LinearBaseline, TfidfBaseline):
        pred = cls().fit(rows).predict(rows, (0.1, 0.9), 4096)
        assert np.all(np.abs(pred.point[:20] - 20) <= 4) and np.all(np.abs(pred.point[20:] - 400) <= 60)
        assert np.all(pred.quantiles[0.1] <= pred.quantiles[0.9])


def test_cli_predict_and_eval(trained, tmp_path, capsys):
    d, out = trained
    queries = tmp_path / "q.jsonl"
    write_jsonl(queries, [{"prompt": "answer briefly about salt", "prompt_tokens": 9},
                          {"prompt": "write a detailed essay about salt", "prompt_tokens": 9}])
    capsys.readouterr()
    assert main(["predict", str(queries), "--model", str(out), "--quantiles", "0.5,0.9",
                 "--output", str(tmp_path / "p.jsonl")]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [r["index"] for r in lines] == [0, 1] and lines[0]["remaining_tokens"] < lines[1]["remaining_tokens"]
    assert lines[1]["q0.9"] >= lines[1]["q0.5"]
    assert (tmp_path / "p.jsonl").read_text().splitlines() == [json.dumps(r) for r in lines]
    assert main(["eval-predictor", "--model", str(out), "--json"]) == 0  # rebuilds the model's own test split
    res = json.loads(capsys.readouterr().out)
    summary = json.loads((out / "training_summary.json").read_text())["evaluation"]
    name = next(k for k in res if k.startswith("model"))
    assert res[name]["plain"]["mae"] == pytest.approx(summary["model"]["plain"]["mae"])
    assert res["tfidf"]["plain"]["mae"] == pytest.approx(summary["tfidf"]["plain"]["mae"])
    assert main(["eval-predictor", "--model", str(out), "--data", str(d / "test.jsonl")]) == 0
    assert "plain" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["train", "--data", "nowhere/missing.jsonl", "--encoder", "tiny"], "no such file"),
    (["train"], "data"),
    (["train", "--data", "x.jsonl", "--k", "-1"], "k"),
    (["predict", "--model", "/nonexistent"], "directory written by `lengthsched train`"),
    (["eval-predictor"], "model"),
])
def test_cli_errors_are_one_line(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "x.jsonl").write_text('{"prompt": "a", "response_length": 3}\n')
    if argv[0] == "predict":
        monkeypatch.setattr("sys.stdin", __import__("io").StringIO("hello\n"))
    try:
        code = main(argv)
    except SystemExit as exc:  # a required flag left out: argparse's own one-line error
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err


def test_cli_wrong_schema_and_offline_hub_encoder(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)  # the default --out (predictor) lands here, not in the checkout
    write_jsonl(tmp_path / "g.jsonl", [{"question": "q"}])
    assert main(["train", "--data", f"gsm8k:{tmp_path / 'g.jsonl'}", "--encoder", "tiny"]) == 2
    assert "field 'answer' missing" in capsys.readouterr().err
    assert not (tmp_path / "predictor").exists()  # a failed run leaves no directory it made behind
    write_jsonl(tmp_path / "p.jsonl", synthetic_rows(20, 3))
    assert main(["train", "--data", str(tmp_path / "p.jsonl"), "--encoder", "bert-base-uncased",
                 "--label-tokenizer", "minilm", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "pass a local directory" in err and "'minilm'" in err and len(err.strip().splitlines()) == 1
    assert main(["train", "--data", str(tmp_path / "p.jsonl"), "--encoder", "tiny", "--test-fraction", "0.0",
                 "--out", str(tmp_path / "o")]) == 2
    assert "split 'test' is empty" in capsys.readouterr().err


def test_k_prefix_model_and_the_k0_comparison_from_the_cli(trained, tmp_path, capsys):
    _, k0 = trained
    rng = np.random.default_rng(7)
    rows = []
    for i in range(120):
        long = i % 2 == 0
        n = int((300 if long else 20) * np.exp(0.1 * rng.standard_normal()))
        opener = "Essay: " if long else "Short: "
        rows.append({"id": str(i), "prompt": f"question {i % 7}", "response": opener + " ".join(["word"] * n)})
    write_jsonl(tmp_path / "texts.jsonl", rows)
    k4 = tmp_path / "k4"
    assert main(["train", "--data", str(tmp_path / "texts.jsonl"), "--out", str(k4), "--encoder", "tiny", "--k", "4",
                 "--label-tokenizer", "minilm", "--epochs", "8", "--learning-rate", "2e-3", "--max-length", "32",
                 "--prefix-max-tokens", "8", "--l-max", "1024", "--tiny-hidden", "32", "--test-fraction", "0.3"]) == 0
    assert (k4 / "label_tokenizer").is_dir()  # predict can count policy tokens offline
    assert BertLengthPredictor.from_pretrained(k4).config.k == 4
    capsys.readouterr()
    assert main(["eval-predictor", "--model", f"{k0},{k4}", "--k", "4", "--data", str(tmp_path / "texts.jsonl"),
                 "--label-tokenizer", "minilm", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert {"model (k=0)", "k4 (k=4)"} <= set(res) and res["k4 (k=4)"]["plain"]["n"] == 120
    # the prefix reveals the length here ("Essay:" vs "Short:"), which the k = 4 model can use
    assert res["k4 (k=4)"]["plain"]["kendall_tau_b"] > 0.5


def test_the_sampler_plans_with_a_trained_predictor(trained, capsys):
    """`lengthsched sample --predictor DIR`: a k = 0 predictor plans from the prompt text."""
    _, out = trained
    capsys.readouterr()
    assert main(["sample", "--predictor", str(out), "-G", "4", "--policy", "length_aware", "--slots", "2",
                 "--max-new-tokens", "12", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["policy"] == "length_aware" and len(summary["lengths"]) == 4 and summary["preemptions"] == 0


def test_a_k_token_predictor_drives_the_sampler_probe(tmp_path):
    from sampler import InfiniteSampler
    from sampler.cli import ByteTokenizer, tiny_qwen3

    rows = [{"id": str(i), "prompt": f"q {i}", "response": "x " * (5 + i)} for i in range(40)]
    write_jsonl(tmp_path / "t.jsonl", rows)
    train(TrainOptions(data=str(tmp_path / "t.jsonl"), out=str(tmp_path / "k3"), encoder="tiny", k=3,
                       label_tokenizer="minilm", epochs=1, max_length=24, prefix_max_tokens=6, l_max=256,
                       tiny_hidden=16, test_fraction=0.25, validation_fraction=0.0), progress=False)
    pred = BertLengthPredictor.from_pretrained(tmp_path / "k3")
    model = tiny_qwen3()
    sampler = InfiniteSampler(model, policy="length_aware", slots=2, predictor=pred, tokenizer=ByteTokenizer())
    assert sampler.probe_tokens == 3  # taken from the predictor's config
    res = sampler.sample_group(ByteTokenizer().encode("hello"), 4, max_new_tokens=10, seed=0,
                               force_lengths=[2, 10, 6, 8], stop_token_ids=[ByteTokenizer.eos_token_id])
    assert res.lengths == [2, 10, 6, 8] and res.preemptions == 3 and res.recomputed_tokens == 9


def test_tau_difference_bootstraps_whole_prompts():
    from predictor_training.evaluate import Predictions, score, tau_difference

    rng = np.random.default_rng(0)
    means = rng.lognormal(5, 1, size=60)
    truth = [[int(m * np.exp(0.1 * rng.standard_normal())) + 1 for _ in range(4)] for m in means]
    sources = ["x"] * 30 + ["y"] * 30
    good, noise = means, rng.permutation(means)
    res = tau_difference(good, noise, truth, sources, resamples=200)
    for name, idx in (("x", slice(0, 30)), ("y", slice(30, 60)), ("all", slice(0, 60))):
        t = truth[idx]
        want = score(Predictions(good[idx]), t, 4096)["kendall_tau_b"] - score(Predictions(noise[idx]), t, 4096)[
            "kendall_tau_b"]
        assert res[name]["diff"] == pytest.approx(want)
        assert 0 < res[name]["low"] <= res[name]["diff"] <= res[name]["high"] and res[name]["p_not_better"] == 0
    same = tau_difference(good, good, truth, sources, resamples=50)["all"]
    assert same["diff"] == same["low"] == same["high"] == 0 and same["p_not_better"] == 1
    with pytest.raises(InvalidArgument, match="argument 'a'"):
        tau_difference(good[:3], good, truth, sources)
